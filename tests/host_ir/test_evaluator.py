"""The evaluator and the extension points: straight-line programs, registered lowerings, kernel
launches, deallocation, and (on CUDA) iterations spread over the worker-stream pool."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.host_ir.evaluator import HostIrEvaluator, stream_pool
from pyfuser.host_ir.nodes import AtenCall, Deallocate, HostIrContainer, HostNode, LaunchKernel
from pyfuser.host_ir.outputs import OutputLayout
from pyfuser.ir.base import Expr
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.iter_domain import ParallelType
from pyfuser.ir.tensor_view import new_like
from pyfuser.runtime.backends import register_lowering, register_step_builder
from tests.host_ir.conftest import DoublingOp

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_fusion_without_streams_is_straight_line(device, run_dumped, normalize):
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1, -1])
    t1 = fd.define_tensor([-1])
    t2 = fd.ops.add(t0, t1)
    t3 = fd.ops.sum(t2, [0])
    fd.add_output(t3)
    x, y = torch.randn(4, 3, device=device), torch.randn(3, device=device)
    (out,), dump = run_dumped(fd, [x, y])
    torch.testing.assert_close(out, (x + y).sum(0))
    lines = normalize(dump)
    assert lines[0].startswith("%HostIrContainer { (T?_g_float[iS?{i?}, iS?{i?}], T?_g_float[")
    assert lines[-1] == "} // %HostIrContainer"
    assert not any(x.startswith(("FOR", "ALLOCATE", "SetCurrentStream")) for x in lines)
    assert sum(x.startswith("= ") for x in lines) == 3  # broadcast, add, reduction


class _ScaleOp(Expr):
    """A test-only op lowered by a registered lowering to a kernel launch."""

    def __init__(self, fusion: Any, out: Any, inp: Any) -> None:
        super().__init__(fusion, [inp], [out])

    def evaluate(self, ctx: EvalContext, x: torch.Tensor) -> list[Any]:
        raise AssertionError("lowered to LaunchKernel: never evaluated as an ATen call")

    def to_string(self, indent: int = 0) -> str:
        return f"{self.output} = scale({self.inputs[0]})\n"


class _ScaleKernel:
    name = "scale_kernel"

    def __init__(self) -> None:
        self.launches = 0

    def run(self, ctx: EvalContext, x: torch.Tensor) -> list[torch.Tensor]:
        self.launches += 1
        return [x * 3]


def test_registered_lowering_launches_kernel(device, run_dumped):
    kernel = _ScaleKernel()
    register_lowering(_ScaleOp, lambda expr, lctx: [LaunchKernel(kernel, expr.inputs, expr.outputs)])
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1])
    t1 = new_like(t0)
    _ScaleOp(fd.fusion, t1, t0)
    fd.add_output(fd.ops.neg(t1))
    x = torch.randn(5, device=device)
    (out,), dump = run_dumped(fd, [x])
    torch.testing.assert_close(out, -3 * x)
    assert kernel.launches == 1
    assert "LaunchKernel( scale_kernel, inputs = ( T0_g_float[iS0{i0}] ), outputs = ( T1_g_float[iS1{i0}] ) )" in dump


def test_register_lowering_rejects_non_exprs():
    with pytest.raises(TypeError, match="register_lowering expects an Expr subclass, got <class 'int'>"):
        register_lowering(int, lambda expr, lctx: [])  # type: ignore[arg-type]


def test_deallocate_drops_the_buffer_and_program_runs_by_hand():
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1])
    t1 = fd.ops.exp(t0)
    t2 = fd.ops.add(t1, 1.0)
    fd.add_output(t2)
    nodes = [AtenCall(t1.definition), AtenCall(t2.definition), Deallocate(t1)]
    container = HostIrContainer([t0], [t2], nodes)
    assert "  Deallocate T1_l_float[iS1{i0}]\n" in str(container)
    program = HostIrEvaluator(container, [OutputLayout((0,), False)], torch.device("cpu"), num_streams=2)
    x = torch.randn(4)
    (out,) = program.run([x], EvalContext({"i0": 4}))
    torch.testing.assert_close(out, torch.exp(x) + 1.0)


def _stream_matmul(chunks: int) -> FusionDefinition:
    fd = FusionDefinition()
    a = fd.define_tensor([-1, -1])
    b = fd.define_tensor([-1, -1])
    out = fd.ops.matmul(a, b)
    fd.add_output(out)
    out.outer_split(0, chunks)
    out.axis(0).parallelize(ParallelType.stream)
    return fd


@pytest.mark.cuda
@cuda
def test_cuda_iterations_run_on_worker_streams(tmp_path):
    fd = _stream_matmul(4)
    a, b = torch.randn(256, 128, device="cuda"), torch.randn(128, 64, device="cuda")
    fd.execute([a, b])
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        (out,) = fd.execute([a, b])
        torch.cuda.synchronize()
    torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)  # chunked GEMMs may pick other kernels
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    streams = {e["args"]["stream"] for e in kernels}
    user = torch.cuda.current_stream().stream_id
    assert len(kernels) >= 4
    assert len(streams) == 4, f"expected the 4 GEMMs on 4 worker streams, got streams {streams}"
    assert user not in streams


@pytest.mark.cuda
@cuda
def test_cuda_stream_pool_reused_and_user_stream_restored():
    fd = _stream_matmul(3)
    a, b = torch.randn(9, 4, device="cuda"), torch.randn(4, 5, device="cuda")
    user = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        (out,) = fd.execute([a, b])
        assert torch.cuda.current_stream() == side
    torch.cuda.synchronize()
    torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)
    assert stream_pool(a.device, 4) is stream_pool(a.device, 4)
    bad = torch.randn(9, 7, device="cuda")
    with pytest.raises((ValueError, RuntimeError)):
        fd.execute([a, bad])
    assert torch.cuda.current_stream() == user


class _DoubleOp(DoublingOp):
    """A test-only chunkable op whose lowering appends a node bound to it (like Wait after Communication)."""


class _Record(HostNode):
    """Records the shape of the value it follows; must stay right after its producer."""

    binds_to_previous = True

    def __init__(self, tv: Any, seen: list) -> None:
        self.tv, self.seen = tv, seen
        self.inputs, self.outputs = [tv], []

    def to_string(self, indent: int = 0) -> str:
        return f"{'  ' * indent}Record {self.tv}\n"

    def substitute(self, mapping: dict, index: Any = None) -> _Record:
        return _Record(mapping.get(self.tv, self.tv), self.seen)


def _record_step(node: _Record, cc: Any) -> Any:
    """The evaluator visits _Record nodes with this step builder (nodes are data)."""
    slot = cc.slot(node.tv)
    return lambda frame: node.seen.append(tuple(frame.values[slot].shape))


def test_node_bound_to_previous_stays_in_the_stream_loop(device, run_dumped):
    seen: list = []
    register_lowering(_DoubleOp, lambda expr, lctx: [AtenCall(expr), _Record(expr.output, seen)])
    register_step_builder(_Record, _record_step)
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1, -1])
    t1 = new_like(t0)
    _DoubleOp(fd.fusion, t1, t0)
    fd.add_output(t1)
    t1.outer_split(0, 3)
    t1.axis(0).parallelize(ParallelType.stream)
    x = torch.randn(7, 2, device=device)
    (out,), dump = run_dumped(fd, [x])
    torch.testing.assert_close(out, 2 * x)
    assert seen == [(3, 2), (3, 2), (1, 2)]  # once per chunk, on the chunk
    body = dump[dump.index("FOR "):]
    assert body.index("= double(") < body.index("Record T") < body.index("SetCurrentStream to Stream 0")


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_cuda_program_on_another_device_keeps_the_callers_device_and_streams():
    """Stream switches on cuda:1 must not leave cuda:1 current (torch.cuda.set_stream sets the device)."""
    fd = _stream_matmul(3)
    a, b = torch.randn(9, 4, device="cuda:1"), torch.randn(4, 5, device="cuda:1")
    torch.cuda.set_device(0)
    before = (torch.cuda.current_stream(0), torch.cuda.current_stream(1))
    (out,) = fd.execute([a, b])
    assert torch.cuda.current_device() == 0
    assert (torch.cuda.current_stream(0), torch.cuda.current_stream(1)) == before
    torch.cuda.synchronize(1)
    torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)


def test_outputs_never_share_memory(device: str) -> None:
    """``b``, ``set(b)`` and a view of ``b`` all returned: each output owns its memory."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=True)
        b = fd.ops.add(x, 1.0)
        fd.add_output(b)
        fd.add_output(fd.ops.set(b))
        fd.add_output(fd.ops.permute(b, [1, 0]))
    x_in = torch.randn(4, 3, device=device)
    outs = fd.execute([x_in])
    expected = x_in + 1.0
    for out in outs[:2]:
        torch.testing.assert_close(out, expected)
    torch.testing.assert_close(outs[2], expected.t())
    assert len({o.untyped_storage().data_ptr() for o in outs}) == 3
    outs[0].zero_()
    torch.testing.assert_close(outs[1], expected)


def test_outputs_derived_from_new_memory_skip_the_aliasing_check(device: str) -> None:
    """Only outputs that may share memory with an input or another output are checked per call: a
    view of a matmul's or an add's result owns its memory; a view of an input, or two views of one
    result, are copied (each output owns its memory either way)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=True)
        w = fd.define_tensor([-1, -1], contiguity=True)
        y = fd.ops.add(x, 1.0)
        fd.add_output(fd.ops.permute(fd.ops.matmul(x, w), [1, 0]))  # 0: a view of new memory
        fd.add_output(fd.ops.reshape(x, [-1]))  # 1: a view of an input
        fd.add_output(fd.ops.permute(y, [1, 0]))  # 2 and 3: two views of one result
        fd.add_output(fd.ops.reshape(y, [-1]))
        fd.add_output(fd.ops.permute(fd.ops.mul(x, 2.0), [1, 0]))  # 4: a view of new memory
    x_in, w_in = torch.randn(4, 3, device=device), torch.randn(3, 5, device=device)
    outs = fd.execute([x_in, w_in])
    want = [(x_in @ w_in).t(), x_in.reshape(-1), (x_in + 1).t(), (x_in + 1).reshape(-1), (x_in * 2).t()]
    for got, expected in zip(outs, want, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    storages = [t.untyped_storage().data_ptr() for t in (x_in, w_in, *outs)]
    assert len(set(storages)) == len(storages), "an output shares memory with an input or another output"
    if device == "cpu":  # every op an ATen call (kernels would write some of these outputs themselves)
        program = fd.fec.last_program
        own = {pos for pos, _, shared in program._conform if not shared}
        assert own == {0, 4}, program._conform  # views of a matmul's and a mul's new memory: not checked

    with FusionDefinition() as made:  # an op without tensor operands, and views of its result (fuzz seed 504)
        n = made.define_scalar(dtype=DataType.Int)
        r = made.ops.iota(n, -2.0, 0.5, DataType.Float)
        made.add_output(made.ops.slice(r, [1], [3], [1]))
        made.add_output(r)
        made.add_output(made.ops.broadcast_in_dim(r, [2, 4, 1], [1]))
    outs = made.execute([4])
    assert len({t.untyped_storage().data_ptr() for t in outs}) == 3
    torch.testing.assert_close(outs[1].cpu(), torch.arange(4, dtype=torch.float32) * 0.5 - 2.0)  # CUDA when present
