"""Slice, pad and cat: ops that move a producer's elements along an axis.

A consumer's index on a resized axis becomes its producer's through the op: a slice reads
``start + index * step``, a pad and each operand of a cat read ``index - offset``; a pad or a cat
may fall outside its producer there (the generated kernel masks that read and picks the other
value, as nvFuser lowers its resize ops). The code generator indexes with these axes; the pointwise
scheduler uses them to count the producer axes a resize reads into its reference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyfuser.ir.analysis.reshape import reshaped_classes
from pyfuser.ir.base import Expr
from pyfuser.ir.iter_domain import IterDomain
from pyfuser.ir.ops import CatOp, PadOp, SliceOp
from pyfuser.ir.symbolic import SymConst, SymExpr
from pyfuser.ir.tensor_view import TensorView

RESIZE_OPS = (SliceOp, PadOp, CatOp)


@dataclass(frozen=True)
class ResizedAxis:
    """Producer axis ``dim`` read at ``consumer index * step + offset``; ``bounded``: the result may
    fall outside the producer (a pad or cat: the read needs the in-range condition)."""

    dim: int
    step: int
    offset: SymExpr
    bounded: bool


def resized_axes(expr: SliceOp | PadOp | CatOp, operand: int) -> list[ResizedAxis]:
    """How the consumer's indices reach the ``operand``-th tensor input of ``expr`` on the axes it
    resizes: those its logical map leaves out."""
    producer = expr.inputs[operand]
    assert isinstance(producer, TensorView)
    mapped = expr.logical_map(producer)
    dims = [d for d, i in enumerate(producer.get_logical_domain(no_reductions=True)) if i not in mapped]
    if isinstance(expr, SliceOp):
        return [ResizedAxis(d, expr.ranges[d][2], expr.ranges[d][0], False) for d in dims]
    if isinstance(expr, PadOp):
        return [ResizedAxis(d, 1, SymConst(0) - expr.axis_widths(d)[0], True) for d in dims]
    offset: SymExpr = SymConst(0)
    for earlier in expr.inputs[:operand]:
        assert isinstance(earlier, TensorView)
        offset = offset + earlier.get_logical_domain(no_reductions=True)[expr.dim].extent
    return [ResizedAxis(d, 1, SymConst(0) - offset, True) for d in dims]


def resized_classes(exprs: Sequence[Expr], class_of: Callable[[IterDomain], int], allowed: set[int],
                    to_broadcasts: bool = True) -> set[int]:
    """``allowed`` (ID classes of a kernel's reference) grown by the producer axes resize ops read
    into them, consumers before producers (``exprs`` in definition order, walked backwards). A
    producer axis resized to a broadcast (a slice or pad to one element) is read at one index and
    needs no loop of the reference's: it is grown too, unless not ``to_broadcasts``."""
    grown = set(allowed)
    for expr in reversed(exprs):
        if not isinstance(expr, RESIZE_OPS):
            continue
        out_ids = expr.output.get_logical_domain(no_reductions=True)
        for k, v in enumerate(expr.tensor_inputs):
            p_ids = v.get_logical_domain(no_reductions=True)
            for axis in resized_axes(expr, k):
                if (to_broadcasts and out_ids[axis.dim].is_broadcast()) or class_of(out_ids[axis.dim]) in grown:
                    grown.add(class_of(p_ids[axis.dim]))
    return grown


def readable_classes(exprs: Sequence[Expr], class_of: Callable[[IterDomain], int], iterated: set[int]) -> set[int]:
    """The ID classes a kernel iterating ``iterated`` reads: grown by the producer axes resize ops shift
    into them and the axes of reshapes' operands read at indices computed from their results', until
    neither adds one."""
    readable = set(iterated)
    while True:
        grown = reshaped_classes(exprs, class_of, resized_classes(exprs, class_of, readable))
        if grown == readable:
            return readable
        readable = grown
