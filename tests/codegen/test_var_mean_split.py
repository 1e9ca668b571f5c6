"""var_mean split across programs (a grid reduction): each program's Welford partial results (its mean, sum
of squared deviations and count), combined by a second launch. Outer reductions (channels-last batch-norm
statistics: N*H*W rows of C channels) and few long rows, scheduled automatically and by hand (splits that
leave programs empty), through the generated kernels (Triton's interpreter on CPU) against torch in float64,
and the rfactored fusion's ATen evaluation."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from pyfuser import DataType, FusionDefinition, ParallelType, schedule
from pyfuser.codegen.kernel_source import KernelError
from pyfuser.codegen.values import L2Hint
from pyfuser.ir.ops.rfactor import WelfordCombineOp, WelfordPartialOp, rfactor_var_mean
from pyfuser.schedule import SchedulerType
from pyfuser.scheduler import inner_persistent, reduction
from pyfuser.scheduler.reduction_schedule import OuterHeuristic, outer_heuristic
from pyfuser.scheduler.registry import Machine, SizeHints
from tests.codegen.conftest import execute_with_kernels, kernel_segments


def _var_mean(x: torch.Tensor, dims: list[int], correction: int = 0, cast: bool = True) -> FusionDefinition:
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        var, mean = fd.ops.var_mean(fd.ops.cast(t, DataType.Float) if cast else t, dims, correction=correction)
        fd.add_output(mean)
        fd.add_output(var)
    return fd


def _close(got: list[torch.Tensor], x: torch.Tensor, dims: list[int], correction: int = 0,
           rtol: float = 1e-5, atol: float = 1e-5) -> None:
    ref_var, ref_mean = torch.var_mean(x.double(), dims, correction=correction)
    mean, var = got
    torch.testing.assert_close(mean.double(), ref_mean, rtol=rtol, atol=atol)
    torch.testing.assert_close(var.double(), ref_var, rtol=rtol, atol=atol)


def _split_params(fd: FusionDefinition) -> Any:
    (segment,) = kernel_segments(fd)
    return segment.scheduler_params


#: Loop steps of 256 bytes: the interpreter combines a step's lanes one pair at a time (Python calls), so
#: the automatic schedules run on small steps (many of them, and splits of every program count).
SMALL_STEPS = OuterHeuristic(step_bytes=256, welford_step_elements=64, small_welford_step_elements=64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(4, 5, 24, 24), (1, 3, 37, 41), (1300, 7, 1, 1)],
                         ids=["4x5x24x24", "N=1", "H=W=1"])
def test_channels_last_batchnorm_statistics_split_across_programs(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """Fewer column blocks of channels than the interpreter's programs: the N*H*W rows are split across
    programs, one var_mean segment, means far from 0 (the combine must keep the spread)."""
    x = (torch.randn(*shape) * 3 + 100).to(dtype).contiguous(memory_format=torch.channels_last)
    fd = _var_mean(x, [0, 2, 3])
    with outer_heuristic(SMALL_STEPS):
        _close(execute_with_kernels(fd, [x]), x, [0, 2, 3], rtol=1e-6, atol=1e-4)
    params = _split_params(fd)
    assert params.shape == "outer" and params.split >= 2, params


def test_split_var_mean_of_data_far_from_zero() -> None:
    """Mean 1e4, spread 1: the programs' partial means differ by little next to their size; the combine
    takes their differences in float64 (a float32 sum of squares would lose the variance)."""
    x = torch.randn(9000, 3, dtype=torch.float64).add(1e4).float()
    fd = _var_mean(x, [0], cast=False)
    with outer_heuristic(SMALL_STEPS):
        _close(execute_with_kernels(fd, [x]), x, [0], rtol=1e-5, atol=1e-3)
    assert _split_params(fd).split >= 2


@pytest.mark.parametrize("correction", [0, 1])
def test_few_long_rows_split_var_mean(correction: int) -> None:
    """Three rows of 10000 (fewer rows than programs): each row split across programs (the split shape);
    an unbiased variance is corrected once, after the combine."""
    x = torch.randn(3, 10000) * 5 - 20
    fd = _var_mean(x, [1], correction)
    _close(execute_with_kernels(fd, [x]), x, [1], correction)
    params = _split_params(fd)
    assert params.shape == "split" and params.split >= 2, params


@pytest.mark.parametrize(("shape", "dim", "params"), [
    ((1000, 40), 0, {"shape": "outer", "tile": 16, "tile_reduced": 8, "split": 3}),
    ((40, 33), 0, {"shape": "outer", "tile": 16, "tile_reduced": 8, "split": 8}),  # 5 steps: 3 programs empty
    ((37, 13), 0, {"shape": "outer", "tile": 8, "tile_reduced": 64, "split": 2}),  # a step longer than the rows
    ((3, 1000), 1, {"shape": "split", "tile": 64, "split": 5}),
    ((2, 130), 1, {"shape": "split", "tile": 64, "split": 4}),  # 3 steps: a program of each row empty
], ids=["outer", "outer-empty-programs", "outer-one-step", "rows", "rows-empty-programs"])
def test_hand_split_var_mean(shape: tuple[int, int], dim: int, params: dict[str, object]) -> None:
    """Splits no extent divides, some leaving programs without rows (count 0: no part in the combine)."""
    x = torch.randn(shape) * 2 + 7
    with FusionDefinition() as fd:
        var, mean = fd.ops.var_mean(fd.from_pytorch(x), [dim], correction=1)
        fd.add_output(mean)
        fd.add_output(var)
        base = schedule.compute_heuristics(fd.fusion, SchedulerType.reduction, [x])
        chosen = dataclasses.replace(base, **params)  # type: ignore[arg-type]
        schedule.schedule(fd.fusion, SchedulerType.reduction, chosen)
    _close(fd.manual_execute([x], chosen), x, [dim], 1)


def test_rfactored_var_mean_ir_and_aten_evaluation() -> None:
    """``rfactor_var_mean`` by hand: the partial step (mean, sum of squares, count over each program's
    share) and the combine in the IR, and the rfactored fusion evaluated by ATen as by the kernels."""
    x = torch.randn(5, 3, 11) + 3
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        var, mean = fd.ops.var_mean(t0, [0, 2], correction=0)
        fd.add_output(mean)
        fd.add_output(var)
        for tv in (var, mean):
            tv.reorder({1: 0})  # [i1, r0, r2]
            tv.merge(1)  # [i1, r0*r2]
            tv.split(1, 7)  # [i1, r/7, r7]
        partials = rfactor_var_mean(var, [2])
        for tv in (var, mean, *partials):
            tv.axis(0).parallelize(ParallelType.grid_x)
            tv.axis(1).parallelize(ParallelType.grid_y)
        for tv in partials:
            tv.axis(2).parallelize(ParallelType.block_x)
    assert isinstance(partials[0].definition, WelfordPartialOp) and isinstance(var.definition, WelfordCombineOp)
    assert [p.dtype for p in partials] == [DataType.Float, DataType.Float, DataType.Double]
    text = str(fd.fusion)
    assert "rfactor" in text and "welford combine" in text
    _close(fd.execute([x]), x, [0, 2])
    _close(fd.manual_execute([x]), x, [0, 2])


def test_rfactor_var_mean_errors() -> None:
    x = torch.randn(6, 4)
    with FusionDefinition() as fd:
        var, mean = fd.ops.var_mean(fd.from_pytorch(x), [0], correction=0)
        fd.add_output(mean)
        fd.add_output(var)
    with pytest.raises(ValueError, match="is not the variance of a var_mean"):
        rfactor_var_mean(mean, [0])
    var.split(0, 2)
    with pytest.raises(ValueError, match="is not scheduled like"):
        rfactor_var_mean(var, [1])
    mean.split(0, 2)
    with pytest.raises(ValueError, match="leaves no final reduction"):
        rfactor_var_mean(var, [0, 1])
    # a grid var_mean with nothing reduced within a program: no partial results to combine
    for tv in (var, mean):
        tv.axis(0).parallelize(ParallelType.grid_x)
        tv.axis(1).parallelize(ParallelType.grid_y)
    with pytest.raises(KernelError, match="with no axis reduced within a program"):
        fd.manual_execute([x])


@pytest.mark.parametrize(("rows", "cols", "dtype"), [(1, 3001, torch.float32), (3, 2500, torch.bfloat16),
                                                     (2, 4097, torch.float32)])
def test_layer_norm_of_few_long_rows_splits_its_var_mean(rows: int, cols: int, dtype: torch.dtype,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer norm over fewer rows than half the SMs: each row's var_mean split across programs
    (Welford's partial results, combined in float64 by the launch that normalizes the program's share of
    the row), on data far from 0; within twice torch's error against float64. (A machine of 16 SMs with
    the interpreter's small tiles: the rows split as a handful do on an H200.)"""
    monkeypatch.setattr(Machine, "of", staticmethod(lambda _device: Machine(16, 1024, 128)))
    x = (torch.randn(rows, cols, dtype=torch.float64) * 2 + 1e3).to(dtype)
    w, b = torch.randn(cols).to(dtype), torch.randn(cols).to(dtype)
    with FusionDefinition() as fd:
        tx, tw, tb = (fd.ops.cast(fd.from_pytorch(t), DataType.Float) for t in (x, w, b))
        var, mean = fd.ops.var_mean(tx, [1], correction=0, keepdim=True)
        y = fd.ops.mul(fd.ops.sub(tx, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
        y = fd.ops.add(fd.ops.mul(y, fd.ops.broadcast(tw, [True, False])), fd.ops.broadcast(tb, [True, False]))
        fd.add_output(fd.ops.cast(y, DataType.Float if dtype is torch.float32 else DataType.BFloat16))
    (got,) = execute_with_kernels(fd, [x, w, b])
    ref = torch.nn.functional.layer_norm(x.double(), (cols,), w.double(), b.double(), 1e-5)
    torch_error = (torch.nn.functional.layer_norm(x.float(), (cols,), w.float(), b.float(), 1e-5).to(dtype).double()
                   - ref).abs().max().item()
    assert (got.double() - ref).abs().max().item() <= 2 * torch_error + 1e-6
    params = _split_params(fd)
    assert params.shape == "split" and params.split >= 2, params


def _layer_norm_fusion(cols: int) -> FusionDefinition:
    x = torch.randn(2, cols)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        var, mean = fd.ops.var_mean(tx, [1], correction=0, keepdim=True)
        fd.add_output(fd.ops.mul(fd.ops.sub(tx, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5))))
    return fd


@pytest.mark.parametrize(("rows", "shape"), [(1, "split"), (33, "split"), (65, "split"), (66, "loop"), (128, "loop"),
                                             (256, "loop")])
def test_layer_norms_split_only_for_fewer_rows_than_half_the_sms(rows: int, shape: str) -> None:
    """An H200 (132 SMs) splits a long row's var_mean across programs only for fewer rows than half its
    SMs, as an online softmax: from 128 rows one program a row was faster (1.06x of Inductor against
    0.83x split at 128 x 262144 bf16)."""
    h200 = Machine(132, 16384, 2048)
    params = inner_persistent.compute_heuristics(_layer_norm_fusion(262144).fusion, SizeHints(262144, rows, h200))
    assert params.shape == shape, params
    # the row is read again by the normalizing pass: kept in L2, but by that last pass from 32 MiB on
    assert params.l2 is (L2Hint.keep_until_last if rows * 262144 * 4 >= 32 << 20 else L2Hint.keep), params


def test_an_outer_var_mean_of_few_rows_takes_them_in_one_tile() -> None:
    """A var_mean across few rows (a channels-last batch norm's 49 pixels, staged per image) reads all
    of them in one tile (the two passes over registers), not in a loop of Welford updates."""
    x = torch.randn(49, 4096)
    with FusionDefinition() as fd:
        var, mean = fd.ops.var_mean(fd.from_pytorch(x), [0], correction=0)
        fd.add_output(var)
        fd.add_output(mean)
    params = reduction.compute_heuristics(fd.fusion, SizeHints(64, 262144, Machine(132, 16384, 2048)))
    assert params.shape == "outer" and params.tile_reduced == 0 and params.split == 1, params
    (got_var, got_mean) = execute_with_kernels(fd, [x])
    torch.testing.assert_close(got_mean, x.mean(0))
    torch.testing.assert_close(got_var, x.var(0, correction=0))
