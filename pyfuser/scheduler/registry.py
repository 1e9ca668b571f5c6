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

from pyfuser.ir.base import Expr, Val
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.tensor_view import TensorView


class SchedulerType(Enum):
    """nvFuser's member names, so code that names a scheduler reads the same."""

    #: one generated kernel over the output's iteration space (pointwise, broadcast, shape ops)
    pointwise = "pointwise"
    #: like pointwise, tiled in 2-D where inputs and outputs disagree on the innermost axis
    transpose = "transpose"
    #: the segment runs as ATen calls, one per expr (matmul, linear, and what no kernel takes)
    expr_eval = "expr_eval"
    #: a resharding ``set``: a collective between ranks
    communication = "communication"

    @property
    def is_kernel(self) -> bool:
        return self in (SchedulerType.pointwise, SchedulerType.transpose)


class FusionLike(Protocol):
    """What schedulers read of a fusion: a whole ``Fusion`` or a ``SegmentView`` of one."""

    def inputs(self) -> list[Val]: ...

    def outputs(self) -> list[Val]: ...

    def exprs(self) -> list[Expr]: ...

    def tensors(self) -> list[TensorView]: ...


class SegmentView:
    """Exprs of a larger fusion seen as a fusion of their own, for ``can_schedule`` while segmenting
    (reading only: nothing is copied)."""

    def __init__(self, exprs: Sequence[Expr], inputs: Sequence[Val], outputs: Sequence[Val]) -> None:
        self._exprs = list(exprs)
        self._inputs = list(inputs)
        self._outputs = list(outputs)

    def inputs(self) -> list[Val]:
        return list(self._inputs)

    def outputs(self) -> list[Val]:
        return list(self._outputs)

    def exprs(self) -> list[Expr]:
        return list(self._exprs)

    def tensors(self) -> list[TensorView]:
        seen: dict[int, TensorView] = {}
        for v in self._inputs:
            if isinstance(v, TensorView):
                seen.setdefault(id(v), v)
        for e in self._exprs:
            for v in (*e.inputs, *e.outputs):
                if isinstance(v, TensorView):
                    seen.setdefault(id(v), v)
        return list(seen.values())


class SchedulerParams(Protocol):
    """What ``compute_heuristics`` returns: printable and hashable (the kernel cache key)."""

    def __hash__(self) -> int: ...


@dataclass(frozen=True)
class Scheduler:
    """One scheduler: its type and its three entry points."""

    type: SchedulerType
    can_schedule: Callable[[FusionLike], tuple[bool, str]]
    compute_heuristics: Callable[[FusionLike, Sequence[Any]], SchedulerParams]
    schedule: Callable[[Fusion, Any], None]
