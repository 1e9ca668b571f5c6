"""Pointwise ops of ``fd.ops``: every kind of ``UnaryOpType`` / ``BinaryOpType`` / ``TernaryOpType``
as a method, with torch's broadcasting and type promotion (the kind's torch reference decides the
output dtype)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import torch

from pyfuser.frontend.ops_base import Operand, OpsBase, PointwiseResult
from pyfuser.ir.base import Scalar
from pyfuser.ir.dtypes import DataType, as_data_type
from pyfuser.ir.iter_domain import IterType
from pyfuser.ir.ops import BinaryOp, BinaryOpType, TernaryOp, TernaryOpType, UnaryOp, UnaryOpType
from pyfuser.ir.ops.promotion import result_dtype
from pyfuser.ir.ops.sizes import host_expression, size_expression
from pyfuser.ir.tensor_view import TensorView

Kind = UnaryOpType | BinaryOpType | TernaryOpType


class PointwiseOps(OpsBase):
    def _pointwise(self, kind: Kind, operands: Sequence[Any], dtype: DataType | None = None) -> PointwiseResult:
        """``dtype``: the result dtype when the op decides it otherwise than its torch reference."""
        op = kind.name
        for k, x in enumerate(operands):
            self._check_operand(x, f"{op} operand {k}")
        tensors = [x for x in operands if isinstance(x, TensorView)]
        fn = kind.spec.fn
        assert fn is not None  # only cast has no reference, and it does not come through here
        probed = result_dtype(fn, operands)  # also rejects operands torch's op does not take
        dtype = probed if dtype is None else dtype
        expanded = self._expanded_positions(tensors) if tensors else {}
        extents = self._pointwise_extents(op, tensors, expanded) if tensors else []
        operands = self._meet_expanded(list(operands), extents, expanded)
        vals = [self._val(x, f"{op} operand {k}") for k, x in enumerate(operands)]
        if tensors:
            vals = [self._broadcast_to_rank(v, len(extents)) if isinstance(v, TensorView) else v for v in vals]
            ids = [self._id(1, IterType.Broadcast) if e is None else self._id(e) for e in extents]
            out: PointwiseResult = self._new_tv(ids, dtype)
        else:
            out = Scalar(self._fusion, dtype)
            # size arithmetic, and other arithmetic of values known before any op runs, can size other ops
            out.extent_expr = size_expression(kind, vals) or host_expression(op, fn, vals, dtype)
        if isinstance(kind, UnaryOpType):
            UnaryOp(self._fusion, kind, out, vals[0])
            return out
        expr: BinaryOp | TernaryOp = BinaryOp(self._fusion, kind, out, vals[0], vals[1]) \
            if isinstance(kind, BinaryOpType) else TernaryOp(self._fusion, kind, out, vals[0], vals[1], vals[2])
        # torch promotes a 0-dim tensor like a number; the evaluator must see it as one.
        expr.number_like = tuple(k for k, x in enumerate(operands)
                                 if isinstance(x, TensorView) and x.ndim == 0 and extents)
        return out

    @overload
    def cast(self, x: TensorView, dtype: DataType | torch.dtype) -> TensorView: ...

    @overload
    def cast(self, x: Scalar | int | float | bool | complex, dtype: DataType | torch.dtype) -> Scalar: ...

    def cast(self, x: Operand, dtype: DataType | torch.dtype) -> PointwiseResult:
        """``x`` as ``dtype``: a tensor of a tensor, a scalar of a scalar."""
        target = as_data_type(dtype)
        val = self._val(x, "cast")
        if isinstance(val, TensorView):
            ids = [self._id(i.extent, i.iter_type) for i in val.get_logical_domain(no_reductions=True)]
            out: PointwiseResult = self._new_tv(ids, target)
        else:
            out = Scalar(self._fusion, target)
            out.extent_expr = host_expression("cast", lambda x: x, [val], target)
        UnaryOp(self._fusion, UnaryOpType.cast, out, val)
        return out

    # --- unary ---------------------------------------------------------------------------------------
    def neg(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.neg, [x])

    def abs(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.abs, [x])

    def exp(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.exp, [x])

    def log(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.log, [x])

    def sqrt(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.sqrt, [x])

    def rsqrt(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.rsqrt, [x])

    def reciprocal(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.reciprocal, [x])

    def sin(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.sin, [x])

    def cos(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.cos, [x])

    def tanh(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.tanh, [x])

    def sigmoid(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.sigmoid, [x])

    def relu(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.relu, [x])

    def silu(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.silu, [x])

    def erf(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.erf, [x])

    def logical_not(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.logical_not, [x])

    def bitwise_not(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.bitwise_not, [x])

    def acos(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.acos, [x])

    def acosh(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.acosh, [x])

    def asin(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.asin, [x])

    def asinh(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.asinh, [x])

    def atan(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.atan, [x])

    def atanh(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.atanh, [x])

    def cosh(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.cosh, [x])

    def sinh(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.sinh, [x])

    def tan(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.tan, [x])

    def ceil(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.ceil, [x])

    def floor(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.floor, [x])

    def round(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.round, [x])

    def trunc(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.trunc, [x])

    def frac(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.frac, [x])

    def sign(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.sign, [x])

    def signbit(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.signbit, [x])

    def exp2(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.exp2, [x])

    def expm1(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.expm1, [x])

    def log2(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.log2, [x])

    def log10(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.log10, [x])

    def log1p(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.log1p, [x])

    def lgamma(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.lgamma, [x])

    def erfc(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.erfc, [x])

    def erfinv(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.erfinv, [x])

    def erfcinv(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.erfcinv, [x])

    def isfinite(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.isfinite, [x])

    def isinf(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.isinf, [x])

    def isnan(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.isnan, [x])

    def isneginf(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.isneginf, [x])

    def isposinf(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.isposinf, [x])

    def isreal(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.isreal, [x])

    def real(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.real, [x])

    def imag(self, x: Operand) -> PointwiseResult:
        return self._pointwise(UnaryOpType.imag, [x])

    def gelu(self, x: Operand, approximate: str = "none") -> PointwiseResult:
        if approximate not in ("none", "tanh"):
            raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        return self._pointwise(UnaryOpType.gelu if approximate == "none" else UnaryOpType.gelu_tanh, [x])

    # --- binary --------------------------------------------------------------------------------------
    def add(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.add, [a, b])

    def sub(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.sub, [a, b])

    def mul(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.mul, [a, b])

    def div(self, a: Operand, b: Operand) -> PointwiseResult:
        """nvFuser's ``div``: true division for floating operands, truncation for integers."""
        return self._pointwise(BinaryOpType.div, [a, b])

    def truediv(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.truediv, [a, b])

    def pow(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.pow, [a, b])

    def maximum(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.maximum, [a, b])

    def minimum(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.minimum, [a, b])

    def eq(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.eq, [a, b])

    def ne(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.ne, [a, b])

    def lt(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.lt, [a, b])

    def le(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.le, [a, b])

    def gt(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.gt, [a, b])

    def ge(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.ge, [a, b])

    def logical_and(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.logical_and, [a, b])

    def logical_or(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.logical_or, [a, b])

    def bitwise_and(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.bitwise_and, [a, b])

    def bitwise_or(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.bitwise_or, [a, b])

    def bitwise_xor(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.bitwise_xor, [a, b])

    def bitwise_left_shift(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.bitwise_left_shift, [a, b])

    def bitwise_right_shift(self, a: Operand, b: Operand) -> PointwiseResult:
        """arithmetic (sign-extending) right shift"""
        return self._pointwise(BinaryOpType.bitwise_right_shift, [a, b])

    def logical_right_shift(self, a: Operand, b: Operand) -> PointwiseResult:
        """right shift filling with zeros (nvFuser's, for signed integers too)"""
        return self._pointwise(BinaryOpType.logical_right_shift, [a, b])

    def gcd(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.gcd, [a, b])

    def nextafter(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.nextafter, [a, b])

    def atan2(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.atan2, [a, b])

    def fmod(self, a: Operand, b: Operand) -> PointwiseResult:
        return self._pointwise(BinaryOpType.fmod, [a, b])

    def mod(self, a: Operand, b: Operand) -> PointwiseResult:
        """C's remainder (the dividend's sign), as ``fmod``"""
        return self._pointwise(BinaryOpType.mod, [a, b])

    def remainder(self, a: Operand, b: Operand) -> PointwiseResult:
        """Python's remainder (the divisor's sign)"""
        return self._pointwise(BinaryOpType.remainder, [a, b])

    def complex(self, a: Operand, b: Operand) -> PointwiseResult:
        """A complex value from real part ``a`` and imaginary part ``b`` (one floating dtype)."""
        return self._pointwise(BinaryOpType.complex, [a, b])

    # --- ternary -------------------------------------------------------------------------------------
    def where(self, cond: Operand, a: Operand, b: Operand) -> PointwiseResult:
        """``a`` where ``cond`` else ``b``. When both branches are scalars (Python numbers are Double,
        Int, Bool and ComplexDouble scalars), the result has their promoted dtype, as nvFuser's
        ``where``: ``where(t, 3.0, 5.0)`` is a double tensor where ``torch.where`` gives float32.
        Otherwise torch's promotion."""
        branches = [a, b]
        if not any(isinstance(x, TensorView) for x in branches):
            for k, x in enumerate(branches):
                self._check_operand(x, f"where operand {k + 1}")
            return self._pointwise(TernaryOpType.where, [cond, a, b], result_dtype(torch.add, branches))
        return self._pointwise(TernaryOpType.where, [cond, a, b])

    def clamp(self, x: Operand, min: Operand, max: Operand) -> PointwiseResult:  # torch's argument names
        return self._pointwise(TernaryOpType.clamp, [x, min, max])

    def lerp(self, start: Operand, end: Operand, weight: Operand) -> PointwiseResult:
        return self._pointwise(TernaryOpType.lerp, [start, end, weight])

    def threshold(self, x: Operand, threshold: Operand, value: Operand) -> PointwiseResult:
        """``x`` where ``x > threshold``, else ``value``."""
        return self._pointwise(TernaryOpType.threshold, [x, threshold, value])

    def addcmul(self, arg1: Operand, arg2: Operand, arg3: Operand, value: Operand) -> PointwiseResult:
        """``arg1 + value * arg2 * arg3``, built from ``mul`` and ``add`` as nvFuser builds it."""
        return self.add(arg1, self.mul(self.mul(arg2, arg3), value))
