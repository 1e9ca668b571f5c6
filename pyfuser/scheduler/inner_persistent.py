"""The inner persistent scheduler (softmax, layernorm, rmsnorm and their backward): reductions
over the innermost axes whose results are read back along the row. Rows that fit a tile stay on
chip between the reduction and its consumers (one read, one write); longer rows are read once per
pass (multi-pass)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyfuser.ir.fusion import Fusion
from pyfuser.scheduler.reduction_analysis import NormalizationKind, analyze
from pyfuser.scheduler.reduction_schedule import (
    ReductionParams,
    checked_analysis,
    inner_params,
    schedule_segment,
    size_hints,
)
from pyfuser.scheduler.registry import FusionLike, Scheduler, SchedulerType, SizeHints

KINDS = (NormalizationKind.inner_persistent,)


def can_schedule(fusion: FusionLike) -> tuple[bool, str]:
    analysis, reason = analyze(fusion)
    if analysis is None:
        return False, reason
    if analysis.kind not in KINDS:
        return False, f"not a normalization over the innermost axes: a {analysis.kind.value} segment"
    return True, ""


def compute_heuristics(fusion: FusionLike, inputs: Sequence[Any] | SizeHints = ()) -> ReductionParams:
    analysis = checked_analysis(fusion, KINDS)
    hints = size_hints(fusion, analysis, inputs)
    return inner_params(SchedulerType.inner_persistent, analysis.reference, hints, False)


def schedule(fusion: Fusion, params: ReductionParams) -> None:
    schedule_segment(fusion, params, KINDS)


INNER_PERSISTENT = Scheduler(SchedulerType.inner_persistent, can_schedule, compute_heuristics,  # type: ignore[arg-type]
                             schedule)
