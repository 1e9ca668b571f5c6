"""Rows read in a loop compute ``max(y)`` and ``sum(exp(y - max(y)))`` in one pass (an online softmax:
each lane's sum kept relative to its running max, rescaled when the max grows), together with the
other reductions of that pass (cross-entropy's picked logit): softmax and log-softmax read the row
twice and write it once, log-sum-exp and cross-entropy read it once. Values as torch's, also for rows
of -inf, +inf and NaN, and as accurate against float64."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyfuser import DataType, FusionDefinition, schedule
from pyfuser.codegen.values import ValueLowering
from pyfuser.ir.analysis.online_softmax import softmax_shift
from pyfuser.ir.ops import ReductionOp, ReductionOpType
from pyfuser.ir.tensor_view import TensorView
from pyfuser.scheduler import inner_persistent
from pyfuser.scheduler.registry import Machine, SchedulerType, SizeHints
from tests.codegen.conftest import execute_with_aten, execute_with_kernels, kernel_segments

#: Rows this wide are read in a loop on the interpreter's machine (``Machine.of``: rows on chip up to
#: 1024, few rows split across programs from 2049 columns); odd widths, so the last step is partial.
LOOPED = (1031, 2011)

Define = Callable[[FusionDefinition, torch.dtype], None]


def _input(fd: FusionDefinition, dtype: torch.dtype) -> TensorView:
    x = fd.define_tensor([-1, -1], dtype=DataType.from_torch(dtype))
    return fd.ops.cast(x, DataType.Float) if dtype is not torch.float32 else x


def _out(fd: FusionDefinition, tv: TensorView, dtype: torch.dtype) -> None:
    fd.add_output(fd.ops.cast(tv, DataType.from_torch(dtype)) if dtype is not torch.float32 else tv)


def _softmax(fd: FusionDefinition, dtype: torch.dtype) -> None:
    x = _input(fd, dtype)
    e = fd.ops.exp(fd.ops.sub(x, fd.ops.max(x, [1], keepdim=True)))
    _out(fd, fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)), dtype)


def _log_softmax(fd: FusionDefinition, dtype: torch.dtype) -> None:
    x = _input(fd, dtype)
    shifted = fd.ops.sub(x, fd.ops.max(x, [1], keepdim=True))
    _out(fd, fd.ops.sub(shifted, fd.ops.log(fd.ops.sum(fd.ops.exp(shifted), [1], keepdim=True))), dtype)


def _logsumexp(fd: FusionDefinition, dtype: torch.dtype) -> None:
    x = _input(fd, dtype)
    m = fd.ops.max(x, [1])
    s = fd.ops.sum(fd.ops.exp(fd.ops.sub(x, fd.ops.broadcast_in_dim(m, [x.shape()[0], 1], [0]))), [1])
    fd.add_output(fd.ops.add(fd.ops.log(s), m))


def _cross_entropy(fd: FusionDefinition, dtype: torch.dtype) -> None:
    """Per-row loss and its mean, as ``F.cross_entropy`` of fp32 logits (the target's logit picked by
    ``iota == target``)."""
    x = _input(fd, dtype)
    target = fd.define_tensor([-1], dtype=DataType.Int)
    m = fd.ops.max(x, [1], keepdim=True)
    lse = fd.ops.add(fd.ops.log(fd.ops.sum(fd.ops.exp(fd.ops.sub(x, m)), [1], keepdim=True)), m)
    columns = fd.ops.broadcast(fd.ops.iota(x.shape()[1], 0, 1, DataType.Int), [True, False])
    hot = fd.ops.eq(columns, fd.ops.broadcast(target, [False, True]))
    loss = fd.ops.sub(lse, fd.ops.sum(fd.ops.where(hot, x, 0.0), [1], keepdim=True))
    fd.add_output(loss)
    fd.add_output(fd.ops.mean(loss))


def _torch_cross_entropy(x: torch.Tensor, target: torch.Tensor) -> list[torch.Tensor]:
    loss = torch.nn.functional.cross_entropy(x.float(), target, reduction="none")
    return [loss[:, None], loss.mean()]


#: name -> (definition, torch's result, the kernel's loops over the row: one pass for the reductions
#: plus one for a per-element output)
FAMILIES: dict[str, tuple[Define, Callable[..., list[torch.Tensor]], int]] = {
    "softmax": (_softmax, lambda x: [torch.softmax(x.float(), 1).to(x.dtype)], 2),
    "log_softmax": (_log_softmax, lambda x: [torch.log_softmax(x.float(), 1).to(x.dtype)], 2),
    "logsumexp": (_logsumexp, lambda x: [torch.logsumexp(x.float(), 1)], 1),
    "cross_entropy": (_cross_entropy, _torch_cross_entropy, 1),
}


def _fusion(name: str, dtype: torch.dtype) -> FusionDefinition:
    with FusionDefinition() as fd:
        FAMILIES[name][0](fd, dtype)
    return fd


def _inputs(name: str, x: torch.Tensor) -> list[torch.Tensor]:
    if name == "cross_entropy":
        return [x, torch.randint(0, x.shape[1], (x.shape[0],), device=x.device)]
    return [x]


#: layout -> the reduction shape its kernel takes (reduction_schedule.py)
LAYOUTS = {"contiguous": "loop", "strided": "loop", "transposed": "outer"}


def _rows(rows: int, cols: int, dtype: torch.dtype, device: str, layout: str = "contiguous") -> torch.Tensor:
    if layout == "strided":  # every other row of a wider tensor, from its 8th column
        return torch.randn(2 * rows, cols + 7, device=device).to(dtype)[::2, 7:]
    if layout == "transposed":  # the view of a [cols, rows] tensor: the row's elements far apart in memory
        return torch.randn(cols, rows, device=device).to(dtype).t()
    return torch.randn(rows, cols, device=device).to(dtype)


def _normalization_kernel_code(fd: FusionDefinition) -> str:
    """The source of the latest execution's normalization kernel (the first kernel)."""
    code = fd.last_kernel_code()
    start = re.search(r"def \w*persistent_\w*kernel\(", code).start()
    end = code.find("\ndef ", start + 1)
    return code[start:end if end >= 0 else len(code)]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("cols", LOOPED)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_looped_rows_match_torch_in_one_pass(name: str, dtype: torch.dtype, cols: int, layout: str, device: str,
                                             run_kernels) -> None:
    fd = _fusion(name, dtype)
    inputs = _inputs(name, _rows(3, cols, dtype, device, layout))
    got = run_kernels(fd, inputs)
    if device == "cpu":  # the interpreter's schedule loops (a GPU's holds these rows on chip, or splits
        # them): max and sum of exp share the first loop
        assert kernel_segments(fd)[0].scheduler_params.shape == LAYOUTS[layout]
        assert _normalization_kernel_code(fd).count(" for ") == FAMILIES[name][2]
    want = FAMILIES[name][1](*inputs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w.to(g.dtype), atol=1e-5 if dtype is torch.float32 else None,
                                   rtol=1e-5 if dtype is torch.float32 else None)
    for g, a in zip(got, execute_with_aten(fd, inputs), strict=True):
        torch.testing.assert_close(g, a)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_gpus_schedule_in_the_interpreter(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel an H100 or H200 runs (132 SMs: rows of 20001 in loop steps of 8192, tile sums written
    as a GPU thread adds), through Triton's interpreter."""
    monkeypatch.setattr(Machine, "of", staticmethod(lambda _device: Machine(132, 16384, 2048)))
    monkeypatch.setattr(ValueLowering, "gpu_sums", property(lambda self: True))
    fd = _fusion(name, torch.bfloat16)
    inputs = _inputs(name, _rows(2, 20001, torch.bfloat16, "cpu"))
    got = execute_with_kernels(fd, inputs)
    assert kernel_segments(fd)[0].scheduler_params.shape == "loop"
    code = _normalization_kernel_code(fd)
    assert code.count(" for ") == FAMILIES[name][2]
    # the statistics pass keeps a max and a sum per lane (and cross-entropy's picked logit), no Kahan term
    assert code[:code.index(" for ")].count("= tl.full(") == (3 if name == "cross_entropy" else 2)
    for g, w in zip(got, FAMILIES[name][1](*inputs), strict=True):
        torch.testing.assert_close(g, w.to(g.dtype))


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "logsumexp"])
def test_rows_with_inf_and_nan(name: str, device: str, run_kernels) -> None:
    """-inf before the first finite value of a lane (a masked attention row's start), only -inf (a fully
    masked row: NaN, as torch's softmax gives), -inf at the end, a +inf, a NaN: each row as the fusion's
    ATen evaluation gives it, the finite rows beside them unchanged."""
    cols = 1500
    x = torch.randn(7, cols, device=device)
    x[0, :700] = float("-inf")
    x[1] = float("-inf")
    x[2, 1200:] = float("-inf")
    x[3, 40] = float("inf")
    x[4, 1499] = float("nan")
    x[5, ::3] = float("-inf")
    fd = _fusion(name, torch.float32)
    (got,) = run_kernels(fd, [x])
    (want,) = execute_with_aten(fd, [x])
    torch.testing.assert_close(got, want, equal_nan=True)
    if name != "logsumexp":  # torch's own logsumexp gives -inf for a row of -inf; the fusion NaN
        torch.testing.assert_close(got, FAMILIES[name][1](x)[0], equal_nan=True)
    assert got[1].isnan().all() and not got[[0, 2, 5, 6]].isnan().any()


@pytest.mark.parametrize("offset", [0.0, 1e2, 1e4])
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "logsumexp"])
def test_error_against_float64_within_twice_torchs(name: str, offset: float, device: str, run_kernels) -> None:
    """Rows growing along the row (the running max rescales the sums at most steps) and far from 0."""
    x = (torch.randn(3, 2011, dtype=torch.float64) + offset + torch.linspace(0, 20, 2011, dtype=torch.float64))
    x = x.float().to(device)
    torch_fn = FAMILIES[name][1]
    ref = torch_fn(x.double())[0]
    fd = _fusion(name, torch.float32)
    (got,) = run_kernels(fd, [x])
    assert device != "cpu" or kernel_segments(fd)[0].scheduler_params.shape == "loop"  # a GPU holds 2011 on chip
    ours, torchs = float((got.double() - ref).abs().max()), float((torch_fn(x)[0].double() - ref).abs().max())
    assert ours <= 2 * max(torchs, 1e-7 * float(ref.abs().max())), (ours, torchs)


def test_an_output_of_the_shifted_exponentials_is_not_lane_relative(device: str, run_kernels) -> None:
    """``exp(x - max)`` as an output of its own beside the softmax: stored from the row's max, never from
    the lane's running max the pass computes the sum with."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        e = fd.ops.exp(fd.ops.sub(x, fd.ops.max(x, [1], keepdim=True)))
        fd.add_output(e)
        fd.add_output(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)))
    x = torch.randn(3, 1500, device=device) + torch.linspace(0, 10, 1500, device=device)
    e, p = run_kernels(fd, [x])
    torch.testing.assert_close(e, torch.exp(x - x.amax(1, keepdim=True)))
    torch.testing.assert_close(p, torch.softmax(x, 1))


def test_rows_of_one_column_no_rows_and_empty_rows(device: str, run_kernels) -> None:
    """Rows of one element stay on chip; no rows of a looped width give empty results; rows of no
    element have no max (ATen's amax raises too): a clear error, not a kernel's -inf."""
    with pytest.raises(ValueError, match="axis 1 has size 0; the max of an empty axis is undefined"):
        run_kernels(_fusion("softmax", torch.float32), [torch.randn(3, 0, device=device)])
    for shape in ((5, 1), (0, 3001)):
        x = torch.randn(*shape, device=device)
        for name in ("softmax", "logsumexp"):
            got = run_kernels(_fusion(name, torch.float32), [x]) if shape[0] else \
                _fusion(name, torch.float32).execute([x], _enable_options=["triton_interpreter"])
            torch.testing.assert_close(got[0], FAMILIES[name][1](x)[0])


@settings(max_examples=10, deadline=None)
@given(cols=st.integers(1025, 2048), masked=st.integers(0, 2048), rows=st.integers(1, 3),
       special=st.sampled_from([None, float("inf"), float("nan"), float("-inf")]), at=st.integers(0, 2047))
def test_softmax_of_masked_rows_matches_torch(cols: int, masked: int, rows: int, special: float | None,
                                              at: int) -> None:
    """Any looped width, any number of leading -inf (all of the row: NaN as torch's), and a value that is
    not finite anywhere in the last row."""
    x = torch.randn(rows, cols) * 10
    x[:, :masked] = float("-inf")
    if special is not None:
        x[-1, at % cols] = special
    fd = _fusion("softmax", torch.float32)
    (got,) = fd.execute([x], _enable_options=["triton_interpreter"])
    torch.testing.assert_close(got, torch.softmax(x, 1), equal_nan=True)


def _reductions(fd: FusionDefinition) -> dict[ReductionOpType, ReductionOp]:
    return {e.kind: e for e in fd.fusion.exprs() if isinstance(e, ReductionOp)}


@pytest.mark.parametrize("online", [True, False])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_the_schedule_puts_the_sum_in_the_max_pass(name: str, online: bool) -> None:
    """``ReductionParams.online`` (on by default; ``kernels.py --sweep`` turns it off): on, the schedule
    marks the sum of ``exp(y - max)`` for its max's pass, and the statistics take one loop over the row;
    off, one loop each. torch's values either way."""
    fd = _fusion(name, torch.float32)
    inputs = _inputs(name, _rows(3, 2011, torch.float32, "cpu"))
    params = schedule.compute_heuristics(fd.fusion, SchedulerType.inner_persistent, inputs)
    assert params.shape == "loop" and params.online
    params = replace(params, online=online)
    schedule.schedule(fd.fusion, SchedulerType.inner_persistent, params)
    found = _reductions(fd)
    assert found[ReductionOpType.sum].online_max is (found[ReductionOpType.max] if online else None)
    got = fd.manual_execute(inputs, params)
    code = fd.last_kernel_code()
    loops = code[code.index("def manual_kernel"):].count(" for ")
    assert loops == FAMILIES[name][2] + (0 if online else 1)
    for g, w in zip(got, FAMILIES[name][1](*inputs), strict=True):
        torch.testing.assert_close(g, w.to(g.dtype).reshape(g.shape), atol=1e-5, rtol=1e-5)


def _row_losses(fd: FusionDefinition, dtype: torch.dtype) -> None:
    """Cross-entropy per row of 131072 logits (one segment: no mean, no size read from the input)."""
    x = _input(fd, dtype)
    target = fd.define_tensor([-1], dtype=DataType.Int)
    m = fd.ops.max(x, [1], keepdim=True)
    lse = fd.ops.add(fd.ops.log(fd.ops.sum(fd.ops.exp(fd.ops.sub(x, m)), [1], keepdim=True)), m)
    hot = fd.ops.eq(fd.ops.broadcast(fd.ops.iota(131072, 0, 1, DataType.Int), [True, False]),
                    fd.ops.broadcast(target, [False, True]))
    fd.add_output(fd.ops.sub(lse, fd.ops.sum(fd.ops.where(hot, x, 0.0), [1], keepdim=True)))


@pytest.mark.parametrize(("define", "dtype", "rows", "step", "warps"), [
    (_softmax, torch.bfloat16, 512, 8192, 16), (_softmax, torch.float32, 512, 4096, 16),
    (_softmax, torch.bfloat16, 200, 8192, 16), (_row_losses, torch.bfloat16, 512, 4096, 16),
    (_row_losses, torch.bfloat16, 128, 4096, 16), (_row_losses, torch.float32, 128, 4096, 16),
    (_row_losses, torch.float32, 512, 2048, 16)])
def test_a_looped_row_loads_vectors_per_thread_per_step(define: Define, dtype: torch.dtype, rows: int, step: int,
                                                        warps: int) -> None:
    """On a GPU (132 SMs), rows wider than a tile loop on 16 warps in steps of two 16-byte loads per thread
    where the pass carries at most two running results (softmax's max and sum, over 200 or 512 rows), or
    more over float32 rows fewer than two programs an SM (a cross-entropy of 128 rows), else one
    (cross-entropy's max, sum and picked logit over 512 rows, or over 128 rows of bf16), by the row's
    element size (a cross-entropy's int64 targets, one per row, do not count)."""
    with FusionDefinition() as fd:
        define(fd, dtype)
    params = inner_persistent.compute_heuristics(fd.fusion, SizeHints(131072, rows, Machine(132, 16384, 2048)))
    assert (params.shape, params.tile, params.num_warps, params.online) == ("loop", step, warps, True)
    assert f"loop step: {step}, online softmax: True" in str(params)


@pytest.mark.parametrize(("rows", "step", "warps"), [(1024, 8192, 8), (264, 8192, 8), (263, 16384, 16), (128, 16384, 16)])
def test_a_looped_single_sum_widens_its_step_for_few_rows(rows: int, step: int, warps: int) -> None:
    """An RMS norm's looped pass (one running sum) takes 32 elements a thread on 8 warps, on 16 for fewer
    rows than two programs an SM (more loads in flight per program where programs are few)."""
    with FusionDefinition() as fd:
        _rms_norm(fd, torch.bfloat16)
    params = inner_persistent.compute_heuristics(fd.fusion, SizeHints(131072, rows, Machine(132, 16384, 2048)))
    assert (params.shape, params.tile, params.num_warps) == ("loop", step, warps), params


def _layer_norm(fd: FusionDefinition, dtype: torch.dtype) -> None:
    x = _input(fd, dtype)
    var, mean = fd.ops.var_mean(x, [1], correction=0, keepdim=True)
    _out(fd, fd.ops.mul(fd.ops.sub(x, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5))), dtype)


def _rms_norm(fd: FusionDefinition, dtype: torch.dtype) -> None:
    x = _input(fd, dtype)
    _out(fd, fd.ops.mul(x, fd.ops.rsqrt(fd.ops.add(fd.ops.mean(fd.ops.mul(x, x), [1], keepdim=True), 1e-6))), dtype)


@pytest.mark.parametrize(("define", "dtype", "rows", "shape", "step", "warps"), [
    (_layer_norm, torch.bfloat16, 1024, "loop", 2048, 16), (_layer_norm, torch.float32, 1024, "loop", 2048, 16),
    (_layer_norm, torch.bfloat16, 128, "loop", 8192, 16),
    (_rms_norm, torch.bfloat16, 1024, "loop", 8192, 8), (_rms_norm, torch.float32, 256, "loop", 16384, 16),
    (_rms_norm, torch.bfloat16, 66, "loop", 16384, 16), (_rms_norm, torch.bfloat16, 65, "split", None, None)])
def test_a_looped_norm_steps_by_what_its_pass_carries(define: Define, dtype: torch.dtype, rows: int, shape: str,
                                                      step: int | None, warps: int | None) -> None:
    """On a GPU (132 SMs), a pass carrying a var_mean (Welford's four running values and a division an
    element) over a row for every SM steps 4 elements a lane on 16 warps (fewer rows: two 16-byte loads a
    lane); one carrying a single sum (an RMS norm's) 32 elements a lane on 8 warps, whatever the element
    size, on 16 for fewer rows than two programs an SM; any normalization splits its rows across programs
    only for fewer rows than half the SMs (66 rows: one program a row)."""
    with FusionDefinition() as fd:
        define(fd, dtype)
    params = inner_persistent.compute_heuristics(fd.fusion, SizeHints(131072, rows, Machine(132, 16384, 2048)))
    assert params.shape == shape, params
    if step is not None:
        assert (params.tile, params.num_warps) == (step, warps), params


def test_the_shift_is_recognized_in_the_ir() -> None:
    """The sum of ``exp(y - max(y))`` over the max's axes is found from the IR, whichever ops make ``y``."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.ops.where(fd.ops.gt(x, 0.5), fd.ops.mul(x, 0.125), float("-inf"))  # scaled and masked scores
        m = fd.ops.max(y, [1], keepdim=True)
        fd.add_output(fd.ops.sum(fd.ops.exp(fd.ops.sub(y, m)), [1]))
    found = _reductions(fd)
    assert softmax_shift(found[ReductionOpType.sum]) is found[ReductionOpType.max]


@pytest.mark.parametrize("case", ["other_tensor", "other_axis", "bf16_shift", "transposed_max", "plus"])
def test_what_is_not_a_softmax_shift(case: str) -> None:
    """Not the pattern: the max of another tensor, a sum over the kept axis, a shift rounded to bfloat16
    (a lane's max would round differently), the row's max read along columns, ``y + max``."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1] if case != "transposed_max" else [4, 4])
        z = fd.define_tensor([-1, -1] if case != "transposed_max" else [4, 4])
        y = fd.ops.cast(x, DataType.BFloat16) if case == "bf16_shift" else x
        if case == "transposed_max":
            b = fd.ops.broadcast(fd.ops.max(y, [1]), [True, False])
        else:
            b = fd.ops.max(z if case == "other_tensor" else y, [1], keepdim=True)
        d = fd.ops.add(y, b) if case == "plus" else fd.ops.sub(y, b)
        fd.add_output(fd.ops.sum(fd.ops.exp(d), [0 if case == "other_axis" else 1]))
    assert softmax_shift(_reductions(fd)[ReductionOpType.sum]) is None
