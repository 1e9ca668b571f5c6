"""Every pointwise ``fd.ops`` op against torch: broadcasting, layouts, scalars and type promotion."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition

UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal, "sin": torch.sin, "cos": torch.cos,
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu, "silu": F.silu, "erf": torch.erf,
}
POSITIVE_ONLY = {"log", "sqrt", "rsqrt", "reciprocal"}

BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "truediv": torch.true_divide, "div": torch.div,
    "pow": torch.pow, "maximum": torch.maximum, "minimum": torch.minimum,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
}


def run(build: Callable[[FusionDefinition], Any], inputs: list[Any], device: str = "cpu") -> list[torch.Tensor]:
    with FusionDefinition() as fd:
        build(fd)
    return fd.execute([x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs])


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(actual.cpu(), expected.cpu(), equal_nan=True)


def positive(*shape: int) -> torch.Tensor:
    return torch.rand(*shape) + 0.1


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_matches_torch(name: str, device: str) -> None:
    x = positive(3, 5) if name in POSITIVE_ONLY else torch.randn(3, 5)
    (out,) = run(lambda fd: fd.add_output(getattr(fd.ops, name)(fd.define_tensor([-1, -1]))), [x], device)
    assert_close(out, UNARY[name](x))


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_on_transposed_input(name: str) -> None:
    """A non-contiguous (transposed) input declared with from_pytorch."""
    x = (positive(5, 3) if name in POSITIVE_ONLY else torch.randn(5, 3)).t()
    with FusionDefinition() as fd:
        fd.add_output(getattr(fd.ops, name)(fd.from_pytorch(x)))
    (out,) = fd.execute([x])
    assert_close(out, UNARY[name](x))
    assert out.stride() == UNARY[name](x).stride(), "the output layout follows the input's (a hint), as in torch"


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate: str, device: str) -> None:
    x = torch.randn(4, 6)
    (out,) = run(lambda fd: fd.add_output(fd.ops.gelu(fd.define_tensor([-1, -1]), approximate=approximate)), [x], device)
    assert_close(out, F.gelu(x, approximate=approximate))


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize(("shape_a", "shape_b"), [
    ((3, 4), (3, 4)),
    ((3, 4), (4,)),  # rank mismatch: numpy-style leading broadcast
    ((3, 1), (1, 4)),  # size-1 axes on both sides
    ((2, 1, 4), (3, 1)),
])
def test_binary_broadcast(name: str, shape_a: tuple[int, ...], shape_b: tuple[int, ...], device: str) -> None:
    a, b = positive(*shape_a), positive(*shape_b)

    def build(fd: FusionDefinition) -> None:
        ta = fd.define_tensor([1 if s == 1 else -1 for s in shape_a])
        tb = fd.define_tensor([1 if s == 1 else -1 for s in shape_b])
        fd.add_output(getattr(fd.ops, name)(ta, tb))

    (out,) = run(build, [a, b], device)
    assert_close(out, BINARY[name](a, b))


def test_integer_div_truncates_and_truediv_promotes() -> None:
    a = torch.tensor([7, -7, 9, -9, 0])
    b = torch.tensor([2, 2, -4, -4, 3])

    def build(fd: FusionDefinition) -> None:
        ta, tb = fd.define_tensor([-1], dtype=DataType.Int), fd.define_tensor([-1], dtype=DataType.Int)
        fd.add_output(fd.ops.div(ta, tb))
        fd.add_output(fd.ops.truediv(ta, tb))
        fd.add_output(fd.ops.truediv(ta, 2))

    div, truediv, by_two = run(build, [a, b])
    assert_close(div, torch.div(a, b, rounding_mode="trunc"))
    assert_close(truediv, a / b)
    assert_close(by_two, a / 2)
    assert by_two.dtype == torch.float32


@pytest.mark.parametrize(("dtype", "scalar", "name"), [
    (torch.float16, 2.5, "add"),  # half tensor + python float stays half
    (torch.bfloat16, 3, "mul"),
    (torch.int64, 2.5, "mul"),  # int tensor * float -> default float
    (torch.int32, 3, "add"),  # int32 tensor + python int stays int32
    (torch.bool, 1, "add"),  # bool + int -> int64
    (torch.float32, True, "mul"),
    (torch.int64, 2, "truediv"),
    (torch.float32, 2.0, "pow"),
])
def test_python_number_operand_promotion(dtype: torch.dtype, scalar: Any, name: str) -> None:
    x = (torch.rand(3, 4) * 4 + 1).to(dtype)

    def build(fd: FusionDefinition) -> None:
        t = fd.define_tensor([-1, -1], dtype=dtype)
        fd.add_output(getattr(fd.ops, name)(t, scalar))
        fd.add_output(getattr(fd.ops, name)(scalar, t))

    lhs, rhs = run(build, [x])
    python_op = getattr(operator, name)  # Python's operators take a number on either side, as fd.ops do
    assert_close(lhs, python_op(x, scalar))
    assert_close(rhs, python_op(scalar, x))


@pytest.mark.parametrize(("dtype", "scalar_dtype", "value"), [
    (torch.float16, DataType.Double, 0.75),
    (torch.float32, DataType.Int, 3),
    (torch.int64, DataType.Double, 1.5),
    (torch.bfloat16, DataType.Float, -2.0),
])
def test_define_scalar_input_and_constant(dtype: torch.dtype, scalar_dtype: DataType, value: Any,
                                          device: str) -> None:
    x = (torch.rand(2, 3) * 3).to(dtype)

    def build(fd: FusionDefinition) -> None:
        t = fd.define_tensor([-1, -1], dtype=dtype)
        s = fd.define_scalar(dtype=scalar_dtype)
        c = fd.define_scalar(value, dtype=scalar_dtype)
        fd.add_output(fd.ops.mul(t, s))
        fd.add_output(fd.ops.sub(c, t))
        fd.add_output(fd.ops.add(fd.ops.mul(s, c), t))  # scalar-scalar arithmetic feeding a tensor op

    prod, diff, mixed = run(build, [x, value], device)
    assert_close(prod, x.to(device) * value)
    assert_close(diff, value - x.to(device))
    assert_close(mixed, value * value + x.to(device))


def test_where_clamp_logical_and_comparisons(device: str) -> None:
    x, y = torch.randn(4, 5), torch.randn(5)

    def build(fd: FusionDefinition) -> None:
        tx, ty = fd.define_tensor([-1, -1]), fd.define_tensor([-1])
        gt = fd.ops.gt(tx, ty)
        fd.add_output(fd.ops.where(gt, tx, ty))
        fd.add_output(fd.ops.where(fd.ops.lt(tx, 0.0), 0.0, tx))  # python-number branch
        fd.add_output(fd.ops.clamp(tx, -0.5, 0.5))
        fd.add_output(fd.ops.logical_and(gt, fd.ops.ge(tx, 0.1)))
        fd.add_output(fd.ops.logical_or(gt, fd.ops.le(ty, -0.2)))
        fd.add_output(fd.ops.logical_not(gt))
        fd.add_output(fd.ops.eq(fd.ops.relu(tx), tx))
        fd.add_output(fd.ops.ne(tx, ty))

    outs = run(build, [x, y], device)
    expected = [torch.where(x > y, x, y), torch.where(x < 0, 0.0, x), torch.clamp(x, -0.5, 0.5),
                (x > y) & (x >= 0.1), (x > y) | (y <= -0.2), ~(x > y), torch.relu(x) == x, x != y]
    for out, ref in zip(outs, expected, strict=True):
        assert_close(out, ref)


def test_clamp_with_tensor_bounds_and_where_on_half() -> None:
    x, lo = torch.randn(3, 4).half(), torch.full((4,), -0.25).half()

    def build(fd: FusionDefinition) -> None:
        tx, tlo = fd.define_tensor([-1, -1], dtype=DataType.Half), fd.define_tensor([-1], dtype=DataType.Half)
        fd.add_output(fd.ops.clamp(tx, tlo, 1.0))
        fd.add_output(fd.ops.where(fd.ops.gt(tx, 0.0), tx, 2.0))

    clamped, picked = run(build, [x, lo])
    assert_close(clamped, torch.clamp(x, lo, torch.tensor(1.0, dtype=torch.half)))
    assert_close(picked, torch.where(x > 0, x, torch.tensor(2.0, dtype=torch.half)))


@pytest.mark.parametrize("dtype", [DataType.Half, DataType.Double, DataType.Int32, DataType.Bool, DataType.BFloat16])
def test_cast(dtype: DataType) -> None:
    x = torch.randn(3, 4) * 3
    (out,) = run(lambda fd: fd.add_output(fd.ops.cast(fd.define_tensor([-1, -1]), dtype)), [x])
    assert_close(out, x.to(dtype.torch_dtype))


def test_set_and_segment_set_copy(device: str) -> None:
    x = torch.randn(3, 4)

    def build(fd: FusionDefinition) -> None:
        t = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.set(t))
        fd.add_output(fd.ops.segment_set(fd.ops.neg(t)))

    copied, negated = run(build, [x], device)
    assert_close(copied, x)
    assert_close(negated, -x)
    assert copied.data_ptr() != x.data_ptr() or device != "cpu", "an output never aliases an input"


@pytest.mark.parametrize("stride_order", [[1, 0], [0, 1]])
def test_permuted_stride_order_input(stride_order: list[int], device: str) -> None:
    base = torch.randn(4, 6)
    x = base if stride_order == [1, 0] else base.t().contiguous().t()  # column-major copy of the same values
    y = torch.randn(6)

    def build(fd: FusionDefinition) -> None:
        tx = fd.define_tensor([-1, -1], contiguity=True, stride_order=stride_order)
        fd.add_output(fd.ops.mul(fd.ops.exp(tx), fd.define_tensor([-1])))

    (out,) = run(build, [x, y], device)
    assert_close(out, torch.exp(base) * y)
    assert out.stride() == (torch.exp(x) * y).stride(), "the output layout follows the input's (a hint)"


def test_channels_last_input_and_output_stride_order() -> None:
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)

    def build(fd: FusionDefinition) -> None:
        t = fd.define_tensor([-1, -1, -1, -1], contiguity=True, stride_order=[3, 0, 2, 1])
        y = fd.ops.sigmoid(t)
        fd.add_output(y, stride_order=[3, 0, 2, 1])
        fd.add_output(fd.ops.add(y, 1.0))

    required, default = run(build, [x])
    assert_close(required, torch.sigmoid(x))
    assert required.stride() == torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last).stride()
    assert default.stride() == required.stride(), "no requirement: the inferred channels-last hint"


@pytest.mark.parametrize("stride_order", [[0, 1, 2], [2, 0, 1], [1, 2, 0]])
def test_output_stride_order_is_honoured(stride_order: list[int], device: str) -> None:
    x = torch.randn(3, 4, 5)

    def build(fd: FusionDefinition) -> None:
        fd.add_output(fd.ops.cos(fd.define_tensor([-1, -1, -1])), stride_order=stride_order)

    (out,) = run(build, [x], device)
    assert_close(out, torch.cos(x))
    strides = out.stride()
    for d in range(3):  # a larger stride order entry means an outer (larger-stride) axis
        for e in range(3):
            if stride_order[d] > stride_order[e]:
                assert strides[d] > strides[e], (strides, stride_order)
    assert out.is_contiguous() == (stride_order == [2, 1, 0])


def test_sliced_input_with_gaps() -> None:
    """A view with a non-unit innermost stride needs contiguity False."""
    x = torch.randn(4, 10)[:, ::2]
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], contiguity=False)
        fd.add_output(fd.ops.mul(t, t))
    (out,) = fd.execute([x])
    assert_close(out, x * x)


def test_symbolic_shapes_reexecuted_with_new_sizes(device: str) -> None:
    with FusionDefinition() as fd:
        a, b = fd.define_tensor([-1, -1]), fd.define_tensor([-1])
        s = fd.ops.sum(fd.ops.mul(a, b), [1])
        fd.add_output(fd.ops.reshape(fd.ops.add(a, 1.0), [-1]))
        fd.add_output(s)
    for rows, cols in [(3, 4), (5, 7), (1, 9), (6, 1)]:
        x, y = torch.randn(rows, cols, device=device), torch.randn(cols, device=device)
        flat, total = fd.execute([x, y])
        assert_close(flat, (x + 1).reshape(-1))
        assert_close(total, (x * y).sum(1))


def test_broadcast_axis_declared_as_one(device: str) -> None:
    x, y = torch.randn(1, 5), torch.randn(3, 5)
    with FusionDefinition() as fd:
        tx, ty = fd.define_tensor([1, -1]), fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sub(tx, ty))
    (out,) = fd.execute([x.to(device), y.to(device)])
    assert_close(out, x - y)


def test_static_shapes(device: str) -> None:
    x = torch.randn(2, 3)
    with FusionDefinition() as fd:
        t = fd.define_tensor([2, 3])
        fd.add_output(fd.ops.mul(fd.ops.tanh(t), fd.define_tensor([3])))
    y = torch.randn(3)
    (out,) = fd.execute([x.to(device), y.to(device)])
    assert_close(out, torch.tanh(x) * y)


def test_scalars_wherever_a_tensor_operand_goes(device: str) -> None:
    """Input and constant scalars as fill values, pad values, clamp bounds, where branches and in
    scalar-only arithmetic (unary ops and casts on scalars)."""
    x = torch.randn(2, 3)

    def build(fd: FusionDefinition) -> None:
        t = fd.define_tensor([-1, -1])
        s = fd.define_scalar(dtype=DataType.Double)
        k = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.full([2, 3], s, DataType.Float))
        fd.add_output(fd.ops.pad(t, [1, 1], s))
        fd.add_output(fd.ops.clamp(t, fd.ops.neg(s), s))
        fd.add_output(fd.ops.where(fd.ops.gt(t, 0.0), s, t))
        fd.add_output(fd.ops.mul(t, fd.ops.exp(fd.ops.cast(k, DataType.Double))))
        fd.add_output(fd.ops.add(t, fd.ops.truediv(k, 2)))

    full, padded, clamped, picked, scaled, halves = run(build, [x, 0.5, 2], device)
    x = x.to(device)
    assert_close(full, torch.full((2, 3), 0.5, device=device))
    assert_close(padded, F.pad(x, [1, 1], value=0.5))
    assert_close(clamped, torch.clamp(x, -0.5, 0.5))
    assert_close(picked, torch.where(x > 0, 0.5, x))
    assert_close(scaled, x * torch.exp(torch.tensor(2.0)).item())
    assert_close(halves, x + 1.0)


@pytest.mark.parametrize("cond", [True, False])
def test_where_with_a_number_condition_broadcasts_the_branches(cond: bool) -> None:
    a, b = torch.randn(3), torch.randn(2, 3)

    def build(fd: FusionDefinition) -> None:
        ta, tb = fd.define_tensor([-1]), fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.where(cond, ta, tb))
        fd.add_output(fd.ops.where(fd.define_scalar(cond), tb, 0.5))

    picked, with_number = run(build, [a, b])
    assert_close(picked, torch.where(torch.tensor(cond), a, b))
    assert_close(with_number, torch.where(torch.tensor(cond), b, 0.5))


@pytest.mark.parametrize("name", ["mul", "truediv", "add", "lt", "gt", "maximum"])
@pytest.mark.parametrize(("dtype", "scalar_dtype"), [(torch.float32, torch.float64), (torch.float16, torch.float32),
                                                     (torch.bfloat16, torch.float64), (torch.int32, torch.int64)])
def test_zero_dim_tensor_operand_promotes_like_a_number(name: str, dtype: torch.dtype,
                                                         scalar_dtype: torch.dtype) -> None:
    """``x_float * t_double_0d`` is float in torch, computed as torch computes it (not in double)."""
    x = (torch.randn(64, 8) * 4).to(dtype)
    s = torch.tensor(0.1 if scalar_dtype.is_floating_point else 3, dtype=scalar_dtype)
    fn = torch.true_divide if name == "truediv" else getattr(torch, name)
    for args in ((x, s), (s, x)):
        with FusionDefinition() as fd:
            fd.add_output(getattr(fd.ops, name)(*[fd.from_pytorch(a) for a in args]))
        (out,) = fd.execute(list(args))
        expected = fn(*args)
        assert out.dtype == expected.dtype
        torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_scalar_outputs_are_zero_dim_tensors() -> None:
    with FusionDefinition() as fd:
        s = fd.define_scalar(dtype=DataType.Double)
        n = fd.define_scalar(dtype=DataType.Int)
        t = fd.define_tensor([-1])
        fd.add_output(fd.ops.mul(s, s))
        fd.add_output(fd.ops.add(t, n))
        fd.add_output(n)
    squared, added, same = fd.execute([1.5, 3, torch.ones(2)])
    assert_close(squared, torch.tensor(2.25, dtype=torch.float64))
    assert_close(added, torch.ones(2) + 3)
    assert_close(same, torch.tensor(3))
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.mul(fd.define_scalar(dtype=DataType.Int), 2))
    (only,) = fd.execute([4])
    assert_close(only, torch.tensor(8))


@pytest.mark.parametrize("example", [
    torch.randn(1, 5).expand(4, 5),  # stride 0 on the outer axis
    torch.randn(2, 1, 3).expand(2, 5, 3),  # stride 0 in the middle
    torch.randn(4, 1).expand(4, 5).t(),  # [5, 4] with strides [0, 1]
])
def test_from_pytorch_of_an_expanded_tensor_declares_the_axis_expanded(example: torch.Tensor) -> None:
    """A stride-0 axis of extent > 1 is declared expanded (contiguity None), as nvFuser does: any
    tensor expanded there runs, a materialized copy (which could hold different values along the
    axis) is rejected naming the axis."""
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.mul(fd.from_pytorch(example), 2))
    other = (torch.randn_like(example.contiguous()) * 0).add(3).as_strided(example.shape, example.stride())
    for x in (example, other):
        (out,) = fd.execute([x])
        assert_close(out, x * 2)
    axis = example.stride().index(0)
    with pytest.raises(ValueError, match=rf"input 0 \(T0\) axis {axis}: declared expanded \(contiguity None\), so "
                                         r"its stride must be 0"):
        fd.execute([example.contiguous()])
