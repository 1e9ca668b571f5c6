"""The reduction scheduler: reductions over one set of axes with their pointwise prologue and
epilogue, inner or outer in memory; few long rows are split across programs (a grid reduction)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pyfuser.ir.fusion import Fusion
from pyfuser.ir.ops import VarMeanOp
from pyfuser.ir.tensor_view import TensorView
from pyfuser.scheduler.grid_reduction import FinalSchedule
from pyfuser.scheduler.reduction_analysis import NormalizationKind, analyze
from pyfuser.scheduler.reduction_schedule import (
    ReductionParams,
    checked_analysis,
    element_bytes,
    final_params,
    inner_params,
    l2_by_size,
    loop_stages,
    outer_params,
    pipeline_stages,
    reduction_inner_params,
    schedule_segment,
    size_hints,
    streamed_bytes,
)
from pyfuser.scheduler.registry import FusionLike, Machine, Scheduler, SchedulerType, SizeHints
from pyfuser.scheduler.tools import reset_schedule

KINDS = (NormalizationKind.reduction,)
#: Elements a program of a grid reduction's final step reads at once.
FINAL_TILE = 8192


def can_schedule(fusion: FusionLike) -> tuple[bool, str]:
    analysis, reason = analyze(fusion)
    if analysis is None:
        return False, reason
    if analysis.kind not in KINDS:
        return False, f"a reduction is read back over the axes it reduces: a {analysis.kind.value} segment"
    return True, ""


def compute_heuristics(fusion: FusionLike, inputs: Sequence[Any] | SizeHints = ()) -> ReductionParams:
    analysis = checked_analysis(fusion, KINDS)
    hints = size_hints(fusion, analysis, inputs)
    # A var_mean splits too: Welford's partial results per program, combined by the second launch.
    welford = any(isinstance(e, VarMeanOp) for e in fusion.exprs())
    if analysis.inner:
        return l2_by_size(reduction_inner_params(analysis.reference, hints, True, welford, streamed_bytes(fusion)),
                          hints, fusion)
    # Few rows (up to a persistent tile's worth of the column block) are taken in one tile where the
    # column blocks give every SM a program and every output is reduced: no loop, and a sum added up
    # over registers without a loop's compensation. H200, bf16 column sums of 33 to 255 rows 0.68-0.80x
    # -> 1.04-1.22x of Inductor. A var_mean of few rows (a channels-last batch norm's 7 x 7 pixels per
    # image, staged) then takes the two passes over registers, where a loop's Welford update divides per
    # element and its float64 combine across the step's rows cost 20x the load time (bf16 128 x 2048 x 7
    # x 7: 342 us for Inductor's 17; 35 in one tile). A segment that also writes outputs as large as its
    # input (the second part of a wide norm backward's split, ``dx`` beside the column sums) keeps the
    # loop: in one tile, layer-norm backward bf16 33 x 128256 fell from 1.72x to 1.11x.
    whole_rows = not any(analysis.reduced & analysis.iterated(out) for out in fusion.outputs()
                         if isinstance(out, TensorView))
    element = streamed_bytes(fusion)
    params = l2_by_size(outer_params(SchedulerType.reduction, analysis.reference, hints, whole_rows, True, element,
                                     welford), hints, fusion)
    return replace(params, num_stages=pipeline_stages(fusion, analysis, params.tile * params.tile_reduced, hints.machine,
                                                      loop_stages(params, element, welford)))


def schedule(fusion: Fusion, params: ReductionParams) -> None:
    schedule_segment(fusion, params, KINDS)


def schedule_final_step(fusion: Fusion, machine: Machine, kept: int | None = None) -> FinalSchedule | None:
    """Schedule the second launch of a grid reduction afresh: it reduces the programs' partial
    results (and computes what follows), never split again; ``kept``: the extent of the partials'
    columns (a size bucket's), which the final step's column blocks are sized by. Returns the kernel's
    reference and warps; None (the fusion untouched) where the launch is no plain reduction: a split
    normalization's next launch, which keeps its split schedule (reading its share of the row again)."""
    analysis, _ = analyze(fusion)
    if analysis is None or analysis.kind not in KINDS:
        return None
    reset_schedule(fusion)
    analysis = checked_analysis(fusion, KINDS)
    reduced, _ = analysis.extents()
    if analysis.inner:
        params = inner_params(SchedulerType.reduction, analysis.reference, SizeHints(reduced.value, None, machine),
                              False)
    else:
        welford = any(isinstance(e, VarMeanOp) for e in fusion.exprs())
        params = final_params(analysis.reference, reduced.value, kept, machine, element_bytes(fusion), FINAL_TILE,
                              welford)
    schedule_segment(fusion, params, KINDS)
    return FinalSchedule(analysis.reference, params.num_warps)


#: a reduction split across programs keeps its kept axes in its partial results
REDUCTION = Scheduler(SchedulerType.reduction, can_schedule, compute_heuristics, schedule, size_dependent=True,
                      partial_columns=lambda hints: hints.kept)
