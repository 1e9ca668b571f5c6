"""Patterns of Hugging Face models outside the zoo, written as small modules: a training step through
generated kernels (Triton's interpreter on CPU) against eager, a kernel falling back to ATen calls an
error."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from pyfuser.integrations.torch_compile import PyfuserBackend

pytestmark = pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")

#: bfloat16 steps against eager's: the same math, rounded at other places
TOLERANCE = {torch.float32: {}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


class MultiQueryAttention(torch.nn.Module):
    """GPTBigCode's attention: one projection gives the queries of every head and a single key and value
    head (``split`` of ``unsqueeze(1)``), which the heads' matmuls broadcast. Its backward sums the heads'
    key and value gradients and concatenates them after the queries' gradient, whose heads are merged
    back into the hidden axis (a reshape of a transpose) inside the concatenation's kernel."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv = torch.nn.Linear(hidden, hidden + 2 * self.head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(x).unsqueeze(1).split((hidden, self.head_dim, self.head_dim), dim=3)
        q = q.reshape(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        weights = torch.softmax(q @ k.transpose(2, 3) * self.head_dim**-0.5, dim=-1, dtype=torch.float32)
        out = weights.to(q.dtype) @ v
        return out.transpose(1, 2).reshape(batch, seq, hidden)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_multi_query_attention_gradients_match_eager(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = MultiQueryAttention(hidden=20, heads=5).to(dtype)  # head_dim 4: the merged axis 20 of 28
    x = torch.randn(3, 7, 20, dtype=dtype)
    weight = torch.randn(3, 7, 20, dtype=dtype)

    def step(run: torch.nn.Module) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        inputs = x.clone().requires_grad_()
        out = run(inputs)
        (out * weight).sum().backward()
        assert inputs.grad is not None and model.qkv.weight.grad is not None and model.qkv.bias.grad is not None
        return [out.detach(), inputs.grad, model.qkv.weight.grad.clone(), model.qkv.bias.grad.clone()]

    backend = PyfuserBackend(triton_interpreter=True)
    got = step(torch.compile(model, backend=backend))
    want = step(model)
    for name, g, w in zip(["output", "input grad", "weight grad", "bias grad"], got, want, strict=True):
        torch.testing.assert_close(g, w, **TOLERANCE[dtype], msg=lambda m, name=name: f"{name}: {m}")
    assert any(" kernel " in r.summary() for g in backend.graphs if g.kind == "backward" for r in g.regions)


class NormedRotaryAttention(torch.nn.Module):
    """Qwen3's and Gemma3's attention inputs: an RMS norm over each query and key head (its own weight),
    then rotary embedding (``rotate_half``) of the heads moved before the sequence, then attention. The
    forward computes each norm and its rotation in one kernel (the rotated half re-read at the shifted
    column, scaled by the row's statistics); the backward's pads (rotary) come before the norm's sums."""

    def __init__(self, hidden: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.q = torch.nn.Linear(hidden, hidden, bias=False)
        self.k = torch.nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v = torch.nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.q_norm = torch.nn.RMSNorm(self.head_dim, eps=1e-6)
        self.k_norm = torch.nn.RMSNorm(self.head_dim, eps=1e-6)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape

        def rotary(t: torch.Tensor) -> torch.Tensor:
            half = t.shape[-1] // 2
            return t * cos[:, None] + torch.cat((-t[..., half:], t[..., :half]), -1) * sin[:, None]

        q = rotary(self.q_norm(self.q(x).view(batch, seq, self.heads, -1)).transpose(1, 2))
        k = rotary(self.k_norm(self.k(x).view(batch, seq, self.kv_heads, -1)).transpose(1, 2))
        v = self.v(x).view(batch, seq, self.kv_heads, -1).transpose(1, 2)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return out.transpose(1, 2).reshape(batch, seq, hidden)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_per_head_norm_and_rotary_training_step_matches_eager(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = NormedRotaryAttention(hidden=40, heads=4, kv_heads=2).to(dtype)  # head_dim 10: a tile of 16
    x = torch.randn(2, 7, 40, dtype=dtype)
    angle = torch.arange(7.0)[:, None] * torch.rand(10)[None, :]
    cos, sin = (t.expand(2, 7, 10).to(dtype) for t in (angle.cos(), angle.sin()))
    weight = torch.randn(2, 7, 40, dtype=dtype)

    def step(run: torch.nn.Module) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        inputs = x.clone().requires_grad_()
        out = run(inputs, cos, sin)
        (out * weight).sum().backward()
        grads = [p.grad for p in (inputs, model.q.weight, model.k.weight, model.q_norm.weight, model.k_norm.weight)]
        assert all(g is not None for g in grads)
        return [out.detach(), *(g.clone() for g in grads if g is not None)]

    backend = PyfuserBackend(triton_interpreter=True)
    got = step(torch.compile(model, backend=backend))
    want = step(model)
    names = ["output", "input grad", "q weight grad", "k weight grad", "q norm grad", "k norm grad"]
    for name, g, w in zip(names, got, want, strict=True):
        torch.testing.assert_close(g, w, **TOLERANCE[dtype], msg=lambda m, name=name: f"{name}: {m}")
    (forward,) = [g for g in backend.graphs if g.kind == "forward"]
    summary = "\n".join(r.summary() for r in forward.regions)
    # the query's and the key's norm with its rotation; no pointwise kernel of the rotation
    assert "-> 2 kernel(s)" in summary and "pointwise" not in summary, summary
