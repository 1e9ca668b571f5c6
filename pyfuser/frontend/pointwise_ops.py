"""Pointwise ops of ``fd.ops``: every kind of ``UnaryOpType`` / ``BinaryOpType`` / ``TernaryOpType``
as a method, with torch's broadcasting and type promotion (the kind's torch reference decides the
output dtype)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pyfuser.frontend.ops_base import Operand, OpsBase
from pyfuser.ir.base import Scalar, Val
from pyfuser.ir.dtypes import DataType, as_data_type
from pyfuser.ir.iter_domain import IterType
from pyfuser.ir.ops import BinaryOp, BinaryOpType, TernaryOp, TernaryOpType, UnaryOp, UnaryOpType
from pyfuser.ir.ops.promotion import result_dtype
from pyfuser.ir.tensor_view import TensorView

Kind = UnaryOpType | BinaryOpType | TernaryOpType


class PointwiseOps(OpsBase):
    def _pointwise(self, kind: Kind, operands: Sequence[Any]) -> Val:
        op = kind.name
        for k, x in enumerate(operands):
            self._check_operand(x, f"{op} operand {k}")
        tensors = [x for x in operands if isinstance(x, TensorView)]
        fn = kind.spec.fn
        assert fn is not None  # only cast has no reference, and it does not come through here
        dtype = result_dtype(fn, operands)
        extents = self._pointwise_extents(op, tensors) if tensors else []
        vals = [self._val(x, f"{op} operand {k}") for k, x in enumerate(operands)]
        if tensors:
            vals = [self._broadcast_to_rank(v, len(extents)) if isinstance(v, TensorView) else v for v in vals]
            out: Val = self._new_tv([self._id(1, IterType.Broadcast) if e is None else self._id(e) for e in extents],
                                    dtype)
        else:
            out = Scalar(self._fusion, dtype)
        if isinstance(kind, UnaryOpType):
            UnaryOp(self._fusion, kind, out, vals[0])
            return out
        expr: BinaryOp | TernaryOp = BinaryOp(self._fusion, kind, out, vals[0], vals[1]) \
            if isinstance(kind, BinaryOpType) else TernaryOp(self._fusion, kind, out, vals[0], vals[1], vals[2])
        # torch promotes a 0-dim tensor like a number; the evaluator must see it as one.
        expr.number_like = tuple(k for k, x in enumerate(operands)
                                 if isinstance(x, TensorView) and x.ndim == 0 and extents)
        return out

    def cast(self, x: Operand, dtype: DataType | torch.dtype) -> Val:
        target = as_data_type(dtype)
        val = self._val(x, "cast")
        if isinstance(val, TensorView):
            out: Val = self._new_tv([self._id(i.extent, i.iter_type) for i in val.get_logical_domain(no_reductions=True)],
                                    target)
        else:
            out = Scalar(self._fusion, target)
        UnaryOp(self._fusion, UnaryOpType.cast, out, val)
        return out

    # --- unary ---------------------------------------------------------------------------------------
    def neg(self, x: Operand) -> Val:
        return self._pointwise(UnaryOpType.neg, [x])

    def abs(self, x: Operand) -> Val:
        return self._pointwise(UnaryOpType.abs, [x])

    def exp(self, x: Operand) -> Val:
        return self._pointwise(UnaryOpType.exp, [x])

    def log(self, x: Operand) -> Val:
        return self._pointwise(UnaryOpType.log, [x])

    def sqrt(self, x: Operand) -> Val:
        return self._pointwise(UnaryOpType.sqrt, [x])

    def rsqrt(self, x: Operand) -> Val:
        return self._pointwise(UnaryOpType.rsqrt, [x])

    def reciprocal(self, x: Operand) -> Val:
        return self._pointwise(UnaryOpType.reciprocal, [x])

    def sin(self, x: Operand) -> Val:
        return self._pointwise(UnaryOpType.sin, [x])

    def cos(self, x: Operand) -> Val:
        return self._pointwise(UnaryOpType.cos, [x])

    def tanh(self, x: Operand) -> Val:
        return self._pointwise(UnaryOpType.tanh, [x])

    def sigmoid(self, x: Operand) -> Val:
        return self._pointwise(UnaryOpType.sigmoid, [x])

    def relu(self, x: Operand) -> Val:
        return self._pointwise(UnaryOpType.relu, [x])

    def silu(self, x: Operand) -> Val:
        return self._pointwise(UnaryOpType.silu, [x])

    def erf(self, x: Operand) -> Val:
        return self._pointwise(UnaryOpType.erf, [x])

    def logical_not(self, x: Operand) -> Val:
        return self._pointwise(UnaryOpType.logical_not, [x])

    def gelu(self, x: Operand, approximate: str = "none") -> Val:
        if approximate not in ("none", "tanh"):
            raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        return self._pointwise(UnaryOpType.gelu if approximate == "none" else UnaryOpType.gelu_tanh, [x])

    # --- binary --------------------------------------------------------------------------------------
    def add(self, a: Operand, b: Operand) -> Val:
        return self._pointwise(BinaryOpType.add, [a, b])

    def sub(self, a: Operand, b: Operand) -> Val:
        return self._pointwise(BinaryOpType.sub, [a, b])

    def mul(self, a: Operand, b: Operand) -> Val:
        return self._pointwise(BinaryOpType.mul, [a, b])

    def div(self, a: Operand, b: Operand) -> Val:
        """nvFuser's ``div``: true division for floating operands, truncation for integers."""
        return self._pointwise(BinaryOpType.div, [a, b])

    def truediv(self, a: Operand, b: Operand) -> Val:
        return self._pointwise(BinaryOpType.truediv, [a, b])

    def pow(self, a: Operand, b: Operand) -> Val:
        return self._pointwise(BinaryOpType.pow, [a, b])

    def maximum(self, a: Operand, b: Operand) -> Val:
        return self._pointwise(BinaryOpType.maximum, [a, b])

    def minimum(self, a: Operand, b: Operand) -> Val:
        return self._pointwise(BinaryOpType.minimum, [a, b])

    def eq(self, a: Operand, b: Operand) -> Val:
        return self._pointwise(BinaryOpType.eq, [a, b])

    def ne(self, a: Operand, b: Operand) -> Val:
        return self._pointwise(BinaryOpType.ne, [a, b])

    def lt(self, a: Operand, b: Operand) -> Val:
        return self._pointwise(BinaryOpType.lt, [a, b])

    def le(self, a: Operand, b: Operand) -> Val:
        return self._pointwise(BinaryOpType.le, [a, b])

    def gt(self, a: Operand, b: Operand) -> Val:
        return self._pointwise(BinaryOpType.gt, [a, b])

    def ge(self, a: Operand, b: Operand) -> Val:
        return self._pointwise(BinaryOpType.ge, [a, b])

    def logical_and(self, a: Operand, b: Operand) -> Val:
        return self._pointwise(BinaryOpType.logical_and, [a, b])

    def logical_or(self, a: Operand, b: Operand) -> Val:
        return self._pointwise(BinaryOpType.logical_or, [a, b])

    # --- ternary -------------------------------------------------------------------------------------
    def where(self, cond: Operand, a: Operand, b: Operand) -> Val:
        return self._pointwise(TernaryOpType.where, [cond, a, b])

    def clamp(self, x: Operand, min: Operand, max: Operand) -> Val:  # torch's argument names
        return self._pointwise(TernaryOpType.clamp, [x, min, max])
