"""Pointwise ATen ops: each onto the ``fd.ops`` method of the same math.

Type promotion needs no code here: ``fd.ops`` promotes as torch does (it runs the torch reference
on tiny tensors), and the translator checks every result's dtype against the traced one.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from pyfuser.integrations.torch_compile.lowering import Lowering, LoweringContext, arg, meta_of

aten = torch.ops.aten

#: ATen unary op -> the ``fd.ops`` method computing the same function
_UNARY: dict[Any, str] = {
    aten.abs.default: "abs", aten.neg.default: "neg", aten.exp.default: "exp", aten.log.default: "log",
    aten.sqrt.default: "sqrt", aten.rsqrt.default: "rsqrt", aten.reciprocal.default: "reciprocal",
    aten.sin.default: "sin", aten.cos.default: "cos", aten.tan.default: "tan", aten.tanh.default: "tanh",
    aten.sigmoid.default: "sigmoid", aten.relu.default: "relu", aten.silu.default: "silu", aten.erf.default: "erf",
    aten.erfc.default: "erfc", aten.erfinv.default: "erfinv", aten.exp2.default: "exp2", aten.expm1.default: "expm1",
    aten.log2.default: "log2", aten.log10.default: "log10", aten.log1p.default: "log1p",
    aten.lgamma.default: "lgamma", aten.ceil.default: "ceil", aten.floor.default: "floor",
    aten.round.default: "round", aten.trunc.default: "trunc", aten.frac.default: "frac", aten.sign.default: "sign",
    aten.signbit.default: "signbit", aten.asin.default: "asin", aten.acos.default: "acos", aten.atan.default: "atan",
    aten.sinh.default: "sinh", aten.cosh.default: "cosh", aten.asinh.default: "asinh", aten.acosh.default: "acosh",
    aten.atanh.default: "atanh", aten.isnan.default: "isnan", aten.isinf.default: "isinf",
    aten.logical_not.default: "logical_not", aten.bitwise_not.default: "bitwise_not",
}

#: ATen binary op (tensor-tensor and tensor-scalar overloads) -> ``fd.ops`` method
_BINARY: dict[Any, str] = {
    aten.mul.Tensor: "mul", aten.mul.Scalar: "mul",
    aten.div.Tensor: "truediv", aten.div.Scalar: "truediv",
    aten.pow.Tensor_Scalar: "pow", aten.pow.Tensor_Tensor: "pow", aten.pow.Scalar: "pow",
    aten.maximum.default: "maximum", aten.minimum.default: "minimum",
    aten.clamp_min.default: "maximum", aten.clamp_max.default: "minimum",
    aten.eq.Tensor: "eq", aten.eq.Scalar: "eq", aten.ne.Tensor: "ne", aten.ne.Scalar: "ne",
    aten.lt.Tensor: "lt", aten.lt.Scalar: "lt", aten.le.Tensor: "le", aten.le.Scalar: "le",
    aten.gt.Tensor: "gt", aten.gt.Scalar: "gt", aten.ge.Tensor: "ge", aten.ge.Scalar: "ge",
    aten.logical_and.default: "logical_and", aten.logical_or.default: "logical_or",
    aten.bitwise_and.Tensor: "bitwise_and", aten.bitwise_and.Scalar: "bitwise_and",
    aten.bitwise_or.Tensor: "bitwise_or", aten.bitwise_or.Scalar: "bitwise_or",
    aten.bitwise_xor.Tensor: "bitwise_xor", aten.bitwise_xor.Scalar: "bitwise_xor",
    aten.fmod.Tensor: "fmod", aten.fmod.Scalar: "fmod",
    aten.remainder.Tensor: "remainder", aten.remainder.Scalar: "remainder",
    aten.atan2.default: "atan2",
}


def _unary(name: str) -> Lowering:
    return Lowering(lambda ctx, x: getattr(ctx.ops, name)(x))


def _binary(name: str) -> Lowering:
    return Lowering(lambda ctx, a, b: getattr(ctx.ops, name)(a, b))


def _scaled(ctx: LoweringContext, value: Any, alpha: Any) -> Any:
    return value if alpha == 1 else ctx.ops.mul(value, alpha)


def _add(ctx: LoweringContext, a: Any, b: Any, alpha: Any = 1) -> Any:
    return ctx.ops.add(a, _scaled(ctx, b, alpha))


def _sub(ctx: LoweringContext, a: Any, b: Any, alpha: Any = 1) -> Any:
    return ctx.ops.sub(a, _scaled(ctx, b, alpha))


def _rsub(ctx: LoweringContext, a: Any, b: Any, alpha: Any = 1) -> Any:
    return ctx.ops.sub(b, _scaled(ctx, a, alpha))


def _div_mode(ctx: LoweringContext, a: Any, b: Any, rounding_mode: str | None = None) -> Any:
    if rounding_mode is None:
        return ctx.ops.truediv(a, b)
    if ctx.meta.is_floating_point():
        return ctx.ops.trunc(ctx.ops.truediv(a, b))
    quotient = ctx.ops.div(a, b)  # integers: C truncation, as torch's "trunc"
    if rounding_mode == "trunc":
        return quotient
    # "floor" of integers: one less where the division is inexact and the operands' signs differ
    rest = ctx.ops.fmod(a, b)
    inexact_negative = ctx.ops.bitwise_and(ctx.ops.ne(rest, 0), ctx.ops.ne(ctx.ops.lt(rest, 0), ctx.ops.lt(b, 0)))
    return ctx.ops.sub(quotient, ctx.ops.cast(inexact_negative, quotient.dtype))


def _check_div_mode(node: Node) -> str | None:
    mode = arg(node, 2, "rounding_mode")
    if mode not in (None, "trunc", "floor"):
        return f"rounding_mode={mode!r} is not translated (only None, 'trunc' and 'floor')"
    return _check_floor_divide(node) if mode == "floor" else None


def _floor_divide(ctx: LoweringContext, a: Any, b: Any) -> Any:
    return _div_mode(ctx, a, b, "floor")


def _check_floor_divide(node: Node) -> str | None:
    if meta_of(node).is_floating_point():
        return "floor division of floating tensors is not translated (torch's rounding of the quotient)"
    return None


def _gelu(ctx: LoweringContext, x: Any, approximate: str = "none") -> Any:
    return ctx.ops.gelu(x, approximate=approximate)


def _clamp(ctx: LoweringContext, x: Any, min: Any = None, max: Any = None) -> Any:  # torch's names
    if min is not None and max is not None:
        return ctx.ops.clamp(x, min, max)
    if min is not None:
        return ctx.ops.maximum(x, min)
    return ctx.ops.minimum(x, max)


def _check_clamp(node: Node) -> str | None:
    if arg(node, 1, "min") is None and arg(node, 2, "max") is None:
        return "clamp without min or max"
    return None


def _where(ctx: LoweringContext, cond: Any, a: Any, b: Any) -> Any:
    return ctx.ops.where(cond, a, b)


def _lerp(ctx: LoweringContext, start: Any, end: Any, weight: Any) -> Any:
    return ctx.ops.lerp(start, end, weight)


def _addcmul(ctx: LoweringContext, x: Any, t1: Any, t2: Any, value: Any = 1) -> Any:
    return ctx.ops.add(x, _scaled(ctx, ctx.ops.mul(t1, t2), value))


def _addcdiv(ctx: LoweringContext, x: Any, t1: Any, t2: Any, value: Any = 1) -> Any:
    return ctx.ops.add(x, _scaled(ctx, ctx.ops.truediv(t1, t2), value))


def _check_float_operands(node: Node) -> str | None:
    """Ops whose integer form torch computes differently from their floating formula."""
    if not all(getattr(meta_of(a), "is_floating_point", lambda: True)() for a in node.args[:3]):
        return f"{node.target} on integer tensors is not translated"
    return None


POINTWISE_LOWERINGS: dict[Any, Lowering] = {
    **{op: _unary(name) for op, name in _UNARY.items()},
    **{op: _binary(name) for op, name in _BINARY.items()},
    aten.add.Tensor: Lowering(_add), aten.add.Scalar: Lowering(_add),
    aten.sub.Tensor: Lowering(_sub), aten.sub.Scalar: Lowering(_sub),
    aten.rsub.Tensor: Lowering(_rsub), aten.rsub.Scalar: Lowering(_rsub),
    aten.div.Tensor_mode: Lowering(_div_mode, check=_check_div_mode),
    aten.floor_divide.default: Lowering(_floor_divide, check=_check_floor_divide),
    aten.gelu.default: Lowering(_gelu),
    aten.clamp.default: Lowering(_clamp, check=_check_clamp), aten.clamp.Tensor: Lowering(_clamp, check=_check_clamp),
    aten.where.self: Lowering(_where),
    aten.lerp.Scalar: Lowering(_lerp, check=_check_float_operands),
    aten.lerp.Tensor: Lowering(_lerp, check=_check_float_operands),
    aten.addcmul.default: Lowering(_addcmul), aten.addcdiv.default: Lowering(_addcdiv, check=_check_float_operands),
}
