"""The expression-evaluator scheduler: a segment run as ATen calls, one per expr.

It accepts anything (it is every other scheduler's fallback, and the executor on CPU), needs no
heuristics and transforms nothing: the evaluator calls each op's torch reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyfuser.ir.fusion import Fusion
from pyfuser.scheduler.registry import Scheduler, SchedulerType


@dataclass(frozen=True)
class ExprEvalParams:
    def __str__(self) -> str:
        return "ExprEvalParams()"


def can_schedule(fusion: Fusion) -> tuple[bool, str]:
    return True, ""


def compute_heuristics(fusion: Fusion, inputs: Sequence[Any]) -> ExprEvalParams:
    return ExprEvalParams()


def schedule(fusion: Fusion, params: ExprEvalParams) -> None:
    """Nothing to transform: ATen computes each expr whole."""


EXPR_EVAL = Scheduler(SchedulerType.expr_eval, can_schedule, compute_heuristics, schedule)
