"""sdpfa_fwd / sdpfa_bwd against torch's scaled_dot_product_attention and autograd: shapes, causal,
scale, additive bias and mask, dropout replayed by the backward, Python definitions, bad input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition
from pyfuser.ir.ops.attention import attention
from tests.ir.test_python_definition import rebuild


def attention_fd(causal: bool, scale: float | None, dropout: float, with_bias: bool,
                 dtype: DataType = DataType.Float) -> FusionDefinition:
    with FusionDefinition() as fd:
        q, k, v = (fd.define_tensor([-1, -1, -1, -1], dtype=dtype) for _ in range(3))
        bias = fd.define_tensor([-1, -1], dtype=dtype) if with_bias else None
        out, lse, seed, offset = fd.ops.sdpfa_fwd(q, k, v, bias=bias, dropout_p=dropout, is_causal=causal, scale=scale)
        for t in (out, lse, seed, offset):
            fd.add_output(t)
        if not with_bias:
            grad = fd.define_tensor([-1, -1, -1, -1])
            for g in fd.ops.sdpfa_bwd(grad, q, k, v, out, lse, dropout, causal, seed, offset, scale):
                fd.add_output(g)
    return fd


@pytest.mark.parametrize(("causal", "scale"), [(False, None), (True, None), (True, 0.3)])
def test_forward_and_backward_match_torch(causal: bool, scale: float | None, device: str) -> None:
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 4)
    grad = torch.randn(2, 3, 5, 4)
    fd = attention_fd(causal, scale, 0.0, False)
    out, lse, seed, offset, gq, gk, gv = fd.execute([t.to(device) for t in (q, k, v, grad)])
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale)
    want.backward(grad)
    torch.testing.assert_close(out.cpu(), want.detach())
    for got, leaf in zip((gq, gk, gv), leaves, strict=True):
        torch.testing.assert_close(got.cpu(), leaf.grad)
    scores = q @ k.transpose(-2, -1) * (scale or 8 ** -0.5)
    if causal:
        scores = scores.masked_fill(~torch.ones(5, 7, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(lse.cpu(), torch.logsumexp(scores, -1))
    assert lse.dtype == torch.float32 and seed.dtype == torch.uint64 and seed.shape == (2,) and offset.shape == ()
    again = rebuild(fd).execute([t.to(device) for t in (q, k, v, grad)])
    torch.testing.assert_close(again[0], out)


def test_half_precision_and_additive_bias() -> None:
    q, k, v = (torch.randn(1, 2, 4, 8, dtype=torch.half) for _ in range(3))
    bias = torch.randn(4, 4, dtype=torch.half)
    fd = attention_fd(False, None, 0.0, True, DataType.Half)
    out, _, _, _ = fd.execute([q, k, v, bias])
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=bias.float())
    assert out.dtype == torch.half
    torch.testing.assert_close(out.float(), want, atol=2e-3, rtol=2e-3)


def test_dropout_is_replayed_by_the_backward() -> None:
    q, k, v = (torch.randn(1, 2, 6, 4, dtype=torch.double) for _ in range(3))
    grad = torch.randn(1, 2, 6, 4, dtype=torch.double)
    with FusionDefinition() as fd:
        tq, tk, tv = (fd.from_pytorch(t) for t in (q, k, v))
        out, lse, seed, offset = fd.ops.sdpfa_fwd(tq, tk, tv, dropout_p=0.5)
        for t in (out, seed, *fd.ops.sdpfa_bwd(fd.from_pytorch(grad), tq, tk, tv, out, lse, 0.5, False, seed, offset)):
            fd.add_output(t)
    torch.manual_seed(3)
    out, seed, gq, gk, gv = fd.execute([q, k, v, grad])
    assert seed[0].item() != 0
    # The same mask, differentiated by autograd: the backward saw the forward's dropout.
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref, _ = attention(*leaves, None, None, 0.5, False, None, int(seed[0].item()))
    torch.testing.assert_close(out, ref.detach())
    ref.backward(grad)
    for got, leaf in zip((gq, gk, gv), leaves, strict=True):
        torch.testing.assert_close(got, leaf.grad)
    torch.manual_seed(3)
    assert torch.equal(fd.execute([q, k, v, grad])[0], out), "torch.manual_seed repeats the dropout"


@pytest.mark.parametrize(("call", "error", "pattern"), [
    (lambda fd, q, k: fd.ops.sdpfa_fwd(fd.ops.sum(q, [0]), k, k), ValueError, r"has rank 2; query, key and value"),
    (lambda fd, q, k: fd.ops.sdpfa_fwd(q, k, fd.ops.cast(k, DataType.Half)), ValueError,
     r"sdpfa_fwd: T\d+ \(__half, rank 3\) must match query T0 \(float, rank 3\)"),
    (lambda fd, q, k: fd.ops.sdpfa_fwd(q, fd.define_tensor([2, 5, 9]), fd.define_tensor([2, 5, 9])), ValueError,
     r"sdpfa_fwd: T0 axis 2 has extent 8 but T2 axis 2 has extent 9"),
    (lambda fd, q, k: fd.ops.sdpfa_fwd(q, k, k, is_causal=1.0), TypeError, r"is_causal must be a bool or scalar"),
    (lambda fd, q, k: fd.ops.sdpfa_fwd(q, k, k, bias=fd.define_tensor([1, 1, 1, 1])), ValueError,
     r"bias T2 has rank 4; it must broadcast to \[N\*, H, L, S\] \(rank 3\)"),
    (lambda fd, q, k: fd.ops.sdpfa_fwd(fd.ops.cast(q, DataType.Int), k, k), TypeError, r"expected a floating-point"),
])
def test_bad_arguments(call: Callable[..., Any], error: type[Exception], pattern: str) -> None:
    with FusionDefinition() as fd:
        q, k = fd.define_tensor([2, 4, 8]), fd.define_tensor([2, 5, 8])
        with pytest.raises(error, match=pattern):
            call(fd, q, k)


def test_dropout_out_of_range_at_run_time() -> None:
    with FusionDefinition() as fd:
        q = fd.define_tensor([-1, -1, -1])
        fd.add_output(fd.ops.sdpfa_fwd(q, q, q, dropout_p=fd.define_scalar(dtype=DataType.Double))[0])
    with pytest.raises(ValueError, match=r"sdpfa_fwd: dropout_p must be in \[0, 1\), got 1.0"):
        fd.execute([torch.randn(1, 2, 3), 1.0])


def test_backward_takes_none_for_the_forward_defaults() -> None:
    """nvFuser's sdpfa_bwd: dropout_p / is_causal None are the forward's defaults."""
    q, k, v, grad = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 4), torch.randn(2, 3, 5, 4)
    with FusionDefinition() as fd:
        tq, tk, tv = (fd.from_pytorch(t) for t in (q, k, v))
        out, lse, seed, offset = fd.ops.sdpfa_fwd(tq, tk, tv, dropout_p=None, is_causal=None, scale=None)
        for g in fd.ops.sdpfa_bwd(fd.from_pytorch(grad), tq, tk, tv, out, lse, None, None, seed, offset, None):
            fd.add_output(g)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*leaves).backward(grad)
    for got, leaf in zip(fd.execute([q, k, v, grad]), leaves, strict=True):
        torch.testing.assert_close(got, leaf.grad)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_boolean_mask_keeps_true_entries_and_cpu_results_are_torchs(transposed: bool, causal: bool) -> None:
    """A boolean ``mask`` drops its False entries (torch's ``attn_mask`` and nvFuser's), and on a CPU the
    output is exactly what torch's attention gives in bf16, for [N, S, H, E] operands viewed as [N, H, S, E]."""
    n, h, lq, s, e = 3, 2, 5, 7, 4
    if transposed:
        q, k, v = (torch.randn(n, m, h, e, dtype=torch.bfloat16).transpose(1, 2) for m in (lq, s, s))
    else:
        q, k, v = (torch.randn(n, h, m, e, dtype=torch.bfloat16) for m in (lq, s, s))
    bias = torch.randn(n, h, lq, s, dtype=torch.bfloat16)
    mask = torch.rand(n, h, lq, s) > 0.3
    mask[..., 0] = True  # no fully masked row
    with FusionDefinition() as fd:
        tq, tk, tv, tb, tm = (fd.from_pytorch(t) for t in (q, k, v, bias, mask))
        out, lse, _, _ = fd.ops.sdpfa_fwd(tq, tk, tv, bias=tb, mask=tm, is_causal=causal)
        fd.add_output(out)
        fd.add_output(lse)
    got, got_lse = fd.execute([q, k, v, bias, mask])
    attn_mask = (bias + torch.where(mask, 0.0, float("-inf"))).to(torch.bfloat16)
    if causal:
        attn_mask = attn_mask.masked_fill(~torch.ones(lq, s, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask), rtol=0, atol=0)
    scores = (q.float() @ k.float().transpose(-2, -1)) / e ** 0.5 + attn_mask.float()
    torch.testing.assert_close(got_lse, torch.logsumexp(scores, -1), rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="ATen's flash attention runs on CUDA")
def test_cuda_attention_is_atens_flash_attention_dropout_included() -> None:
    """On CUDA, as nvFuser: bfloat16 attention is ATen's flash attention, so a seeded run draws torch's
    dropout mask and the backward replays the flash kernel's philox state; with a mask, torch's own
    attention computes the output (a row that masks every key included)."""
    n, h, seq_q, seq_k, e = 2, 4, 16, 16, 8
    q, k, v, grad = (torch.randn(n, h, length, e, dtype=torch.bfloat16, device="cuda")
                     for length in (seq_q, seq_k, seq_k, seq_q))
    with FusionDefinition() as fwd:
        out, lse, seed, offset = fwd.ops.sdpfa_fwd(*(fwd.from_pytorch(t) for t in (q, k, v)), dropout_p=0.2,
                                                   is_causal=True, scale=0.3)
        for t in (out, lse, seed, offset):
            fwd.add_output(t)
    torch.manual_seed(0)
    got = fwd.execute([q, k, v])
    torch.manual_seed(0)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        want = F.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True, scale=0.3)
    torch.testing.assert_close(got[0], want)

    ref = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.2, True, return_debug_mask=False, scale=0.3)
    want_grads = torch.ops.aten._scaled_dot_product_flash_attention_backward(
        grad, q, k, v, ref[0], ref[1], ref[2], ref[3], ref[4], ref[5], 0.2, True, ref[6], ref[7], scale=0.3)
    with FusionDefinition() as bwd:
        ins = [bwd.from_pytorch(t) for t in (grad, q, k, v, ref[0], ref[1], ref[6], ref[7])]
        for g in bwd.ops.sdpfa_bwd(*ins[:6], 0.2, True, ins[6], ins[7], 0.3):
            bwd.add_output(g)
    for g, w in zip(bwd.execute([grad, q, k, v, ref[0], ref[1], ref[6], ref[7]]), want_grads, strict=True):
        torch.testing.assert_close(g, w)

    bias = torch.randn(n, h, seq_q, seq_k, dtype=torch.bfloat16, device="cuda")
    mask = torch.rand(n, h, seq_q, seq_k, device="cuda") > 0.3
    mask[0, 0, 0] = False  # a row that masks every key
    with FusionDefinition() as masked:
        ins = [masked.from_pytorch(t) for t in (q, k, v, bias, mask)]
        masked.add_output(masked.ops.sdpfa_fwd(*ins[:3], bias=ins[3], mask=ins[4])[0])
    attn_mask = (bias + torch.where(mask, 0.0, float("-inf"))).to(torch.bfloat16)
    torch.testing.assert_close(masked.execute([q, k, v, bias, mask])[0],
                               F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask), equal_nan=True)
