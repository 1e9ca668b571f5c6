"""Reductions of at most ``UNROLL_LIMIT`` elements per result (constant extents) become pointwise math: one
pointwise kernel with their producers and consumers, also where a consumer reads the results at shifted
positions (GQA's backward: the sum over a KV head's repeats, then RoPE's rotation of it). Larger or
symbolic extents stay reductions. Through generated kernels (Triton's interpreter on CPU) against torch,
with float64 beside torch's own error for half-precision sums."""

from __future__ import annotations

import pytest
import torch

from pyfuser import FusionDefinition
from pyfuser.preseg.unrolled_reductions import UNROLL_LIMIT
from tests.codegen.conftest import execute_with_kernels, kernel_schedulers

REFERENCE = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "amin": torch.amin}
OPS = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min"}



def _reduce(x: torch.Tensor, op: str, axes: list[int], keepdim: bool = False) -> FusionDefinition:
    with FusionDefinition() as fd:
        fd.add_output(getattr(fd.ops, OPS[op])(fd.from_pytorch(x, static_sizes=True), axes, keepdim))
    return fd


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize(("shape", "axes", "layout"), [
    ((3, 4, 5), [1], None),           # a middle axis
    ((6, 2), [1], None),              # innermost: strided reads of neighbours
    ((2, 3, 5), [0, 1], None),        # two axes, 6 elements
    ((4, 3, 7), [0], (2, 0, 1)),      # permuted memory
    ((5, 7), [1], None),              # exactly the limit
    ((0, 4), [1], None),              # no results
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_small_reductions_are_one_pointwise_kernel(op: str, shape: tuple[int, ...], axes: list[int],
                                                   layout: tuple[int, ...] | None, dtype: torch.dtype,
                                                   device: str) -> None:
    x = torch.randn(shape, device=device).to(dtype)
    if layout is not None:
        x = x.permute(layout).contiguous().permute([layout.index(d) for d in range(len(shape))])
    fd = _reduce(x, op, axes)
    (out,) = execute_with_kernels(fd, [x])
    ref = REFERENCE[op](x, axes)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    if not x.numel():
        return
    exact = REFERENCE[op](x.double(), axes)
    torch_error = (ref.double() - exact).abs().max().item()
    assert (out.double() - exact).abs().max().item() <= max(2 * torch_error, 1e-6)
    assert kernel_schedulers(fd) == ["pointwise"]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_sums_accumulate_in_the_result_dtype(dtype: torch.dtype, device: str) -> None:
    """``sum`` of int32 is int64 (torch's promotion), accumulated in int64: no overflow of the int32 input."""
    x = torch.full((5, 4), 2**30, dtype=dtype, device=device)
    fd = _reduce(x, "sum", [1])
    (out,) = execute_with_kernels(fd, [x])
    assert out.dtype == torch.int64 and torch.equal(out, x.sum(1))
    assert kernel_schedulers(fd) == ["pointwise"]


def test_max_and_min_propagate_nan(device: str) -> None:
    x = torch.randn(4, 3, device=device)
    x[1, 2] = x[3, 0] = float("nan")
    for op in ("amax", "amin"):
        (out,) = execute_with_kernels(_reduce(x, op, [1]), [x])
        torch.testing.assert_close(out, REFERENCE[op](x, [1]), equal_nan=True)


def test_keepdim_results_broadcast_back(device: str) -> None:
    """A softmax over 6 experts: the max and the sum are pointwise math, read back across the row."""
    x = torch.randn(33, 6, device=device)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x, static_sizes=True)
        shifted = fd.ops.exp(fd.ops.sub(tx, fd.ops.max(tx, [1], True)))
        fd.add_output(fd.ops.div(shifted, fd.ops.sum(shifted, [1], True)))
    (out,) = execute_with_kernels(fd, [x])
    torch.testing.assert_close(out, torch.softmax(x, 1))
    assert kernel_schedulers(fd) == ["pointwise"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_gqa_backward_sum_and_rotation_are_one_kernel(dtype: torch.dtype, device: str) -> None:
    """The gradient of K in a GQA layer: the gradients of the 4 repeats of each KV head summed, RoPE's
    backward (the sum times sin, rotated by half the head dim, plus the sum times cos) and the transpose
    back to [batch, tokens, kv heads, dim]: one pointwise kernel, where a reduction kernel could not
    read its sums rotated."""
    b, kv, rep, s, d = 2, 3, 4, 5, 8
    grads = torch.randn(b, kv * rep, s, d, device=device).to(dtype)
    cos, sin = torch.randn(1, s, d, device=device).to(dtype), torch.randn(1, s, d, device=device).to(dtype)
    with FusionDefinition() as fd:
        tg, tc, ts = (fd.from_pytorch(t, static_sizes=True) for t in (grads, cos, sin))
        summed = fd.ops.sum(fd.ops.reshape(tg, [b, kv, rep, s, d]), [2])
        flags = [False, True, False, False]
        by_sin = fd.ops.mul(summed, fd.ops.broadcast(ts, flags))
        half = d // 2
        first = fd.ops.pad(fd.ops.neg(fd.ops.slice(by_sin, [0, 0, 0, 0], [b, kv, s, half])), [half, 0])
        second = fd.ops.pad(fd.ops.slice(by_sin, [0, 0, 0, half], [b, kv, s, d]), [0, half])
        rotated = fd.ops.add(fd.ops.add(first, second), fd.ops.mul(summed, fd.ops.broadcast(tc, flags)))
        fd.add_output(fd.ops.permute(rotated, [0, 2, 1, 3]))
    (out,) = execute_with_kernels(fd, [grads, cos, sin])

    def reference(g: torch.Tensor, c: torch.Tensor, s_: torch.Tensor) -> torch.Tensor:
        summed = g.view(b, kv, rep, s, d).sum(2)
        by_sin = summed * s_[:, None]
        pad = torch.nn.functional.pad
        return (pad(-by_sin[..., :half], [half, 0]) + pad(by_sin[..., half:], [0, half])
                + summed * c[:, None]).permute(0, 2, 1, 3)

    exact = reference(grads.double(), cos.double(), sin.double())
    torch_error = (reference(grads, cos, sin).double() - exact).abs().max().item()
    assert out.dtype == dtype and (out.double() - exact).abs().max().item() <= max(2 * torch_error, 1e-5)
    assert kernel_schedulers(fd) == ["pointwise"]


def test_larger_or_symbolic_extents_stay_reductions(device: str) -> None:
    x = torch.randn(6, UNROLL_LIMIT + 1, device=device)
    fd = _reduce(x, "sum", [1])
    (out,) = execute_with_kernels(fd, [x])
    torch.testing.assert_close(out, x.sum(1))
    assert "pointwise" not in kernel_schedulers(fd)
    small = torch.randn(6, 2, device=device)
    with FusionDefinition() as symbolic:
        symbolic.add_output(symbolic.ops.sum(symbolic.from_pytorch(small), [1]))
    (out,) = execute_with_kernels(symbolic, [small])
    torch.testing.assert_close(out, small.sum(1))
    assert "pointwise" not in kernel_schedulers(symbolic)
