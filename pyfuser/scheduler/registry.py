"""The schedulers, by type, and how a segment finds one that accepts it.

Every scheduler module has the same three entry points (nvFuser's ``registry.h``):

* ``can_schedule(fusion) -> (bool, reason)``: whether it can run this segment, and why not;
* ``compute_heuristics(fusion, inputs) -> params``: a frozen, printable dataclass that is also
  the kernel cache key (``PYFUSER_DUMP=scheduler_params``);
* ``schedule(fusion, params)``: transform the segment's loop domains with the same public API a
  user calls. It never writes kernel text: the code generator turns the scheduled segment into
  a kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from pyfuser.ir.fusion import Fusion


class SchedulerType(Enum):
    """nvFuser's member names, so code that names a scheduler reads the same."""

    #: the segment runs as ATen calls, one per expr (matmul, linear, and what no kernel takes)
    expr_eval = "expr_eval"
    #: a resharding ``set``: a collective between ranks
    communication = "communication"


class SchedulerParams(Protocol):
    """What ``compute_heuristics`` returns: printable and hashable (the kernel cache key)."""

    def __hash__(self) -> int: ...


@dataclass(frozen=True)
class Scheduler:
    """One scheduler: its type and its three entry points."""

    type: SchedulerType
    can_schedule: Callable[[Fusion], tuple[bool, str]]
    compute_heuristics: Callable[[Fusion, Sequence[Any]], SchedulerParams]
    schedule: Callable[[Fusion, Any], None]
