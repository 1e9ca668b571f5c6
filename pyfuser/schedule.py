"""nvFuser's ``schedule`` module: find, check and apply schedulers by type, and the schedule tools.

``schedule.schedule(fd.fusion, SchedulerType.pointwise, inputs)`` transforms the fusion in place and
returns the heuristics; ``fd.manual_execute(inputs, params)`` then runs it as one kernel.
A public façade over the scheduler layer (nothing below imports it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyfuser.ir.fusion import Fusion
from pyfuser.scheduler.registry import SchedulerParams, SchedulerType
from pyfuser.scheduler.schedulers import KERNEL_SCHEDULERS, SCHEDULERS
from pyfuser.scheduler.tools import inline_at, inline_most, parallelize_like, set_compute_at, transform_like

__all__ = ["SchedulerType", "can_schedule", "compute_heuristics", "find_compatible_schedulers", "inline_at",
           "inline_most", "parallelize_like", "schedule", "set_compute_at", "transform_like"]


# nvFuser's SchedulerType is a pybind11 enum, whose members its scripts list through ``__entries``
# (name -> (member, docstring)); outside a class body the name is not mangled.
SchedulerType.__entries = {t.name: (t, None) for t in SchedulerType}  # type: ignore[attr-defined]  # pybind11 enum API


def _scheduler(scheduler_type: SchedulerType) -> Any:
    if not isinstance(scheduler_type, SchedulerType):
        raise TypeError(f"expected a SchedulerType, got {type(scheduler_type).__name__}")
    if scheduler_type not in SCHEDULERS:
        raise ValueError(f"{scheduler_type.name} is not a scheduler of a fusion (known: "
                         f"{', '.join(t.name for t in SCHEDULERS)})")
    return SCHEDULERS[scheduler_type]


def find_compatible_schedulers(fusion: Fusion, inputs: Sequence[Any] = ()) -> list[SchedulerType]:
    """Every scheduler whose ``can_schedule`` accepts the whole fusion."""
    return [s.type for s in [*KERNEL_SCHEDULERS, SCHEDULERS[SchedulerType.expr_eval]] if s.can_schedule(fusion)[0]]


def can_schedule(fusion: Fusion, scheduler_type: SchedulerType, inputs: Sequence[Any] = ()) -> tuple[bool, str]:
    return _scheduler(scheduler_type).can_schedule(fusion)


def compute_heuristics(fusion: Fusion, scheduler_type: SchedulerType, inputs: Sequence[Any] = ()) -> SchedulerParams:
    return _scheduler(scheduler_type).compute_heuristics(fusion, inputs)


def schedule(fusion: Fusion, scheduler_type: SchedulerType, inputs_or_params: Any = ()) -> SchedulerParams:
    """Schedule ``fusion`` in place with ``scheduler_type``: with inputs, heuristics are computed
    first; with a params object (from ``compute_heuristics``, maybe edited with ``dataclasses.replace``:
    params are frozen, they are the kernel cache key), they are used as given."""
    scheduler = _scheduler(scheduler_type)
    ok, reason = scheduler.can_schedule(fusion)
    if not ok:
        raise ValueError(f"the {scheduler_type.name} scheduler cannot schedule this fusion: {reason}")
    if isinstance(inputs_or_params, (list, tuple)):
        params = scheduler.compute_heuristics(fusion, inputs_or_params)
    else:
        params = inputs_or_params
    scheduler.schedule(fusion, params)
    return params
