"""Slice, pad and cat: ops that move a producer's elements along an axis.

A consumer's index on a resized axis becomes its producer's through the op: a slice reads
``start + index * step``, a pad and each operand of a cat read ``index - offset``; a pad or a cat
may fall outside its producer there (the generated kernel masks that read and picks the other
value, as nvFuser lowers its resize ops). The code generator indexes with these axes; the pointwise
scheduler uses them to count the producer axes a resize reads into its reference.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyfuser.ir.analysis.reshape import reshaped_classes
from pyfuser.ir.base import Expr
from pyfuser.ir.iter_domain import IterDomain
from pyfuser.ir.ops import BinaryOp, BinaryOpType, CatOp, PadOp, SliceOp, UnaryOp, UnaryOpType
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


#: Pointwise kinds whose libdevice routines take tens of instructions an element (a range reduction, a
#: polynomial), against one or two for arithmetic: what makes computing a cat's part for lanes outside it
#: cost more than a branch.
TRANSCENDENTAL = frozenset({
    UnaryOpType.exp, UnaryOpType.log, UnaryOpType.sin, UnaryOpType.cos, UnaryOpType.tanh, UnaryOpType.sigmoid,
    UnaryOpType.silu, UnaryOpType.gelu, UnaryOpType.gelu_tanh, UnaryOpType.erf, UnaryOpType.acos,
    UnaryOpType.acosh, UnaryOpType.asin, UnaryOpType.asinh, UnaryOpType.atan, UnaryOpType.atanh, UnaryOpType.cosh,
    UnaryOpType.sinh, UnaryOpType.tan, UnaryOpType.exp2, UnaryOpType.expm1, UnaryOpType.log2, UnaryOpType.log10,
    UnaryOpType.log1p, UnaryOpType.lgamma, UnaryOpType.erfc, UnaryOpType.erfinv, UnaryOpType.erfcinv})


def costly_part(expr: PadOp | CatOp, operand: int) -> bool:
    """Whether the ``operand``-th input of a pad or cat is computed (inside its fusion) with a transcendental
    op (``TRANSCENDENTAL``, ``pow``): a kernel computing it only where some lane of its tile is inside that
    part saves the op on every other lane (rotary embeddings' backward into a fused q / k / v projection: each
    part's cosines and sines)."""
    stack = [expr.inputs[operand]]
    seen: set[int] = set()
    while stack:
        val = stack.pop()
        if id(val) in seen or val.definition is None:
            continue
        seen.add(id(val))
        definition = val.definition
        if isinstance(definition, UnaryOp) and definition.kind in TRANSCENDENTAL:
            return True
        if isinstance(definition, BinaryOp) and definition.kind is BinaryOpType.pow:
            return True
        stack.extend(definition.inputs)
    return False


def resized_part_starts(expr: PadOp | CatOp) -> dict[int, list[int | None]]:
    """Per output axis a pad or cat resizes: where its parts begin and end along it (a cat's operands' offsets
    and its extent; a pad's left width, the operand's end and the extent), None where not static."""
    out = expr.output.get_logical_domain(no_reductions=True)
    starts: dict[int, list[int | None]] = {}
    for k in range(len(expr.tensor_inputs)):
        for axis in resized_axes(expr, k):
            operand = expr.tensor_inputs[k].get_logical_domain(no_reductions=True)[axis.dim]
            begin = (SymConst(0) - axis.offset).value
            end = begin + operand.extent.value if begin is not None and operand.extent.value is not None else None
            starts.setdefault(axis.dim, []).extend([begin, end, out[axis.dim].extent.value])
    return starts


#: The shortest part (along its resized axis) of a pad or cat whose costly parts a kernel branches on
#: (``branched_parts``): finer parts (a rotary embedding's halves of a head) share every tile.
MIN_BRANCHED_PART = 256


def branched_parts(expr: PadOp | CatOp) -> frozenset[int]:
    """The operands of ``expr`` a kernel computes each under a branch on its tile having a lane inside their
    part: its costly ones (``costly_part``), where its parts along every resized axis are static and at least
    ``MIN_BRANCHED_PART`` elements long (else none)."""
    costly = frozenset(k for k in range(len(expr.tensor_inputs)) if costly_part(expr, k))
    if not costly:
        return costly
    for starts in resized_part_starts(expr).values():
        if any(s is None for s in starts):
            return frozenset()
        bounds = sorted({s for s in starts if s is not None})
        if any(b - a < MIN_BRANCHED_PART for a, b in itertools.pairwise(bounds)):
            return frozenset()
    return costly
