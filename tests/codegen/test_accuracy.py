"""Reductions in generated kernels are as accurate as torch's: on float32 rows of std 1 far from 0
(mean 1e2, 1e3, 1e4), pyfuser's largest error against float64 is within 2x of torch's on the same data
(or of half an ulp of the result), on every reduction path (a row on chip, a row read in a loop,
columns, a reduction across programs, an inner-outer kernel). The sweep and its report:
``benchmarks/accuracy.py``."""

from __future__ import annotations

import pytest
import torch

from benchmarks.accuracy import OPS, floor, fusion, max_error
from pyfuser.scheduler.registry import Machine
from tests.codegen.conftest import kernel_segments

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
    ("sum", 3, 1531, "tile"),
    ("sum", 2, 20000, "loop"),
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


@pytest.mark.parametrize("offset", [1e2, 1e3, 1e4])
@pytest.mark.parametrize(("op", "rows", "cols", "shape"), CASES)
def test_error_within_twice_torchs(op: str, rows: int, cols: int, shape: str, offset: float, device: str,
                                   run_kernels) -> None:
    _check_error(op, rows, cols, shape, offset, device, run_kernels)


@pytest.mark.parametrize("offset", [1e2, 1e3, 1e4])
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
    """Kahan's compensation of an infinite sum is dropped: inf stays inf (not NaN), inf - inf is NaN."""
    x = torch.randn(3, 1500, device=device)
    x[0, 5] = float("inf")
    x[1, 7], x[1, 900] = float("inf"), float("-inf")
    (got,) = run_kernels(fusion(OPS["sum"]), [x])
    torch.testing.assert_close(got, x.sum(1), equal_nan=True)
