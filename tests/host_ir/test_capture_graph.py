"""The ``CaptureGraph`` node and the ``capture_graph`` pass (``_enable_options=["cuda_graph"]``): the
program's nodes in one block that prints around them, what the block reads and hands on, the pass
leaving a CPU program as it is (with a warning) and marking a multi-device one's block collective, and the evaluator
reading the outputs' memory through the block. Capture and replay themselves need a GPU
(``tests/host_ir/test_cuda_graph.py``)."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from pyfuser import FusionDefinition, ParallelType
from pyfuser.host_ir.evaluator import HostIrEvaluator
from pyfuser.host_ir.nodes import AtenCall, CaptureGraph, ForLoop, HirAliasSelect, HostIrContainer
from pyfuser.host_ir.passes.capture_graph import capture_graph
from pyfuser.ir.eval_context import EvalContext
from pyfuser.multidevice import DeviceMesh
from pyfuser.options import CompileOptions, DisableOption, EnableOption
from pyfuser.runtime.compile import compile_fusion

CUDA = torch.device("cuda", 0)  # a device to compile for: nothing here runs on it
GRAPHS = frozenset({EnableOption.cuda_graph})
ATEN = frozenset({DisableOption.kernel_codegen})


def _linear_fusion() -> FusionDefinition:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        w = fd.define_tensor([-1, -1], contiguity=True)
        s = fd.define_scalar(None, torch.float64)
        y = fd.ops.linear(fd.ops.mul(fd.ops.sigmoid(x), s), w)
        fd.add_output(fd.ops.add(y, fd.ops.sum(y, [1], keepdim=True)))
        fd.add_output(fd.ops.exp(fd.ops.mul(x, 2.0)))
    return fd


def _stream_fusion(chunks: int) -> FusionDefinition:
    fd = FusionDefinition()
    x = fd.define_tensor([-1, -1])
    w = fd.define_tensor([-1, -1])
    y = fd.ops.relu(fd.ops.matmul(x, w))
    z = fd.ops.mul(y, 3.0)
    fd.add_output(z)
    for t in (y, y.definition.inputs[0], z):
        t.outer_split(0, chunks)
        t.axis(0).parallelize(ParallelType.stream)
    return fd


def _program_lines(text: str) -> list[str]:
    return text.rstrip("\n").split("\n")


def test_the_pass_prints_the_program_in_one_block() -> None:
    """On CUDA the program is its nodes, unchanged, in one ``CaptureGraph`` block: it reads the inputs
    the nodes read (a constant scalar is none of them), in order of first read, and hands on the outputs."""
    fd = _linear_fusion()
    plain = compile_fusion(fd.fusion, CompileOptions(frozenset(), ATEN, CUDA))
    graphs = compile_fusion(fd.fusion, CompileOptions(GRAPHS, ATEN, CUDA))
    (node,) = graphs.container.nodes
    assert isinstance(node, CaptureGraph)
    x, w, s = graphs.container.inputs
    assert node.inputs == [x, s, w] and node.outputs == graphs.container.outputs
    lines, plain_lines = _program_lines(str(graphs)), _program_lines(str(plain))
    assert lines[1] == (f"  CaptureGraph( inputs = ( {x}, {s}, {w} ), outputs = ( "
                        f"{', '.join(map(str, graphs.container.outputs))} ) ):")
    assert [lines[0], *(line[2:] for line in lines[2:-1]), lines[-1]] == plain_lines
    assert all(line.startswith("    ") for line in lines[2:-1])


def test_a_stream_program_in_one_block() -> None:
    """A stream loop is captured with the rest: the block reads what the program reads, not the chunks
    its loop selects nor the buffers it allocates; run by the steps (a CPU program built by hand: no
    capture), it computes what the program computes."""
    fd = _stream_fusion(3)
    x, w = torch.randn(7, 4), torch.randn(4, 5)
    (want,) = fd.execute([x, w], _disable_options=["kernel_codegen"])
    torch.testing.assert_close(want, torch.relu(x @ w) * 3)
    program = fd.fec.last_program
    assert isinstance(program, HostIrEvaluator)
    container = program.container
    loops = [n for n in container.nodes if isinstance(n, ForLoop)]
    assert loops
    capture_graph(container, CompileOptions(device=CUDA))
    (node,) = container.nodes
    assert isinstance(node, CaptureGraph) and loops[0] in node.body
    assert node.inputs == container.inputs and node.outputs == container.outputs
    selected = {n.out for n in container.walk() if isinstance(n, HirAliasSelect)}
    assert selected and not selected & set(node.inputs)
    assert "FOR StreamIdx in" in str(container) and str(container).count("CaptureGraph(") == 1
    rebuilt = HostIrEvaluator(container, program.layouts, torch.device("cpu"))
    torch.testing.assert_close(rebuilt.run([x, w], EvalContext({"i0": 7, "i1": 4, "i2": 4, "i3": 5}))[0], want)


def test_a_cpu_program_is_left_as_it_is_with_a_warning() -> None:
    """``cuda_graph`` on a CPU execution: the program prints and computes as without the option; the
    warning names the caller's line."""
    fd = _linear_fusion()
    x, w = torch.randn(6, 4).t().contiguous().t(), torch.randn(5, 4)
    with pytest.warns(RuntimeWarning, match=r"_enable_options=\['cuda_graph'\]: CUDA graphs capture CUDA work only; "
                                            r"the fusion runs on cpu without one") as record:
        got = fd.execute([x, w, 0.5], _enable_options=["cuda_graph"])
    assert record[0].filename == __file__
    with_option = str(fd.fec.last_program)
    want = fd.execute([x, w, 0.5])
    assert with_option == str(fd.fec.last_program) and "CaptureGraph" not in with_option
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r)


def test_a_multi_device_programs_block_is_collective() -> None:
    """A program of a fusion on a device mesh is captured with its communications: its block says
    ``collective`` (every rank captures and replays at the same calls; a signature's first call runs
    without a graph); a single-device block does not. On a CPU the option does nothing, with its warning."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.relu(x))
    x.set_device_mesh(DeviceMesh(range(2)))
    fusion = fd.fusion

    def container() -> HostIrContainer:
        return HostIrContainer(fusion.inputs(), fusion.outputs(), [AtenCall(e) for e in fusion.exprs()])

    on_cpu = container()
    with pytest.warns(RuntimeWarning, match="CUDA graphs capture CUDA work only"):
        capture_graph(on_cpu, CompileOptions())
    assert not any(isinstance(n, CaptureGraph) for n in on_cpu.nodes)
    on_gpu = container()
    capture_graph(on_gpu, CompileOptions(device=CUDA))
    (block,) = on_gpu.nodes
    assert isinstance(block, CaptureGraph) and block.collective
    assert _program_lines(str(on_gpu))[1].endswith(f"outputs = ( {fusion.outputs()[0]} ), collective ):")
    single = _linear_fusion()
    program = compile_fusion(single.fusion, CompileOptions(GRAPHS, ATEN, CUDA))
    (block,) = program.container.nodes
    assert isinstance(block, CaptureGraph) and not block.collective and "collective" not in str(program.container)


def test_the_outputs_of_a_block_are_written_by_it() -> None:
    fd = _linear_fusion()
    program = compile_fusion(fd.fusion, CompileOptions(frozenset(), ATEN, CUDA))
    container = program.container
    with pytest.raises(ValueError, match=re.escape(f"CaptureGraph outputs {container.inputs[0]} are not written by "
                                                   "its body")):
        CaptureGraph(container.nodes, [container.inputs[0], *container.outputs])


def _aliasing_fusion() -> FusionDefinition:
    """Outputs the evaluator conforms or not: one returned twice, fresh results of a kernel."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.ops.mul(x, 2.0)
        fd.add_output(fd.ops.permute(x, [1, 0]))
        fd.add_output(y)
        fd.add_output(y)
        fd.add_output(fd.ops.permute(y, [1, 0]))
        fd.add_output(fd.ops.sum(y, [0]))
    return fd


def test_the_evaluator_reads_the_outputs_memory_through_the_block() -> None:
    """Which outputs a run conforms (copies, restrides) and which it hands out as they are is read
    through the block: the same as without it. Run by the steps, the outputs are torch's and never
    share memory with the input or with one another."""
    fd = _aliasing_fusion()
    x = torch.randn(5, 3)
    kernels = CompileOptions(frozenset({EnableOption.triton_interpreter}), frozenset(), torch.device("cpu"))
    plain = compile_fusion(fd.fusion, kernels)
    captured = compile_fusion(fd.fusion, kernels)
    capture_graph(captured.container, CompileOptions(device=CUDA))
    captured = HostIrEvaluator(captured.container, captured.layouts, torch.device("cpu"))
    assert isinstance(captured.container.nodes[0], CaptureGraph)
    conformed = [(pos, shared) for pos, _, shared in plain._conform]
    assert conformed == [(2, True)]  # the output returned twice; the kernel's results are its own
    assert [(pos, shared) for pos, _, shared in captured._conform] == conformed
    assert len(captured._fresh_output_slots) == len(plain._fresh_output_slots) == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outputs = captured.run([x], EvalContext({"i0": 5, "i1": 3}))
    y = x * 2
    for got, want in zip(outputs, [x.t(), y, y, y.t(), y.sum(0)], strict=True):
        torch.testing.assert_close(got, want)
    storages = [o.untyped_storage().data_ptr() for o in outputs]
    assert x.untyped_storage().data_ptr() not in storages and storages[1] != storages[2]
