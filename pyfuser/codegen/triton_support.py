"""What the Triton emitter needs to spell things: dtypes, literals, integer extents, and the
prelude of helper functions a generated module starts with (one per target: on CUDA the helpers
call libdevice; Triton's interpreter has no libdevice, so there they are written with ``tl``)."""

from __future__ import annotations

import math

import torch

from pyfuser.ir.dtypes import DataType
from pyfuser.ir.symbolic import SymBinary, SymConst, SymExpr, SymVar

#: Largest number of elements a Triton tile may hold (``triton.language.TRITON_MAX_TENSOR_NUMEL``).
MAX_TILE_NUMEL = 1 << 20

_TRITON_DTYPES = {
    DataType.Float: "tl.float32", DataType.Double: "tl.float64", DataType.Half: "tl.float16",
    DataType.BFloat16: "tl.bfloat16", DataType.Int: "tl.int64", DataType.Int32: "tl.int32",
    DataType.Bool: "tl.int1",
}


def triton_dtype(dtype: DataType) -> str | None:
    """The Triton type of ``dtype``, None when kernels do not handle it (complex)."""
    return _TRITON_DTYPES.get(dtype)


def compute_dtype(dtype: DataType) -> DataType:
    """Half and bfloat16 are computed in float32, as nvFuser does; other types as they are."""
    return DataType.Float if dtype in (DataType.Half, DataType.BFloat16) else dtype


#: NaN in kernel source
NAN = "(_INF - _INF)"


def literal(value: object, dtype: DataType) -> str:
    """A constant in the kernel, typed as ``dtype`` (a bare float literal would be float32)."""
    if isinstance(value, bool) or dtype is DataType.Bool:
        return "True" if value else "False"
    if not isinstance(value, int | float):  # a complex constant has no Triton type
        raise TypeError(f"a {dtype} constant in a kernel must be a real number, got {value!r}")
    if dtype.is_integral:
        # wrapped into the type, as torch converts a Python int operand of an integer tensor (an int32
        # tensor plus 2**31 adds -2**31); Triton refuses a literal out of its type's range
        info = torch.iinfo(dtype.torch_dtype)
        return str((int(value) - info.min) % (info.max - info.min + 1) + info.min)
    number = float(value)
    # NaN as ``_INF - _INF`` (folded at compile time): a NaN global would fail Triton's check that a
    # kernel's globals are unchanged at each launch (NaN != NaN).
    text = repr(number) if math.isfinite(number) else (NAN if math.isnan(number) else
                                                       ("_INF" if number > 0 else "-_INF"))
    if dtype is DataType.Double:
        return f"tl.full([], {text}, tl.float64)"
    return text


def int_expr(e: SymExpr) -> str:
    """An integer extent as a Triton (or plain Python) expression over size arguments."""
    if isinstance(e, SymConst):
        return str(e.val)
    if isinstance(e, SymVar):
        return e.name
    assert isinstance(e, SymBinary)
    a, b = int_expr(e.lhs), int_expr(e.rhs)
    if e.op == "ceilDiv":
        return f"(({a} + {b} - 1) // {b})"
    if e.op in ("max", "min"):
        return f"tl.{e.op}imum({a}, {b})"
    op = "//" if e.op == "/" else e.op
    return f"({a} {op} {b})"


def host_int_expr(e: SymExpr) -> str:
    """An integer extent as plain Python (for the host-side launcher)."""
    if isinstance(e, SymConst):
        return str(e.val)
    if isinstance(e, SymVar):
        return e.name
    assert isinstance(e, SymBinary)
    a, b = host_int_expr(e.lhs), host_int_expr(e.rhs)
    if e.op == "ceilDiv":
        return f"(-(-{a} // {b}))"
    if e.op in ("max", "min"):
        return f"{e.op}({a}, {b})"
    op = "//" if e.op == "/" else e.op
    return f"({a} {op} {b})"


_PRELUDE_COMMON = '''
_INF = tl.constexpr(float("inf"))


@_jit
def _aligned(x, alignment: tl.constexpr):
    """Integer argument ``x``, a multiple of ``alignment`` (a power of two, its launch's
    specialization), written so that Triton's analysis of divisibility knows it: the quotient times
    the constant. (Multiples of 16 Triton knows from its own specialization.)"""
    if alignment > 1 and alignment < 16:
        return x // alignment * alignment
    else:
        return x


@_jit
def _fdiv(n, multiplier, divisor, alignment: tl.constexpr):
    """``n // divisor`` for an int32 index ``0 <= n < 2**31``. Where ``divisor`` is odd in this
    variant (``alignment``, its compile-time alignment, is 1), a multiply-high, an add and a shift by
    the launch's ``division_multiplier(divisor)`` (``kernel_source.py``); else the division, whose
    quotient Triton's analysis knows constant over runs of the alignment (it knows nothing of the
    multiply's); a 64-bit index divides."""
    if alignment == 1 and n.dtype == tl.int32:
        packed = multiplier.to(tl.int64)
        m = ((packed >> 8) & 0xFFFFFFFF).to(tl.uint32)
        s = ((packed >> 1) & 127).to(tl.uint32)
        u = n.to(tl.uint32, bitcast=True)
        return ((tl.umulhi(u, m) + u) >> s).to(tl.int32, bitcast=True)
    else:
        return n // divisor


@_jit
def _fmod(n, multiplier, divisor, alignment: tl.constexpr, divided: tl.constexpr):
    """``n % divisor`` for a non-negative index ``n``, itself a flat index divided by a size of
    compile-time alignment ``divided`` (1: not divided): through ``_fdiv`` where both alignments are 1
    (``n`` varies from one lane to the next, and ``divisor`` is odd); else the remainder, which keeps
    what Triton knows of ``n``'s runs."""
    if alignment == 1 and divided == 1:
        return n - _fdiv(n, multiplier, divisor, 1) * divisor
    else:
        return n % divisor


@_jit
def _div(a, b):
    """nvFuser's div: true division for floating point, truncation (C semantics) for integers."""
    if a.dtype.is_floating():
        return a / b
    else:
        return a // b


@_jit
def _bitwise_not(x):
    """``~x``; a boolean's is its logical not (``~`` of a 0 / 1 byte would set the other bits)."""
    if x.dtype == tl.int1:
        return x == 0
    else:
        return ~x


@_jit
def _floor(x):
    if x.dtype.is_floating():
        return tl.floor(x)
    else:
        return x


@_jit
def _ceil(x):
    if x.dtype.is_floating():
        return tl.ceil(x)
    else:
        return x


@_jit
def _trunc(x):
    if x.dtype.is_floating():
        return tl.where(x < 0, tl.ceil(x), tl.floor(x))
    else:
        return x


@_jit
def _round(x):
    """``torch.round``: halves to even, the sign of a zero result kept (-0.3 rounds to -0.0)."""
    if x.dtype.is_floating():
        r = tl.floor(x)
        d = x - r
        odd = (r - 2.0 * tl.floor(r * 0.5)) == 1.0
        r = tl.where((d > 0.5) | ((d == 0.5) & odd), r + 1.0, r)
        return tl.where(r == 0, x * 0.0, r)
    else:
        return x


@_jit
def _sign(x):
    """``torch.sign``: 0 for zeros and NaN; a boolean is its own sign."""
    if x.dtype == tl.int1:
        return x
    else:
        return (x > 0).to(x.dtype) - (x < 0).to(x.dtype)


@_jit
def _isinf(x):
    if x.dtype.is_floating():
        return tl.abs(x) == _INF
    else:
        return x != x


@_jit
def _log1p(x):
    """log(1 + x) without the rounding of 1 + x (the ratio restores what the sum lost)."""
    u = 1.0 + x
    ratio = tl.log(u) * (x / (u - 1.0))
    return tl.where(u == 1.0, x, tl.where(u == _INF, u, ratio))


@_jit
def _expm1(x):
    """exp(x) - 1 without the cancellation near 0 (Kahan's: (u - 1) * x / log(u))."""
    u = tl.exp(x)
    ratio = (u - 1.0) * (x / tl.log(u))
    return tl.where(u == 1.0, x, tl.where(u == _INF, u, tl.where(u - 1.0 == -1.0, u - 1.0, ratio)))


@_jit
def _add(a, b):
    return a + b


@_jit
def _mul(a, b):
    return a * b


@_jit
def _max(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@_jit
def _min(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@_jit
def _welford_combine(shift_a, mean_a, m2_a, n_a, shift_b, mean_b, m2_b, n_b):
    """Welford's combine of two partial results, each mean held as a shift (a value near the data)
    plus a mean relative to it: the difference of means is taken as small numbers, so a row far from
    0 keeps the precision of its spread. The combined mean is split again into a shift and the
    little its rounding lost (Knuth's two-sum, exact), so combines in any order round only the small
    part. An empty side (its shift and mean not set) takes no part."""
    n = n_a + n_b
    delta = (shift_b - shift_a) + (mean_b - mean_a)
    w = n_b / tl.where(n == 0, 1.0, n)
    moved = mean_a + delta * w
    shift = shift_a + moved
    part = shift - shift_a
    lost = (shift_a - (shift - part)) + (moved - part)
    first = n_a == 0
    second = n_b == 0
    m2 = tl.where(second, m2_a, m2_a + m2_b + delta * delta * n_a * w)
    return (tl.where(first, shift_b, tl.where(second, shift_a, shift)),
            tl.where(first, mean_b, tl.where(second, mean_a, lost)), tl.where(first, m2_b, m2), n)


@_jit
def _add_pair(a0, b0, a1, b1):
    return a0 + a1, b0 + b1


@_jit
def _two_sum(sum_a, lost_a, sum_b, lost_b):
    """Two sums, each with what the roundings of its adds lost: their sum and, exactly (Knuth's
    two-sum, no assumption on the magnitudes), what rounding it loses, added to the rest. A value
    enters with -0.0 lost (``x + -0.0`` is ``x``: the compiler drops that add)."""
    total = sum_a + sum_b
    part = total - sum_a
    lost = (sum_a - (total - part)) + (sum_b - part)
    return total, (lost_a + lost_b) + lost


@_jit
def _sum_keeping_lost(total, lost, axis: tl.constexpr, plain: tl.constexpr, keep_dims: tl.constexpr):
    """``total`` (float32) summed over ``axis`` beside what the adds lost (``_two_sum`` pairs), or, where
    ``plain`` (a tile of few values a thread, decided when the variant compiles), the plain sum and
    nothing lost (``* 0.0``: an inf's NaN stays out, the join takes a non-finite sum alone)."""
    if plain:
        total = tl.reduce(total, axis, _add, keep_dims=keep_dims)
        return total, total * 0.0
    else:
        return tl.reduce((total, lost), axis, _two_sum, keep_dims=keep_dims)


@_jit
def _sigmoid(x):
    # tl.sigmoid is a jit function of triton.language, which Triton's interpreter cannot call
    return 1.0 / (1.0 + tl.exp(-x))


@_jit
def _clamp(x, lo, hi):
    return tl.minimum(tl.maximum(x, lo, propagate_nan=tl.PropagateNan.ALL), hi, propagate_nan=tl.PropagateNan.ALL)
'''

_PRELUDE_CUDA = '''import triton
import triton.language as tl
from triton.language.extra import libdevice

_jit = triton.jit


@_jit
def _tanh(x):
    return libdevice.tanh(x)


@_jit
def _pow(a, b):
    return libdevice.pow(a, b)


@_jit
def _round_bf16(x):
    return x.to(tl.bfloat16).to(tl.float32)


@_jit
def _to_bf16(x):
    return x.to(tl.bfloat16)


@_jit
def _from_bf16(x):
    return x.to(tl.float32)


@_jit
def _approx_div(a, b):
    """float32 ``a / b`` within 2 ulp for ``|b|`` in [2^-126, 2^126] (``div.approx``: a reciprocal and a
    multiply, without ``div.full``'s range fix-ups): a division by a count."""
    return libdevice.fast_dividef(a, b)
''' + _PRELUDE_COMMON

_PRELUDE_INTERPRETER = '''import numpy as _np
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction as _jit

from pyfuser.codegen.kernel_source import IndexOutOfRange as _IndexOutOfRange

# the interpreter sums a ``tl.reduce`` with this combine function with numpy
_sum_combine = tl.standard._sum_combine


def _range(*bounds):
    """A loop over size arguments (interpreters before Triton 3.9 pass them as 1-element arrays),
    its index an int32 tensor as in a compiled kernel (a plain int has no ``.to``)."""
    ints = [int(b.handle.data.reshape(-1)[0]) if getattr(b, "handle", None) is not None else int(b) for b in bounds]
    return (tl.full([], i, tl.int32) for i in range(*ints))


def _check_index(inside, mask, message):
    """The interpreter's device-side assert (it drops ``tl.device_assert`` outside its debug mode):
    an index out of range where the loop point is in range (``mask``) stops the kernel."""
    ok = _np.asarray(getattr(getattr(inside, "handle", None), "data", inside), dtype=bool)
    if mask is not None:
        ok = ok | ~_np.asarray(getattr(getattr(mask, "handle", None), "data", mask), dtype=bool)
    if not ok.all():
        raise _IndexOutOfRange(message)


@_jit
def _tanh(x):
    # Triton's interpreter has no libdevice: odd Taylor series near 0, exp form elsewhere.
    a = tl.abs(x)
    e = tl.exp(2.0 * a)
    t = 1.0 - 2.0 / (e + 1.0)
    x2 = x * x
    small = x * (1.0 - x2 * (1.0 / 3.0 - x2 * (2.0 / 15.0 - x2 * (17.0 / 315.0))))
    return tl.where(a < 0.0625, small, tl.where(x < 0, -t, t))


# The interpreter's own float32 <-> bfloat16 conversions truncate and mangle subnormals: these
# work on the bits (bfloat16 is the high half of a float32), rounding to nearest even.
@_jit
def _round_bf16(x):
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & -65536
    return tl.where(x != x, (_INF - _INF), bits.to(tl.float32, bitcast=True))


@_jit
def _to_bf16(x):
    bits = _round_bf16(x).to(tl.int32, bitcast=True) >> 16
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@_jit
def _from_bf16(x):
    return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)


@_jit
def _approx_div(a, b):
    # the interpreter's division (the GPU's ``div.approx`` differs from it by 2 ulp at most)
    return a / b


@_jit
def _pow(a, b):
    # |a| ** b with the sign of a negative base for integral exponents, NaN for fractional ones
    # (C's pow: -inf ** b is 0 or inf for any b, 1 ** b and (-1) ** +-inf are 1). exp2(b * log2|a|)
    # in float64, rounded once: in float32 its error grows with b * log2|a| (6 ** 6 was 7 ulps off).
    magnitude = tl.exp2(b.to(tl.float64) * tl.log2(tl.abs(a).to(tl.float64))).to((b * a).dtype)
    integral = tl.floor(b) == b
    odd = integral & (tl.abs(b - 2.0 * tl.floor(b * 0.5)) == 1.0)
    # ``* -1.0``, not a negation: interpreters before Triton 3.9 negate as ``0 - x``, which loses -0.0
    signed = tl.where(odd, magnitude * -1.0, magnitude)
    negative = tl.where(a == -_INF, signed, tl.where(integral, signed, (_INF - _INF)))
    zero = tl.where(b > 0, 0.0, tl.where(b < 0, _INF, (_INF - _INF)))
    zero = tl.where(1.0 / a < 0, tl.where(odd, zero * -1.0, zero), zero)  # -0.0 ** odd keeps the sign
    result = tl.where(a < 0, negative, tl.where(a == 0, zero, magnitude))
    result = tl.where(a == -1.0, tl.where(tl.abs(b) == _INF, 1.0, result), result)
    return tl.where(b == 0, 1.0, tl.where(a == 1.0, 1.0, result))
''' + _PRELUDE_COMMON


def loop_range(target: str) -> str:
    """The loop iterator of a serial loop: Triton's ``range``, or the interpreter's helper."""
    return "range" if target == "cuda" else "_range"


def prelude(target: str) -> str:
    """Module header for ``target`` ("cuda" or "interpreter")."""
    return _PRELUDE_CUDA if target == "cuda" else _PRELUDE_INTERPRETER
