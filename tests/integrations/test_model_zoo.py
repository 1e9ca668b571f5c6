"""The model zoo of ``benchmarks/models.py`` (``benchmarks/model_zoo.py``) at its tiny size: a training step
(forward, loss, backward) of every architecture through ``backend=PyfuserBackend()`` against eager, and a
few architectures of different op mixes with their regions run as generated kernels (Triton's
interpreter), where a kernel falling back to ATen calls fails the test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._dynamo

from pyfuser.integrations.torch_compile import PyfuserBackend

pytest.importorskip("transformers")

from benchmarks.model_zoo import ARCHS, Batch, build_model, make_batch  # after the skip: it imports transformers

#: Architectures whose regions run as generated kernels (the Llama of test_torch_compile_transformers.py
#: runs so too): relative attention with gathers (DeBERTa-v2); with ``-m slow`` also a vision transformer
#: (ViT), depthwise convolutions between channels-last layer norms (ConvNeXt), an audio encoder-decoder
#: (Whisper) and soft-capped sliding-window attention (Gemma2).
GENERATED = ("deberta_v2",)
GENERATED_SLOW = ("vit", "convnext", "whisper", "gemma2")

#: Slow: covered in the default run by the same graph through generated kernels, by Llama's decoder layer
#: (Qwen2: q/k/v biases, Phi-3: fused qkv and gate/up projections) or by Whisper's BART-style
#: encoder-decoder (BART).
SLOW = dict.fromkeys((*GENERATED, "qwen2", "phi3", "bart"), pytest.mark.slow)


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


Step = tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]


def training_step(run: Callable[..., Any], model: torch.nn.Module, batch: Batch) -> Step:
    model.zero_grad(set_to_none=True)
    out = run(**batch.training)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), out.loss.detach(), grads


def check_training_step(name: str, dtype: torch.dtype, backend: PyfuserBackend) -> None:
    model = build_model(name, "tiny").to(dtype).train()
    batch = make_batch(name, "tiny", dtype=dtype)
    logits, loss, grads = training_step(torch.compile(model, backend=backend), model, batch)
    want_logits, want_loss, want_grads = training_step(model, model, batch)
    # A model that computes part of its step in float32 whatever its dtype matches to float32's precision.
    tolerance = {"rtol": 1.3e-6, "atol": 1e-5} if ARCHS[name].float32_inside else {}
    torch.testing.assert_close(logits, want_logits, **tolerance)
    torch.testing.assert_close(loss, want_loss, **tolerance)
    assert grads.keys() == want_grads.keys()
    for param, grad in grads.items():
        torch.testing.assert_close(grad, want_grads[param], **tolerance,
                                   msg=lambda m, param=param: f"grad of {param}: {m}")
    assert {g.kind for g in backend.graphs} >= {"forward", "backward"}
    assert any(g.regions for g in backend.graphs)


def _params(names: Any, marks: dict[str, Any]) -> list[Any]:
    return [pytest.param(n, marks=marks[n]) if n in marks else n for n in names]


@pytest.mark.parametrize("name", _params([n for n in ARCHS if n != "mixtral"], SLOW))
def test_training_step_matches_eager(name: str) -> None:
    """float64 (regions evaluated with ATen, the CPU default): the graphs dynamo and AOTAutograd make of
    each architecture translate and partition into regions whose results are eager's."""
    check_training_step(name, torch.float64, PyfuserBackend())


def test_mixtral_training_step_matches_eager() -> None:
    """The MoE's step (top-2 routing, grouped GEMMs, the experts' gate/up ``split`` at a region's edge,
    whose region planning once never finished); float32: eager ``torch._grouped_mm`` has no float64."""
    check_training_step("mixtral", torch.float32, PyfuserBackend())


def test_mixtral_inference_matches_eager() -> None:
    """The MoE's forward (top-2 routing, grouped GEMMs) in eval mode; float32: eager inference calls
    ``torch._grouped_mm``, which has no float64."""
    model = build_model("mixtral", "tiny")
    batch = make_batch("mixtral", "tiny")
    backend = PyfuserBackend()
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(**batch.inference).logits
        want = model(**batch.inference).logits
    torch.testing.assert_close(got, want)
    assert any(g.regions for g in backend.graphs)


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("name", [*GENERATED, *_params(GENERATED_SLOW, dict.fromkeys(GENERATED_SLOW, pytest.mark.slow))])
def test_training_step_runs_generated_kernels(name: str) -> None:
    """float32 through generated kernels (Triton's interpreter): no region falls back to ATen calls."""
    backend = PyfuserBackend(triton_interpreter=True)
    check_training_step(name, torch.float32, backend)
    regions = [r for g in backend.graphs for r in g.regions]
    assert sum(" kernel " in r.summary() for r in regions) >= 3
