"""Hugging Face models (tiny configs built in code, random weights) through the backend, forward and
backward, against eager."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo

from pyfuser.integrations.torch_compile import PyfuserBackend
from tests.integrations.time_limit import time_limit

transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


def tiny_llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=64, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config)


def tiny_gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=64, n_positions=64, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def tiny_phi3() -> torch.nn.Module:
    config = transformers.Phi3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, vocab_size=64, max_position_embeddings=64, pad_token_id=0,
                                     bos_token_id=1, eos_token_id=2)
    return transformers.Phi3ForCausalLM(config)


def train_step(run: Any, model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    out = run(ids, labels=ids, use_cache=False)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def check_against_eager(model: torch.nn.Module, compiled: Any, ids: torch.Tensor) -> None:
    logits, grads = train_step(compiled, model, ids)
    want_logits, want_grads = train_step(model, model, ids)
    torch.testing.assert_close(logits, want_logits)
    assert grads.keys() == want_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, want_grads[name], msg=lambda m, name=name: f"grad of {name}: {m}")


@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2], ids=["llama", "gpt2"])
def test_forward_and_backward_match_eager(build: Any) -> None:
    torch.manual_seed(0)
    model = build().double()
    backend = PyfuserBackend()
    compiled = torch.compile(model, backend=backend)
    check_against_eager(model, compiled, torch.randint(0, 64, (2, 8)))
    kinds = [g.kind for g in backend.graphs]
    assert "forward" in kinds and "backward" in kinds
    regions = [r for g in backend.graphs for r in g.regions]
    assert len(regions) >= 3
    claimed = {entry.split(" (")[1] for r in regions for entry in r.nodes}
    assert {"aten.mm.default)", "aten.mul.Tensor)"} <= claimed  # projections fused with their neighbours


#: Phi-3's training step compiles and runs in 20-40 s on the 2-core CPU machine (most of it compiling the
#: regions' programs; planning its two graphs takes 1-2 s)
PHI3_LIMIT_S = 240


def test_phi3_training_step_compiles_in_bounded_time() -> None:
    """Phi-3 splits its fused QKV and gate-up projections; its backward graph has the splits' getitem
    nodes at regions' edges. The step compiles within a time limit and matches eager."""
    torch.manual_seed(0)
    model = tiny_phi3().double()
    backend = PyfuserBackend()
    compiled = torch.compile(model, backend=backend)
    with time_limit(PHI3_LIMIT_S, "Phi-3's training step through the backend"):
        check_against_eager(model, compiled, torch.randint(0, 64, (2, 8)))
    backward = [g for g in backend.graphs if g.kind == "backward"]
    assert backward and all(g.regions for g in backward)
    claimed = {entry.split(" (")[1] for g in backend.graphs for r in g.regions for entry in r.nodes}
    assert {"aten.mm.default)", "aten.mul.Tensor)", "getitem)"} <= claimed


def test_llama_new_sequence_length_recompiles_nothing() -> None:
    torch.manual_seed(0)
    model = tiny_llama().double()
    backend = PyfuserBackend()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    check_against_eager(model, compiled, torch.randint(0, 64, (2, 8)))
    graphs = len(backend.graphs)
    counts = [r.fec.compile_count for g in backend.graphs for r in g.regions]
    check_against_eager(model, compiled, torch.randint(0, 64, (3, 12)))
    assert len(backend.graphs) == graphs
    assert [r.fec.compile_count for g in backend.graphs for r in g.regions] == counts


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
def test_llama_regions_run_generated_kernels() -> None:
    """Every region of a Llama training step runs its generated kernels (the Triton interpreter here):
    none falls back to ATen calls (the backward's rotary region once did, its kernel failing to build)."""
    torch.manual_seed(0)
    model = tiny_llama()
    backend = PyfuserBackend(triton_interpreter=True)
    check_against_eager(model, torch.compile(model, backend=backend), torch.randint(0, 64, (2, 8)))
    regions = [r for g in backend.graphs for r in g.regions]
    assert {g.kind for g in backend.graphs} == {"forward", "backward"}
    assert sum(" kernel " in r.summary() for r in regions) >= 3
