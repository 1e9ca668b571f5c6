"""The inner-outer persistent scheduler (docs/cached_inputs.md's fusion, layernorm backward): a reduction per
row (inner in memory) and a reduction across rows (outer), in one pass over the input.

``G`` programs each take a contiguous block of rows. For each of its rows, a program reduces the
row (a tile, or a loop when the row is too long for one), computes the row's outputs, and adds the
row into its partial results of the reduction across rows; a second, small launch finishes that
reduction over the ``G`` partials (a grid reduction). The reference is the reduction across rows:
``[G (grid_x), rows/G (loop), row (block_x)]``, or ``[G, rows/G/R (loop), R (block_y), row]`` with
``R`` rows a step, which each reduction across rows adds up (an rfactor) before it accumulates
them, so its accumulator over the loop is one row; for narrow rows it keeps a partial per row of
the step instead, added up once after the loop (``keep_step_rows``). The loop is software-pipelined
(``num_stages``).

A row too long to stay on chip (``on_chip_row``) would have each program read its
row again for every step of the row it sums across rows: the per-row reductions are computed first,
by a launch of their own, and the rest reads them (``row_statistics``; two launches, each of a
scheduler that takes it: a reduction of rows, then a reduction across rows that also writes the
row's outputs). Each element is read twice, as Inductor's two kernels read it, not once a step.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import ParallelType
from pyfuser.ir.ops import ReductionOp, VarMeanOp
from pyfuser.ir.tensor_view import TensorView
from pyfuser.scheduler.cache import cache_inputs
from pyfuser.scheduler.reduction_analysis import NormalizationKind, analyze
from pyfuser.scheduler.reduction_schedule import (
    ReductionParams,
    checked_analysis,
    element_bytes,
    flatten,
    in_force,
    mark_rounded_sums,
    pipeline_stages,
    propagate,
    size_hints,
    warps_for,
)
from pyfuser.scheduler.registry import FusionLike, Machine, Scheduler, SchedulerType, SizeHints
from pyfuser.scheduler.tools import inline_most
from pyfuser.utils import next_power_of_2

KINDS = (NormalizationKind.inner_outer_persistent,)

#: Rows of at most this many elements (rounded up to a power of two) are narrow: each program steps
#: through its block many rows at a time, 16 elements a thread (8 warps over 4096 elements for rows
#: up to 128, 4 warps over 2048 above), and each reduction across rows keeps a partial per row of the
#: step until its block is done (``keep_step_rows``): adding up each step's rows costs a reduction
#: across warps and a barrier a step, and one program an SM spends its time waiting on them. H200
#: sweep (``benchmarks/kernels.py --sweep`` on ``ROWS_MANY_NARROW``: layer-norm backward bf16
#: 100352 x 96, 65536 x 64, 25088 x 192, 16384 x 256, 6272 x 384, 16384 x 512, float32 100352 x 96,
#: rms-norm backward 100352 x 96; rows a step x warps x 1-8 programs an SM x kept partials): at least
#: 0.94x of each shape's best (rms-norm 96 and layer-norm 512 at 0.94x; four of eight the best); 4
#: rows a step, as wide rows take, lost 2.8-14x on rows up to 256 (100352 x 96: 890 against 53 us).
#: Rows of 1024 add up each step's rows (38.6 against 50-54 us kept). One program an SM beat two to
#: eight when kept (measured while a grid reduction's final steps ran one program each: ``ManyRows``
#: takes many rows of more than 64 elements since).
NARROW_ROW = 512


@dataclass(frozen=True)
class ManyRows:
    """Narrow rows of more than 64 elements, many of them: blocks of ``block_rows`` rows, one a program (as
    Inductor's mix-order reduction takes them), each stepping through its block ``step_elements`` elements at
    a time (``step_elements_wide`` for rows over 128), ``elements_per_lane`` of them a thread
    (``narrow_elements_per_lane`` where rows load narrower than 16 bytes: more warps, as
    ``ReductionParams.narrow_warps``), where that gives at least ``waves`` programs an SM; each step's rows
    kept as partials (``keep_step_rows``) from rows of ``keep_from_width``. Small programs, many resident at
    once, hide the latency of loads the loop cannot pipeline; one 8-warp program an SM waited on them.

    H200 A/B over 20 layer-norm and rms-norm backwards (bf16 and float32, rows of 96-512, odd and even, 16383
    to 131072 of them; ``kernels_notes.md``): geomean 0.68 -> 0.96x of Inductor (131072 x 127 bf16: 0.25 ->
    0.66x; 65536 x 512: 0.65 -> 1.21x); blocks of 128 rows 0.80x, steps of 1024 for rows of 128 0.90x, 4
    elements a thread on aligned rows 0.61x but on rows of odd length 0.70-1.06x against 0.62-0.75x. One block an
    SM (the A/B had two): an earlier A/B's 16384 x 512 and 16384 x 256 ran 64-row blocks at 1.23x against 1.05x and
    0.97x for one program an SM."""

    block_rows: int = 64
    waves: int = 1
    step_elements: int = 512
    step_elements_wide: int = 1024
    elements_per_lane: int = 16
    narrow_elements_per_lane: int = 4
    keep_from_width: int = 256


_MANY_ROWS = [ManyRows()]


def many_rows(heuristic: ManyRows) -> AbstractContextManager[ManyRows]:
    """Size many narrow rows by ``heuristic`` inside the block (kernels compiled there keep it;
    ``benchmarks/kernels.py --sweep`` times its variants)."""
    return in_force(_MANY_ROWS, heuristic)


def can_schedule(fusion: FusionLike) -> tuple[bool, str]:
    analysis, reason = analyze(fusion)
    if analysis is None:
        return False, reason
    if analysis.kind not in KINDS:
        return False, f"not a reduction per row and across rows: a {analysis.kind.value} segment"
    return True, ""


def compute_heuristics(fusion: FusionLike, inputs: Sequence[Any] | SizeHints = ()) -> ReductionParams:
    analysis = checked_analysis(fusion, KINDS)
    hints = size_hints(fusion, analysis, inputs)  # reduced: the row (inner); kept: the rows
    m = hints.machine
    rows = hints.kept
    # One wave: every program holds its partials across rows for its whole block, and the second
    # launch reads one partial row per program. H200 sweep (kernels.py's seed003, layernorm, rmsnorm
    # backward): one program per SM with two rows per step beat two and four waves by 3-5%. As few
    # programs as give each SM's block its rows: 4096 rows on 132 SMs are blocks of 32 either way,
    # and 128 programs leave none without rows (idle, spinning at the cooperative launch's barrier,
    # adding an empty partial row to the second step). Equal speed on the H200 (3159 against 3173
    # GB/s with 132, within noise); fewer partials and no idle programs.
    if rows is None:
        programs = m.sm_count
    else:
        block = -(-rows // max(1, min(m.sm_count, rows)))  # rows of a block, one program per SM
        programs = -(-rows // block)
    assert analysis.outer_reference is not None
    row = hints.reduced
    if row is not None and next_power_of_2(row) <= m.max_persistent:
        width = next_power_of_2(max(row, 1))
        many = _MANY_ROWS[-1]
        if rows is not None and _many_rows(hints):
            step = many.step_elements if width <= 128 else many.step_elements_wide
            rows_per_step = max(1, step // width)
            elements = rows_per_step * width

            def warps_giving(per_lane: int) -> int:
                return max(1, min(8, elements // (32 * per_lane)))

            return ReductionParams(SchedulerType.inner_outer_persistent, analysis.outer_reference.name, "tile",
                                   rows=rows_per_step, split=-(-rows // many.block_rows),
                                   num_warps=warps_giving(many.elements_per_lane),
                                   narrow_warps=warps_giving(many.narrow_elements_per_lane),
                                   num_stages=pipeline_stages(fusion, analysis, rows_per_step * width, m),
                                   keep_step_rows=rows_per_step > 1 and width >= many.keep_from_width)
        if width <= NARROW_ROW:  # 16 elements a thread, partials kept per row of the step (NARROW_ROW)
            step, warps = (4096, 8) if width <= 128 else (2048, 4)
            rows_per_step = max(1, step // width)
            if rows is not None:  # no more rows a step than a program's block has
                rows_per_step = min(rows_per_step, next_power_of_2(-(-rows // programs)))
            return ReductionParams(SchedulerType.inner_outer_persistent, analysis.outer_reference.name, "tile",
                                   rows=rows_per_step, split=programs, num_warps=warps,
                                   num_stages=pipeline_stages(fusion, analysis, rows_per_step * width, m),
                                   keep_step_rows=rows_per_step > 1)
        # H200 sweeps (layernorm and rmsnorm backward, bf16 rows of 8192; kernels.py's seed003, f32 rows of 4096),
        # with the row loop software-pipelined three deep (no branch in its body): steps of half the
        # persistent tile (one row of 8192: 3606 and 3784 GB/s, 0.85 and 0.89 of copy; two rows of
        # 4096) beat steps of the whole tile (two rows of 8192: 255 registers and spills, 3200 and
        # 3447 GB/s); 8 warps beat 16; unpipelined, every shape lost 20-35%.
        rows_per_step = max(1, min(4, m.max_persistent // 2 // width))
        return ReductionParams(SchedulerType.inner_outer_persistent, analysis.outer_reference.name, "tile",
                               rows=rows_per_step, split=programs, num_warps=warps_for(rows_per_step * width),
                               num_stages=pipeline_stages(fusion, analysis, rows_per_step * width, m))
    step = m.loop_tile * max(1, 4 // element_bytes(fusion))
    return ReductionParams(SchedulerType.inner_outer_persistent, analysis.outer_reference.name, "loop",
                           tile=step, split=programs, num_warps=warps_for(step))


def _many_rows(hints: SizeHints) -> bool:
    """Whether rows of ``hints``' sizes take ``ManyRows``' programs of a block of rows each."""
    many, row, rows = _MANY_ROWS[-1], hints.reduced, hints.kept
    if row is None or rows is None:
        return False
    return 64 < next_power_of_2(max(row, 1)) <= NARROW_ROW and rows >= many.block_rows * many.waves * hints.machine.sm_count


def on_chip_row(machine: Machine) -> int:
    """The longest row (a power of two) the inner-outer kernel keeps on chip: half the persistent tile.
    A whole tile of 16384 (rows of 8193-16384) holds 64 values a thread of each live tensor on 8 warps,
    and the sums across rows with their compensations as many again: it spilled (H200, layer-norm
    backward bf16 2048 x 11008: 1273 us against Inductor's 90; float32 1024 x 11008: 579 against 95),
    where the two launches of longer rows run at 0.85-1.3x of Inductor."""
    return machine.max_persistent // 2


def row_statistics(fusion: FusionLike, hints: SizeHints) -> list[TensorView]:
    """The per-row reductions' outputs where a row of ``hints``' size does not stay on chip
    (``on_chip_row``; the segment then runs as two launches split there, the module's docstring), else
    none."""
    if hints.reduced is None or next_power_of_2(hints.reduced) <= on_chip_row(hints.machine):
        return []
    analysis = checked_analysis(fusion, KINDS)
    return [t for e in fusion.exprs() if isinstance(e, ReductionOp | VarMeanOp)
            and frozenset(analysis.exact.class_of(i) for i in e.output.get_logical_domain()
                          if i.is_reduction() and not i.is_broadcast()) == analysis.reduced
            for t in e.tensor_outputs]


def schedule(fusion: Fusion, params: ReductionParams) -> None:
    analysis = checked_analysis(fusion, KINDS)
    caches = cache_inputs(fusion, propagate_allocation_domain=False)
    ref = next(tv for tv in fusion.tensors() if tv.name == params.reference)
    flatten(ref, analysis, reduced_first=True)  # [rows (reduced here), row]
    ref.split(0, params.split, inner_split=False)  # [G, rows/G, row]
    ref.axis(0).parallelize(ParallelType.grid_x)
    if params.rows > 1:  # several rows per step: [G, rows/G/R, R (block_y), row]
        ref.split(1, params.rows)
        ref.axis(2).parallelize(ParallelType.block_y)
    row = len(ref.get_loop_domain()) - 1
    if params.shape == "loop":
        ref.split(row, params.tile)  # [..., row/T, T]
        ref.axis(row + 1).parallelize(ParallelType.block_x)
    else:
        ref.axis(row).parallelize(ParallelType.block_x)
    propagate(fusion, ref, caches)
    if params.rows > 1 and not params.keep_step_rows:
        _add_up_each_step(fusion)
    mark_rounded_sums(fusion)


def _add_up_each_step(fusion: Fusion) -> None:
    """Each reduction across rows adds up a step's rows (rfactor of its block_y axis) before it
    accumulates them across steps: the accumulator it keeps over the row loop is one row, not one
    per row of the step (layernorm backward's two reductions across rows held 2 x 2 rows of 8192
    float32 values, spilling registers)."""
    for expr in list(fusion.exprs()):
        if not isinstance(expr, ReductionOp):
            continue
        loop = expr.output.get_loop_domain()
        rows = [k for k, i in enumerate(loop) if i.is_reduction() and i.parallel_type is ParallelType.block_y]
        if rows and any(i.is_reduction() and i.parallel_type is ParallelType.serial for i in loop):
            expr.output.rfactor(rows)
    inline_most(fusion=fusion)


def partial_columns(hints: SizeHints) -> int | None:
    """The columns of the partial results the final steps split into blocks: a row's, where many programs
    (``ManyRows``) write them. One program an SM runs its final steps in the same cooperative launch,
    one program of the whole row each (on an H200 narrower blocks there made layer-norm backward of
    131072 x 127 1.6x slower, 1023 x 1000 1.2x)."""
    return hints.reduced if _many_rows(hints) else None


INNER_OUTER_PERSISTENT = Scheduler(SchedulerType.inner_outer_persistent, can_schedule, compute_heuristics, schedule,
                                   size_dependent=True, split_at=row_statistics, partial_columns=partial_columns)
