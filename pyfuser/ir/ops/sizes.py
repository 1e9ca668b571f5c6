"""Sizes as values: ``fd.ops.size`` / ``tv.shape()`` and integer arithmetic on sizes.

An integer scalar computed from sizes and constants stands for a size expression
(``Scalar.extent_expr``), known before any op runs: it can size another op (reshape to a computed
shape, dynamic pad widths and slice bounds). Used as a value it evaluates from the bound sizes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from pyfuser.ir.base import Expr, PythonCall, Scalar, Val
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.ops.common import header
from pyfuser.ir.ops.pointwise import BinaryOpType
from pyfuser.ir.symbolic import SymExpr, binary, sym_call

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion
    from pyfuser.ir.tensor_view import TensorView

#: Integer scalar arithmetic that is size arithmetic, as the symbolic operator it builds
#: (``div`` truncates, as nvFuser's extents and integer ``div`` do).
EXTENT_ARITHMETIC = {BinaryOpType.add: "+", BinaryOpType.sub: "-", BinaryOpType.mul: "*",
                     BinaryOpType.div: "/", BinaryOpType.maximum: "max", BinaryOpType.minimum: "min"}


def size_expression(kind: Any, operands: Sequence[Val]) -> SymExpr | None:
    """The size expression ``kind(operands)`` stands for, when all are integer sizes or constants."""
    op = EXTENT_ARITHMETIC.get(kind)
    if op is None or len(operands) != 2:
        return None
    sizes = [v for v in operands if isinstance(v, Scalar) and v.dtype.is_integral and v.is_size_like]
    if len(sizes) != len(operands):
        return None
    a, b = (v.as_extent() for v in sizes)
    return binary(op, a, b)


def host_expression(label: str, fn: Callable[..., torch.Tensor], operands: Sequence[Val],
                    out_dtype: DataType) -> SymExpr | None:
    """``fn`` (a torch reference) of scalars whose values are known before any op runs, as a host
    expression in ``out_dtype`` (nvFuser evaluates such scalar graphs on the host, so they can size
    ops); None when an operand is not known before ops run."""
    scalars = [v for v in operands if isinstance(v, Scalar)]
    if len(scalars) != len(operands):
        return None
    exprs = [e for v in scalars if (e := v.host_expr()) is not None]
    if len(exprs) != len(scalars):
        return None
    dtypes = [v.dtype.torch_dtype for v in operands]

    def apply(*values: Any) -> Any:
        result = fn(*(torch.tensor(x, dtype=dt) for x, dt in zip(values, dtypes, strict=True)))
        return result.to(out_dtype.torch_dtype).item()

    return sym_call(label, tuple(v.dtype.name for v in operands), out_dtype.name, apply, tuple(exprs))


class SizeOp(Expr):
    """``out = tv.size(dim)``: the (global) extent of a logical axis, from the bound sizes.

    The tensor is an attribute, not an input: the value needs no data of it, so reading a size
    never orders the op after the tensor's producer.
    """

    def __init__(self, fusion: Fusion, out: Scalar, tv: TensorView, dim: int) -> None:
        super().__init__(fusion, [], [out])
        self.tv = tv
        self.dim = dim
        self.extent = tv.get_logical_domain(no_reductions=True)[dim].extent
        out.extent_expr = self.extent

    def evaluate(self, ctx: EvalContext) -> list[Any]:
        return [self.extent.evaluate(ctx.env)]

    def python_call(self) -> PythonCall:
        return PythonCall("size", (self.tv,), {"dim": self.dim})

    def to_string(self, indent: int = 0) -> str:
        return f"{header(self.outputs[0], indent)}size( {self.tv}, dim = {self.dim} ) = {self.extent};\n"
