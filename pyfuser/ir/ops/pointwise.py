"""Pointwise ops: unary, binary and ternary, with torch semantics and type promotion.

Each op kind is a member of ``UnaryOpType`` / ``BinaryOpType`` / ``TernaryOpType`` whose value is
its one row of the op table: the torch reference, the ``out=`` overload that writes into a chunk
and how kernel math prints it. The output dtype rule is the reference itself (``ir.ops.promotion``:
torch's promotion, found by running it on one-element tensors), so adding a kind is one row; a
generated kernel computes the kinds of codegen's table (``codegen/triton_ops.py``), the others
run as ATen calls.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from pyfuser.ir.base import Expr, PythonCall, Val, as_tensor, indent_str
from pyfuser.ir.dtypes import DataType, python_scalar_type
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.ops.common import header, positional_map
from pyfuser.ir.ops.shape import SizeCheck, check_same_sizes

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion
    from pyfuser.ir.iter_domain import IterDomain
    from pyfuser.ir.tensor_view import TensorView


@dataclass(frozen=True, eq=False)
class PointwiseSpec:
    """One row of a pointwise op table.

    ``fn``: the torch reference on tensors (and numbers where torch takes them); ``out_fn``: a torch
    function with an ``out=`` overload (tensor first), used to write straight into a preallocated
    chunk; ``inline``: printed as an operator (``-x``, ``a + b``); ``printed``: the kernel-math name
    for an output dtype (nvFuser's CUDA runtime names: ``expf`` for a float ``exp``), default the
    kind's own name. How a generated kernel computes a kind is the code generator's
    (``codegen/triton_ops.py``).
    """

    fn: Callable[..., Any] | None
    out_fn: Callable[..., Any] | None = None
    inline: str | None = None
    printed: Callable[[str, DataType], str] | None = None
    #: On integer operands, the values torch raises for (division by zero): reported as a ValueError
    #: naming the operands.
    integer_domain: str | None = None

    def reference(self, name: str) -> Callable[..., Any]:
        """``fn``, which every kind but a cast has (a cast's evaluation is the dtype conversion)."""
        if self.fn is None:
            raise NotImplementedError(f"pointwise op {name} has no torch reference")
        return self.fn


def _float_suffixed(name: str, out: DataType) -> str:
    """Math functions with a single-precision variant spelled with an ``f`` suffix."""
    return f"{name}f" if out is DataType.Float else name


def _fmax_or_max(name: str, out: DataType) -> str:
    """``maximum`` / ``minimum`` are ``fmax`` / ``fmin`` on floating values, ``max`` / ``min`` otherwise."""
    return ("f" if out.is_floating else "") + name[:3]


def _erfcinv(x: torch.Tensor) -> torch.Tensor:
    return torch.erfinv(1 - x)


class UnaryOpType(Enum):
    """Unary pointwise kinds (``fd.ops.<name>``)."""

    neg = PointwiseSpec(torch.neg, torch.neg, inline="-")
    abs = PointwiseSpec(torch.abs, torch.abs)
    exp = PointwiseSpec(torch.exp, torch.exp, printed=_float_suffixed)
    log = PointwiseSpec(torch.log, torch.log, printed=_float_suffixed)
    sqrt = PointwiseSpec(torch.sqrt, torch.sqrt, printed=_float_suffixed)
    rsqrt = PointwiseSpec(torch.rsqrt, torch.rsqrt, printed=_float_suffixed)
    reciprocal = PointwiseSpec(torch.reciprocal, torch.reciprocal)
    sin = PointwiseSpec(torch.sin, torch.sin, printed=_float_suffixed)
    cos = PointwiseSpec(torch.cos, torch.cos, printed=_float_suffixed)
    tanh = PointwiseSpec(torch.tanh, torch.tanh, printed=_float_suffixed)
    sigmoid = PointwiseSpec(torch.sigmoid, torch.sigmoid)
    relu = PointwiseSpec(torch.relu)
    silu = PointwiseSpec(F.silu)
    gelu = PointwiseSpec(F.gelu)
    gelu_tanh = PointwiseSpec(lambda x: F.gelu(x, approximate="tanh"))
    erf = PointwiseSpec(torch.erf, torch.erf, printed=_float_suffixed)
    logical_not = PointwiseSpec(torch.logical_not, inline="!")
    bitwise_not = PointwiseSpec(torch.bitwise_not, torch.bitwise_not, inline="~")
    acos = PointwiseSpec(torch.acos, torch.acos, printed=_float_suffixed)
    acosh = PointwiseSpec(torch.acosh, torch.acosh, printed=_float_suffixed)
    asin = PointwiseSpec(torch.asin, torch.asin, printed=_float_suffixed)
    asinh = PointwiseSpec(torch.asinh, torch.asinh, printed=_float_suffixed)
    atan = PointwiseSpec(torch.atan, torch.atan, printed=_float_suffixed)
    atanh = PointwiseSpec(torch.atanh, torch.atanh, printed=_float_suffixed)
    cosh = PointwiseSpec(torch.cosh, torch.cosh, printed=_float_suffixed)
    sinh = PointwiseSpec(torch.sinh, torch.sinh, printed=_float_suffixed)
    tan = PointwiseSpec(torch.tan, torch.tan, printed=_float_suffixed)
    ceil = PointwiseSpec(torch.ceil, torch.ceil, printed=_float_suffixed)
    floor = PointwiseSpec(torch.floor, torch.floor, printed=_float_suffixed)
    round = PointwiseSpec(torch.round, torch.round, printed=_float_suffixed)
    trunc = PointwiseSpec(torch.trunc, torch.trunc, printed=_float_suffixed)
    frac = PointwiseSpec(torch.frac, torch.frac)
    sign = PointwiseSpec(torch.sign, torch.sign)
    signbit = PointwiseSpec(torch.signbit, torch.signbit)
    exp2 = PointwiseSpec(torch.exp2, torch.exp2, printed=_float_suffixed)
    expm1 = PointwiseSpec(torch.expm1, torch.expm1, printed=_float_suffixed)
    log2 = PointwiseSpec(torch.log2, torch.log2, printed=_float_suffixed)
    log10 = PointwiseSpec(torch.log10, torch.log10, printed=_float_suffixed)
    log1p = PointwiseSpec(torch.log1p, torch.log1p, printed=_float_suffixed)
    lgamma = PointwiseSpec(torch.lgamma, torch.lgamma, printed=_float_suffixed)
    erfc = PointwiseSpec(torch.erfc, torch.erfc, printed=_float_suffixed)
    erfinv = PointwiseSpec(torch.erfinv, torch.erfinv, printed=_float_suffixed)
    erfcinv = PointwiseSpec(_erfcinv, printed=_float_suffixed)
    isfinite = PointwiseSpec(torch.isfinite)
    isinf = PointwiseSpec(torch.isinf)
    isnan = PointwiseSpec(torch.isnan)
    isneginf = PointwiseSpec(torch.isneginf, torch.isneginf)
    isposinf = PointwiseSpec(torch.isposinf, torch.isposinf)
    isreal = PointwiseSpec(torch.isreal)
    #: the real / imaginary part of a complex tensor (a real tensor is its own real part)
    real = PointwiseSpec(torch.real)
    imag = PointwiseSpec(torch.imag)
    #: ``x.to(output dtype)`` (no function: the output dtype is the attribute); printed with nvFuser's
    #: cast names (``__half2float``).
    cast = PointwiseSpec(None)

    @property
    def spec(self) -> PointwiseSpec:
        return self.value


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
    quotient = abs(a) // abs(b)  # exact for any int (``int(a / b)`` rounds through a double)
    return quotient if (a < 0) == (b < 0) else -quotient


def _naming_integer_domain(fn: Callable[[Any, Any], Any], kind: BinaryOpType, lhs: Val,
                           rhs: Val) -> Callable[[Any, Any], Any]:
    """``fn`` with torch's errors for integer values outside the op's domain (``x // 0``) turned
    into a ValueError naming the operands; free until one is raised."""
    names = f"{lhs.short_name} and {rhs.short_name}"

    def apply(a: Any, b: Any) -> Any:
        try:
            return fn(a, b)
        except (RuntimeError, ZeroDivisionError) as e:
            raise ValueError(f"{kind.name}: on the integer operands {names}, {kind.spec.integer_domain}; torch "
                             f"raises for that ({e})") from None

    return apply


def _tensor_or_scalar(fn: Callable[[Any, Any], Any], scalar_fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """A torch function that takes tensors only, extended to numbers (as 0-dim tensors) and pure scalars."""
    def apply(a: Any, b: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return fn(a, b if isinstance(b, torch.Tensor) else torch.as_tensor(b, device=a.device))
        if isinstance(b, torch.Tensor):
            return fn(torch.as_tensor(a, device=b.device), b)
        return scalar_fn(a, b)
    return apply


def _logical_right_shift(a: Any, b: Any) -> Any:
    """``a >> b`` filling with zeros (the bits of a signed ``a`` read as unsigned), as nvFuser's;
    a shift by the width or more gives 0."""
    if not isinstance(a, torch.Tensor):
        a = torch.as_tensor(a, device=b.device if isinstance(b, torch.Tensor) else None)
    bits = a.element_size() * 8
    shift = torch.as_tensor(b, device=a.device).to(a.dtype)
    clamped = shift.clamp(0, bits - 1)
    shifted = torch.bitwise_right_shift(a, clamped)
    # Clear the copies of the sign bit an arithmetic shift brought in: keep the low bits - shift bits.
    keep = torch.bitwise_left_shift(torch.ones_like(shifted), (bits - clamped).clamp(max=bits - 1)) - 1
    keep = torch.where(clamped == 0, torch.full_like(keep, -1), keep)
    result = torch.bitwise_and(shifted, keep)
    return torch.where(shift >= bits, torch.zeros_like(result), result)


def _scalar_fmod(a: Any, b: Any) -> Any:
    """C's remainder of numbers: integers stay integers."""
    if isinstance(a, int) and isinstance(b, int):
        return a - b * _trunc_div(a, b)
    return math.fmod(a, b)


def _scalar_complex(real: Any, imag: Any) -> complex:
    return complex(real, imag)


def _scalar_logical_right_shift(a: int, b: int) -> int:
    return 0 if b >= 64 else (a % (1 << 64)) >> b


class BinaryOpType(Enum):
    """Binary pointwise kinds (``fd.ops.<name>``), with torch's broadcasting and type promotion."""

    add = PointwiseSpec(operator.add, torch.add, inline="+")
    sub = PointwiseSpec(operator.sub, torch.sub, inline="-")
    mul = PointwiseSpec(operator.mul, torch.mul, inline="*")
    #: true division for floating operands, truncation for integers (decided per op from the dtypes)
    div = PointwiseSpec(_div, inline="/", integer_domain="a divisor is 0")
    truediv = PointwiseSpec(_true_div, torch.true_divide, inline="/")
    pow = PointwiseSpec(operator.pow, integer_domain="an exponent is negative")
    maximum = PointwiseSpec(_tensor_or_scalar(torch.maximum, max), printed=_fmax_or_max)
    minimum = PointwiseSpec(_tensor_or_scalar(torch.minimum, min), printed=_fmax_or_max)
    eq = PointwiseSpec(operator.eq, inline="==")
    ne = PointwiseSpec(operator.ne, inline="!=")
    lt = PointwiseSpec(operator.lt, inline="<")
    le = PointwiseSpec(operator.le, inline="<=")
    gt = PointwiseSpec(operator.gt, inline=">")
    ge = PointwiseSpec(operator.ge, inline=">=")
    logical_and = PointwiseSpec(_tensor_or_scalar(torch.logical_and, lambda a, b: bool(a) and bool(b)), inline="&&")
    logical_or = PointwiseSpec(_tensor_or_scalar(torch.logical_or, lambda a, b: bool(a) or bool(b)), inline="||")
    bitwise_and = PointwiseSpec(operator.and_, torch.bitwise_and, inline="&")
    bitwise_or = PointwiseSpec(operator.or_, torch.bitwise_or, inline="|")
    bitwise_xor = PointwiseSpec(operator.xor, torch.bitwise_xor, inline="^")
    bitwise_left_shift = PointwiseSpec(operator.lshift, inline="<<")
    #: arithmetic (sign-extending) right shift
    bitwise_right_shift = PointwiseSpec(operator.rshift, inline=">>")
    logical_right_shift = PointwiseSpec(_tensor_or_scalar(_logical_right_shift, _scalar_logical_right_shift))
    gcd = PointwiseSpec(_tensor_or_scalar(torch.gcd, math.gcd))
    nextafter = PointwiseSpec(_tensor_or_scalar(torch.nextafter, math.nextafter), printed=_float_suffixed)
    atan2 = PointwiseSpec(_tensor_or_scalar(torch.atan2, math.atan2), printed=_float_suffixed)
    #: C's remainder (the dividend's sign): ``fmod``; nvFuser's ``mod`` is the same on integers
    fmod = PointwiseSpec(_tensor_or_scalar(torch.fmod, _scalar_fmod), torch.fmod, printed=_float_suffixed,
                         integer_domain="a divisor is 0")
    mod = PointwiseSpec(_tensor_or_scalar(torch.fmod, _scalar_fmod), torch.fmod, printed=_float_suffixed,
                        integer_domain="a divisor is 0")
    #: Python's remainder (the divisor's sign)
    remainder = PointwiseSpec(_tensor_or_scalar(torch.remainder, operator.mod), torch.remainder,
                              integer_domain="a divisor is 0")
    #: a complex number from its real and imaginary parts (of one floating dtype)
    complex = PointwiseSpec(_tensor_or_scalar(torch.complex, _scalar_complex))

    @property
    def spec(self) -> PointwiseSpec:
        return self.value


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


def _lerp(start: Any, end: Any, weight: Any) -> Any:
    """``start + weight * (end - start)``: torch.lerp (its formula is exact at both ends) where its
    operands share a dtype, else the formula, which promotes as torch's arithmetic does."""
    if isinstance(start, torch.Tensor) and isinstance(end, torch.Tensor) and start.dtype == end.dtype \
            and start.dtype.is_floating_point and (not isinstance(weight, torch.Tensor) or weight.dtype == start.dtype):
        return torch.lerp(start, end, weight)
    return start + weight * (end - start)


def _threshold(x: Any, threshold: Any, value: Any) -> Any:
    """``x`` where ``x > threshold``, else ``value`` (``F.threshold``)."""
    return _where(x > threshold, x, value)


class TernaryOpType(Enum):
    """Ternary pointwise kinds: ``where(cond, a, b)``, ``clamp(x, min, max)``, ``lerp(start, end, weight)``,
    ``threshold(x, threshold, value)``."""

    where = PointwiseSpec(_where)
    clamp = PointwiseSpec(_clamp)
    lerp = PointwiseSpec(_lerp)
    threshold = PointwiseSpec(_threshold)

    @property
    def spec(self) -> PointwiseSpec:
        return self.value


# --- cast names ---------------------------------------------------------------------------------------
#: Short type names used inside cast function names.
_CAST_NAME = {
    DataType.Float: "float", DataType.Double: "double", DataType.Half: "half", DataType.BFloat16: "bfloat",
    DataType.Int: "int64", DataType.Int32: "int32", DataType.UInt64: "uint64", DataType.Bool: "bool",
    DataType.ComplexFloat: "complex_float", DataType.ComplexDouble: "complex_double",
}


def cast_function(src: DataType, dst: DataType) -> str:
    """``__half2float``-style names to and from 16-bit floats, ``__to_double``-style otherwise."""
    reduced = {DataType.Half: "half", DataType.BFloat16: "bfloat"}
    if src in reduced:
        dst_name = "int" if dst is DataType.Int else _CAST_NAME[dst]
        return f"__{reduced[src]}2{dst_name}"
    if dst in reduced:
        if src.is_complex:
            return f"__real_then_2{reduced[dst]}"
        src_name = "int" if src.is_integral else _CAST_NAME[src]
        return f"__{src_name}2{reduced[dst]}"
    prefix = "__real_then_to_" if src.is_complex and not dst.is_complex else "__to_"
    return prefix + _CAST_NAME[dst]


def function_name(kind: UnaryOpType | BinaryOpType | TernaryOpType, out: DataType) -> str:
    """How kernel math spells a kind that is printed as a function call."""
    printed = kind.spec.printed
    return printed(kind.name, out) if printed is not None else kind.name


# --- size checks ---------------------------------------------------------------------------------------
def broadcast_checks(a: Val, b: Val) -> list[int]:
    """Dims where both tensor operands iterate with extents not provably equal at definition, so
    their runtime sizes must be compared."""
    ta, tb = as_tensor(a), as_tensor(b)
    if ta is None or tb is None:
        return []
    da = ta.get_logical_domain(no_reductions=True)
    db = tb.get_logical_domain(no_reductions=True)
    return [d for d, (x, y) in enumerate(zip(da, db, strict=True))
            if not x.is_broadcast() and not y.is_broadcast() and x.extent != y.extent]


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


def _pointwise_map(expr: Expr, producer: TensorView) -> dict[IterDomain, IterDomain]:
    return positional_map(producer, expr.output) if expr.outputs[0].is_tensor else {}


# --- nodes ----------------------------------------------------------------------------------------------
class UnaryOp(Expr):
    def __init__(self, fusion: Fusion, kind: UnaryOpType, out: Val, inp: Val) -> None:
        super().__init__(fusion, [inp], [out])
        self.kind = kind
        self._fn = kind.spec.fn  # looked up once: evaluate is on the hot path
        self._out_fn = kind.spec.out_fn

    def evaluate(self, ctx: EvalContext, x: Any) -> list[Any]:
        if self.kind is UnaryOpType.cast:
            if isinstance(x, torch.Tensor):
                return [x.to(self.output.dtype.torch_dtype)]
            return [python_scalar_type(self.outputs[0].dtype)(x)]
        fn = self._fn
        assert fn is not None  # every kind but cast has a reference
        if isinstance(x, torch.Tensor):
            return [fn(x)]
        return [fn(torch.tensor(x)).item()]  # scalar arithmetic

    def evaluate_into(self, ctx: EvalContext, out: Any, x: Any) -> None:
        """Write straight into ``out`` (e.g. a stream-loop chunk) when torch has an ``out=`` overload."""
        if self._out_fn is not None and isinstance(x, torch.Tensor):
            self._out_fn(x, out=out)
        else:
            super().evaluate_into(ctx, out, x)

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return _pointwise_map(self, producer)

    def python_call(self) -> PythonCall:
        if self.kind is UnaryOpType.cast:
            return PythonCall("cast", (self.inputs[0],), {"dtype": self.outputs[0].dtype})
        if self.kind is UnaryOpType.gelu_tanh:
            return PythonCall("gelu", (self.inputs[0],), {"approximate": "tanh"})
        return PythonCall(self.kind.name, (self.inputs[0],))

    def to_string(self, indent: int = 0) -> str:
        inp, out = self.inputs[0], self.outputs[0]
        if self.kind is UnaryOpType.cast:
            body = f"{cast_function(inp.dtype, out.dtype)}({inp})"
        elif self.kind.spec.inline is not None:
            body = f"{self.kind.spec.inline}{inp}"
        else:
            body = f"{function_name(self.kind, out.dtype)}({inp})"
        return f"{header(out, indent)}{body};\n"


class BinaryOp(Expr):
    returns_new_memory = True  # every binary torch function computes into a new tensor

    def __init__(self, fusion: Fusion, kind: BinaryOpType, out: Val, lhs: Val, rhs: Val) -> None:
        super().__init__(fusion, [lhs, rhs], [out])
        self.kind = kind
        self._checks = size_checks((lhs, rhs), 0, 1)
        self._fn = kind.spec.reference(kind.name)
        out_fn = kind.spec.out_fn
        integral = not any(v.dtype.is_floating or v.dtype.is_complex for v in (lhs, rhs))
        if kind is BinaryOpType.div:  # integer or true division is decided by the operand dtypes, once
            self._fn = _trunc_div if integral else _true_div
            out_fn = None if integral else BinaryOpType.truediv.spec.out_fn
        if integral and kind.spec.integer_domain is not None:
            self._fn = _naming_integer_domain(self._fn, kind, lhs, rhs)
            out_fn = None
        #: a torch function with an ``out=`` overload taking a tensor first and a tensor or number second
        self._out_fn = out_fn
        #: Operands that were 0-dim tensors before the frontend broadcast them (see ``as_numbers``).
        self.number_like: tuple[int, ...] = ()

    def evaluate(self, ctx: EvalContext, a: Any, b: Any) -> list[Any]:
        if self._checks:
            check_same_sizes(self.kind.name, self._checks, self.defined_inputs, (a, b))
        if self.number_like:
            a, b = as_numbers(self.number_like, (a, b))
        return [self._fn(a, b)]

    def evaluate_into(self, ctx: EvalContext, out: Any, a: Any, b: Any) -> None:
        """Write straight into ``out`` (e.g. a stream-loop chunk) when torch has an ``out=`` overload."""
        if self._out_fn is None or not isinstance(a, torch.Tensor):
            super().evaluate_into(ctx, out, a, b)
            return
        if self._checks:
            check_same_sizes(self.kind.name, self._checks, self.defined_inputs, (a, b))
        if self.number_like:
            a, b = as_numbers(self.number_like, (a, b))
        self._out_fn(a, b, out=out)

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return _pointwise_map(self, producer)

    def python_call(self) -> PythonCall:
        return PythonCall(self.kind.name, tuple(self.inputs))

    def to_string(self, indent: int = 0) -> str:
        lhs, rhs = self.inputs
        out = self.outputs[0]
        pad = indent_str(indent)
        if self.kind.spec.inline is not None:
            return f"{header(out, indent)}{lhs}\n{pad}   {self.kind.spec.inline} {rhs};\n"
        return f"{header(out, indent)}{function_name(self.kind, out.dtype)}({lhs},\n{pad}     {rhs});\n"


class TernaryOp(Expr):
    def __init__(self, fusion: Fusion, kind: TernaryOpType, out: Val, a: Val, b: Val, c: Val) -> None:
        super().__init__(fusion, [a, b, c], [out])
        self.kind = kind
        operands = (a, b, c)
        tensors = [k for k, v in enumerate(operands) if v.is_tensor]
        self._checks = [s for ka, kb in itertools.combinations(tensors, 2) for s in size_checks(operands, ka, kb)]
        self._fn = kind.spec.reference(kind.name)
        #: Operands that were 0-dim tensors before the frontend broadcast them (see ``as_numbers``).
        self.number_like: tuple[int, ...] = ()

    def evaluate(self, ctx: EvalContext, a: Any, b: Any, c: Any) -> list[Any]:
        if self._checks:
            check_same_sizes(self.kind.name, self._checks, self.defined_inputs, (a, b, c))
        if self.number_like:
            a, b, c = as_numbers(self.number_like, (a, b, c))
        result = self._fn(a, b, c)
        if isinstance(result, torch.Tensor) and self.outputs[0].is_tensor:
            result = result.to(self.outputs[0].dtype.torch_dtype)
        return [result]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return _pointwise_map(self, producer)

    def python_call(self) -> PythonCall:
        return PythonCall(self.kind.name, tuple(self.inputs))

    def to_string(self, indent: int = 0) -> str:
        pad = indent_str(indent)
        a, b, c = self.inputs
        return f"{header(self.outputs[0], indent)}{self.kind.name}({a}\n{pad}     , {b}\n{pad}     , {c});\n"
