"""Reductions (sum / prod / max / min / mean, var / var_mean) and matmul / linear against torch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition


def assert_close(actual: torch.Tensor, expected: torch.Tensor, **tol: Any) -> None:
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(actual.cpu(), expected.cpu(), **tol)


def torch_reduce(op: str, x: torch.Tensor, dims: list[int], keepdim: bool, dtype: torch.dtype | None) -> torch.Tensor:
    if op == "sum":
        return torch.sum(x, dims, keepdim=keepdim, dtype=dtype)
    if op == "mean":
        return torch.mean(x, dims, keepdim=keepdim, dtype=dtype)
    if op == "prod":
        for d in sorted(dims, reverse=True):
            x = torch.prod(x, d, keepdim=keepdim, dtype=dtype)
        return x
    fn = torch.amax if op == "max" else torch.amin
    out = fn(x, dims, keepdim=keepdim)
    return out if dtype is None else out.to(dtype)


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "mean"])
@pytest.mark.parametrize("dims", [[0], [1], [-1], [0, 2], [0, 1, 2]])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduction(op: str, dims: list[int], keepdim: bool, device: str) -> None:
    x = torch.rand(3, 4, 5) + 0.5
    with FusionDefinition() as fd:
        fd.add_output(getattr(fd.ops, op)(fd.define_tensor([-1, -1, -1]), dims, keepdim=keepdim))
    (out,) = fd.execute([x.to(device)])
    assert_close(out, torch_reduce(op, x, dims, keepdim, None))


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "mean"])
@pytest.mark.parametrize("dims", [[0, 1], [1, 2], [0, 1, 2], [1]])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduction_over_broadcast_axes(op: str, dims: list[int], keepdim: bool, device: str,
                                      kernel_options: list[str]) -> None:
    """Size-1 broadcast axes among the reduced ones are squeezed (a trivial reduction), the others
    reduced. Values and shapes as torch's, through generated kernels."""
    x = (torch.rand(1, 4, 5) + 0.5).to(device)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)  # axis 0 (size 1) is a broadcast axis
        fd.add_output(getattr(fd.ops, op)(t, dims, keepdim=keepdim))
    reductions = [e for e in fd.fusion.exprs() if type(e).__name__ == "ReductionOp"]
    assert len(reductions) == 1
    reduced = [i for i in reductions[0].outputs[0].get_logical_domain() if i.is_reduction()]
    assert len(reduced) == len([d for d in dims if d != 0])
    (out,) = fd.execute([x], _enable_options=kernel_options)
    assert_close(out, torch_reduce(op, x, dims, keepdim, None))


@pytest.mark.parametrize(("op", "dtype", "requested"), [
    ("sum", torch.float32, DataType.Null), ("sum", torch.bfloat16, DataType.Float),
    ("sum", torch.int32, DataType.Null),  # torch's int64: a cast, then the squeeze
    ("prod", torch.bool, DataType.Null), ("max", torch.bfloat16, DataType.Null),
    ("min", torch.int32, DataType.Null), ("mean", torch.bfloat16, DataType.Null),
])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduction_of_only_broadcast_axes_is_a_squeeze(op: str, dtype: torch.dtype, requested: DataType,
                                                       keepdim: bool, device: str,
                                                       kernel_options: list[str]) -> None:
    """Every reduced axis a size-1 broadcast: nothing is reduced, the result is the input in the
    result's dtype with those axes squeezed (nvFuser builds, and prints, the same squeeze)."""
    x = (torch.rand(1, 4, 1, 5) * 4 + 0.5).to(dtype).to(device).transpose(1, 3)  # [1, 5, 1, 4], strided
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.mul(getattr(fd.ops, op)(t, [0, 2], keepdim=keepdim, dtype=requested), 1))
    kinds = [type(e).__name__ for e in fd.fusion.exprs()]
    assert "ReductionOp" not in kinds and "SqueezeOp" in kinds
    (out,) = fd.execute([x], _enable_options=kernel_options)
    want = torch_reduce(op, x, [0, 2], keepdim, None if requested is DataType.Null else requested.torch_dtype)
    assert_close(out, want * 1)


@pytest.mark.parametrize(("op", "in_dtype", "dtype"), [
    ("sum", torch.float16, DataType.Float),
    ("sum", torch.int32, DataType.Null),  # torch promotes integer sums to int64
    ("sum", torch.bool, DataType.Null),
    ("prod", torch.int32, DataType.Null),
    ("mean", torch.float16, DataType.Null),
    ("mean", torch.float32, DataType.Double),
    ("max", torch.int32, DataType.Null),
    ("min", torch.float16, DataType.Float),
])
def test_reduction_dtype(op: str, in_dtype: torch.dtype, dtype: DataType) -> None:
    x = (torch.rand(4, 6) * 3).to(in_dtype)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=in_dtype)
        fd.add_output(getattr(fd.ops, op)(t, [1], dtype=dtype))
    (out,) = fd.execute([x])
    want = None if dtype is DataType.Null else dtype.torch_dtype
    assert_close(out, torch_reduce(op, x, [1], False, want), atol=1e-2, rtol=1e-2)


def test_mean_of_integers_needs_a_float_dtype() -> None:
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1], dtype=DataType.Int)
        with pytest.raises(TypeError, match=r"T0.*floating-point"):
            fd.ops.mean(t, [0])
        fd.add_output(fd.ops.mean(t, [0], dtype=DataType.Double))
    (out,) = fd.execute([torch.arange(5)])
    assert_close(out, torch.arange(5).double().mean())


@pytest.mark.parametrize("correction", [0, 1, 2])
@pytest.mark.parametrize("dims", [[0], [1], [0, 1]])
@pytest.mark.parametrize("keepdim", [False, True])
def test_var_and_var_mean(correction: int, dims: list[int], keepdim: bool, device: str) -> None:
    x = torch.randn(5, 6)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.var(t, dims, correction=correction, keepdim=keepdim))
        var, mean = fd.ops.var_mean(t, dims, correction=correction, keepdim=keepdim)
        fd.add_output(var)
        fd.add_output(mean)
    v, v2, m = fd.execute([x.to(device)])
    ref_v, ref_m = torch.var_mean(x, dims, correction=correction, keepdim=keepdim)
    assert_close(v, ref_v)
    assert_close(v2, ref_v)
    assert_close(m, ref_m)


def test_reduction_feeding_broadcast_and_pointwise(device: str) -> None:
    """Softmax written out: max, sub (broadcast), exp, sum, div."""
    x = torch.randn(4, 7)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1])
        shifted = fd.ops.sub(t, fd.ops.max(t, [1], keepdim=True))
        e = fd.ops.exp(shifted)
        fd.add_output(fd.ops.div(e, fd.ops.broadcast(fd.ops.sum(e, [1]), [False, True])))
    (out,) = fd.execute([x.to(device)])
    assert_close(out, torch.softmax(x, 1))


MATMUL_SHAPES = [
    ((5,), (5,)),
    ((5,), (5, 3)),
    ((4, 5), (5,)),
    ((4, 5), (5, 3)),
    ((2, 4, 5), (5, 3)),
    ((4, 5), (2, 5, 3)),
    ((2, 4, 5), (2, 5, 3)),
    ((2, 1, 4, 5), (3, 5, 6)),  # broadcast batch
    ((2, 3, 4, 5), (1, 3, 5, 2)),
    ((5,), (2, 3, 5, 4)),
]


@pytest.mark.parametrize(("shape_a", "shape_b"), MATMUL_SHAPES)
def test_matmul(shape_a: tuple[int, ...], shape_b: tuple[int, ...], device: str) -> None:
    a, b = torch.randn(shape_a), torch.randn(shape_b)
    with FusionDefinition() as fd:
        ta = fd.define_tensor([1 if s == 1 else -1 for s in shape_a])
        tb = fd.define_tensor([1 if s == 1 else -1 for s in shape_b])
        fd.add_output(fd.ops.matmul(ta, tb))
    (out,) = fd.execute([a.to(device), b.to(device)])
    assert_close(out, torch.matmul(a, b), atol=1e-4, rtol=1e-4)


def test_matmul_on_transposed_operand_and_half() -> None:
    a, b = torch.randn(4, 6).half(), torch.randn(3, 6).half().t()  # b is column-major
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.matmul(fd.define_tensor([-1, -1], dtype=DataType.Half), fd.from_pytorch(b)))
    (out,) = fd.execute([a, b])
    assert_close(out, torch.matmul(a, b), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize(("x_shape", "w_shape", "with_bias"), [
    ((4, 6), (3, 6), True),
    ((4, 6), (3, 6), False),
    ((2, 4, 6), (3, 6), True),
    ((6,), (3, 6), True),
    ((2, 4, 6), (6,), False),  # 1-D weight: contracts to the batch shape
    ((4, 6), (6,), False),
    ((6,), (6,), False),
    ((2, 4, 6), (3, 6), False),
])
def test_linear(x_shape: tuple[int, ...], w_shape: tuple[int, ...], with_bias: bool, device: str) -> None:
    x, w = torch.randn(x_shape), torch.randn(w_shape)
    bias = (torch.randn(w_shape[0]) if len(w_shape) == 2 else torch.randn(())) if with_bias else None
    with FusionDefinition() as fd:
        tx, tw = fd.define_tensor([-1] * len(x_shape)), fd.define_tensor([-1] * len(w_shape))
        tb = fd.define_tensor([-1] * bias.dim()) if bias is not None else None
        fd.add_output(fd.ops.linear(tx, tw, tb))
    inputs = [x, w] + ([bias] if bias is not None else [])
    (out,) = fd.execute([t.to(device) for t in inputs])
    assert_close(out, F.linear(x, w, bias), atol=1e-4, rtol=1e-4)


def test_linear_then_gelu_symbolic_reexecution() -> None:
    with FusionDefinition() as fd:
        x, w, b = fd.define_tensor([-1, -1, -1]), fd.define_tensor([-1, -1]), fd.define_tensor([-1])
        fd.add_output(fd.ops.gelu(fd.ops.linear(x, w, b), approximate="tanh"))
    for batch, m, k, n in [(2, 3, 4, 5), (1, 7, 2, 3)]:
        x_, w_, b_ = torch.randn(batch, m, k), torch.randn(n, k), torch.randn(n)
        (out,) = fd.execute([x_, w_, b_])
        assert_close(out, F.gelu(F.linear(x_, w_, b_), approximate="tanh"), atol=1e-5, rtol=1e-5)
