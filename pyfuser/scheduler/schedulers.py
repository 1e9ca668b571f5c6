"""Every scheduler, by type, in the order the segmenter tries the kernel ones."""

from __future__ import annotations

from pyfuser.scheduler.expr_eval import EXPR_EVAL
from pyfuser.scheduler.pointwise import POINTWISE
from pyfuser.scheduler.registry import Scheduler, SchedulerType
from pyfuser.scheduler.transpose import TRANSPOSE

#: Kernel schedulers, most specific first is not needed: their ``can_schedule`` exclude each other.
KERNEL_SCHEDULERS: list[Scheduler] = [POINTWISE, TRANSPOSE]

SCHEDULERS: dict[SchedulerType, Scheduler] = {s.type: s for s in [*KERNEL_SCHEDULERS, EXPR_EVAL]}
