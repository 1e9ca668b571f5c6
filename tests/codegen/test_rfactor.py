"""Manual reduction schedules (nvFuser's tutorial): block and grid parallel reductions, rfactor into
a per-thread and a block step, the two-level grid version; rfactor's IR and its ATen evaluation;
the errors a wrong schedule gets."""

from __future__ import annotations

import pytest
import torch

from pyfuser import DataType, FusionDefinition, ParallelType
from pyfuser.codegen import kernel_sequence
from pyfuser.codegen.kernel_source import KernelError

_DTYPES = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16}


def _sum(rank: int = 2, dims: tuple[int, ...] = (1,)) -> tuple[FusionDefinition, object]:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1] * rank)
        t1 = fd.ops.sum(t0, list(dims))
        fd.add_output(t1)
    return fd, t1


def test_tutorial_reduction_block_and_grid(device: str) -> None:
    x = torch.randn(10, 1024, device=device)
    for types in ((None, ParallelType.block_x), (None, ParallelType.grid_x), (ParallelType.grid_x, ParallelType.block_x),
                  (ParallelType.block_y, ParallelType.block_x)):
        fd, t1 = _sum()
        for axis, ptype in enumerate(types):
            if ptype is not None:
                t1.axis(axis).parallelize(ptype)
        x_in = x if types[0] is not ParallelType.block_y else x[:, :32].contiguous()
        fd.manual_validate([x_in], [x_in.sum(1)])


def test_tutorial_rfactor_per_thread_then_block(device: str) -> None:
    """tv1 [r/1024, r1024] -> rfactor([0]): each of 1024 lanes sums its column of the split, then the
    block sums the lanes."""
    for op, ref in (("sum", torch.sum), ("max", torch.amax), ("mean", torch.mean), ("min", torch.amin)):
        with FusionDefinition() as fd:
            t0 = fd.define_tensor([-1])
            t1 = getattr(fd.ops, op)(t0, [0])
            fd.add_output(t1)
            t1.split(0, 1024)
            t2 = t1.rfactor([0])
            t1.axis(0).parallelize(ParallelType.block_x)
            t2.axis(1).parallelize(ParallelType.block_x)
        x = torch.randn(10000, device=device)
        fd.manual_validate([x], [ref(x)])
        text = str(fd.fusion)
        assert "rfactor" in text and text.count("reduction(") == 2
        assert t2.domain().root is not None and [str(i.iter_type.value) for i in t2.get_logical_domain()] == ["r", "i"]
        # The rfactored fusion evaluates the same through ATen (the split padded with the identity).
        torch.testing.assert_close(fd.execute([x])[0], ref(x))


def _two_level_grid_sum() -> FusionDefinition:
    """[r/1024/100, r100, r1024]: per-thread, block, then a grid reduction of one partial result
    per program (each program sums 102,400 elements)."""
    fd, t1 = _sum(1, (0,))
    t1.split(0, 1024)
    t1.split(0, 100)
    t2 = t1.rfactor([1])
    t3 = t1.rfactor([1])
    for tv in (t2, t3, t1):
        tv.axis(0).parallelize(ParallelType.grid_x)
    t2.axis(2).parallelize(ParallelType.block_x)
    t3.axis(1).parallelize(ParallelType.block_x)
    return fd


def test_tutorial_rfactor_two_level_grid(device: str) -> None:
    fd = _two_level_grid_sum()
    x = torch.randn(300_000, device=device)
    fd.manual_validate([x], [x.sum()])
    code = fd.last_kernel_code()
    assert "manual_kernel_partial0" in code and "manual_kernel_final" in code


def test_grid_reduction_in_one_launch_when_its_programs_fit(device: str) -> None:
    """The partial and the final step run as one cooperative launch, a grid synchronization between
    them, when the device runs all the partial step's programs at once (one per SM on a GPU; one in
    Triton's interpreter, which runs programs one after another); with one program more, as two
    launches. The barrier's counter is left as found (up to its flipped bit) for the next launch."""
    fd = _two_level_grid_sum()
    resident = kernel_sequence.resident_programs(torch.device(device))
    for programs, cooperative in ((resident, True), (resident + 1, False)):
        for trial in range(3):  # the counter flips at every launch: each must still synchronize
            x = torch.randn(programs * 102_400 - 3 * trial, device=device)
            before = kernel_sequence.cooperative_launches
            fd.manual_validate([x], [x.sum()])
            assert kernel_sequence.cooperative_launches - before == (1 if cooperative else 0), (programs, trial)
    counters = [c for (kind, index, _), c in kernel_sequence._COUNTERS.items()
                if (kind, index) == (x.device.type, x.device.index)]
    assert counters and all(int(c) & ((1 << 30) - 1) == 0 for c in counters)


def test_rfactor_of_merged_non_divisible_axes_and_its_aten_evaluation(device: str) -> None:
    for op, ref in (("sum", lambda x: x.sum((0, 2))), ("max", lambda x: x.amax((0, 2))),
                    ("mean", lambda x: x.mean((0, 2)))):
        with FusionDefinition() as fd:
            t0 = fd.define_tensor([-1, -1, -1])
            t1 = getattr(fd.ops, op)(t0, [0, 2])
            fd.add_output(t1)
            t1.reorder({1: 0})  # [i1, r0, r2]
            t1.merge(1)  # [i1, r0*r2]
            t1.split(1, 7)  # [i1, r/7, r7]
            t2 = t1.rfactor([2])
            for tv in (t1, t2):
                tv.axis(0).parallelize(ParallelType.grid_x)
                tv.axis(1).parallelize(ParallelType.block_x)
        x = torch.randn(5, 3, 11, device=device)
        torch.testing.assert_close(fd.execute([x])[0], ref(x))
        fd.manual_validate([x], [ref(x)])


@pytest.mark.parametrize("op", ["matmul", "linear"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_rfactor_of_a_contraction_writes_its_partial_sums_and_sets_them(op: str, dtype: torch.dtype) -> None:
    """nvFuser's manual row-parallel matmul on one device: K split 3 ways (K = 14: not divisible), rfactored
    over its inner part; the contraction writes the partial, ``out = set(partial)``; the result is the
    contraction's whatever the operands' layouts (a permuted, a broadcast operand)."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1, 14], dtype=_DTYPES[dtype])
        b = fd.define_tensor([14, 5] if op == "matmul" else [5, 14], dtype=_DTYPES[dtype])
        out = getattr(fd.ops, op)(a, b)
        fd.add_output(out)
        out.outer_split(-1, 3)  # [i, i, i, r{3}, r{ceil(14 / 3)}]
        partial = out.rfactor([-1])
    assert out.definition is not None and type(out.definition).__name__ == "LoadStoreOp"
    assert out.definition.inputs[0] is partial
    assert type(partial.definition).__name__ == {"matmul": "MatmulOp", "linear": "LinearOp"}[op]
    assert len(partial.get_loop_domain()) == len(out.get_loop_domain()) == 5
    assert partial.axis(-2).is_reduction() and str(partial.axis(-2).extent) == "3"
    x = torch.randn(4, 14, 2, dtype=dtype).permute(0, 2, 1)  # [4, 2, 14], permuted
    w = torch.randn(14, 5 if op == "matmul" else 1, dtype=dtype).expand(14, 5)
    if op == "linear":
        w = w.t()
    (got,) = fd.execute([x, w])
    torch.testing.assert_close(got, getattr(torch.nn.functional, op)(x, w) if op == "linear" else x @ w)


def test_rfactor_of_a_linear_with_a_bias_is_refused() -> None:
    with FusionDefinition() as fd:
        x, w, b = fd.define_tensor([-1, 8]), fd.define_tensor([4, 8]), fd.define_tensor([4])
        out = fd.ops.linear(x, w, b)
        fd.add_output(out)
        out.outer_split(-1, 2)
        with pytest.raises(ValueError, match="T3 cannot be rfactored: it is a linear with a bias"):
            out.rfactor([-1])


def test_rfactor_errors() -> None:
    _, t1 = _sum()
    with pytest.raises(ValueError, match=r"T1: rfactor axis 0 \(iS2\{i0\}\) is not a reduction axis"):
        t1.rfactor([0])
    with pytest.raises(ValueError, match=r"rfactor of every reduction axis \(\[1\]\) leaves no final reduction"):
        t1.rfactor([1])
    with pytest.raises(ValueError, match="rfactor axis 5 is out of range"):
        t1.rfactor([5])
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        var, mean = fd.ops.var_mean(t0, [1])
        fd.add_output(var)
        fd.add_output(mean)
        var.split(1, 4)
        with pytest.raises(ValueError, match="T1 cannot be rfactored: only a sum / prod / max / min / mean reduction, a matmul"):
            var.rfactor([1])
        with pytest.raises(ValueError, match=r"T0 cannot be rfactored.*a fusion input"):
            t0.rfactor([0])


def test_grid_reduction_without_a_legal_final_step(device: str) -> None:
    """The reduction runs across programs but its producer is not computed per program (its axis is a
    serial loop): no program holds partial results of its own for a final step to combine."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1])
        e = fd.ops.exp(t0)
        t1 = fd.ops.sum(e, [0])
        fd.add_output(t1)
        t1.axis(0).parallelize(ParallelType.grid_x)
    with pytest.raises(KernelError, match=r"T2 axis 0 .* is a grid reduction, but its producer T1 does not iterate "
                                          "that axis on grid_x"):
        fd.manual_execute([torch.randn(1000, device=device)])
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        var, mean = fd.ops.var_mean(t0, [1])
        fd.add_output(var)
        fd.add_output(mean)
        var.axis(1).parallelize(ParallelType.grid_x)
    with pytest.raises(KernelError, match=r"T1 axis 1 .* reduces var_mean across programs \(grid_x\)"):
        fd.manual_execute([torch.randn(4, 8, device=device)])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and streams")
def test_cooperative_grid_reduction_in_a_cuda_graph_and_on_concurrent_streams() -> None:
    """A captured cooperative launch replays its grid synchronization (the counter is left usable);
    launches on two streams at once synchronize on counters of their own."""
    fd = _two_level_grid_sum()
    x = torch.randn(8 * 102_400 - 5, device="cuda")  # eight programs
    fd.manual_validate([x], [x.sum()])
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fd.manual_execute([x])  # warm-up on the capture's side stream
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        (captured,) = fd.manual_execute([x])
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.testing.assert_close(captured, x.sum(), rtol=1e-4, atol=1e-2)
    streams = [torch.cuda.Stream() for _ in range(2)]
    inputs = [torch.randn(8 * 102_400, device="cuda") + k for k in range(2)]
    torch.cuda.synchronize()
    before = kernel_sequence.cooperative_launches
    results = []
    for _ in range(5):
        for s, xi in zip(streams, inputs, strict=True):
            with torch.cuda.stream(s):
                results.append(fd.manual_execute([xi])[0])
    torch.cuda.synchronize()
    assert kernel_sequence.cooperative_launches - before == 10
    for k, r in enumerate(results):
        torch.testing.assert_close(r, inputs[k % 2].sum(), rtol=1e-4, atol=1e-2)


def test_independent_final_steps_share_one_synchronization(device: str, one_program_machine: None) -> None:
    """Two reductions across rows (layernorm backward's shape): their final steps read only the first
    step's partials, so the cooperative kernel synchronizes once and runs both after it; results
    match torch. One program per machine, so the interpreter runs it cooperatively too."""
    x = torch.randn(37, 96, device=device)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        y = fd.ops.sub(t0, fd.ops.sum(t0, [1], keepdim=True))
        fd.add_output(y)
        fd.add_output(fd.ops.sum(y, [0]))
        fd.add_output(fd.ops.sum(fd.ops.mul(t0, t0), [0]))
    before = kernel_sequence.cooperative_launches
    y, dy_sum, sq_sum = fd.execute([x], _enable_options=["triton_interpreter"] if device == "cpu" else [])
    assert kernel_sequence.cooperative_launches - before == 1
    ref = x - x.sum(1, keepdim=True)
    torch.testing.assert_close(y, ref)
    torch.testing.assert_close(dy_sum, ref.sum(0), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(sq_sum, (x * x).sum(0))
    joined = fd.last_kernel_code().split("# As one cooperative launch")[1]
    assert joined.count("\n    _grid_sync(counter, programs)\n") == 1 and "_step2(" in joined


@pytest.mark.parametrize(("cols", "cooperative"), [(96, True), (384, False)])
def test_cooperative_launch_only_within_two_rounds_of_later_programs(cols: int, cooperative: bool, device: str,
                                                                     one_program_machine: None) -> None:
    """The launch's programs take on the later steps' programs one after another: with more than
    ``COOPERATIVE_ROUNDS`` per program (two final steps of three programs each, on one program), the
    steps run as a launch each instead. Results match torch either way."""
    x = torch.randn(37, cols, device=device)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        y = fd.ops.sub(t0, fd.ops.sum(t0, [1], keepdim=True))
        fd.add_output(fd.ops.sum(y, [0]))
        fd.add_output(fd.ops.sum(fd.ops.mul(t0, t0), [0]))
    before = kernel_sequence.cooperative_launches
    y_sum, sq_sum = fd.execute([x], _enable_options=["triton_interpreter"] if device == "cpu" else [])
    assert kernel_sequence.cooperative_launches - before == (1 if cooperative else 0)
    torch.testing.assert_close(y_sum, (x - x.sum(1, keepdim=True)).sum(0), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(sq_sum, (x * x).sum(0))
    assert "_step2(" in fd.last_kernel_code()  # a partial step and two final steps
