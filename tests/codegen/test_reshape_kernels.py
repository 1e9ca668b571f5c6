"""Reshapes inside generated kernels: the operand read at indices computed through the reshape's groups
of axes, so a reshape of a permuted or expanded value (a copy as an ATen call) is written by the kernel
that computes the value; a reshape its operand's layout makes a view stays an ATen view. Against torch,
float32 and bfloat16, odd sizes, non-contiguous inputs."""

from __future__ import annotations

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.ir.analysis.reshape import ReshapeGroup, _groups
from pyfuser.ir.symbolic import SymConst, SymVar
from tests.codegen.conftest import kernel_schedulers

DTYPES = [torch.float32, torch.bfloat16]


def aten_calls(fd: FusionDefinition) -> list[str]:
    """The ATen calls of the latest execution, by op (``Reshape``, ``Expand``, ...)."""
    program = fd.fec.last_program
    return [type(n.expr).__name__.removesuffix("Op") for n in program.container.walk() if type(n).__name__ == "AtenCall"]


def _static(fd: FusionDefinition, t: torch.Tensor):
    return fd.define_tensor(sizes=t.shape, strides=t.stride(), static_sizes=True,
                            dtype=DataType.BFloat16 if t.dtype == torch.bfloat16 else DataType.Float)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_gqa_repeat_kv_after_rotary_is_one_kernel(dtype: torch.dtype, run_kernels) -> None:
    """GQA's ``k[:, :, None].expand(B, KV, R, S, D).reshape(B, KV * R, S, D)`` of a rotary embedding's
    result, the keys a head split of a projection (``[B, S, KV, D]`` read transposed): one kernel writes the
    repeated heads, no ATen copy of the expanded value."""
    b, kv, r, s, d = 2, 3, 4, 5, 6
    g = torch.Generator().manual_seed(0)
    k = torch.randn(b, s, kv, d, generator=g).to(dtype).transpose(1, 2)
    cos, sin = torch.randn(s, d, generator=g).to(dtype), torch.randn(s, d, generator=g).to(dtype)
    with FusionDefinition() as fd:
        x, c, sn = _static(fd, k), _static(fd, cos), _static(fd, sin)
        upper = fd.ops.slice(x, [0, 0, 0, d // 2], [b, kv, s, d])
        lower = fd.ops.slice(x, [0, 0, 0, 0], [b, kv, s, d // 2])
        rotated = fd.ops.cat([fd.ops.neg(upper), lower], 3)
        y = fd.ops.add(fd.ops.mul(x, c), fd.ops.mul(rotated, sn))
        y = fd.ops.expand(fd.ops.broadcast(y, [False, False, True, False, False]), [b, kv, r, s, d])
        fd.add_output(fd.ops.reshape(y, [b, kv * r, s, d]))
    (out,) = run_kernels(fd, [k, cos, sin])
    want = (k * cos + _rotate_half(k) * sin)[:, :, None].expand(b, kv, r, s, d).reshape(b, kv * r, s, d)
    torch.testing.assert_close(out, want)
    assert kernel_schedulers(fd) == ["pointwise"] and aten_calls(fd) == []


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_head_merge_of_a_transposed_value_is_one_kernel(dtype: torch.dtype, run_kernels) -> None:
    """``(o * scale).transpose(1, 2).reshape(B, S, H * D)`` of an attention output ``[B, H, S, D]``: the
    transposing copy ATen's reshape would make is the kernel computing the product."""
    b, h, s, d = 2, 3, 7, 5
    o = torch.randn(b, h, s, d, generator=torch.Generator().manual_seed(1)).to(dtype)
    with FusionDefinition() as fd:
        x = _static(fd, o)
        y = fd.ops.permute(fd.ops.mul(x, 0.5), [0, 2, 1, 3])
        fd.add_output(fd.ops.reshape(y, [b, s, h * d]))
    (out,) = run_kernels(fd, [o])
    torch.testing.assert_close(out, (o * 0.5).transpose(1, 2).reshape(b, s, h * d))
    assert len(kernel_schedulers(fd)) == 1 and aten_calls(fd) == []


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_head_split_and_transpose_is_one_kernel(dtype: torch.dtype, run_kernels) -> None:
    """A projection's output scaled, split into heads and transposed (``(q * scale).view(B, S, H, D)
    .transpose(1, 2)``) and returned contiguous: one kernel, not a kernel, a view and a transpose kernel."""
    b, s, h, d = 3, 5, 3, 7
    q = torch.randn(b, s, h * d, generator=torch.Generator().manual_seed(2)).to(dtype)
    with FusionDefinition() as fd:
        x = _static(fd, q)
        y = fd.ops.reshape(fd.ops.mul(x, 0.25), [b, s, h, d])
        fd.add_output(fd.ops.permute(y, [0, 2, 1, 3]), stride_order=[3, 2, 1, 0])
    (out,) = run_kernels(fd, [q])
    torch.testing.assert_close(out, (q * 0.25).view(b, s, h, d).transpose(1, 2).contiguous())
    assert out.is_contiguous()
    assert len(kernel_schedulers(fd)) == 1 and aten_calls(fd) == []


def test_a_reshape_of_a_permuted_input_is_a_copy_kernel(run_kernels) -> None:
    """A reshape alone that merges axes a permute separated in memory: ATen would copy, a kernel copies
    (the layout it writes is the reshape's row-major one)."""
    x = torch.randn(2, 5, 3, 4).transpose(1, 2)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.reshape(_static(fd, x), [2, 3, 20]))
    (out,) = run_kernels(fd, [x])
    torch.testing.assert_close(out, x.reshape(2, 3, 20))
    assert kernel_schedulers(fd) == ["pointwise"] and aten_calls(fd) == []


def test_a_reshape_its_layout_makes_a_view_stays_an_aten_view() -> None:
    """A reshape of a dense input is an ATen view, never a kernel copying the data; one of a kernel's
    result that a matmul reads is written in its new shape by that kernel."""
    a = torch.randn(2, 3, 8)
    w = torch.randn(8, 6)
    with FusionDefinition() as fd:
        x, wt = _static(fd, a), _static(fd, w)
        flat = fd.ops.reshape(fd.ops.relu(x), [6, 8])
        fd.add_output(fd.ops.matmul(flat, wt))
        fd.add_output(fd.ops.reshape(x, [6, 8]))
    out, view = fd.execute([a, w], _enable_options=["triton_interpreter"])
    torch.testing.assert_close(out, a.relu().reshape(6, 8) @ w)
    torch.testing.assert_close(view, a.reshape(6, 8))
    assert kernel_schedulers(fd) == ["pointwise"] and sorted(aten_calls(fd)) == ["Matmul", "Reshape"]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_a_norm_of_a_reshaped_value_stays_one_kernel(dtype: torch.dtype, run_kernels) -> None:
    """A projection's ``[B*S, H]`` result reshaped to ``[B, S, H]``, added to the residual stream and
    RMS-normalized: the norm's kernel computes the add and the square, reading the projection through the
    reshape (its ``B * S`` rows are the norm's merged kept axes): no ATen view either."""
    b, s, h = 3, 5, 24
    g = torch.Generator().manual_seed(4)
    proj = torch.randn(b * s, h, generator=g).to(dtype)
    res = torch.randn(b, s, h, generator=g).to(dtype)
    w = torch.randn(h, generator=g).to(dtype)
    with FusionDefinition() as fd:
        p, r, wt = _static(fd, proj), _static(fd, res), _static(fd, w)
        x = fd.ops.cast(fd.ops.add(fd.ops.reshape(p, [b, s, h]), r), DataType.Float)
        var = fd.ops.mean(fd.ops.mul(x, x), [2], keepdim=True)
        y = fd.ops.mul(fd.ops.mul(x, fd.ops.rsqrt(fd.ops.add(var, 1e-6))), fd.ops.cast(wt, DataType.Float))
        fd.add_output(fd.ops.cast(y, DataType.BFloat16 if dtype == torch.bfloat16 else DataType.Float))
    (out,) = run_kernels(fd, [proj, res, w])
    x = (proj.reshape(b, s, h) + res).float()
    want = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(dtype)
    torch.testing.assert_close(out, want)
    assert kernel_schedulers(fd) == ["inner_persistent"] and aten_calls(fd) == []


@pytest.mark.parametrize(("shape", "perm", "target"), [
    ((4, 6), (1, 0), (3, 8)),            # a transposed value regrouped across both axes
    ((2, 3, 5), (2, 0, 1), (5, 6)),      # merge of the two outer axes after a rotation
    ((2, 3, 5), (0, 2, 1), (2, 5, 3, 1)),  # a trailing size-1 axis
    ((1, 6, 4), (0, 2, 1), (4, 2, 3)),   # a leading size-1 axis dropped, one axis split
    ((3, 1, 4), (2, 1, 0), (12,)),       # everything merged, a size-1 axis in the middle
])
def test_reshapes_of_permuted_values_match_torch(shape, perm, target, run_kernels) -> None:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(3))
    with FusionDefinition() as fd:
        y = fd.ops.permute(fd.ops.add(_static(fd, x), 1.0), list(perm))
        fd.add_output(fd.ops.mul(fd.ops.reshape(y, list(target)), 2.0))
    (out,) = run_kernels(fd, [x])
    torch.testing.assert_close(out, ((x + 1).permute(perm).reshape(target)) * 2)
    assert len(kernel_schedulers(fd)) == 1 and aten_calls(fd) == []


def test_reshape_groups() -> None:
    c = SymConst
    assert _groups([c(2), c(12)], [c(2), c(3), c(4)]) == [ReshapeGroup((0,), (0,)), ReshapeGroup((1,), (1, 2))]
    assert _groups([c(4), c(6)], [c(3), c(8)]) == [ReshapeGroup((0, 1), (0, 1))]
    assert _groups([c(1), c(6)], [c(6), c(1)]) == [ReshapeGroup((0,), ()), ReshapeGroup((1,), (0,)),
                                                   ReshapeGroup((), (1,))]
    n = SymVar("i0")
    assert _groups([n, c(6)], [n, c(2), c(3)]) == [ReshapeGroup((0,), (0,)), ReshapeGroup((1,), (1, 2))]
    assert _groups([n, c(6)], [c(6), n]) is None  # symbolic extents regrouped: unknown
    assert _groups([c(0), c(6)], [c(6), c(0)]) is None


def test_a_reshape_of_symbolic_sizes_regrouped_stays_aten() -> None:
    """Groups not known from symbolic extents: the reshape is an ATen call (no kernel reads it wrongly)."""
    x = torch.randn(4, 6).t()
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.reshape(fd.ops.neg(t), [3, 8]))
    (out,) = fd.execute([x], _enable_options=["triton_interpreter"])
    torch.testing.assert_close(out, (-x).reshape(3, 8))
    assert "Reshape" in aten_calls(fd)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_stacked_qkv_gradients_merged_into_one_axis(dtype: torch.dtype, run_kernels) -> None:
    """The gradient of a fused qkv projection split by ``view(b, t, 3, heads, d).permute(2, 0, 3, 1, 4)``:
    the three gradients padded into one stack (select_backward), permuted back and merged, three axes
    into one (each producer index divided by the product of the extents inside it)."""
    g = torch.Generator().manual_seed(4)
    gs = [torch.randn(3, 2, 5, 7, generator=g).to(dtype) for _ in range(3)]
    with FusionDefinition() as fd:
        acc = None
        for k, t in enumerate(_static(fd, x) for x in gs):
            padded = fd.ops.pad(fd.ops.broadcast(t, [True, False, False, False, False]), [0] * 8 + [k, 2 - k])
            acc = padded if acc is None else fd.ops.add(acc, padded)
        fd.add_output(fd.ops.reshape(fd.ops.permute(acc, [1, 3, 0, 2, 4]), [3, 5, 42]))
    (out,) = run_kernels(fd, gs)
    torch.testing.assert_close(out, torch.stack(gs).permute(1, 3, 0, 2, 4).reshape(3, 5, 42))
    assert len(kernel_schedulers(fd)) == 1 and aten_calls(fd) == []
