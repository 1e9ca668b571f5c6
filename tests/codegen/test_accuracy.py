"""Reductions in generated kernels are as accurate as torch's: on float32 rows of std 1 centred and far
from 0 (mean 0, 1e2, 1e3, 1e4), pyfuser's largest error against float64 is within 2x of torch's on the same data
(or of half an ulp of the result), on every reduction path (a row on chip, a row read in a loop,
columns, a reduction across programs, an inner-outer kernel). The sweep and its report:
``benchmarks/accuracy.py``."""

from __future__ import annotations

import re

import pytest
import torch

from benchmarks.accuracy import OPS, floor, fusion, max_error
from pyfuser import DataType, FusionDefinition
from pyfuser.codegen.values import PLAIN_SUM_ELEMENTS, ValueLowering
from pyfuser.scheduler.registry import Machine
from tests.codegen.conftest import execute_with_kernels, kernel_segments

#: (op, rows, cols, the reduction shape its kernel takes on this machine: see reduction_schedule.py)
CASES = [
    ("layernorm", 3, 100, "tile"),
    ("layernorm", 2, 1531, "loop"),
    ("layernorm_sums", 2, 1500, "loop"),
    ("var_mean", 3, 77, "tile"),
    ("var_mean", 2, 1500, "loop"),
    ("var_mean_columns", 1500, 3, "outer"),
    ("var_mean_columns", 300, 5, "outer"),
    ("softmax", 2, 1500, "loop"),
    ("sum", 3, 1531, "loop"),
    ("sum", 2, 3000, "split"),
    ("sum_all", 1, 20000, "split"),
    ("row_and_column_sums", 1500, 24, "tile"),
    ("rmsnorm", 2, 1500, "loop"),
]


#: an H100's or H200's machine description (132 SMs): the schedules a GPU runs, in Triton's interpreter
GPU_MACHINE = Machine(132, 16384, 2048)

#: (op, rows, cols, the reduction shape its kernel takes on ``GPU_MACHINE``): rows on chip up to 16384,
#: columns summed in an inner-outer kernel's partials per program, then across them
GPU_CASES = [
    ("layernorm", 2, 1531, "tile"),
    ("layernorm_sums", 2, 1500, "tile"),
    ("var_mean", 2, 1500, "tile"),
    ("var_mean", 2, 20000, "loop"),
    ("layernorm", 2, 20000, "loop"),
    ("sum", 3, 1531, "tile"),
    ("sum", 2, 20000, "loop"),
    ("softmax", 2, 20001, "loop"),
    ("sum_all", 1, 200000, "split"),
    ("row_and_column_sums", 1500, 24, "tile"),
    ("rmsnorm", 2, 1500, "tile"),
]


def _check_error(op: str, rows: int, cols: int, shape: str, offset: float, device: str, run_kernels) -> None:
    x = (torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows * cols), dtype=torch.float64)
         + offset).float().to(device)
    ref = OPS[op].torch_fn(x.double())
    fd = fusion(OPS[op])
    got = run_kernels(fd, [x])
    if device == "cpu":  # the machine description this case is for
        assert kernel_segments(fd)[0].scheduler_params.shape == shape
    ours, torchs = max_error(got, ref), max_error(OPS[op].torch_fn(x), ref)
    assert ours <= 2 * max(torchs, floor(ref)), f"{op} {rows}x{cols} offset {offset:g}: pyfuser {ours:.3e}, " \
                                                f"torch {torchs:.3e}"


@pytest.mark.parametrize("offset", [0.0, 1e2, 1e3, 1e4])
@pytest.mark.parametrize(("op", "rows", "cols", "shape"), CASES)
def test_error_within_twice_torchs(op: str, rows: int, cols: int, shape: str, offset: float, device: str,
                                   run_kernels, request: pytest.FixtureRequest) -> None:
    if device == "cuda" and (op, rows, cols, offset) == ("var_mean", 3, 77, 0.0):
        # Known, open (strict: a fix shows as a failure, to remove this): on an H200 the on-chip var_mean of
        # these centred rows errs 1.418e-07 (1.19 ulp of the variance) against torch's 4.79e-08, just over twice
        # torch's or an ulp; with Triton's FMA contraction off (TRITON_DEFAULT_FP_FUSION=0) it matches torch's
        # error (kernels_notes.md).
        request.applymarker(pytest.mark.xfail(reason="on-chip var_mean of centred rows: 1.19 ulp on an H200",
                                              strict=True))
    _check_error(op, rows, cols, shape, offset, device, run_kernels)


@pytest.mark.parametrize("offset", [0.0, 1e2, 1e3, 1e4])
@pytest.mark.parametrize(("op", "rows", "cols", "shape"), GPU_CASES)
def test_error_within_twice_torchs_on_a_gpus_schedule(op: str, rows: int, cols: int, shape: str, offset: float,
                                                      device: str, run_kernels,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The schedules of an H100 or H200 (larger tiles, 132 programs' partial results), also on the CPU."""
    monkeypatch.setattr(Machine, "of", staticmethod(lambda _device: GPU_MACHINE))
    _check_error(op, rows, cols, shape, offset, device, run_kernels)


def test_var_mean_of_rows_with_inf_and_nan(device: str, run_kernels) -> None:
    """Rows that are not finite do not spill into others through the shifts and corrections: their
    variance is NaN, their mean NaN or the inf (torch's Welford gives either, by the inf's place)."""
    for cols in (40, 1500):  # on chip, in a loop
        x = torch.randn(4, cols, device=device) + 1e3
        x[0, 0], x[1, cols // 2], x[2, -1] = float("inf"), float("nan"), float("-inf")  # row 3 finite
        var, mean = run_kernels(fusion(OPS["var_mean"]), [x])
        want_var, want_mean = torch.var_mean(x, 1, correction=1)
        torch.testing.assert_close(var, want_var, equal_nan=True)
        torch.testing.assert_close(mean[3], want_mean[3])
        assert mean[1].isnan() and all(mean[k].isnan() or mean[k] == x[k].sum() for k in (0, 2)), mean


def test_sum_with_inf_in_a_loop(device: str, run_kernels) -> None:
    """The compensation of an infinite sum is dropped: inf stays inf (not NaN), inf - inf is NaN."""
    x = torch.randn(3, 1500, device=device)
    x[0, 5] = float("inf")
    x[1, 7], x[1, 900] = float("inf"), float("-inf")
    (got,) = run_kernels(fusion(OPS["sum"]), [x])
    torch.testing.assert_close(got, x.sum(1), equal_nan=True)


@pytest.fixture
def gpu_sums_in_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tile sums written as for a GPU (``ValueLowering.gpu_sums``), run by Triton's interpreter, which
    applies their combine functions to a whole axis one value after another: the order a GPU thread
    adds its share of a tile in (32 values of a row of 2048 on 2 warps), at its longest. On an H200,
    plain float32 adds in that order gave rmsnorm 2x1500 (offset 1e3) twice torch's error."""
    monkeypatch.setattr(Machine, "of", staticmethod(lambda _device: GPU_MACHINE))
    monkeypatch.setattr(ValueLowering, "gpu_sums", property(lambda self: True))


@pytest.mark.parametrize("cols", [100, 256, 257])
def test_float32_sums_of_a_few_values_a_thread_are_plain(cols: int, gpu_sums_in_the_interpreter: None) -> None:
    """A row tile sized at launch decides in the kernel, on its constexpr, between the plain sum (at most
    ``PLAIN_SUM_ELEMENTS`` values: a GPU thread adds at most 8, as torch's do) and the ``_two_sum``
    pairs; the interpreter runs the branch the tile takes, and both sum the rows."""
    x = torch.randn(3, cols, generator=torch.Generator().manual_seed(cols)) + 100.0
    fd = fusion(OPS["sum"])
    (got,) = execute_with_kernels(fd, [x])
    torch.testing.assert_close(got, x.sum(1))
    calls = [line for line in fd.last_kernel_code().splitlines() if "= _sum_keeping_lost(" in line]
    assert calls and all(f"<= {PLAIN_SUM_ELEMENTS}" in line for line in calls), calls


@pytest.mark.parametrize("offset", [1e2, 1e3, 1e4])
@pytest.mark.parametrize(("op", "rows", "cols"), [("rmsnorm", 2, 1500), ("layernorm_sums", 2, 1500), ("sum", 3, 1531)])
def test_float32_sums_on_chip_are_compensated_in_a_gpu_threads_order(op: str, rows: int, cols: int, offset: float,
                                                                      gpu_sums_in_the_interpreter: None) -> None:
    """Each add of a float32 tile sum keeps what its rounding lost (``_two_sum``): in any order the sum
    rounds about once, within torch's error (one value after another, plain adds are 7x torch's on
    rmsnorm at offset 1e3)."""
    x = (torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows * cols), dtype=torch.float64)
         + offset).float()
    ref = OPS[op].torch_fn(x.double())
    fd = fusion(OPS[op])
    got = execute_with_kernels(fd, [x])
    assert kernel_segments(fd)[0].scheduler_params.shape == "tile"
    assert "= _sum_keeping_lost(" in fd.last_kernel_code()
    ours, torchs = max_error(got, ref), max_error(OPS[op].torch_fn(x), ref)
    assert ours <= max(torchs, floor(ref)), f"{op} {rows}x{cols} offset {offset:g}: pyfuser {ours:.3e}, " \
                                            f"torch {torchs:.3e}"


def test_compensated_sums_of_rows_with_inf_and_nan(gpu_sums_in_the_interpreter: None) -> None:
    """The lost part of a sum that is not finite is NaN; the sum itself is the result: inf stays inf,
    inf - inf and NaN are NaN."""
    x = torch.randn(4, 1531)
    x[0, 5] = float("inf")
    x[1, 7], x[1, 900] = float("inf"), float("-inf")
    x[2, 3] = float("nan")
    (got,) = execute_with_kernels(fusion(OPS["sum"]), [x])
    torch.testing.assert_close(got, x.sum(1), equal_nan=True)


def test_half_precision_rows_keep_the_plain_sum(gpu_sums_in_the_interpreter: None) -> None:
    """Sums of bfloat16 data round far below a bfloat16 result's precision: their memory-bound kernels
    keep one add per value."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        wide = fd.ops.cast(x, DataType.Float)
        ms = fd.ops.mean(fd.ops.mul(wide, wide), [1], keepdim=True)
        fd.add_output(fd.ops.cast(fd.ops.mul(wide, fd.ops.rsqrt(fd.ops.add(ms, 1e-5))), DataType.BFloat16))
    data = torch.randn(2, 1500).bfloat16()
    (got,) = execute_with_kernels(fd, [data])
    assert "= _sum_keeping_lost(" not in fd.last_kernel_code() and ", _add)" in fd.last_kernel_code()
    wide = data.float()
    torch.testing.assert_close(got, (wide * torch.rsqrt(wide.square().mean(1, keepdim=True) + 1e-5)).bfloat16())


def _kahan(code: str) -> bool:
    """Whether a kernel adds in a loop with a compensation (what each add lost, kept apart)."""
    return re.search(r"(acc\d+) = \1 \+ \([\w.]+ - \(d\d+ - acc\d+\)\)", code) is not None


@pytest.mark.parametrize("offset", [0.0, 1e3])
@pytest.mark.parametrize(("rows", "cols", "axis"), [(3000, 40, 0), (5, 3001, 1), (20000, 3, 0)])
def test_sums_rounded_to_16_bits_add_plainly_within_torchs_error(rows: int, cols: int, axis: int, offset: float,
                                                                  device: str, run_kernels) -> None:
    """A bfloat16 sum or mean of bfloat16 data accumulated in a loop (columns, long rows, a split across
    programs) adds each value once, without the compensation: its float32 rounding stays far below the
    result's, as torch's does (``mark_rounded_sums``)."""
    x = (torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows), dtype=torch.float64)
         + offset).bfloat16().to(device)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        wide = fd.ops.cast(tx, DataType.Float)
        fd.add_output(fd.ops.cast(fd.ops.sum(wide, [axis]), DataType.BFloat16))
        fd.add_output(fd.ops.cast(fd.ops.mean(fd.ops.mul(wide, 0.5), [axis]), DataType.BFloat16))
    got = run_kernels(fd, [x])
    ref = [x.double().sum(axis), (x.double() * 0.5).mean(axis)]
    torchs = [x.sum(axis), (x * 0.5).mean(axis)]
    assert not _kahan(fd.last_kernel_code())
    for g, r, t in zip(got, ref, torchs, strict=True):
        assert g.dtype is torch.bfloat16
        ulp = float(r.abs().max()) * 2.0 ** -8  # a bfloat16 ulp of the largest result
        assert max_error([g], [r]) <= max(2 * max_error([t], [r]), ulp)


def test_sums_used_at_full_precision_keep_the_compensation(device: str, run_kernels) -> None:
    """A float32 sum of float32 data, a mean subtracted from its row (its error then counts against the
    spread, not the mean), or one less a constant (which may cancel it) keeps the compensation in a loop."""
    cols = 2 * Machine.of(torch.device(device)).max_persistent + 1  # a row read in a loop on this device
    x = (torch.randn(3, cols, dtype=torch.float64) + 1e3).float().to(device)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.sum(fd.from_pytorch(x), [1]))
    run_kernels(fd, [x])
    assert _kahan(fd.last_kernel_code())
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        mean = fd.ops.mean(tx, [1], keepdim=True)
        fd.add_output(fd.ops.cast(fd.ops.sub(tx, mean), DataType.BFloat16))
    (got,) = run_kernels(fd, [x])
    assert _kahan(fd.last_kernel_code())
    torch.testing.assert_close(got, (x.double() - x.double().mean(1, keepdim=True)).bfloat16(), rtol=2e-2, atol=2e-2)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.cast(fd.ops.sub(fd.ops.mean(fd.from_pytorch(x), [1]), 1e3), DataType.BFloat16))
    run_kernels(fd, [x])
    assert _kahan(fd.last_kernel_code())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("offset", [0.0, 1e3])
@pytest.mark.parametrize(("rows", "cols", "axis"), [(3000, 40, 0), (5, 3001, 1), (20000, 3, 0)])
def test_float32_sums_of_16_bit_values_add_plainly_within_torchs_error(rows: int, cols: int, axis: int, offset: float,
                                                                       dtype: torch.dtype, device: str,
                                                                       run_kernels) -> None:
    """16-bit floats widened to float32 carry 8 or 11 significant bits: a float32 accumulator adds most of
    them exactly, so their sums and means (columns, long rows, a split across programs), float32 results
    included and a mean subtracted from its row, add each value once, within twice torch's error on the
    device or a float32 ulp of the data's magnitude (``mark_rounded_sums``)."""
    x = (torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows), dtype=torch.float64)
         + offset).to(dtype).to(device)
    with FusionDefinition() as fd:
        wide = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        fd.add_output(fd.ops.sum(wide, [axis]))
        fd.add_output(fd.ops.sub(wide, fd.ops.mean(wide, [axis], keepdim=True)))
    got = run_kernels(fd, [x])
    assert not _kahan(fd.last_kernel_code())
    wide64 = x.double()
    refs = [wide64.sum(axis), wide64 - wide64.mean(axis, keepdim=True)]
    wide32 = x.float()
    torchs = [wide32.sum(axis), wide32 - wide32.mean(axis, keepdim=True)]
    ulp = float(wide64.abs().sum(axis).max()) * 2.0 ** -24  # a float32 ulp of the largest magnitude summed
    for g, r, t in zip(got, refs, torchs, strict=True):
        assert g.dtype is torch.float32
        assert max_error([g], [r]) <= max(2 * max_error([t], [r]), ulp)


@pytest.mark.parametrize("offset", [0.0, 1e3])
def test_a_float32_mean_of_compensated_sums_is_the_rounded_quotient(offset: float, device: str, run_kernels) -> None:
    """A float32 mean of rows read in a loop (a compensated float64 sum per row) multiplies by the
    count's reciprocal, computed once in float64, where each thread holding a row's sum divided it:
    within an ulp of float64's mean, as the quotient was, or twice torch's own error on the device. Where
    the rows are split across programs (few rows on a GPU), each program's float32 partial sum rounds once
    and a mean near 0 cancels them (an H200: 1.03 ulps of a mean of 0.002): there the bound is that of
    sums rounded once each, 2**-24 of the sum of the row's magnitudes, over the count."""
    cols = 2 * Machine.of(torch.device(device)).max_persistent + 3
    x = (torch.randn(5, cols, generator=torch.Generator().manual_seed(cols), dtype=torch.float64) + offset).float()
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.mean(fd.from_pytorch(x.to(device)), [1]))
    (got,) = run_kernels(fd, [x.to(device)])
    code = fd.last_kernel_code()
    assert _kahan(code) and code.count("tl.full([], 1.0, tl.float64) / (") == 1, code
    exact = x.double().mean(1)
    ulp = exact.float().abs().double() * 2.0 ** -23
    torchs = (x.to(device).mean(1).cpu().double() - exact).abs()
    bound = torch.maximum(ulp, 2 * torchs)
    if "_partial0" in code:  # split across programs: float32 partial sums, each rounded once
        bound = torch.maximum(bound, 2.0 ** -24 * x.double().abs().sum(1) / cols)
    assert ((got.cpu().double() - exact).abs() <= bound).all()
