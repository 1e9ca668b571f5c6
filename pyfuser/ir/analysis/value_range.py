"""Bounds of the integer values a fusion computes, where they follow from constants.

An indexed read (gather, index_select, embedding) checks each index against its lookup axis; an index
clamped to that axis (DeBERTa's relative-position buckets: ``clamp(pos + span, 0, 2 * span - 1)``), an
``iota`` of a known length, or arithmetic of such values is in range by construction, and its kernel
needs no check (Inductor drops its ``device_assert`` on the same proof). Only what is certain is
answered: any value whose bounds this does not derive is unknown (None).
"""

from __future__ import annotations

from collections.abc import Callable

from pyfuser.ir.base import Scalar, Val
from pyfuser.ir.ops import (
    BinaryOp,
    BinaryOpType,
    BroadcastOp,
    ExpandOp,
    FullOp,
    IotaOp,
    LoadStoreOp,
    PermuteOp,
    SqueezeOp,
    TernaryOp,
    TernaryOpType,
    UnaryOp,
    UnaryOpType,
)
from pyfuser.ir.tensor_view import TensorView

Bounds = tuple[int, int]

#: exprs whose output holds the values of their (first) operand, rearranged
_SAME_VALUES = (BroadcastOp, ExpandOp, SqueezeOp, PermuteOp, LoadStoreOp)
#: how deep a chain of exprs is followed (a value computed further away is unknown)
_DEPTH = 64
#: binary kinds whose bounds follow from their operands'
_BINARY: dict[BinaryOpType, Callable[[Bounds, Bounds], Bounds]] = {
    BinaryOpType.add: lambda a, b: (a[0] + b[0], a[1] + b[1]),
    BinaryOpType.sub: lambda a, b: (a[0] - b[1], a[1] - b[0]),
    BinaryOpType.maximum: lambda a, b: (max(a[0], b[0]), max(a[1], b[1])),
    BinaryOpType.minimum: lambda a, b: (min(a[0], b[0]), min(a[1], b[1])),
}


def integer_bounds(value: Val) -> Bounds | None:
    """``(lo, hi)`` with every element of the integer ``value`` in ``[lo, hi]`` (None: unknown)."""
    return _bounds(value, {}, 0)


def _bounds(value: Val, known: dict[int, Bounds | None], depth: int) -> Bounds | None:
    """``integer_bounds``; ``known``: the values of this query already bounded (a value several exprs of
    the chain read is bounded once), each operand bounded only where the expr's rule reads it."""
    if isinstance(value, Scalar):
        constant = value.value if value.is_const else None
        return (constant, constant) if type(constant) is int else None
    if not isinstance(value, TensorView) or not value.dtype.is_integral or depth > _DEPTH:
        return None
    expr = value.definition
    if expr is None:
        return None
    if id(value) not in known:
        known[id(value)] = _expr_bounds(value, lambda k: _bounds(expr.inputs[k], known, depth + 1))
    return known[id(value)]


def _expr_bounds(value: TensorView, operand: Callable[[int], Bounds | None]) -> Bounds | None:
    """The bounds of ``value`` from those of its definition's operands (``operand(k)``: the k-th's)."""
    expr = value.definition
    assert expr is not None  # (_bounds asks only for defined values)
    if isinstance(expr, (*_SAME_VALUES, FullOp)):
        return operand(0)
    if isinstance(expr, IotaOp):
        length, start, step = operand(0), operand(1), operand(2)
        if length is None or start is None or step is None or length[0] != length[1] or length[0] <= 0:
            return None
        first, last = start[0], start[0] + (length[0] - 1) * step[0]
        span = (min(first, last), max(first, last))
        return span if start[0] == start[1] and step[0] == step[1] and _fits(span, value) else None
    if isinstance(expr, TernaryOp) and expr.kind in (TernaryOpType.clamp, TernaryOpType.where):
        low, high = operand(1), operand(2)  # (clamp's bounds; where's two sides)
        if low is None or high is None:
            return None
        if expr.kind is TernaryOpType.clamp:  # min(max(x, lo), hi): in [lo, hi], or hi where lo > hi
            return (min(low[0], high[1]), high[1])
        return (min(low[0], high[0]), max(low[1], high[1]))
    if isinstance(expr, UnaryOp) and expr.kind in (UnaryOpType.cast, UnaryOpType.neg):
        inner = operand(0)
        if inner is None:
            return None
        if expr.kind is UnaryOpType.neg:
            return (-inner[1], -inner[0])
        return inner if _fits(inner, value) else None
    if isinstance(expr, BinaryOp) and expr.kind in _BINARY:
        a, b = operand(0), operand(1)
        if a is None or b is None:
            return None
        result = _BINARY[expr.kind](a, b)
        return result if _fits(result, value) else None
    return None


def _fits(bounds: Bounds, value: TensorView) -> bool:
    """Whether ``value``'s dtype holds every integer in ``bounds`` (no wrap-around)."""
    bits = value.dtype.torch_dtype.itemsize * 8
    signed = value.dtype.torch_dtype.is_signed
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return lo <= bounds[0] and bounds[1] <= hi
