"""How many kernels and ATen calls a compiled step runs, counted from the compiled programs (never timed):
boolean masks combined in one kernel, and a tiny Llama's training and inference steps held at or below
the counts they reached (``benchmarks/fusion_counts.py`` prints them for every decoder of the zoo)."""

from __future__ import annotations

import re

import pytest
import torch
import torch._dynamo

from benchmarks.fusion_counts import pyfuser_counts
from pyfuser.integrations.torch_compile import PyfuserBackend
from pyfuser.scheduler.registry import Machine
from tests.conftest import devices

pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_boolean_masks_combine_in_one_kernel(dtype: torch.dtype) -> None:
    """An attention mask built with ``&`` / ``|`` / ``^`` of boolean comparisons (a causal and a padding
    mask): one kernel, no ATen call between its parts; on integers the same ops stay bitwise."""
    def mask(scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(scores.shape[-2])[:, None]
        cols = torch.arange(scores.shape[-1])[None, :]
        allowed = ((cols <= rows) & keep[:, None, None, :]) | ((rows == cols) ^ (scores > 3))
        return torch.where(allowed, scores, torch.finfo(scores.dtype).min)

    def bits(ids: torch.Tensor) -> torch.Tensor:
        return (ids & 6) | (ids ^ 3)

    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 2, 5, 7, generator=g).to(dtype)
    keep = torch.rand(3, 7, generator=g) > 0.3
    ids = torch.randint(0, 100, (3, 7), generator=g)
    backend = PyfuserBackend(triton_interpreter=True)
    compiled = torch.compile(mask, backend=backend)
    for _ in range(3):
        got = compiled(scores, keep)
    torch.testing.assert_close(got, mask(scores, keep))
    (graph,) = backend.graphs
    (region,) = graph.regions
    summary = region.summary()
    assert "ATen calls" not in summary and summary.count(" kernel ") == 1, summary
    torch.testing.assert_close(torch.compile(bits, backend=PyfuserBackend(triton_interpreter=True))(ids), bits(ids))


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_a_safe_softmax_is_one_kernel(dtype: torch.dtype) -> None:
    """SDPA's math path (``_safe_softmax``: rows masked out entirely give zeros) with a padding mask: the
    softmax, the all-masked-rows test (``aten.all``) and the select in one kernel, no ATen call between."""
    def attention_probs(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._safe_softmax(scores.float() + mask, -1).to(scores.dtype)

    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 5, 7, generator=g).to(dtype)
    mask = torch.zeros(2, 1, 5, 7)
    mask[0, :, 1] = float("-inf")  # a fully masked row
    mask[1, :, :, 4:] = float("-inf")
    backend = PyfuserBackend(triton_interpreter=True)
    got = torch.compile(attention_probs, backend=backend)(scores, mask)
    expected = attention_probs(scores, mask)
    torch.testing.assert_close(got, expected)
    assert bool((got[0, :, 1] == 0).all())
    (graph,) = backend.graphs
    (region,) = graph.regions
    summary = region.summary()
    assert not graph.eager and "ATen calls" not in summary and summary.count(" kernel ") == 1, summary


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_a_group_norm_and_its_activation_are_one_kernel(dtype: torch.dtype) -> None:
    """GroupNorm of one channel a group over a 1-D convolution's output and the GELU after it (wav2vec2's
    feature encoder), as ATen's CUDA decomposition of ``native_group_norm`` writes it: the statistics of
    a ``[N, C, 1, L]`` view, the normalized view back to ``[N, C, L]``. Those views only insert and drop
    a size-1 axis, so they are a broadcast and a squeeze that the kernel computing the statistics also
    computes: one kernel writes the activation, no ATen reshape between."""
    def block(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        n, c, length = x.shape
        rows = x.reshape(n, c, 1, length).float()
        var, mean = torch.var_mean(rows, dim=[2, 3], correction=0, keepdim=True)
        normalized = ((rows - mean) * torch.rsqrt(var + 1e-5)).view(n, c, length)
        return torch.nn.functional.gelu((normalized * weight[:, None] + bias[:, None]).to(x.dtype))

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 6, 37, generator=g) * 3 + 1).to(dtype)
    weight, bias = torch.rand(6, generator=g) + 0.5, torch.rand(6, generator=g) - 0.5
    backend = PyfuserBackend(triton_interpreter=True)
    got = torch.compile(block, backend=backend)(x, weight, bias)
    expected = torch.nn.functional.gelu(torch.nn.functional.group_norm(x.double(), 6, weight.double(), bias.double()))
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.double(), expected, rtol=tolerance, atol=tolerance)
    (graph,) = backend.graphs
    (region,) = graph.regions
    summary = region.summary()
    assert "ATen calls" not in summary and summary.count(" kernel ") == 1, summary


class RelativeScores(torch.nn.Module):
    """DeBERTa-v2's disentangled attention scores (``DisentangledSelfAttention``): content-to-position and
    position-to-content biases gathered from ``[B*H, S, 2 * span]`` at the clamped relative positions,
    added to the content scores, masked and normalized."""

    def __init__(self, span: int, transposed: bool) -> None:
        super().__init__()
        self.span, self.transposed = span, transposed

    def forward(self, scores: torch.Tensor, c2p: torch.Tensor, p2c: torch.Tensor, rel: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        size = scores.shape
        c2p_att = torch.gather(c2p, -1, torch.clamp(rel + self.span, 0, 2 * self.span - 1).expand(size))
        p2c_att = torch.gather(p2c, -1, torch.clamp(-rel + self.span, 0, 2 * self.span - 1).expand(size))
        if self.transposed:
            p2c_att = p2c_att.transpose(-1, -2)
        y = scores + (c2p_att + p2c_att) / 3.0
        return torch.softmax(y.masked_fill(mask, torch.finfo(y.dtype).min), -1)


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize(("transposed", "kernels"), [(False, 1), (True, 2)], ids=["c2p_p2c", "p2c_transposed"])
def test_relative_position_gathers_run_inside_kernels(dtype: torch.dtype, transposed: bool, kernels: int) -> None:
    """Both gathers are indirect loads of generated kernels: no ATen gather (nor any ATen call) in the
    region, the relative positions computed where the gathers read them. Without the transpose they
    join the softmax's kernel; DeBERTa transposes p2c, which over a square [S, S] makes the scores' two
    axes one axis class, and the reduction analysis keeps the softmax in a kernel of its own (the
    count to lower)."""
    g = torch.Generator().manual_seed(0)
    span, b, s = 4, 6, 9
    scores = torch.randn(b, s, s, generator=g).to(dtype)
    c2p, p2c = (torch.randn(b, s, 2 * span, generator=g).to(dtype) for _ in range(2))
    rel = torch.arange(s)[:, None] - torch.arange(s)[None, :]
    mask = torch.rand(s, s, generator=g) > 0.8
    module = RelativeScores(span, transposed)
    backend = PyfuserBackend(triton_interpreter=True)
    got = torch.compile(module, backend=backend)(scores, c2p, p2c, rel, mask)
    torch.testing.assert_close(got, module(scores, c2p, p2c, rel, mask))
    (graph,) = backend.graphs
    (region,) = graph.regions
    summary = region.summary()
    assert "ATen calls" not in summary and summary.count(" kernel ") == kernels, summary
    assert any("gather" in node for node in region.nodes), region.nodes


class SlidingWindowScores(torch.nn.Module):
    """A sliding-window, packed-sequence attention mask as ``transformers`` builds it for eager attention
    (``sdpa_mask`` / ``eager_mask``): positions and segment ids read by advanced indexing at
    ``[batch, None, q, None]`` and ``[batch, None, None, kv]``, combined, and applied to the scores."""

    def forward(self, scores: torch.Tensor, positions: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        b, _, s, _ = scores.shape
        batch = torch.arange(b, device=scores.device)[:, None, None, None]
        q, kv = torch.arange(s, device=scores.device)[None, None, :, None], \
            torch.arange(s, device=scores.device)[None, None, None, :]
        segments = starts.cumsum(-1)
        keep = (positions[batch, kv] <= positions[batch, q]) & (positions[batch, kv] > positions[batch, q] - 3) & \
            (segments[batch, q] == segments[batch, kv])
        return torch.softmax(scores.masked_fill(~keep, torch.finfo(scores.dtype).min), -1)


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_an_indexed_mask_is_computed_in_the_softmax_kernel(dtype: torch.dtype) -> None:
    """``aten.index.Tensor`` of integer tensors is claimed by the region (no eager op, no mask written to
    memory): the positions and segment ids are read at indexed positions inside the softmax's kernel
    (Inductor's one kernel); results equal eager's."""
    g = torch.Generator().manual_seed(0)
    b, h, s = 2, 3, 11  # more keys than a softmax unrolled into pointwise math (preseg/unrolled_reductions.py)
    scores = torch.randn(b, h, s, s, generator=g).to(dtype)
    positions = torch.arange(s)[None].expand(b, s) + torch.randint(0, 3, (b, 1), generator=g)
    starts = (torch.rand(b, s, generator=g) > 0.7).long()
    module = SlidingWindowScores()
    backend = PyfuserBackend(triton_interpreter=True)
    got = torch.compile(module, backend=backend)(scores, positions, starts)
    torch.testing.assert_close(got, module(scores, positions, starts))
    (graph,) = backend.graphs
    assert not any("index.Tensor" in str(node) for node in graph.eager), graph.eager
    (region,) = graph.regions
    summary = region.summary()
    assert any("index.Tensor" in node for node in region.nodes), region.nodes
    assert len(re.findall(r"kernel inner_persistent_\w*kernel ", summary)) == 1, summary
    assert "ATen calls: Scan x1" in summary, summary


#: a tiny Llama's step (one layer, float32), as fusion_counts counts it: generated kernels, ATen calls
#: that compute (not views, not GEMMs or attention, which run in cuBLAS / torch either way) inside regions
#: and between them. Lower them when a change lowers the count; never raise one without lowering the other
#: more (the embedding's backward, one ATen call of several CUDA kernels, a sort among them, is one scatter
#: kernel since; the grouped-query attention's key and value repeats, ATen copies after the regions, are
#: written by the regions' kernels since; the causal mask, built from aranges, is folded into SDPA's is_causal;
#: the sums over the key / value repeats are pointwise math in RoPE's backward kernels, and the logits' own
#: gradient is added in the loss's backward kernel).
LLAMA_TRAINING_KERNELS = 22
LLAMA_INFERENCE_KERNELS = 8
LLAMA_TRAINING_OTHER_ATEN = 2
LLAMA_INFERENCE_OTHER_ATEN = 1
_GEMMS_AND_ATTENTION = ("Matmul", "Linear", "_scaled_dot_product")


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_llama_step_kernel_count_does_not_grow(training: bool) -> None:
    counts = pyfuser_counts("llama", training)
    kernels = sum(counts.kernels.values())
    views = ("Reshape", "Permute", "Squeeze", "Broadcast", "Expand", "Slice", "Set")
    other = sum(n for k, n in counts.region_aten.items() if not k.startswith((*views, *_GEMMS_AND_ATTENTION)))
    other += sum(n for k, n in counts.compute_eager().items() if not k.startswith(_GEMMS_AND_ATTENTION))
    limit = (LLAMA_TRAINING_KERNELS, LLAMA_TRAINING_OTHER_ATEN) if training else \
        (LLAMA_INFERENCE_KERNELS, LLAMA_INFERENCE_OTHER_ATEN)
    assert kernels <= limit[0] and other <= limit[1], counts.line()


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("dim", [0, 2, None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_a_weight_norm_and_its_backward_are_generated_kernels(dtype: torch.dtype, dim: int | None) -> None:
    """A grouped convolution with a ``weight_norm`` parametrization (wav2vec2's positional convolution
    normalizes its weight over the kernel axis, dim 2; ``None``: one norm of the whole weight): the weight's
    norm and scaling, and in the backward the gradients of ``v`` and ``g``, are generated kernels, no ATen
    norm call; values and gradients as eager's."""
    torch.manual_seed(0)
    conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(6, 6, 5, groups=2, padding=2), dim=dim)
    conv = conv.to(dtype)
    x = torch.randn(2, 6, 13, dtype=dtype)
    backend = PyfuserBackend(triton_interpreter=True)
    compiled = torch.compile(lambda x: torch.nn.functional.gelu(conv(x)).float().square().sum(), backend=backend)
    params = [conv.parametrizations.weight.original0, conv.parametrizations.weight.original1]
    got = compiled(x)
    got.backward()
    got_grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    want = torch.nn.functional.gelu(conv(x)).float().square().sum()
    want.backward()
    tolerance = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(got, want, **tolerance)
    for g, p in zip(got_grads, params, strict=True):
        assert g.dtype == p.dtype and g.shape == p.shape
        torch.testing.assert_close(g, p.grad, **tolerance)
    left = [name for graph in backend.graphs for name in graph.eager]
    assert not any("norm" in name for name in left), left
    claimed = {entry for graph in backend.graphs for r in graph.regions for entry in r.nodes}
    assert not any("weight_norm" in entry for entry in claimed), claimed


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("ord", [2, 1, 3.5, float("inf"), float("-inf"), 0])
def test_vector_norms_are_reductions(ord: float) -> None:
    """``torch.linalg.vector_norm`` (``F.normalize``, gradient clipping) over an axis and over all
    elements, and the tensor method ``norm`` (ATen's ``norm``): generated reductions, values as eager's,
    on a non-contiguous input with negative values."""
    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(0)).t()
    x[1, 2] = 0.0
    def norms(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.linalg.vector_norm(x, ord, dim=-1, keepdim=True), torch.linalg.vector_norm(x, ord), x.norm(ord, 0)
    backend = PyfuserBackend(triton_interpreter=True)
    got = torch.compile(norms, backend=backend)(x)
    for g, w in zip(got, norms(x), strict=True):
        torch.testing.assert_close(g, w)
    assert not any(graph.eager for graph in backend.graphs), [graph.eager for graph in backend.graphs]


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("device", devices())
def test_a_weight_norm_reduced_across_programs_returns_its_norm(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """The weight norm of wav2vec2's shape class on a GPU's machine (132 SMs: the norm over 3,072 rows of
    128 columns is reduced across programs, a grid reduction): in training the forward returns the norm
    (saved for the backward) beside the scaled weight. The final launch's loop nest is the scaled weight's,
    which iterates the programs' shares of the rows, not the norm's, whose row axes are broadcasts; it was
    the norm's, and the kernel failed to build on CUDA only (ATen ran the region)."""
    if device == "cpu":  # (the interpreter's machine is small; a GPU's is its own)
        monkeypatch.setattr(Machine, "of", staticmethod(lambda _device: Machine(132, 16384, 2048)))
    torch.manual_seed(0)
    v = torch.randn(64, 48, 128, dtype=torch.bfloat16, device=device, requires_grad=True)
    g = torch.randn(1, 1, 128, dtype=torch.bfloat16, device=device, requires_grad=True)
    x = torch.randn(64, 48, 128, dtype=torch.bfloat16, device=device)

    def step(v: torch.Tensor, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return (torch._weight_norm(v, g, 2) * x).float().sum()

    got = torch.compile(step, backend=PyfuserBackend(triton_interpreter=device == "cpu"))(v, g, x)
    got.backward()
    got_grads = [v.grad, g.grad]
    v.grad = g.grad = None
    want = step(v, g, x)
    want.backward()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=1.0)
    for a, b in zip(got_grads, [v.grad, g.grad], strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("dtype", [torch.int32, None], ids=["int32", "default"])
def test_a_cumsum_of_counts_is_one_scan_without_casts(dtype: torch.dtype | None) -> None:
    """An MoE router's expert offsets (``cumsum(counts, 0, dtype=torch.int32)``): the scan accumulates in
    the dtype asked (one ATen call), no cast kernel before or after it."""
    def offsets(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        counts = (x > 0).to(torch.int32).sum(0, dtype=torch.int32)
        return torch.cumsum(counts, 0, dtype=dtype), counts * 2  # the scan's result leaves the region as it is

    x = torch.randn(9, 6, generator=torch.Generator().manual_seed(0))
    backend = PyfuserBackend(triton_interpreter=True)
    got = torch.compile(offsets, backend=backend)(x)
    for g, w in zip(got, offsets(x), strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w)
    (graph,) = backend.graphs
    (region,) = graph.regions
    summary = region.summary()
    assert summary.count(" kernel ") == 1 and "ATen calls: Scan x1" in summary, summary  # the counts (and doubled)
