"""Pointwise ops: unary, binary and ternary, with torch semantics and type promotion."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from pyfuser.ir.base import Expr, Val, indent_str
from pyfuser.ir.dtypes import python_scalar_type
from pyfuser.ir.ops.common import SizeCheck, check_same_sizes, header, positional_map
from pyfuser.ir.ops.names import binary_function, cast_function, unary_function
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
#: Unary ops with an ``out=`` overload, used by ``evaluate_into`` to skip a copy.
_UNARY_OUT = {name: getattr(torch, name) for name in
              ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "sigmoid", "erf")}


class UnaryOp(Expr):
    op_name = "unary"

    def __init__(self, fusion: Fusion, op: str, out: TensorView, inp: TensorView) -> None:
        super().__init__(fusion, [inp], [out])
        self.op = op
        self._fn = UNARY_FNS.get(op)  # looked up once: evaluate is on the hot path
        self._out_fn = _UNARY_OUT.get(op)

    def evaluate(self, ctx: EvalContext, x: Any) -> list[Any]:
        fn = self._fn
        if fn is not None and isinstance(x, torch.Tensor):
            return [fn(x)]
        if not isinstance(x, torch.Tensor):  # scalar arithmetic
            if self.op == "cast":
                return [python_scalar_type(self.output.dtype)(x)]
            return [UNARY_FNS[self.op](torch.tensor(x)).item()]
        return [x.to(self.output.dtype.torch_dtype)]  # cast

    def evaluate_into(self, ctx: EvalContext, out: Any, x: Any) -> None:
        """Write straight into ``out`` (e.g. a stream-loop chunk) when torch has an ``out=`` overload."""
        if self._out_fn is not None and isinstance(x, torch.Tensor):
            self._out_fn(x, out=out)
        else:
            super().evaluate_into(ctx, out, x)

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return positional_map(producer, self.output)

    def to_string(self, indent: int = 0) -> str:
        inp = self.inputs[0]
        if self.op == "cast":
            body = f"{cast_function(inp.dtype, self.output.dtype)}({inp})"
        elif self.op in _UNARY_INLINE:
            body = f"{_UNARY_INLINE[self.op]}{inp}"
        else:
            body = f"{unary_function(self.op, self.output.dtype)}({inp})"
        return f"{header(self.output, indent)}{body};\n"


def _true_div(a: Any, b: Any) -> Any:
    return torch.true_divide(a, b) if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) else a / b


def _div(a: Any, b: Any) -> Any:
    """nvFuser's ``div``: true division for floating point, truncation for integers."""
    integral = all(not (x.is_floating_point() or x.is_complex()) if isinstance(x, torch.Tensor)
                   else isinstance(x, int) for x in (a, b))
    return _trunc_div(a, b) if integral else _true_div(a, b)


def _trunc_div(a: Any, b: Any) -> Any:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.div(a, b, rounding_mode="trunc")
    return int(a / b)


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
_BINARY_OUT = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "truediv": torch.true_divide}
_BINARY_INLINE = {"add": "+", "sub": "-", "mul": "*", "div": "/", "truediv": "/", "eq": "==", "ne": "!=",
                  "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "logical_and": "&&", "logical_or": "||"}


def broadcast_checks(a: Val, b: Val) -> list[int]:
    """Dims where both tensor operands iterate with extents not provably equal at definition, so
    their runtime sizes must be compared."""
    if not (isinstance(a, TensorView) and isinstance(b, TensorView)):
        return []
    da, db = a.get_logical_domain(no_reductions=True), b.get_logical_domain(no_reductions=True)
    return [d for d, (x, y) in enumerate(zip(da, db, strict=True))
            if not x.is_broadcast and not y.is_broadcast and x.extent != y.extent]


def size_checks(operands: Sequence[Val], ka: int, kb: int) -> list[SizeCheck]:
    """Axis pairs of two tensor operands whose runtime sizes must agree (both iterate, extents
    not provably equal at definition)."""
    return [(ka, d, kb, d) for d in broadcast_checks(operands[ka], operands[kb])]


def as_numbers(number_like: tuple[int, ...], args: Sequence[Any]) -> list[Any]:
    """``args`` with the operands at ``number_like`` viewed as 0-dim tensors again.

    The frontend broadcasts a 0-dim tensor operand to the op's rank, but torch promotes a 0-dim
    tensor like a number (``x_half * t_double_0d`` is half, computed as torch computes it): evaluating
    on the 0-dim view keeps torch's dtypes and arithmetic exactly. The result shape is unchanged, as
    another operand has the full rank and the 0-dim one only contributes size-1 axes.
    """
    return [a.reshape(()) if k in number_like and isinstance(a, torch.Tensor) else a for k, a in enumerate(args)]


class BinaryOp(Expr):
    op_name = "binary"

    def __init__(self, fusion: Fusion, op: str, out: Val, lhs: Val, rhs: Val) -> None:
        super().__init__(fusion, [lhs, rhs], [out])
        self.op = op
        self._checks = size_checks((lhs, rhs), 0, 1)
        self._fn = BINARY_FNS[op]
        if op == "div":  # integer or true division is decided by the operand dtypes, once
            integral = not any(v.dtype.is_floating or v.dtype.is_complex for v in (lhs, rhs))
            self._fn = _trunc_div if integral else _true_div
        # torch functions with an ``out=`` overload taking a tensor first and a tensor or scalar second
        self._out_fn = _BINARY_OUT.get("truediv" if op == "div" and self._fn is _true_div else op)
        #: Operands that were 0-dim tensors before the frontend broadcast them (see ``as_numbers``).
        self.number_like: tuple[int, ...] = ()

    def evaluate(self, ctx: EvalContext, a: Any, b: Any) -> list[Any]:
        if self._checks:
            check_same_sizes(self.op, self._checks, self.defined_inputs, (a, b))
        if self.number_like:
            a, b = as_numbers(self.number_like, (a, b))
        return [self._fn(a, b)]

    def evaluate_into(self, ctx: EvalContext, out: Any, a: Any, b: Any) -> None:
        """Write straight into ``out`` (e.g. a stream-loop chunk) when torch has an ``out=`` overload."""
        if self._out_fn is None or not isinstance(a, torch.Tensor):
            super().evaluate_into(ctx, out, a, b)
            return
        if self._checks:
            check_same_sizes(self.op, self._checks, self.defined_inputs, (a, b))
        if self.number_like:
            a, b = as_numbers(self.number_like, (a, b))
        self._out_fn(a, b, out=out)

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return positional_map(producer, self.output) if isinstance(self.output, TensorView) else {}

    def to_string(self, indent: int = 0) -> str:
        lhs, rhs = self.inputs
        pad = indent_str(indent)
        if self.op in _BINARY_INLINE:
            return f"{header(self.output, indent)}{lhs}\n{pad}   {_BINARY_INLINE[self.op]} {rhs};\n"
        return f"{header(self.output, indent)}{binary_function(self.op, self.output.dtype)}({lhs},\n{pad}     {rhs});\n"


def _where(c: Any, a: Any, b: Any) -> Any:
    if isinstance(c, torch.Tensor):
        return torch.where(c, a, b)
    branches = [x for x in (a, b) if isinstance(x, torch.Tensor)]
    if branches:  # a number condition still broadcasts both branches against each other
        return torch.where(torch.as_tensor(c, device=branches[0].device), a, b)
    return a if c else b


def _clamp(x: Any, lo: Any, hi: Any) -> Any:
    tensors = [v for v in (x, lo, hi) if isinstance(v, torch.Tensor)]
    if not tensors:
        return min(max(x, lo), hi)
    if len(tensors) == 1 and tensors[0] is x:
        return torch.clamp(x, lo, hi)
    # torch.clamp takes bounds that are all tensors or all numbers; 0-dim tensors promote like numbers.
    device = tensors[0].device
    x, lo, hi = (v if isinstance(v, torch.Tensor) else torch.as_tensor(v, device=device) for v in (x, lo, hi))
    return torch.clamp(x, lo, hi)


TERNARY_FNS: dict[str, Callable[[Any, Any, Any], Any]] = {"where": _where, "clamp": _clamp}


class TernaryOp(Expr):
    op_name = "ternary"

    def __init__(self, fusion: Fusion, op: str, out: Val, a: Val, b: Val, c: Val) -> None:
        super().__init__(fusion, [a, b, c], [out])
        self.op = op
        operands = (a, b, c)
        tensors = [k for k, v in enumerate(operands) if isinstance(v, TensorView)]
        self._checks = [s for ka, kb in itertools.combinations(tensors, 2) for s in size_checks(operands, ka, kb)]
        self._fn = TERNARY_FNS[op]
        #: Operands that were 0-dim tensors before the frontend broadcast them (see ``as_numbers``).
        self.number_like: tuple[int, ...] = ()

    def evaluate(self, ctx: EvalContext, a: Any, b: Any, c: Any) -> list[Any]:
        if self._checks:
            check_same_sizes(self.op, self._checks, self.defined_inputs, (a, b, c))
        if self.number_like:
            a, b, c = as_numbers(self.number_like, (a, b, c))
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
