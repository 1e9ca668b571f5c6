"""Inner or outer reduction, decided by memory order rather than by logical position.

A reduction is *inner* when the innermost axis of its input that occupies memory (not a
broadcast) is reduced: consecutive elements of one reduction are adjacent in memory. Logical
position alone is misleading: ``sum(x[m, n], dim=1)`` is inner for a row-major ``x`` but outer
when ``x`` is column-major (docs/cached_inputs.md names this trap for allocation domains).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from pyfuser.ir.analysis.allocation_order import infer_allocation_orders
from pyfuser.ir.base import Expr
from pyfuser.ir.domain_replay import logical_order
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import IterDomain
from pyfuser.ir.ops import ReductionOp, VarMeanOp


class ReductionKind(Enum):
    inner = "inner"
    outer = "outer"


def reduction_kind(expr: Expr, input_order: Sequence[IterDomain] | None = None) -> ReductionKind:
    """Classify ``expr`` by ``input_order`` (its input's logical IDs outermost first; default:
    the order its allocation domain gives)."""
    if not isinstance(expr, ReductionOp | VarMeanOp):
        raise TypeError(f"reduction_kind expects a reduction, got {type(expr).__name__} producing {expr.output.short_name}")
    producer = expr.tensor_inputs[0]
    order = list(input_order) if input_order is not None else logical_order(producer)
    mapping = expr.logical_map(producer)
    for p in reversed(order):
        if p.is_broadcast() or p.is_reduction():
            continue
        c = mapping.get(p)
        if c is None:
            raise ValueError(f"{expr.output.short_name}: input ID {p} of {producer.short_name} has no counterpart in "
                             "the reduction's output")
        return ReductionKind.inner if c.is_reduction() else ReductionKind.outer
    raise ValueError(f"{expr.output.short_name}: {producer.short_name} has no axis that occupies memory; "
                     "a reduction of broadcasts is neither inner nor outer")


def reduction_kinds(fusion: Fusion) -> dict[Expr, ReductionKind]:
    """Every reduction of ``fusion``, classified by the memory order its input has or inherits
    (inferred from the fusion inputs for intermediates without an allocation domain)."""
    orders = infer_allocation_orders(fusion)
    return {e: reduction_kind(e, orders[id(e.tensor_inputs[0])])
            for e in fusion.exprs() if isinstance(e, ReductionOp | VarMeanOp)}
