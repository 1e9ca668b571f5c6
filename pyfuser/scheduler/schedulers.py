"""Every scheduler, by type, in the order the segmenter tries the kernel ones."""

from __future__ import annotations

from pyfuser.scheduler.expr_eval import EXPR_EVAL
from pyfuser.scheduler.inner_outer_persistent import INNER_OUTER_PERSISTENT
from pyfuser.scheduler.inner_persistent import INNER_PERSISTENT
from pyfuser.scheduler.outer_persistent import OUTER_PERSISTENT
from pyfuser.scheduler.pointwise import POINTWISE
from pyfuser.scheduler.reduction import REDUCTION
from pyfuser.scheduler.registry import Scheduler, SchedulerType
from pyfuser.scheduler.transpose import TRANSPOSE

#: Kernel schedulers; their ``can_schedule`` exclude each other, so the order is only the order of
#: the reasons a rejected segment prints.
KERNEL_SCHEDULERS: list[Scheduler] = [POINTWISE, TRANSPOSE, REDUCTION, INNER_PERSISTENT, OUTER_PERSISTENT,
                                      INNER_OUTER_PERSISTENT]

SCHEDULERS: dict[SchedulerType, Scheduler] = {s.type: s for s in [*KERNEL_SCHEDULERS, EXPR_EVAL]}
