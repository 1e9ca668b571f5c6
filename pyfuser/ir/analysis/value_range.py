"""Bounds of the integer values a fusion computes, where they follow from constants.

An indexed read (gather, index_select, embedding) checks each index against its lookup axis; an index
clamped to that axis (DeBERTa's relative-position buckets: ``clamp(pos + span, 0, 2 * span - 1)``), an
``iota`` of a known length, or arithmetic of such values is in range by construction, and its kernel
needs no check (Inductor drops its ``device_assert`` on the same proof). Only what is certain is
answered: any value whose bounds this does not derive is unknown (None).
"""

from __future__ import annotations

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


def integer_bounds(value: Val, depth: int = 0) -> Bounds | None:
    """``(lo, hi)`` with every element of the integer ``value`` in ``[lo, hi]`` (None: unknown)."""
    if isinstance(value, Scalar):
        constant = value.value if value.is_const else None
        return (constant, constant) if type(constant) is int else None
    if not isinstance(value, TensorView) or not value.dtype.is_integral or depth > _DEPTH:
        return None
    expr = value.definition
    if expr is None:
        return None
    operand = [integer_bounds(v, depth + 1) if v.dtype.is_integral else None for v in expr.inputs]
    if isinstance(expr, _SAME_VALUES):
        return operand[0]
    if isinstance(expr, FullOp):
        return operand[0]
    if isinstance(expr, IotaOp):
        length, start, step = operand
        if length is None or start is None or step is None or length[0] != length[1] or length[0] <= 0:
            return None
        first, last = start[0], start[0] + (length[0] - 1) * step[0]
        span = (min(first, last), max(first, last))
        return span if start[0] == start[1] and step[0] == step[1] and _fits(span, value) else None
    if isinstance(expr, TernaryOp):
        if expr.kind is TernaryOpType.clamp and operand[1] is not None and operand[2] is not None:
            lo, hi = operand[1][0], operand[2][1]  # min(max(x, lo), hi): in [lo, hi], or hi where lo > hi
            return (min(lo, hi), hi)
        if expr.kind is TernaryOpType.where and operand[1] is not None and operand[2] is not None:
            return (min(operand[1][0], operand[2][0]), max(operand[1][1], operand[2][1]))
        return None
    if isinstance(expr, UnaryOp):
        if expr.kind is UnaryOpType.cast:
            return operand[0] if operand[0] is not None and _fits(operand[0], value) else None
        if expr.kind is UnaryOpType.neg and operand[0] is not None:
            return (-operand[0][1], -operand[0][0])
        return None
    if isinstance(expr, BinaryOp) and operand[0] is not None and operand[1] is not None:
        (a0, a1), (b0, b1) = operand[0], operand[1]
        result = {BinaryOpType.add: (a0 + b0, a1 + b1), BinaryOpType.sub: (a0 - b1, a1 - b0),
                  BinaryOpType.maximum: (max(a0, b0), max(a1, b1)),
                  BinaryOpType.minimum: (min(a0, b0), min(a1, b1))}.get(expr.kind)
        return result if result is not None and _fits(result, value) else None
    return None


def _fits(bounds: Bounds, value: TensorView) -> bool:
    """Whether ``value``'s dtype holds every integer in ``bounds`` (no wrap-around)."""
    bits = value.dtype.torch_dtype.itemsize * 8
    signed = value.dtype.torch_dtype.is_signed
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return lo <= bounds[0] and bounds[1] <= hi
