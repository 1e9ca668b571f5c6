"""Copies of permuted or expanded views inside compiled regions are written by generated kernels, not
ATen copies: GQA's repeat_kv after a rotary embedding, an attention output's head merge before its
output projection, a projection's head split returned contiguous for SDPA. Against eager, float32 and
bfloat16, odd sizes; the regions' ATen calls counted."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from pyfuser.integrations.torch_compile import PyfuserBackend

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


def _summaries(backend: PyfuserBackend) -> str:
    return "\n".join(r.summary() for g in backend.graphs for r in g.regions)


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_gqa_repeat_kv_is_written_by_the_rotary_kernel(dtype: torch.dtype) -> None:
    """Eager attention with grouped keys: the rotary embedding, GQA's expand + reshape of the keys and
    the transpose the score matmul reads are one kernel; the regions call ATen only for the matmul."""
    b, s, kv, r, d = 2, 5, 3, 2, 6

    def scores(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        k = k.view(b, s, kv, d).transpose(1, 2)
        k = k * cos + _rotate_half(k) * sin
        k = k[:, :, None].expand(b, kv, r, s, d).reshape(b, kv * r, s, d)
        return torch.matmul(q, k.transpose(2, 3))

    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, kv * r, s, d, generator=g).to(dtype)
    k = torch.randn(b, s, kv * d, generator=g).to(dtype)
    cos, sin = torch.randn(s, d, generator=g).to(dtype), torch.randn(s, d, generator=g).to(dtype)
    backend = PyfuserBackend(triton_interpreter=True)
    got = torch.compile(scores, backend=backend)(q, k, cos, sin)
    torch.testing.assert_close(got, scores(q, k, cos, sin), **_tolerance(dtype))
    summary = _summaries(backend)
    assert summary.count(" kernel ") == 1 and "ATen calls: Matmul x1" in summary, summary
    assert not any(op in summary for op in ("Reshape", "Expand", "Permute")), summary


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_head_merge_before_the_output_projection_is_a_kernel(dtype: torch.dtype) -> None:
    """``o.transpose(1, 2).contiguous().reshape(B, S, H * D)`` then a linear and the residual add (a
    Whisper layer after SDPA): the transposing copy is a kernel (ATen's reshape of the transpose copied),
    the linear the only ATen call."""
    b, h, s, d = 2, 3, 7, 5

    def project(o: torch.Tensor, w: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(o.transpose(1, 2).contiguous().reshape(b, s, h * d), w) + residual

    g = torch.Generator().manual_seed(1)
    o = torch.randn(b, h, s, d, generator=g).to(dtype)
    w = torch.randn(4, h * d, generator=g).to(dtype)
    residual = torch.randn(b, s, 4, generator=g).to(dtype)
    backend = PyfuserBackend(triton_interpreter=True)
    got = torch.compile(project, backend=backend)(o, w, residual)
    torch.testing.assert_close(got, project(o, w, residual), **_tolerance(dtype))
    summary = _summaries(backend)
    assert summary.count(" kernel ") == 2 and "ATen calls: Linear x1" in summary, summary
    assert "Reshape" not in summary, summary


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_scaled_head_split_for_sdpa_is_one_kernel(dtype: torch.dtype) -> None:
    """A projection's output scaled, split into heads, transposed and made contiguous for SDPA
    (Whisper's queries): one kernel from the linear's result to the contiguous heads, no reshape left to
    ATen between a scaling kernel and a transpose kernel."""
    b, s, h, d = 2, 7, 3, 5

    def heads(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        q = torch.nn.functional.linear(x, w) * 0.3
        q = q.view(b, s, -1, d).transpose(1, 2).contiguous()
        return torch.nn.functional.scaled_dot_product_attention(q, q, q)

    g = torch.Generator().manual_seed(2)
    x = torch.randn(b, s, 8, generator=g).to(dtype)
    w = torch.randn(h * d, 8, generator=g).to(dtype)
    backend = PyfuserBackend(triton_interpreter=True)
    got = torch.compile(heads, backend=backend)(x, w)
    torch.testing.assert_close(got, heads(x, w), **_tolerance(dtype))
    summary = _summaries(backend)
    assert summary.count(" kernel ") == 1 and "Reshape" not in summary, summary
