"""Pointwise ops: unary, binary and ternary, with torch semantics and type promotion."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from pyfuser.ir.base import Expr, Val, indent_str
from pyfuser.ir.dtypes import python_scalar_type
from pyfuser.ir.ops.common import header, positional_map
from pyfuser.ir.tensor_view import TensorView

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion
    from pyfuser.ir.iter_domain import IterDomain
    from pyfuser.runtime.context import EvalContext


UNARY_FNS: dict[str, Callable[[Any], Any]] = {
    "neg": torch.neg,
    "abs": torch.abs,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal,
    "sin": torch.sin,
    "cos": torch.cos,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "erf": torch.erf,
    "logical_not": torch.logical_not,
}
_UNARY_INLINE = {"neg": "-", "logical_not": "!"}


class UnaryOp(Expr):
    op_name = "unary"

    def __init__(self, fusion: Fusion, op: str, out: TensorView, inp: TensorView) -> None:
        super().__init__(fusion, [inp], [out])
        self.op = op

    def evaluate(self, ctx: EvalContext, x: Any) -> list[Any]:
        if not isinstance(x, torch.Tensor):  # scalar arithmetic
            if self.op == "cast":
                return [python_scalar_type(self.output.dtype)(x)]
            return [UNARY_FNS[self.op](torch.tensor(x)).item()]
        if self.op == "cast":
            return [x.to(self.output.dtype.torch_dtype)]
        return [UNARY_FNS[self.op](x)]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return positional_map(producer, self.output)

    def to_string(self, indent: int = 0) -> str:
        inp = self.inputs[0]
        if self.op == "cast":
            body = f"({self.output.dtype.value})({inp})"
        elif self.op in _UNARY_INLINE:
            body = f"{_UNARY_INLINE[self.op]}{inp}"
        else:
            body = f"{self.op}({inp})"
        return f"{header(self.output, indent)}{body};\n"


def _true_div(a: Any, b: Any) -> Any:
    return torch.true_divide(a, b) if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) else a / b


def _div(a: Any, b: Any) -> Any:
    """nvFuser's ``div``: true division for floating point, truncation for integers."""
    integral = all(not (x.is_floating_point() or x.is_complex()) if isinstance(x, torch.Tensor)
                   else isinstance(x, int) for x in (a, b))
    if not (isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)):
        return int(a / b) if integral else a / b
    return torch.div(a, b, rounding_mode="trunc") if integral else torch.div(a, b)


def _tensor_or_scalar(fn: Callable[[Any, Any], Any], scalar_fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def apply(a: Any, b: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return fn(a, b if isinstance(b, torch.Tensor) else torch.as_tensor(b, device=a.device))
        if isinstance(b, torch.Tensor):
            return fn(torch.as_tensor(a, device=b.device), b)
        return scalar_fn(a, b)
    return apply


BINARY_FNS: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "div": _div,
    "truediv": _true_div,
    "pow": operator.pow,
    "maximum": _tensor_or_scalar(torch.maximum, max),
    "minimum": _tensor_or_scalar(torch.minimum, min),
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "logical_and": _tensor_or_scalar(torch.logical_and, lambda a, b: bool(a) and bool(b)),
    "logical_or": _tensor_or_scalar(torch.logical_or, lambda a, b: bool(a) or bool(b)),
}
_BINARY_INLINE = {"add": "+", "sub": "-", "mul": "*", "div": "/", "truediv": "/", "eq": "==", "ne": "!=",
                  "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "logical_and": "&&", "logical_or": "||"}


def broadcast_checks(a: Val, b: Val) -> list[int]:
    """Dims where both tensor operands iterate, so their runtime sizes must agree."""
    if not (isinstance(a, TensorView) and isinstance(b, TensorView)):
        return []
    da, db = a.get_logical_domain(no_reductions=True), b.get_logical_domain(no_reductions=True)
    return [d for d, (x, y) in enumerate(zip(da, db, strict=True))
            if not x.is_broadcast and not y.is_broadcast and (x.extent != y.extent or not x.extent.is_const)]


def check_sizes(op: str, a_val: Val, b_val: Val, a: torch.Tensor, b: torch.Tensor, dims: list[int]) -> None:
    for d in dims:
        if a.shape[d] != b.shape[d]:
            raise ValueError(
                f"{op}: {a_val.short_name} axis {d} has size {a.shape[d]} but {b_val.short_name} axis {d} "  # type: ignore[attr-defined]
                f"has size {b.shape[d]}; incompatible broadcast shapes (define the axis with size 1 to broadcast it)")


class BinaryOp(Expr):
    op_name = "binary"

    def __init__(self, fusion: Fusion, op: str, out: Val, lhs: Val, rhs: Val) -> None:
        super().__init__(fusion, [lhs, rhs], [out])
        self.op = op
        self._check_dims = broadcast_checks(lhs, rhs)
        self._fn = BINARY_FNS[op]

    def evaluate(self, ctx: EvalContext, a: Any, b: Any) -> list[Any]:
        if self._check_dims:
            check_sizes(self.op, self.inputs[0], self.inputs[1], a, b, self._check_dims)
        return [self._fn(a, b)]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return positional_map(producer, self.output) if isinstance(self.output, TensorView) else {}

    def to_string(self, indent: int = 0) -> str:
        lhs, rhs = self.inputs
        pad = indent_str(indent)
        if self.op in _BINARY_INLINE:
            return f"{header(self.output, indent)}{lhs}\n{pad}   {_BINARY_INLINE[self.op]} {rhs};\n"
        return f"{header(self.output, indent)}{self.op}({lhs},\n{pad}     {rhs});\n"


def _where(c: Any, a: Any, b: Any) -> Any:
    if not isinstance(c, torch.Tensor):
        return a if c else b
    return torch.where(c, a, b)


def _clamp(x: Any, lo: Any, hi: Any) -> Any:
    return torch.clamp(x, lo, hi)


TERNARY_FNS: dict[str, Callable[[Any, Any, Any], Any]] = {"where": _where, "clamp": _clamp}


class TernaryOp(Expr):
    op_name = "ternary"

    def __init__(self, fusion: Fusion, op: str, out: Val, a: Val, b: Val, c: Val) -> None:
        super().__init__(fusion, [a, b, c], [out])
        self.op = op
        tensors = [v for v in (a, b, c) if isinstance(v, TensorView)]
        self._checks = [(x, y, broadcast_checks(x, y)) for x, y in zip(tensors, tensors[1:], strict=False)]
        self._fn = TERNARY_FNS[op]

    def evaluate(self, ctx: EvalContext, a: Any, b: Any, c: Any) -> list[Any]:
        if self._checks:
            values = {id(v): t for v, t in zip(self.inputs, (a, b, c), strict=True)}
            for x, y, dims in self._checks:
                if dims:
                    check_sizes(self.op, x, y, values[id(x)], values[id(y)], dims)
        result = self._fn(a, b, c)
        if isinstance(result, torch.Tensor) and isinstance(self.output, TensorView):
            result = result.to(self.output.dtype.torch_dtype)
        return [result]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return positional_map(producer, self.output) if isinstance(self.output, TensorView) else {}

    def to_string(self, indent: int = 0) -> str:
        pad = indent_str(indent)
        a, b, c = self.inputs
        return f"{header(self.output, indent)}{self.op}({a}\n{pad}     , {b}\n{pad}     , {c});\n"
