"""The rest of nvFuser's pointwise ops against torch: math, rounding, classification, complex parts,
bitwise and shifts, gcd, nextafter, lerp, addcmul; with tensors, numbers and broadcasting."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from pyfuser import DataType, FusionDefinition

UNARY: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[], torch.Tensor]]] = {
    "acos": (torch.acos, lambda: torch.rand(3, 5) * 1.8 - 0.9),
    "asin": (torch.asin, lambda: torch.rand(3, 5) * 1.8 - 0.9),
    "atanh": (torch.atanh, lambda: torch.rand(3, 5) * 1.8 - 0.9),
    "acosh": (torch.acosh, lambda: torch.rand(3, 5) + 1.1),
    "asinh": (torch.asinh, lambda: torch.randn(3, 5)),
    "atan": (torch.atan, lambda: torch.randn(3, 5)),
    "cosh": (torch.cosh, lambda: torch.randn(3, 5)),
    "sinh": (torch.sinh, lambda: torch.randn(3, 5)),
    "tan": (torch.tan, lambda: torch.rand(3, 5) - 0.5),
    "ceil": (torch.ceil, lambda: torch.randn(3, 5) * 3),
    "floor": (torch.floor, lambda: torch.randn(3, 5) * 3),
    "round": (torch.round, lambda: torch.randn(3, 5) * 3),
    "trunc": (torch.trunc, lambda: torch.randn(3, 5) * 3),
    "frac": (torch.frac, lambda: torch.randn(3, 5) * 3),
    "sign": (torch.sign, lambda: torch.tensor([-2.0, 0.0, 3.5])),
    "signbit": (torch.signbit, lambda: torch.tensor([-2.0, -0.0, 0.0, 3.5])),
    "exp2": (torch.exp2, lambda: torch.randn(3, 5)),
    "expm1": (torch.expm1, lambda: torch.randn(3, 5)),
    "log2": (torch.log2, lambda: torch.rand(3, 5) + 0.1),
    "log10": (torch.log10, lambda: torch.rand(3, 5) + 0.1),
    "log1p": (torch.log1p, lambda: torch.rand(3, 5)),
    "lgamma": (torch.lgamma, lambda: torch.rand(3, 5) + 0.5),
    "erfc": (torch.erfc, lambda: torch.randn(3, 5)),
    "erfinv": (torch.erfinv, lambda: torch.rand(3, 5) * 1.8 - 0.9),
    "erfcinv": (lambda x: torch.erfinv(1 - x), lambda: torch.rand(3, 5) * 1.8 + 0.1),
    "isfinite": (torch.isfinite, lambda: torch.tensor([1.0, float("inf"), float("nan"), -float("inf")])),
    "isinf": (torch.isinf, lambda: torch.tensor([1.0, float("inf"), float("nan"), -float("inf")])),
    "isnan": (torch.isnan, lambda: torch.tensor([1.0, float("inf"), float("nan"), -float("inf")])),
    "isneginf": (torch.isneginf, lambda: torch.tensor([1.0, float("inf"), float("nan"), -float("inf")])),
    "isposinf": (torch.isposinf, lambda: torch.tensor([1.0, float("inf"), float("nan"), -float("inf")])),
    "isreal": (torch.isreal, lambda: torch.tensor([1 + 0j, 2 + 1j], dtype=torch.complex64)),
    "real": (torch.real, lambda: torch.randn(3, 5, dtype=torch.complex64)),
    "imag": (torch.imag, lambda: torch.randn(3, 5, dtype=torch.complex128)),
    "bitwise_not": (torch.bitwise_not, lambda: torch.randint(-50, 50, (3, 5))),
}


def run(build: Callable[[FusionDefinition], Any], inputs: list[Any], device: str = "cpu") -> list[torch.Tensor]:
    with FusionDefinition() as fd:
        build(fd)
    return fd.execute([x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs])


def assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (actual, expected)
    torch.testing.assert_close(actual.cpu(), expected.cpu(), equal_nan=True)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name: str, device: str) -> None:
    ref, make = UNARY[name]
    x = make().to(device)  # declared from the tensor the fusion runs on
    (out,) = run(lambda fd: fd.add_output(getattr(fd.ops, name)(fd.from_pytorch(x))), [x], device)
    assert_same(out, ref(x))


def test_unary_of_non_contiguous_half_and_scalars() -> None:
    x = torch.randn(6, 4, dtype=torch.half).t()
    (out,) = run(lambda fd: fd.add_output(fd.ops.floor(fd.from_pytorch(x))), [x])
    assert_same(out, torch.floor(x))
    with FusionDefinition() as fd:
        s = fd.define_scalar(dtype=DataType.Double)
        fd.add_output(fd.ops.ceil(s))
    assert_same(fd.execute([2.25])[0], torch.tensor(3.0, dtype=torch.double))


def logical_right_shift(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    bits = a.element_size() * 8
    out = [0 if s >= bits else (int(x) % (1 << bits)) >> int(s) for x, s in zip(a.flatten().tolist(), b.flatten().tolist(),
                                                                               strict=True)]
    wrapped = [v - (1 << bits) if v >= 1 << (bits - 1) else v for v in out]
    return torch.tensor(wrapped, dtype=a.dtype).reshape(a.shape)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize(("name", "ref"), [
    ("bitwise_and", torch.bitwise_and), ("bitwise_or", torch.bitwise_or), ("bitwise_xor", torch.bitwise_xor),
    ("bitwise_left_shift", torch.bitwise_left_shift), ("bitwise_right_shift", torch.bitwise_right_shift),
    ("logical_right_shift", logical_right_shift), ("gcd", torch.gcd), ("fmod", torch.fmod), ("mod", torch.fmod),
    ("remainder", torch.remainder),
])
def test_integer_binary(name: str, ref: Callable[..., torch.Tensor], dtype: torch.dtype, device: str) -> None:
    a = torch.randint(-1000, 1000, (4, 6), dtype=dtype)
    b = torch.randint(0, 9, (6,), dtype=dtype) + (1 if name in ("fmod", "mod", "remainder") else 0)
    if name == "logical_right_shift":
        b[0] = 0
        b[1] = a.element_size() * 8  # a shift by the full width gives 0
    a, b = a.to(device), b.to(device)
    (out,) = run(lambda fd: fd.add_output(getattr(fd.ops, name)(fd.from_pytorch(a), fd.from_pytorch(b))), [a, b], device)
    assert_same(out, ref(a, b.expand(4, 6)))


@pytest.mark.parametrize(("name", "ref"), [("nextafter", torch.nextafter), ("atan2", torch.atan2),
                                           ("fmod", torch.fmod), ("remainder", torch.remainder)])
def test_floating_binary_with_numbers(name: str, ref: Callable[..., torch.Tensor]) -> None:
    a, b = torch.randn(3, 4), torch.randn(3, 4) + 3
    (out,) = run(lambda fd: fd.add_output(getattr(fd.ops, name)(fd.from_pytorch(a), fd.from_pytorch(b))), [a, b])
    assert_same(out, ref(a, b))
    (out,) = run(lambda fd: fd.add_output(getattr(fd.ops, name)(fd.from_pytorch(a), 2.5)), [a])
    assert_same(out, ref(a, torch.tensor(2.5)))
    with FusionDefinition() as fd:
        fd.add_output(getattr(fd.ops, name)(fd.define_scalar(dtype=DataType.Double), 2.5))
    assert_same(fd.execute([1.25])[0], ref(torch.tensor(1.25, dtype=torch.double), torch.tensor(2.5, dtype=torch.double)))


def test_integer_scalars() -> None:
    with FusionDefinition() as fd:
        a, b = fd.define_scalar(dtype=DataType.Int), fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.gcd(a, b))
        fd.add_output(fd.ops.logical_right_shift(a, 60))
        fd.add_output(fd.ops.bitwise_xor(a, b))
    gcd, shifted, xor = fd.execute([-12, 18])
    assert gcd.item() == 6 and shifted.item() == (-12 % (1 << 64)) >> 60 and xor.item() == -12 ^ 18


def test_complex_and_threshold(device: str) -> None:
    re, im = torch.randn(3, 4), torch.randn(4)
    with FusionDefinition() as fd:
        r, i = fd.from_pytorch(re.to(device)), fd.from_pytorch(im.to(device))
        fd.add_output(fd.ops.complex(r, i))
        fd.add_output(fd.ops.threshold(r, 0.1, -2.0))
        fd.add_output(fd.ops.complex(fd.define_scalar(1.5), fd.define_scalar(dtype=DataType.Double)))
    z, t, c = fd.execute([re.to(device), im.to(device), -0.5])
    assert_same(z, torch.complex(re, im.expand(3, 4)).to(device))
    assert_same(t, torch.nn.functional.threshold(re, 0.1, -2.0).to(device))
    assert c.item() == complex(1.5, -0.5) and c.dtype == torch.complex128


def test_lerp_and_addcmul(device: str) -> None:
    start, end = torch.randn(3, 4), torch.randn(4)
    weight = torch.rand(3, 1)
    with FusionDefinition() as fd:
        s, e, w = (fd.from_pytorch(t.to(device)) for t in (start, end, weight))
        fd.add_output(fd.ops.lerp(s, e, w))
        fd.add_output(fd.ops.lerp(s, e, 0.25))
        fd.add_output(fd.ops.lerp(fd.ops.cast(s, DataType.Half), e, 0.75))  # mixed dtypes promote
        fd.add_output(fd.ops.addcmul(s, e, w, 0.5))
    a, b, c, d = fd.execute([t.to(device) for t in (start, end, weight)])
    assert_same(a, torch.lerp(start, end.expand(3, 4), weight.expand(3, 4)))
    assert_same(b, torch.lerp(start, end.expand(3, 4), 0.25))
    assert_same(c, start.half() + 0.75 * (end - start.half()))
    assert_same(d, torch.addcmul(start, end, weight, value=0.5))


@pytest.mark.parametrize(("call", "pattern"), [
    (lambda fd, x: fd.ops.gcd(x, 2), r"not valid for this op: \"gcd_cpu\" not implemented for 'Float'"),
    (lambda fd, x: fd.ops.bitwise_and(x, 1), r"not valid for this op"),
    (lambda fd, x: fd.ops.imag(x), r"imag.*not valid for this op|not valid for this op"),
])
def test_ops_torch_cannot_do_on_the_dtype_are_rejected(call: Callable[[FusionDefinition, Any], Any], pattern: str) -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=DataType.Float)
        with pytest.raises(TypeError, match=pattern):
            call(fd, x)
