"""The expression-evaluator scheduler: a segment run as ATen calls, one per expr.

It takes the ops no kernel scheduler computes (matmul, linear, reshape, slice, cat, pad,
reductions until a reduction scheduler takes them); the segmenter also falls back to it for any
segment no kernel scheduler accepts, and on CPU it is the default executor and the oracle. It needs
no heuristics and transforms nothing: the evaluator calls each op's torch reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyfuser.codegen.support import unsupported_in_pointwise_kernel
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.ops import ReshapeOp
from pyfuser.scheduler.registry import FusionLike, Scheduler, SchedulerType, SizeHints


@dataclass(frozen=True)
class ExprEvalParams:
    scheduler_type: SchedulerType = SchedulerType.expr_eval
    num_warps: int = 0

    def __str__(self) -> str:
        return "===== ExprEval Parameters ========\n(ATen calls)\n"


def can_schedule(fusion: FusionLike) -> tuple[bool, str]:
    exprs = fusion.exprs()
    # a reshape is a view ATen takes as well (one a kernel computes is fused with its neighbours)
    kernel_ops = [e for e in exprs if unsupported_in_pointwise_kernel(e) is None and not isinstance(e, ReshapeOp)]
    if exprs and not kernel_ops:
        return True, ""
    names = ", ".join(e.op_description for e in kernel_ops) or "nothing"
    return False, f"a generated kernel computes {names}; the expression evaluator takes ATen-only ops"


def compute_heuristics(fusion: FusionLike, inputs: Sequence[Any] | SizeHints = ()) -> ExprEvalParams:
    return ExprEvalParams()


def schedule(fusion: Fusion, params: ExprEvalParams) -> None:
    """Nothing to transform: ATen computes each expr whole."""


EXPR_EVAL = Scheduler(SchedulerType.expr_eval, can_schedule, compute_heuristics, schedule, size_dependent=False, is_kernel=False)
