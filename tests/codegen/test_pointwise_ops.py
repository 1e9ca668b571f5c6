"""Every pointwise op and dtype through a generated kernel, against torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition
from pyfuser.codegen.triton_ops import TRITON_POINTWISE
from pyfuser.ir.ops import BinaryOpType, TernaryOpType, UnaryOpType
from tests.codegen.conftest import kernel_schedulers

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.bool]
SHAPE = (5, 7)

UNARY_REFERENCE = {
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu, "silu": F.silu, "relu": torch.relu,
}
#: kinds a generated kernel computes (the others run as ATen calls: tests/ir/ops/test_ops_pointwise_more.py)
UNARY = [k for k in UnaryOpType if k is not UnaryOpType.cast and k in TRITON_POINTWISE]


def _data(dtype: torch.dtype, *, positive: bool = False, nonzero: bool = False) -> torch.Tensor:
    if dtype is torch.bool:
        return torch.rand(SHAPE) > 0.5
    if dtype.is_floating_point:
        x = torch.randn(SHAPE, dtype=torch.float32) * 2
        if positive:
            x = x.abs() + 0.1
        return x.to(dtype)
    x = torch.randint(-6, 7, SHAPE, dtype=dtype)
    if positive or nonzero:
        x = torch.where(x == 0, torch.ones_like(x), x.abs() if positive else x)
    return x


def _unary_ref(kind: UnaryOpType):
    return UNARY_REFERENCE.get(kind.name) or getattr(torch, kind.name)


def _valid(fn, *args) -> bool:
    try:
        fn(*args)
    except (RuntimeError, TypeError):
        return False
    return True


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    if dtype in (torch.float16, torch.bfloat16):
        return {"atol": 1e-2, "rtol": 1e-2}
    if dtype == torch.float32:
        return {"atol": 1e-5, "rtol": 1e-5}
    return {}


UNARY_CASES = [(k, d) for k in UNARY for d in DTYPES if _valid(_unary_ref(k), torch.ones(1, dtype=d))]


@pytest.mark.parametrize(("kind", "dtype"), UNARY_CASES, ids=lambda p: getattr(p, "name", str(p)))
def test_unary(kind: UnaryOpType, dtype: torch.dtype, device: str, run_kernels) -> None:
    x = _data(dtype, positive=kind.name in ("log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal")).to(device)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        out = fd.ops.gelu(t, approximate="tanh") if kind is UnaryOpType.gelu_tanh else getattr(fd.ops, kind.name)(t)
        fd.add_output(out)
    (got,) = run_kernels(fd, [x])
    expected = _unary_ref(kind)(x)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, **_tolerance(expected.dtype))


#: halves (ties to even), signed zeros, NaN, infinities, values past float32's last fraction bit, tiny
#: values (where log1p / expm1 must not round 1 + x)
SPECIAL = [-2.5, -1.5, -0.5, -0.3, -0.0, 0.0, 0.3, 0.5, 1.5, 2.5, 0.49999997, -0.49999997, 3.0e7 + 1, 1e-10,
           -1e-10, -1.0, 90.0, -90.0, float("nan"), float("inf"), -float("inf")]


@pytest.mark.parametrize("kind", ["floor", "ceil", "trunc", "round", "frac", "sign", "isnan", "isinf", "log1p",
                                  "expm1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_unary_special_values(kind: str, dtype: torch.dtype, device: str, run_kernels) -> None:
    x = torch.tensor(SPECIAL, dtype=dtype, device=device)
    with FusionDefinition() as fd:
        fd.add_output(getattr(fd.ops, kind)(fd.from_pytorch(x)))
    (got,) = run_kernels(fd, [x])
    expected = getattr(torch, kind)(x)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, equal_nan=True, **_tolerance(expected.dtype))
    if expected.is_floating_point():  # and the sign of each zero
        zeros = expected == 0
        assert torch.equal(got[zeros].signbit(), expected[zeros].signbit()), (got, expected)


BINARY_REFERENCE = {"div": None, "truediv": torch.true_divide, "maximum": torch.maximum, "minimum": torch.minimum,
                    "logical_and": torch.logical_and, "logical_or": torch.logical_or, "pow": torch.pow,
                    "mod": torch.fmod}
#: integer divisions: a tensor divisor may hold 0, for which ATen raises (they run as ATen calls)
DIVISIONS = (BinaryOpType.div, BinaryOpType.fmod, BinaryOpType.mod)


def _binary_ref(kind: BinaryOpType):
    if kind is BinaryOpType.div:
        return lambda a, b: torch.div(a, b, rounding_mode=None if a.is_floating_point() or b.is_floating_point()
                                      else "trunc")
    return BINARY_REFERENCE.get(kind.name) or getattr(torch, kind.name)


BINARY_CASES = [(k, d) for k in BinaryOpType if k in TRITON_POINTWISE for d in DTYPES
                if _valid(_binary_ref(k), torch.ones(1, dtype=d), torch.ones(1, dtype=d))]


@pytest.mark.parametrize(("kind", "dtype"), BINARY_CASES, ids=lambda p: getattr(p, "name", str(p)))
def test_binary(kind: BinaryOpType, dtype: torch.dtype, device: str, run_kernels) -> None:
    divides = kind in (*DIVISIONS, BinaryOpType.truediv)
    a = _data(dtype, positive=kind is BinaryOpType.pow).to(device)
    b = _data(dtype, nonzero=divides).to(device)
    if kind is BinaryOpType.pow and dtype.is_floating_point:
        b = torch.randint(-2, 3, SHAPE).to(dtype).to(device)
    with FusionDefinition() as fd:
        fd.add_output(getattr(fd.ops, kind.name)(fd.from_pytorch(a), fd.from_pytorch(b)))
    integer = not (a.is_floating_point() or b.is_floating_point())
    if (TRITON_POINTWISE[kind].floating_only or kind in DIVISIONS) and integer:
        (got,) = fd.execute([a, b], _enable_options=[] if a.is_cuda else ["triton_interpreter"])
        with pytest.raises(ValueError, match="no generated kernel"):
            fd.last_kernel_code()  # integer pow stays exact, integer div raises for a 0 divisor: ATen calls
    else:
        (got,) = run_kernels(fd, [a, b])
    expected = _binary_ref(kind)(a, b)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, **_tolerance(expected.dtype), equal_nan=True)


@pytest.mark.parametrize(("a_dtype", "b"), [(torch.int32, 2.5), (torch.float16, 3), (torch.bfloat16, torch.float32),
                                            (torch.int64, torch.float64), (torch.bool, torch.int32)])
def test_mixed_dtypes_promote_like_torch(a_dtype: torch.dtype, b: object, device: str, run_kernels) -> None:
    a = _data(a_dtype).to(device)
    other = _data(b).to(device) if isinstance(b, torch.dtype) else b
    with FusionDefinition() as fd:
        ta = fd.from_pytorch(a)
        tb = fd.from_pytorch(other) if isinstance(other, torch.Tensor) else other
        fd.add_output(fd.ops.mul(fd.ops.add(ta, tb), tb))
        fd.add_output(fd.ops.lt(ta, tb))
    inputs = [a, other] if isinstance(other, torch.Tensor) else [a]
    got = run_kernels(fd, inputs)
    expected = [(a + other) * other, a < other]
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g, e, **_tolerance(e.dtype))


@pytest.mark.parametrize("kind", [k for k in TernaryOpType if k in TRITON_POINTWISE], ids=lambda k: k.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_ternary(kind: TernaryOpType, dtype: torch.dtype, device: str, run_kernels) -> None:
    x, lo, hi = (_data(dtype).to(device) for _ in range(3))
    cond = (torch.rand(SHAPE) > 0.5).to(device)
    with FusionDefinition() as fd:
        tx, tlo, thi = (fd.from_pytorch(t) for t in (x, lo, hi))
        if kind is TernaryOpType.where:
            fd.add_output(fd.ops.where(fd.from_pytorch(cond), tx, tlo))
            inputs, expected = [x, lo, hi, cond], torch.where(cond, x, lo)
        else:
            fd.add_output(fd.ops.clamp(tx, fd.ops.minimum(tlo, thi), fd.ops.maximum(tlo, thi)))
            inputs, expected = [x, lo, hi], torch.clamp(x, torch.minimum(lo, hi), torch.maximum(lo, hi))
    got = run_kernels(fd, inputs[:3] + ([cond] if kind is TernaryOpType.where else []))
    torch.testing.assert_close(got[0], expected)


@pytest.mark.parametrize("target", [DataType.Half, DataType.BFloat16, DataType.Int32, DataType.Bool, DataType.Double])
def test_casts_round_where_the_fusion_says(target: DataType, device: str, run_kernels) -> None:
    x = (torch.randn(SHAPE) * 3).to(device)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.cast(t, target), 1.5), DataType.Float))
    (got,) = run_kernels(fd, [x])
    expected = (x.to(target.torch_dtype) * 1.5).float()
    torch.testing.assert_close(got, expected, **_tolerance(target.torch_dtype if target.torch_dtype.is_floating_point
                                                            else torch.float32))


def test_special_values_follow_torch(device: str, run_kernels) -> None:
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-30, -2.0], device=device)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.relu(t))
        fd.add_output(fd.ops.maximum(t, 0.5))
        fd.add_output(fd.ops.tanh(t))
        fd.add_output(fd.ops.clamp(t, -1.0, 1.0))
    got = run_kernels(fd, [x])
    for g, e in zip(got, [torch.relu(x), torch.maximum(x, torch.tensor(0.5)), torch.tanh(x), torch.clamp(x, -1, 1)],
                    strict=True):
        torch.testing.assert_close(g, e, equal_nan=True)


@pytest.mark.parametrize("value", [2**31, 2**33 + 5, -(2**40) - 7])
def test_python_int_beyond_an_int32_operands_range(value: int, device: str, run_kernels) -> None:
    """A Python int does not promote an int32 tensor: torch converts it to int32 (wrapping around), and
    so does the kernel's constant (Triton refuses a literal out of its type's range)."""
    x = torch.tensor([1, 2, -3, 2**31 - 1, -(2**31), 0], dtype=torch.int32, device=device)
    ops = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "lt": torch.lt, "eq": torch.eq,
           "bitwise_and": torch.bitwise_and}
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        for name in ops:
            fd.add_output(getattr(fd.ops, name)(t, value))
    got = run_kernels(fd, [x])
    for g, fn in zip(got, ops.values(), strict=True):
        want = fn(x, value)
        assert g.dtype == want.dtype
        torch.testing.assert_close(g, want)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.int64])
def test_bitwise_ops_run_in_kernels(dtype: torch.dtype, device: str, run_kernels) -> None:
    """``& | ^ ~`` of integers and booleans (attention masks; DeBERTa inverts its mask) are computed by the
    kernel, a broadcast operand and a number included, not as ATen calls between kernels."""
    high = 2 if dtype == torch.bool else 2**20
    a = torch.randint(-high if dtype != torch.bool else 0, high, (5, 7), device=device).to(dtype)
    b = torch.randint(-high if dtype != torch.bool else 0, high, (7,), device=device).to(dtype)
    number = True if dtype == torch.bool else -6
    ops = [torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor]
    with FusionDefinition() as fd:
        x, y = fd.from_pytorch(a), fd.from_pytorch(b)
        for fn in ops:
            fd.add_output(getattr(fd.ops, fn.__name__)(x, y))
        fd.add_output(fd.ops.bitwise_xor(fd.ops.bitwise_and(x, number), y))
        fd.add_output(fd.ops.bitwise_not(fd.ops.bitwise_or(x, y)))
    got = run_kernels(fd, [a, b])
    want = [fn(a, b) for fn in ops] + [torch.bitwise_xor(torch.bitwise_and(a, number), b),
                                       torch.bitwise_not(torch.bitwise_or(a, b))]
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w)
    assert kernel_schedulers(fd) == ["pointwise"]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32, torch.bfloat16])
def test_remainders_by_a_constant_run_in_kernels(dtype: torch.dtype, device: str, run_kernels) -> None:
    """C's remainder (``fmod``, the dividend's sign) by a non-zero constant, negative dividends and divisors
    included, and torch's integer floor division built from it (an MoE's expert histogram divides token
    positions so): one kernel, no ATen call between kernels."""
    a = (torch.randn(5, 37, generator=torch.Generator().manual_seed(7)) * 40).to(dtype).to(device)
    divisor = 3 if not dtype.is_floating_point else 2.5
    with FusionDefinition() as fd:
        x = fd.from_pytorch(a)
        fd.add_output(fd.ops.fmod(x, divisor))
        fd.add_output(fd.ops.fmod(x, -divisor))
        fd.add_output(fd.ops.mod(x, divisor))
    got = run_kernels(fd, [a])
    for g, w in zip(got, [torch.fmod(a, divisor), torch.fmod(a, -divisor), torch.fmod(a, divisor)], strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, atol=0, rtol=0)
    assert kernel_schedulers(fd) == ["pointwise"]
