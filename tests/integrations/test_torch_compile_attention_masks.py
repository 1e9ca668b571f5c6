"""Attention masks that depend on no input are folded before AOTAutograd (``attention_masks.py``): an
all-allowed mask becomes none, a top-left causal one ``is_causal=True``, any other stays; the results
equal eager's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pyfuser.integrations.torch_compile import PyfuserBackend
from pyfuser.integrations.torch_compile.attention_masks import fold_constant_attention_masks

HEADS, HEAD_DIM = 2, 8


def _mask(kind: str, x: torch.Tensor) -> torch.Tensor | None:
    batch, length, _ = x.shape
    index = torch.arange(length, device=x.device)
    if kind == "all_allowed":  # a padding-free bidirectional mask, broadcast as transformers builds it
        return (index[None, :] >= 0)[None, None].expand(batch, 1, length, length)
    if kind == "causal":
        return (index[None, :] <= index[:, None])[None, None].expand(batch, 1, length, length)
    if kind == "causal_additive":
        allowed = index[None, :] <= index[:, None]
        return torch.zeros(length, length, dtype=x.dtype, device=x.device).masked_fill(~allowed, torch.finfo(x.dtype).min)
    if kind == "sliding_window":
        return ((index[None, :] <= index[:, None]) & (index[:, None] - index[None, :] < 3))[None, None]
    if kind == "vmap_all_allowed":  # transformers' vmap over (kv, q) indices of a mask function
        def allowed(q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
            return kv_idx >= 0
        rows = torch.vmap(torch.vmap(allowed, in_dims=(None, 0)), in_dims=(0, None))(index, index)
        return rows[None, None].expand(batch, 1, length, length)
    if kind == "padding":  # reads the input: not a constant
        return (x[..., 0] > -1e9)[:, None, None, :]
    raise AssertionError(kind)


class Attention(torch.nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.qkv = torch.nn.Linear(HEADS * HEAD_DIM, 3 * HEADS * HEAD_DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = (t.view(batch, length, HEADS, HEAD_DIM).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_mask(self.kind, x))


def _sdpa_arguments(kind: str, x: torch.Tensor) -> tuple[int, list[tuple[bool, bool]], torch.Tensor]:
    """Folds the dynamo graph of ``Attention(kind)``; returns the changed count, (has a mask, is_causal)
    of each SDPA call after folding, and the folded graph's output."""
    seen: dict[str, object] = {}

    def backend(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        seen["changed"] = fold_constant_attention_masks(gm)
        seen["calls"] = [(n.kwargs.get("attn_mask") is not None, n.kwargs.get("is_causal", False) is True)
                         for n in gm.graph.nodes if "scaled_dot_product" in str(n.target)]
        return gm.forward

    torch._dynamo.reset()
    model = Attention(kind)
    out = torch.compile(model, backend=backend)(x)
    torch.testing.assert_close(out, model(x))
    return seen["changed"], seen["calls"], out  # type: ignore[return-value]


@pytest.mark.parametrize(("kind", "expected"), [
    ("all_allowed", (False, False)), ("vmap_all_allowed", (False, False)), ("causal", (False, True)),
    ("causal_additive", (False, True)), ("sliding_window", (True, False)), ("padding", (True, False))])
def test_masks_of_no_input_fold_to_sdpa_arguments(kind: str, expected: tuple[bool, bool]) -> None:
    x = torch.randn(2, 7, HEADS * HEAD_DIM)
    changed, calls, _ = _sdpa_arguments(kind, x)
    assert calls == [expected]
    assert changed == (0 if expected[0] else 1)
    assert torch._C._functorch.maybe_current_level() is None  # a vmap's levels entered while folding were left


def test_causal_mask_of_other_lengths_stays() -> None:
    """SDPA's is_causal is top-left aligned: a mask causal only for its own (rows, columns) that differ
    from (query length, key length) is not that pattern."""
    class Cross(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            rows, columns = q.shape[-2], k.shape[-2]
            mask = torch.ones(rows, columns, dtype=torch.bool).tril(diagonal=columns - rows)
            return F.scaled_dot_product_attention(q, k, k, attn_mask=mask)

    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8)
    seen: list[object] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        seen.append(fold_constant_attention_masks(gm))
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(Cross(), backend=backend)(q, k)
    torch.testing.assert_close(out, Cross()(q, k))
    assert seen == [0]


@pytest.mark.parametrize("kind", ["causal", "vmap_all_allowed", "padding"])
def test_backend_with_folded_masks_matches_eager(kind: str) -> None:
    torch._dynamo.reset()
    model = Attention(kind)
    x = torch.randn(2, 5, HEADS * HEAD_DIM, requires_grad=True)
    compiled = torch.compile(model, backend=PyfuserBackend(triton_interpreter=True))
    out = compiled(x)
    torch.testing.assert_close(out, model(x))
    out.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    model(x).sum().backward()
    torch.testing.assert_close(grad, x.grad)
