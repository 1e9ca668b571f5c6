"""The reduction scheduler's sizing (issue 30, reductions that lost to Inductor), as schedule facts on an
H100-sized machine and through the generated kernels (Triton's interpreter) against torch.

* An outer reduction with enough kept columns narrows its column block (down to whole 128-byte lines)
  rather than split its rows across programs: no second launch (a mean over the outer axis of
  16384 x 4096 bf16, 256 programs of 64 columns, as Inductor runs it). Too few columns even then
  (1000): the wide block, split.
* The last launch of a split outer reduction sizes its column blocks for programs, not for whole lines:
  the float64 combine of a var_mean's partials over 256 channels ran on 4 programs.
* A plain inner reduction of rows longer than ``max_tile`` loops in steps that waste little of any row of
  its size bucket (a row of 11008 as one tile of 16384 masked off a third of its lanes).
"""

from __future__ import annotations

import re

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.scheduler import inner_persistent, reduction
from pyfuser.scheduler.reduction_schedule import (
    InnerHeuristic,
    OuterHeuristic,
    final_params,
    inner_heuristic,
    outer_heuristic,
)
from pyfuser.scheduler.registry import Machine, SizeHints
from tests.codegen.conftest import execute_with_kernels, kernel_segments

H100 = Machine(132, 16384, 2048)


def _outer(op: str, dtype: DataType) -> FusionDefinition:
    with FusionDefinition() as fd:
        x = fd.ops.cast(fd.define_tensor([-1, -1], dtype=dtype), DataType.Float)
        if op == "var_mean":
            var, mean = fd.ops.var_mean(x, [0], correction=0)
            fd.add_output(mean)
            fd.add_output(var)
        else:
            fd.add_output({"sum": fd.ops.sum, "max": fd.ops.max, "mean": fd.ops.mean}[op](x, [0]))
    return fd


@pytest.mark.parametrize(("dtype", "kept", "tile"), [(DataType.BFloat16, 16384, 64), (DataType.Float, 32000, 64),
                                                     (DataType.BFloat16, 131072, 128)])
def test_outer_reduction_narrows_its_columns_before_splitting(dtype: DataType, kept: int, tile: int) -> None:
    params = reduction.compute_heuristics(_outer("mean", dtype).fusion, SizeHints(4096, kept, H100))
    assert (params.shape, params.tile, params.split) == ("outer", tile, 1), params
    assert -(-kept // params.tile) >= H100.sm_count


@pytest.mark.parametrize(("dtype", "kept"), [(DataType.BFloat16, 1000), (DataType.Float, 4096), (DataType.Float, 1)])
def test_outer_reduction_with_few_columns_keeps_wide_blocks_and_splits(dtype: DataType, kept: int) -> None:
    params = reduction.compute_heuristics(_outer("max", dtype).fusion, SizeHints(65536, kept, H100))
    widest = OuterHeuristic().reduction_columns  # elements, whatever their width
    assert params.tile == min(widest, 1 << (kept - 1).bit_length()) and params.split >= 2, params


def test_narrowing_is_a_knob() -> None:
    """``narrow_bytes=0``: split first, as before narrowing (the sweep compares both)."""
    with outer_heuristic(OuterHeuristic(narrow_bytes=0)):
        params = reduction.compute_heuristics(_outer("mean", DataType.BFloat16).fusion, SizeHints(4096, 16384, H100))
    assert params.tile == OuterHeuristic().reduction_columns and params.split >= 2, params


@pytest.mark.parametrize(("partials", "kept", "element"), [(1056, 256, 8), (264, 256, 8), (9, 4096, 4), (66, 1000, 4)])
@pytest.mark.parametrize("welford", [False, True], ids=["sum", "var_mean"])
def test_final_step_columns_give_programs(partials: int, kept: int, element: int, welford: bool) -> None:
    """Columns narrowed (not below ``final_min_columns``) until every SM has a program; every partial
    row in one tile where the tile's budget holds them (a var_mean's float64 combine: an eighth of a
    sum's), else a loop over steps of rows."""
    h = OuterHeuristic()
    ref = _outer("sum", DataType.Float).fusion.outputs()[0]
    params = final_params(ref, partials, kept, H100, element, 8192, welford)  # type: ignore[arg-type]
    budget = 1024 if welford else 8192
    rows = 1 << (partials - 1).bit_length()
    assert params.shape == "outer" and params.tile >= h.final_min_columns, params
    assert -(-kept // params.tile) >= H100.sm_count or params.tile == h.final_min_columns, params
    if rows * params.tile <= budget:
        assert params.tile_reduced == 0, params
    else:
        assert params.tile_reduced * params.tile == budget, params
    if welford:  # at most ``welford_elements`` per thread
        assert (params.tile_reduced or rows) * params.tile <= params.num_warps * 32 * h.welford_elements, params


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(3, 64, 9, 7), (1, 64, 5, 3), (700, 64, 1, 1)], ids=["odd", "N=1", "H=W=1"])
def test_split_var_mean_final_step_runs_on_every_program(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """Channels-last statistics of 64 channels split across the interpreter's programs: the final step's
    column blocks are narrowed so its 4 programs all combine partials (one program of 64 columns before)."""
    x = (torch.randn(*shape) * 2 + 50).to(dtype).contiguous(memory_format=torch.channels_last)
    with FusionDefinition() as fd:
        var, mean = fd.ops.var_mean(fd.ops.cast(fd.from_pytorch(x), DataType.Float), [0, 2, 3], correction=0)
        fd.add_output(mean)
        fd.add_output(var)
    with outer_heuristic(OuterHeuristic(step_bytes=256, welford_step_elements=64, small_welford_step_elements=64)):
        mean, var = execute_with_kernels(fd, [x])
    ref_var, ref_mean = torch.var_mean(x.double(), [0, 2, 3], correction=0)
    torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(var.double(), ref_var, rtol=1e-6, atol=1e-4)
    (segment,) = kernel_segments(fd)
    assert segment.scheduler_params.split >= 2
    final = segment.code[re.search(r"def reduction_\w*kernel_final\(", segment.code).start():]
    columns = int(re.search(r"tl\.arange\(0, (\d+)\)\[None, :\]", final).group(1))  # type: ignore[union-attr]
    assert -(-64 // columns) >= 4, final


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("op", ["sum", "amax", "mean"])
def test_narrowed_outer_reduction_against_torch(op: str, dtype: torch.dtype) -> None:
    """A permuted [rows, columns] input reduced over its outer axis in narrowed column blocks (the
    interpreter's machine: 4 programs), odd sizes."""
    x = torch.randn(37, 301, dtype=dtype).t().contiguous().t()  # columns innermost in memory
    _reduce_against_torch(x, op, 0)


def _reduce_against_torch(x: torch.Tensor, op: str, axis: int) -> FusionDefinition:
    """``op`` of ``x`` over ``axis`` in float32 through generated kernels, checked against float64 torch."""
    with FusionDefinition() as fd:
        t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        fd.add_output({"sum": fd.ops.sum, "amax": fd.ops.max, "mean": fd.ops.mean}[op](t, [axis]))
    (out,) = execute_with_kernels(fd, [x])
    ref = {"sum": torch.sum, "amax": torch.amax, "mean": torch.mean}[op](x.double(), axis)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    return fd


def _inner(op: str, dtype: DataType) -> FusionDefinition:
    with FusionDefinition() as fd:
        x = fd.ops.cast(fd.define_tensor([-1, -1], dtype=dtype), DataType.Float)
        fd.add_output({"sum": fd.ops.sum, "max": fd.ops.max, "mean": fd.ops.mean}[op](x, [1]))
    return fd


@pytest.mark.parametrize(("bucket", "shape", "step"), [(16384, "tile", 0), (8192, "tile", 0), (65536, "loop", 8192),
                                                       (131072, "loop", 8192), (4096, "tile", 0), (128, "tile", 0)])
def test_inner_reduction_rows_past_a_tile_loop_in_steps_that_waste_little(bucket: int, shape: str, step: int) -> None:
    """Rows of at most ``max_tile`` (16384) are one tile (an H100 sweep: amax of 11008 faster so than looped,
    its bucket's masked lanes included); longer ones loop in steps short enough that any row of the
    bucket wastes at most ``max_waste`` of its reads."""
    params = reduction.compute_heuristics(_inner("max", DataType.BFloat16).fusion, SizeHints(bucket, 4096, H100))
    assert (params.shape, params.tile) == (shape, step), params
    if shape == "loop":
        worst = bucket // 2 + 1  # the bucket's shortest row
        assert -(-worst // step) * step - worst <= 0.25 * worst


def test_inner_heuristic_is_a_knob() -> None:
    """Rows past a smaller ``max_tile`` loop (the sweep compares both)."""
    with inner_heuristic(InnerHeuristic(max_tile=4096)):
        params = reduction.compute_heuristics(_inner("max", DataType.BFloat16).fusion, SizeHints(16384, 4096, H100))
    assert (params.shape, params.tile) == ("loop", 2048), params


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("op", ["sum", "amax", "mean"])
@pytest.mark.parametrize("shape", [(7, 1100), (1, 2053), (300, 1)], ids=["odd", "one-row", "one-column"])
def test_looped_inner_reduction_against_torch(op: str, shape: tuple[int, int], dtype: torch.dtype) -> None:
    """Rows past the interpreter's tile (1024) in short steps, the last one mostly past the row's end."""
    fd = _reduce_against_torch(torch.randn(*shape, dtype=dtype), op, 1)
    if shape[1] > 1024:
        (segment,) = kernel_segments(fd)
        assert segment.scheduler_params.shape in ("loop", "split") and segment.scheduler_params.tile <= 512


def test_inner_var_mean_keeps_rows_on_chip() -> None:
    """A var_mean of rows of 12544 (batch-norm statistics' first stage, 112 x 112): one tile up to the
    machine's persistent size, two passes over registers, not Welford's division per element in a loop."""
    with FusionDefinition() as fd:
        x = fd.ops.cast(fd.define_tensor([-1, -1], dtype=DataType.BFloat16), DataType.Float)
        var, mean = fd.ops.var_mean(x, [1], correction=0)
        fd.add_output(mean)
        fd.add_output(var)
    params = reduction.compute_heuristics(fd.fusion, SizeHints(16384, 2048, H100))
    assert (params.shape, params.rows) == ("tile", 1), params


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_split_var_mean_final_step_loops_over_many_partials(dtype: torch.dtype) -> None:
    """Many programs per SM (``welford_waves``): more partial rows than a var_mean combine's tile holds,
    so the final step loops over steps of them; far from 0, against torch."""
    x = (torch.randn(900, 64, 1, 1) * 2 + 300).to(dtype).contiguous(memory_format=torch.channels_last)
    with FusionDefinition() as fd:
        var, mean = fd.ops.var_mean(fd.ops.cast(fd.from_pytorch(x), DataType.Float), [0, 2, 3], correction=0)
        fd.add_output(mean)
        fd.add_output(var)
    with outer_heuristic(OuterHeuristic(step_bytes=256, welford_step_elements=64, small_welford_step_elements=64,
                                        welford_waves=64)):
        mean, var = execute_with_kernels(fd, [x])
    ref_var, ref_mean = torch.var_mean(x.double(), [0, 2, 3], correction=0)
    torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(var.double(), ref_var, rtol=1e-6, atol=1e-4)
    (segment,) = kernel_segments(fd)
    assert segment.scheduler_params.split > 64
    final = segment.code[re.search(r"def reduction_\w*kernel_final\(", segment.code).start():]
    assert "for i" in final, final  # a loop over steps of partial rows


@pytest.mark.parametrize(("reduced", "kept", "warps", "narrow"), [(131072, 128, 2, 8), (1024, 128, 4, 8),
                                                                  (8192, 4096, 2, 8)])
def test_a_looped_column_sum_asks_more_warps_where_its_rows_load_narrow(reduced: int, kept: int, warps: int,
                                                                        narrow: int) -> None:
    """The loop step gives each lane 32 elements, four 16-byte loads of bf16; the variants whose rows load
    in narrower pieces (rows of 127) launch on warps of 8 elements a lane (``narrow_elements``; 8 warps at
    most)."""
    params = reduction.compute_heuristics(_outer("sum", DataType.BFloat16).fusion, SizeHints(reduced, kept, H100))
    assert (params.shape, params.num_warps, params.narrow_warps) == ("outer", warps, narrow), params
    assert params.narrow_warps == min(8, params.tile * params.tile_reduced // (32 * 8))
    with outer_heuristic(OuterHeuristic(narrow_elements=0)):
        params = reduction.compute_heuristics(_outer("sum", DataType.BFloat16).fusion, SizeHints(reduced, kept, H100))
    assert params.narrow_warps == 0


def test_columns_narrowed_to_under_two_programs_an_sm_step_further_on_more_warps() -> None:
    """A column max of 2048 x 11008 bf16: 172 programs of 64 columns, no split; each step reads 16 KiB on
    8 warps (``narrowed_step_bytes``), not 8 KiB on 4. A var_mean keeps its own steps."""
    params = reduction.compute_heuristics(_outer("max", DataType.BFloat16).fusion, SizeHints(2048, 32768, H100))
    # 512 programs, about four an SM: the usual step (counted in float32 accumulators, 8 KiB of them)
    assert (params.tile, params.split, params.tile_reduced, params.num_warps) == (64, 1, 32, 2), params
    params = reduction.compute_heuristics(_outer("max", DataType.BFloat16).fusion, SizeHints(2048, 11008, H100))
    assert (params.tile, params.tile_reduced, params.split, params.num_warps) == (64, 128, 1, 8), params
    with outer_heuristic(OuterHeuristic(narrowed_step_bytes=0)):
        params = reduction.compute_heuristics(_outer("max", DataType.BFloat16).fusion, SizeHints(2048, 11008, H100))
    assert (params.tile_reduced, params.num_warps) == (64, 4), params


def _bucket(rows: int, columns: int, inner: bool) -> SizeHints:
    """An H100-sized machine's size hints for ``rows x columns`` reduced along the columns (``inner``) or rows."""
    reduced, kept = (columns, rows) if inner else (rows, columns)
    return SizeHints(reduced=1 << (reduced - 1).bit_length(), kept=1 << (kept - 1).bit_length(), machine=H100)


@pytest.mark.parametrize(("dtype", "rows", "columns", "stages"), [
    (DataType.BFloat16, 32768, 1000, 4), (DataType.Float, 16384, 1000, 3), (DataType.BFloat16, 1023, 1000, 3)])
def test_outer_loops_streaming_16_bit_data_pipeline_four_deep(dtype: DataType, rows: int, columns: int,
                                                              stages: int) -> None:
    """A plain column reduction streaming 16-bit data past L2 (32 MiB and more) pipelines its loop 4 deep
    (``OuterHeuristic.streamed_16bit_stages``: its steps, counted in float32 accumulators, carry half a float32
    step's bytes); float32 data of the same bytes and 16-bit data kept in L2 3 deep."""
    params = reduction.compute_heuristics(_outer("sum", dtype).fusion, _bucket(rows, columns, inner=False))
    assert params.shape == "outer" and params.tile_reduced > 0 and params.num_stages == stages, params
    with outer_heuristic(OuterHeuristic(streamed_16bit_stages=3)):
        assert reduction.compute_heuristics(_outer("sum", dtype).fusion, _bucket(rows, columns, False)).num_stages == 3


@pytest.mark.parametrize("dtype", [DataType.BFloat16, DataType.Float])
def test_plain_column_blocks_are_128_columns_and_splits_take_two_steps(dtype: DataType) -> None:
    """A plain column reduction reads blocks of ``reduction_columns`` (128) elements whatever their width, and
    splits its rows into programs of at least ``reduction_min_steps`` (2) loop steps: more programs than
    4 steps a program gave (a column sum of 1023 x 1000)."""
    hints = _bucket(1023, 1000, inner=False)
    params = reduction.compute_heuristics(_outer("sum", dtype).fusion, hints)
    assert params.tile == 128 and params.split >= 2, params
    assert hints.reduced is not None and -(-hints.reduced // (params.split * params.tile_reduced)) >= 2, params
    with outer_heuristic(OuterHeuristic(reduction_min_steps=4)):
        fewer = reduction.compute_heuristics(_outer("sum", dtype).fusion, hints)
    assert fewer.split < params.split, (fewer, params)


@pytest.mark.parametrize(("columns", "step", "warps"), [(32000, 4096, 16), (65536, 8192, 8)])
def test_short_loop_steps_of_row_reductions_run_on_16_warps(columns: int, step: int, warps: int) -> None:
    """A plain row reduction looping in steps of at most ``InnerHeuristic.short_step`` (4096) elements runs
    on 16 warps, 8 elements a lane (``warps_for`` gave 4 warps of 32); longer steps keep ``warps_for``'s."""
    params = reduction.compute_heuristics(_inner("sum", DataType.BFloat16).fusion, _bucket(1024, columns, inner=True))
    assert (params.shape, params.tile, params.num_warps) == ("loop", step, warps), params


def _var_mean(dtype: DataType, axis: int) -> FusionDefinition:
    with FusionDefinition() as fd:
        x = fd.ops.cast(fd.define_tensor([-1, -1], dtype=dtype), DataType.Float)
        var, mean = fd.ops.var_mean(x, [axis], correction=0)
        fd.add_output(mean)
        fd.add_output(var)
    return fd


@pytest.mark.parametrize(("dtype", "stages"), [(DataType.Float, 4), (DataType.BFloat16, 4)])
def test_streamed_var_mean_loops_pipeline_four_deep_whatever_their_width(dtype: DataType, stages: int) -> None:
    """A var_mean over columns streaming past L2 (channels-last batch-norm statistics) pipelines its loop
    ``streamed_welford_stages`` (4) deep for float32 as for 16-bit data; moved back, float32 keeps 3."""
    hints = _bucket(401408, 64, inner=False)
    params = reduction.compute_heuristics(_var_mean(dtype, 0).fusion, hints)
    assert params.shape == "outer" and params.num_stages == stages, params
    with outer_heuristic(OuterHeuristic(streamed_welford_stages=3)):
        moved = reduction.compute_heuristics(_var_mean(dtype, 0).fusion, hints)
    assert moved.num_stages == (3 if dtype is DataType.Float else 4), moved


@pytest.mark.parametrize(("dtype", "width", "warps"), [(DataType.Float, 8192, 16), (DataType.Float, 16384, 16),
                                                       (DataType.Float, 4096, 8), (DataType.BFloat16, 8192, 8),
                                                       (DataType.Float, 2048, 4)])
def test_wide_float32_var_mean_rows_on_chip_take_16_elements_a_thread(dtype: DataType, width: int, warps: int) -> None:
    """A var_mean's float32 row of 4096 elements or more on chip runs 16 elements a thread (up to 16 warps),
    not ``warps_for``'s 32; bf16 rows and shorter rows keep ``warps_for``; the knob at 0 moves it back."""
    hints = SizeHints(width, 2048, H100)
    params = reduction.compute_heuristics(_var_mean(dtype, 1).fusion, hints)
    assert (params.shape, params.num_warps) == ("tile", warps), params
    with inner_heuristic(InnerHeuristic(welford_tile_elements=0)):
        moved = reduction.compute_heuristics(_var_mean(dtype, 1).fusion, hints)
    assert moved.num_warps == max(2, min(8, params.rows * width // 1024)), moved


@pytest.mark.parametrize("rows", [1, 8, 63])
def test_rows_split_across_programs_loop_on_16_warps(rows: int) -> None:
    """A softmax of fewer rows than half the SMs splits each row across programs; each program loops over its
    share on ``SPLIT_WARPS`` (16), as a looped row does, where ``warps_for`` gave its steps of 8192 8."""
    with FusionDefinition() as fd:
        x = fd.ops.cast(fd.define_tensor([-1, -1], dtype=DataType.BFloat16), DataType.Float)
        shifted = fd.ops.exp(fd.ops.sub(x, fd.ops.broadcast_in_dim(fd.ops.max(x, [1]), x.shape(), [0])))
        fd.add_output(fd.ops.div(shifted, fd.ops.broadcast_in_dim(fd.ops.sum(shifted, [1]), x.shape(), [0])))
    params = inner_persistent.compute_heuristics(fd.fusion, _bucket(rows, 262144, inner=True))
    assert (params.shape, params.num_warps) == ("split", inner_persistent.SPLIT_WARPS), params
    assert inner_persistent.SPLIT_WARPS == 16
