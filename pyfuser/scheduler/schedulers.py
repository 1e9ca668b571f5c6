"""The registry: every scheduler, in the order the segmenter tries them. A new scheduler is a module
whose ``Scheduler(...)`` declares its type and facts, plus one entry in ``ALL_SCHEDULERS``."""

from __future__ import annotations

from pyfuser.scheduler.expr_eval import EXPR_EVAL
from pyfuser.scheduler.inner_outer_persistent import INNER_OUTER_PERSISTENT
from pyfuser.scheduler.inner_persistent import INNER_PERSISTENT
from pyfuser.scheduler.outer_persistent import OUTER_PERSISTENT
from pyfuser.scheduler.pointwise import POINTWISE
from pyfuser.scheduler.reduction import REDUCTION
from pyfuser.scheduler.registry import FusionLike, Scheduler, SchedulerType
from pyfuser.scheduler.scatter import SCATTER
from pyfuser.scheduler.transpose import TRANSPOSE

#: Kernel schedulers first; their ``can_schedule`` exclude each other, so their order is only the
#: order of the reasons a rejected segment prints. ``expr_eval`` takes what none of them does.
ALL_SCHEDULERS: list[Scheduler] = [POINTWISE, TRANSPOSE, REDUCTION, INNER_PERSISTENT, OUTER_PERSISTENT,
                                   INNER_OUTER_PERSISTENT, SCATTER, EXPR_EVAL]

KERNEL_SCHEDULERS: list[Scheduler] = [s for s in ALL_SCHEDULERS if s.is_kernel]

SCHEDULERS: dict[SchedulerType, Scheduler] = {s.type: s for s in ALL_SCHEDULERS}


def is_kernel(scheduler_type: SchedulerType) -> bool:
    """Whether a segment of this type runs as one generated kernel (a communication never does)."""
    scheduler = SCHEDULERS.get(scheduler_type)
    return scheduler is not None and scheduler.is_kernel


def size_dependent(scheduler_type: SchedulerType) -> bool:
    """Whether a segment of this type is scheduled and compiled per size bucket at launch."""
    scheduler = SCHEDULERS.get(scheduler_type)
    return scheduler is not None and scheduler.size_dependent


def kernel_scheduler_for(fusion: FusionLike) -> SchedulerType | None:
    """The kernel scheduler that takes ``fusion`` (a segment, or a part of one), the first in
    ``KERNEL_SCHEDULERS`` order; None: none does (its exprs run as ATen calls)."""
    return next((s.type for s in KERNEL_SCHEDULERS if s.can_schedule(fusion)[0]), None)

