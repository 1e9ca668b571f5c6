"""The outer persistent scheduler (batchnorm-like): reductions over the outermost axes whose
results are read back along them. A block of columns stays on chip for the whole reduced extent
when it fits; otherwise each pass reads it again (multi-pass). Accesses are contiguous along the
kept (inner) axis. Few columns over many rows (a batch norm's backward over channels-last
activations: C channels, N*H*W rows) split the rows across programs as a reduction does: each sum a
grid reduction whose final launch reads the program's share of the rows again to write the output.
A var_mean (Welford's partial results are not finished across programs) keeps one program a block."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pyfuser.ir.fusion import Fusion
from pyfuser.ir.ops import VarMeanOp
from pyfuser.scheduler.reduction_analysis import NormalizationKind, analyze
from pyfuser.scheduler.reduction_schedule import (
    ReductionParams,
    checked_analysis,
    element_bytes,
    outer_params,
    pipeline_stages,
    schedule_segment,
    size_hints,
)
from pyfuser.scheduler.registry import FusionLike, Scheduler, SchedulerType, SizeHints

KINDS = (NormalizationKind.outer_persistent,)


def can_schedule(fusion: FusionLike) -> tuple[bool, str]:
    analysis, reason = analyze(fusion)
    if analysis is None:
        return False, reason
    if analysis.kind not in KINDS:
        return False, f"not a normalization over the outermost axes: a {analysis.kind.value} segment"
    return True, ""


def compute_heuristics(fusion: FusionLike, inputs: Sequence[Any] | SizeHints = ()) -> ReductionParams:
    analysis = checked_analysis(fusion, KINDS)
    hints = size_hints(fusion, analysis, inputs)
    splittable = not any(isinstance(e, VarMeanOp) for e in fusion.exprs())  # as inner_persistent's
    params = outer_params(SchedulerType.outer_persistent, analysis.reference, hints, True, splittable,
                        element_bytes(fusion))
    return replace(params, num_stages=pipeline_stages(fusion, analysis, params.tile * params.tile_reduced,
                                                      hints.machine, params.num_stages))


def schedule(fusion: Fusion, params: ReductionParams) -> None:
    schedule_segment(fusion, params, KINDS)


OUTER_PERSISTENT = Scheduler(SchedulerType.outer_persistent, can_schedule, compute_heuristics, schedule, size_dependent=True)
