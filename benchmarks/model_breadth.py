"""Breadth: Hugging Face architectures outside the model zoo, built from configs in code (random weights,
nothing downloaded), through ``backend="pyfuser"`` -- what a user brings that pyfuser was not tuned on.

Two modes:

* ``--check`` (a CPU, tiny sizes, one process per architecture): a training step in float64 (float32 where
  eager has no float64 kernel) with the regions evaluated as ATen calls, inference in float32 with the
  regions run as generated kernels (Triton's interpreter), each against eager, and a float32 training step
  through generated kernels against the float64 step beside eager float32's distance from it (a backward's
  kernels are where schedules meet the most shapes); a ``KernelFallbackWarning`` fails the case. A case that
  fails the same way with ``backend="aot_eager"`` is not pyfuser's (dynamo or the config) and says so.
  ``--realistic`` adds each architecture's timed config (batch 2 of its inputs, float32, regions as ATen calls)
  in inference and training: translation, partitioning and layouts at the sizes users run.
* timing (a GPU, realistic sizes, bf16): eager, Inductor and pyfuser in one process, timed interleaved
  (``timing.time_ms_interleaved``), ms per step and the ratios, first calls' seconds.

    python benchmarks/model_breadth.py --check                       # CPU, every architecture
    python benchmarks/model_breadth.py --cases qwen3:training,swin:inference --out benchmarks/results

Writes ``model_breadth[_check]_<kind>.json`` and ``.md`` (``results_files.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
import torch._inductor.config
import transformers
from model_zoo import _without_randomness
from results_files import RESULTS, machine_kind, write_results
from timing import time_ms_interleaved, timing_lock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyfuser.integrations.torch_compile import PyfuserBackend
from pyfuser.integrations.torch_compile.region import KernelFallbackWarning


@dataclass(frozen=True)
class Arch:
    """An architecture: the model class and config class (``transformers`` names), the config's tiny and
    realistic overrides, and the kind of input it takes."""

    model: str
    config: str
    kind: str  # lm, mlm, s2s, image, ctc, audio, embed (no head: a loss of the output)
    tiny: dict[str, Any]
    #: the timed (realistic) config's overrides: the zoo's widths and 4 layers where the library's default
    #: is a multi-billion model or its positions are too few for 512 tokens; empty: the default (base-sized)
    full: dict[str, Any] = field(default_factory=dict)
    #: the check's training step in float32 (an op without float64 kernels: ``torch._grouped_mm``, or a
    #: mask value float64 overflows into), else float64
    float32: bool = False


_T = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 128,
      "max_position_embeddings": 64}
_LM = {**_T, "num_key_value_heads": 2}
_FULL = {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
         "intermediate_size": 2816, "vocab_size": 32000, "max_position_embeddings": 1024}
_MHA = {**_FULL, "num_key_value_heads": 16}
_ENC = {**_MHA, "intermediate_size": 4096}
_S2S_T = {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
          "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "vocab_size": 128,
          "max_position_embeddings": 64}
_S2S = {"d_model": 1024, "encoder_layers": 4, "decoder_layers": 4, "encoder_attention_heads": 16,
        "decoder_attention_heads": 16, "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096, "vocab_size": 32000,
        "max_position_embeddings": 1024}
_VIS = {"image_size": 32, "patch_size": 4, "num_channels": 3, "num_labels": 5}
_SPECIAL = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_AUDIO = {**_T, "conv_dim": (16, 16), "conv_stride": (5, 2), "conv_kernel": (10, 3), "num_conv_pos_embeddings": 16,
          "num_conv_pos_embedding_groups": 4, "vocab_size": 32}

ARCHS: dict[str, Arch] = {
    "opt": Arch("OPTForCausalLM", "OPTConfig", "lm", {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                "ffn_dim": 64, "vocab_size": 128, "max_position_embeddings": 64, "word_embed_proj_dim": 32},
                {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16, "ffn_dim": 4096,
                 "vocab_size": 32000, "max_position_embeddings": 1024, "word_embed_proj_dim": 1024}),
    "gpt_neox": Arch("GPTNeoXForCausalLM", "GPTNeoXConfig", "lm", _T, _MHA),
    "falcon": Arch("FalconForCausalLM", "FalconConfig", "lm", {"hidden_size": 32, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "vocab_size": 128},
                   {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16, "vocab_size": 32000}),
    "bloom": Arch("BloomForCausalLM", "BloomConfig", "lm", {"hidden_size": 32, "n_layer": 2, "n_head": 4, "vocab_size": 128},
                  {"hidden_size": 1024, "n_layer": 4, "n_head": 16, "vocab_size": 32000}),
    "gptj": Arch("GPTJForCausalLM", "GPTJConfig", "lm", {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 128,
                 "n_positions": 64, "rotary_dim": 4},
                 {"n_embd": 1024, "n_layer": 4, "n_head": 16, "vocab_size": 32000, "n_positions": 1024, "rotary_dim": 32}),
    "codegen": Arch("CodeGenForCausalLM", "CodeGenConfig", "lm", {"n_embd": 32, "n_layer": 2, "n_head": 4,
                    "vocab_size": 128, "n_positions": 64, "n_ctx": 64, "rotary_dim": 4},
                    {"n_embd": 1024, "n_layer": 4, "n_head": 16, "vocab_size": 32000, "n_positions": 1024,
                     "n_ctx": 1024, "rotary_dim": 32}),
    "stablelm": Arch("StableLmForCausalLM", "StableLmConfig", "lm", _LM, _FULL),
    "qwen3": Arch("Qwen3ForCausalLM", "Qwen3Config", "lm", {**_LM, "head_dim": 8}, {**_FULL, "head_dim": 64}),
    "qwen3_moe": Arch("Qwen3MoeForCausalLM", "Qwen3MoeConfig", "lm", {**_LM, "head_dim": 8, "num_experts": 4,
                      "num_experts_per_tok": 2, "moe_intermediate_size": 32},
                      {**_FULL, "head_dim": 64, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 704},
                      float32=True),
    "gemma": Arch("GemmaForCausalLM", "GemmaConfig", "lm", {**_LM, "head_dim": 8}, {**_FULL, "head_dim": 64}),
    "gemma3": Arch("Gemma3ForCausalLM", "Gemma3TextConfig", "lm", {**_LM, "head_dim": 8, "sliding_window": 4},
                   {**_FULL, "head_dim": 64, "sliding_window": 256}),
    "olmo": Arch("OlmoForCausalLM", "OlmoConfig", "lm", _LM, _FULL),
    "olmo2": Arch("Olmo2ForCausalLM", "Olmo2Config", "lm", _LM, _FULL),
    "cohere": Arch("CohereForCausalLM", "CohereConfig", "lm", _LM, _FULL),
    "starcoder2": Arch("Starcoder2ForCausalLM", "Starcoder2Config", "lm", _LM, _FULL),
    "phi": Arch("PhiForCausalLM", "PhiConfig", "lm", _T, _MHA),
    "gpt_bigcode": Arch("GPTBigCodeForCausalLM", "GPTBigCodeConfig", "lm", {"n_embd": 32, "n_layer": 2, "n_head": 4,
                        "vocab_size": 128, "n_positions": 64},
                        {"n_embd": 1024, "n_layer": 4, "n_head": 16, "vocab_size": 32000, "n_positions": 1024}),
    "granite": Arch("GraniteForCausalLM", "GraniteConfig", "lm", _LM, _FULL),
    "deepseek_v3": Arch("DeepseekV3ForCausalLM", "DeepseekV3Config", "lm", {**_LM, "moe_intermediate_size": 16,
                        "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
                        "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 4,
                        "qk_nope_head_dim": 4, "v_head_dim": 8},
                        {**_MHA, "moe_intermediate_size": 704, "n_routed_experts": 8, "num_experts_per_tok": 2,
                         "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "kv_lora_rank": 256,
                         "q_lora_rank": 384, "qk_rope_head_dim": 32, "qk_nope_head_dim": 64, "v_head_dim": 64},
                        float32=True),
    "nemotron": Arch("NemotronForCausalLM", "NemotronConfig", "lm", _LM, _FULL),
    "mpt": Arch("MptForCausalLM", "MptConfig", "lm", {"d_model": 32, "n_layers": 2, "n_heads": 4, "vocab_size": 128,
                "max_seq_len": 64},
                {"d_model": 1024, "n_layers": 4, "n_heads": 16, "vocab_size": 32000, "max_seq_len": 1024}),
    "xglm": Arch("XGLMForCausalLM", "XGLMConfig", "lm", {"d_model": 32, "num_layers": 2, "attention_heads": 4,
                 "ffn_dim": 64, "vocab_size": 128, "max_position_embeddings": 64},
                 {"d_model": 1024, "num_layers": 4, "attention_heads": 16, "ffn_dim": 4096, "vocab_size": 32000,
                  "max_position_embeddings": 1024}, float32=True),
    "roberta": Arch("RobertaForMaskedLM", "RobertaConfig", "mlm", _T, _ENC),
    "albert": Arch("AlbertForMaskedLM", "AlbertConfig", "mlm", {**_T, "embedding_size": 16},
                   {**_ENC, "embedding_size": 128}),
    "electra": Arch("ElectraForMaskedLM", "ElectraConfig", "mlm", {**_T, "embedding_size": 16}),
    "distilbert": Arch("DistilBertForMaskedLM", "DistilBertConfig", "mlm", {"dim": 32, "n_layers": 2, "n_heads": 4,
                       "hidden_dim": 64, "vocab_size": 128, "max_position_embeddings": 64},
                       {"dim": 1024, "n_layers": 4, "n_heads": 16, "hidden_dim": 4096, "vocab_size": 32000}),
    "xlm_roberta": Arch("XLMRobertaForMaskedLM", "XLMRobertaConfig", "mlm", _T,
                         {"num_hidden_layers": 4, "max_position_embeddings": 514}),
    "mpnet": Arch("MPNetForMaskedLM", "MPNetConfig", "mlm", _T, {"num_hidden_layers": 4, "max_position_embeddings": 514}),
    "modernbert": Arch("ModernBertForMaskedLM", "ModernBertConfig", "mlm",
                       {**_T, **_SPECIAL, "global_attn_every_n_layers": 2, "local_attention": 4, "cls_token_id": 1,
                        "sep_token_id": 2},
                       {"hidden_size": 768, "num_hidden_layers": 4, "num_attention_heads": 12, "intermediate_size": 1152,
                        "vocab_size": 32000, **_SPECIAL, "cls_token_id": 1, "sep_token_id": 2}),
    "funnel": Arch("FunnelForMaskedLM", "FunnelConfig", "mlm", {"d_model": 32, "n_head": 4, "d_head": 8, "d_inner": 64,
                   "vocab_size": 128, "block_sizes": [1, 1], "num_decoder_layers": 1},
                   {"block_sizes": [2, 2, 2]}),
    "convbert": Arch("ConvBertForMaskedLM", "ConvBertConfig", "mlm", {**_T, "embedding_size": 32}, {"num_hidden_layers": 4}),
    "mobilebert": Arch("MobileBertForMaskedLM", "MobileBertConfig", "mlm", {**_T, "embedding_size": 16,
                       "intra_bottleneck_size": 32, "num_feedforward_networks": 1, "true_hidden_size": 32}),
    "mt5": Arch("MT5ForConditionalGeneration", "MT5Config", "s2s", {"d_model": 32, "d_kv": 8, "d_ff": 64,
                "num_layers": 2, "num_heads": 4, "vocab_size": 128},
                {"d_model": 1024, "d_kv": 64, "d_ff": 2816, "num_layers": 4, "num_heads": 16, "vocab_size": 32000}),
    "pegasus": Arch("PegasusForConditionalGeneration", "PegasusConfig", "s2s", _S2S_T, _S2S),
    "marian": Arch("MarianMTModel", "MarianConfig", "s2s", {**_S2S_T, "decoder_start_token_id": 3, "pad_token_id": 1},
                   {**_S2S, "decoder_start_token_id": 3, "pad_token_id": 1}),
    "mbart": Arch("MBartForConditionalGeneration", "MBartConfig", "s2s", _S2S_T, _S2S),
    "blenderbot": Arch("BlenderbotForConditionalGeneration", "BlenderbotConfig", "s2s", _S2S_T, _S2S),
    "swin": Arch("SwinForImageClassification", "SwinConfig", "image", {"image_size": 32, "patch_size": 4,
                 "num_channels": 3, "embed_dim": 16, "depths": [1, 1], "num_heads": [2, 2], "window_size": 4,
                 "num_labels": 5}),
    "deit": Arch("DeiTForImageClassification", "DeiTConfig", "image", {**_T, **_VIS}),
    "beit": Arch("BeitForImageClassification", "BeitConfig", "image", {**_T, **_VIS, "use_relative_position_bias": True},
                 {"use_relative_position_bias": True, "num_hidden_layers": 4}),
    "dinov2": Arch("Dinov2ForImageClassification", "Dinov2Config", "image", {**_T, **_VIS},
                   {"image_size": 224, "num_hidden_layers": 4}),
    "convnextv2": Arch("ConvNextV2ForImageClassification", "ConvNextV2Config", "image", {"num_channels": 3,
                       "hidden_sizes": [16, 32], "depths": [1, 1], "num_labels": 5, "image_size": 32, "num_stages": 2,
                       "out_features": ["stage2"]}),
    "regnet": Arch("RegNetForImageClassification", "RegNetConfig", "image", {"num_channels": 3, "embedding_size": 16,
                   "hidden_sizes": [16, 32], "depths": [1, 1], "groups_width": 8, "num_labels": 5}),
    "mobilenet_v2": Arch("MobileNetV2ForImageClassification", "MobileNetV2Config", "image", {"num_channels": 3,
                         "image_size": 32, "depth_multiplier": 0.25, "num_labels": 5}),
    "efficientnet": Arch("EfficientNetForImageClassification", "EfficientNetConfig", "image", {"num_channels": 3,
                         "image_size": 32, "width_coefficient": 0.5, "depth_coefficient": 0.25, "num_labels": 5,
                         "hidden_dim": 640},
                         {"image_size": 224, "width_coefficient": 1.0, "depth_coefficient": 1.0, "hidden_dim": 1280}),
    "segformer": Arch("SegformerForImageClassification", "SegformerConfig", "image", {"num_channels": 3,
                      "hidden_sizes": [16, 32], "depths": [1, 1], "num_encoder_blocks": 2, "sr_ratios": [2, 1],
                      "num_attention_heads": [1, 2], "patch_sizes": [7, 3], "strides": [4, 2], "mlp_ratios": [2, 2],
                      "num_labels": 5}),
    "poolformer": Arch("PoolFormerForImageClassification", "PoolFormerConfig", "image", {"num_channels": 3,
                       "hidden_sizes": [16, 32], "depths": [1, 1], "num_encoder_blocks": 2, "patch_sizes": [7, 3],
                       "strides": [4, 2], "padding": [2, 1], "num_labels": 5}),
    "levit": Arch("LevitForImageClassification", "LevitConfig", "image", {"image_size": 64, "num_channels": 3,
                  "hidden_sizes": [32, 48, 64], "num_attention_heads": [2, 2, 2], "depths": [1, 1, 1],
                  "key_dim": [8, 8, 8], "num_labels": 5}),
    "mobilevit": Arch("MobileViTForImageClassification", "MobileViTConfig", "image", {"image_size": 64,
                      "num_channels": 3, "hidden_sizes": [16, 24, 32], "neck_hidden_sizes": [8, 8, 16, 16, 24, 32, 64],
                      "num_labels": 5}),
    "hubert": Arch("HubertForCTC", "HubertConfig", "ctc", _AUDIO, {"num_hidden_layers": 4}),
    "wavlm": Arch("WavLMForCTC", "WavLMConfig", "ctc", {**_AUDIO, "num_buckets": 16, "max_bucket_distance": 32},
                  {"num_hidden_layers": 4}),
    "data2vec_audio": Arch("Data2VecAudioForCTC", "Data2VecAudioConfig", "ctc", {**_AUDIO, "conv_pos_kernel_size": 5,
                           "num_conv_pos_embeddings_layers": 1},
                           {"num_hidden_layers": 4}),
    "ast": Arch("ASTForAudioClassification", "ASTConfig", "audio", {**_T, "patch_size": 4, "frequency_stride": 4,
                "time_stride": 4, "max_length": 32, "num_mel_bins": 16, "num_labels": 5},
                {"num_hidden_layers": 4}),
    "clip_vision": Arch("CLIPVisionModelWithProjection", "CLIPVisionConfig", "embed", {**_T, "image_size": 32,
                        "patch_size": 4, "projection_dim": 16}, {"num_hidden_layers": 4}),
    "siglip_text": Arch("SiglipTextModel", "SiglipTextConfig", "embed", _T,
                        {"max_position_embeddings": 512, "num_hidden_layers": 4}),
}

#: Architectures whose step computes part of its math in float32 whatever the model's dtype (CTC's
#: log-softmax), so float64 checks use float32's tolerance.
FLOAT32_INSIDE = frozenset(("hubert", "wavlm", "data2vec_audio"))


@dataclass
class Built:
    model: torch.nn.Module
    inputs: dict[str, torch.Tensor]
    labels: torch.Tensor | None
    items: int  # tokens, images or clips a step processes


def build(name: str, full: bool, dtype: torch.dtype, device: str) -> Built:
    """The model (random weights of seed 0) and one step's inputs (seed 1, drawn on the CPU)."""
    arch = ARCHS[name]
    config = getattr(transformers, arch.config)(**(arch.full if full else arch.tiny))
    _without_randomness(config)
    if full and arch.kind == "image":
        config.num_labels = 1000
    torch.manual_seed(0)
    model = getattr(transformers, arch.model)(config).to(device, dtype)
    g = torch.Generator().manual_seed(1)
    batch, seq = (8, 512) if full else (2, 8)
    vocab = getattr(config, "vocab_size", 128)
    embed = "embed" in arch.kind
    if arch.kind in ("lm", "mlm") or (embed and "Text" in arch.config):
        ids = torch.randint(5, vocab, (batch, seq), generator=g)
        inputs, labels = {"input_ids": ids}, (None if embed else ids.clone())
    elif arch.kind == "s2s":
        dec = seq // 4 if full else 6
        inputs = {"input_ids": torch.randint(5, vocab, (batch, seq), generator=g),
                  "decoder_input_ids": torch.randint(5, vocab, (batch, dec), generator=g)}
        labels = torch.randint(5, vocab, (batch, dec), generator=g)
    elif arch.kind == "ctc":
        inputs = {"input_values": torch.randn(batch, 16000 if full else 800, generator=g)}
        labels = torch.randint(1, vocab, (batch, 5), generator=g)
    elif arch.kind == "audio":
        inputs = {"input_values": torch.randn(batch, config.max_length, config.num_mel_bins, generator=g)}
        labels = torch.randint(0, config.num_labels, (batch,), generator=g)
    else:  # an image model
        batch = 32 if full else 2
        size = config.image_size if isinstance(getattr(config, "image_size", None), int) else (224 if full else 32)
        inputs = {"pixel_values": torch.randn(batch, 3, size, size, generator=g)}
        labels = None if embed else torch.randint(0, config.num_labels, (batch,), generator=g)
    moved = {k: v.to(device, dtype) if v.is_floating_point() else v.to(device) for k, v in inputs.items()}
    items = inputs["input_ids"].numel() if "input_ids" in inputs else batch
    return Built(model, moved, labels.to(device) if labels is not None else None, items)


def _output(out: Any) -> torch.Tensor:
    for key in ("logits", "last_hidden_state", "image_embeds"):
        value = getattr(out, key, None)
        if isinstance(value, torch.Tensor):
            return value
    raise TypeError(f"no output tensor among {list(out.keys())}")


def step(run: Callable[..., Any], built: Built, training: bool, checked: bool = True) -> list[torch.Tensor | None]:
    """One step: inference's output, or training's output and loss; ``checked``: with every parameter's
    gradient too (None where it has none). A timed step collects nothing (no copy, no host sync)."""
    model = built.model
    if not training:
        with torch.no_grad():
            return [_output(run(**built.inputs)).detach()]
    model.zero_grad(set_to_none=True)
    out = run(**built.inputs, **({"labels": built.labels} if built.labels is not None else {}))
    loss = out.loss if getattr(out, "loss", None) is not None else _output(out).float().square().mean()
    loss.backward()
    if not checked:
        return [_output(out).detach(), loss.detach()]
    return [_output(out).detach(), loss.detach(), *(p.grad.clone() if p.grad is not None else None
                                                     for p in model.parameters())]


#: mode -> (training, regions as generated kernels); training with ATen regions is in float64
#: (``Arch.float32``: float32), through generated kernels in float32 against float64
CHECK_MODES = {"training": (True, False), "inference_kernels": (False, True), "training_kernels": (True, True)}

#: A float32 training step through generated kernels passes where each output and gradient is no further from the
#: float64 step than this many times eager float32's distance (plus ``FLOAT32_FLOOR`` of its scale): the kernels sum
#: in other orders than ATen, and a batch norm over a few values amplifies any rounding (MobileNet-V2, LeViT)
FLOAT32_FACTOR = 4.0
FLOAT32_FLOOR = 1e-4


def check_float32_step(name: str, got: list[torch.Tensor | None], want: list[torch.Tensor | None]) -> None:
    """Raises where a float32 training step through generated kernels is further from the float64 step than
    eager float32 is (``FLOAT32_FACTOR``); an architecture without float64 kernels is compared with eager
    float32 at ``FLOAT32_FLOOR`` of each tensor's scale. Scales are floored at 1e-3 of the largest tensor's (a
    gradient of ~0 is judged against the step's)."""
    truth: list[torch.Tensor | None] | None = None
    if not ARCHS[name].float32:
        reference = build(name, False, torch.float64, "cpu")
        reference.model.train(True)
        truth = step(reference.model, reference, True)
    base = truth if truth is not None else want
    largest = max((t.abs().max().item() for t in base if t is not None and t.numel()), default=0.0)
    for k, (a, b, t) in enumerate(zip(got, want, base, strict=True)):
        if t is None or a is None or b is None or not t.numel():
            if (a is None) != (b is None) and any(v is not None and v.abs().max().item() > 0 for v in (a, b)):
                raise AssertionError(f"output {k}: a gradient on one path only")
            continue
        scale = max(t.abs().max().item(), 1e-3 * largest, 1e-30)
        ours = (a.double() - t.double()).abs().max().item()
        eager = (b.double() - t.double()).abs().max().item() if truth is not None else 0.0
        if ours > FLOAT32_FACTOR * eager + FLOAT32_FLOOR * scale:
            against = "float64" if truth is not None else "eager float32"
            raise AssertionError(f"output {k}: {ours / scale:.2e} of its scale off {against} (eager float32: "
                                 f"{eager / scale:.2e})")


def check_case(name: str, mode: str, backend: Any) -> None:
    """Raises where the compiled step differs from eager's (or fails)."""
    training, kernels = CHECK_MODES[mode]
    dtype = torch.float64 if training and not kernels and not ARCHS[name].float32 else torch.float32
    built = build(name, False, dtype, "cpu")
    built.model.train(training)
    want = step(built.model, built, training)
    torch._dynamo.reset()
    if backend == "pyfuser":
        backend = PyfuserBackend(triton_interpreter=kernels)
    compiled = torch.compile(built.model, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        for _ in range(1 if kernels else 3):  # (the third call runs the graph's specialized function)
            got = step(compiled, built, training)
    if training and kernels:
        check_float32_step(name, got, want)
        return
    tolerance: dict[str, float] = {"atol": 1e-4, "rtol": 1e-4} if dtype != torch.float64 or name in FLOAT32_INSIDE else {}
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        if a is None and b is None:
            continue
        # (a parameter the loss does not reach has no gradient on one path and zeros on the other)
        a = torch.zeros_like(b) if a is None else a
        b = torch.zeros_like(a) if b is None else b
        torch.testing.assert_close(a, b, **tolerance, msg=lambda m, k=k: f"output {k}: {m}")


#: ``--check --realistic``: the timed configs (batch 2 of the timed inputs), float32, regions as ATen calls, each
#: output no further from eager's than this share of its scale: translation, partitioning and layouts at the sizes
#: users run (a meta function and a kernel that disagree on strides there and not at tiny sizes: AST's convolution)
REALISTIC_MODES = {"realistic_inference": False, "realistic_training": True}
REALISTIC_TOLERANCE = 1e-3


def check_realistic(name: str, mode: str, backend: Any) -> None:
    """Raises where the compiled step at the realistic config differs from eager's (or fails)."""
    training = REALISTIC_MODES[mode]
    built = build(name, True, torch.float32, "cpu")
    built.inputs = {k: v[:2] for k, v in built.inputs.items()}
    built.labels = built.labels[:2] if built.labels is not None else None
    built.model.train(training)
    want = step(built.model, built, training, checked=False)
    torch._dynamo.reset()
    compiled = torch.compile(built.model, backend=PyfuserBackend() if backend == "pyfuser" else backend)
    got = step(compiled, built, training, checked=False)
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        scale = max(b.abs().max().item(), 1e-30)
        if (a - b).abs().max().item() > REALISTIC_TOLERANCE * scale:
            raise AssertionError(f"output {k}: {(a - b).abs().max().item() / scale:.1e} of its scale off eager's")


def run_check(name: str, realistic: bool = False) -> list[dict[str, Any]]:
    records = []
    for mode in [*CHECK_MODES, *(REALISTIC_MODES if realistic else ())]:
        start = time.perf_counter()
        record: dict[str, Any] = {"model": name, "mode": mode}
        check = check_realistic if mode in REALISTIC_MODES else check_case
        try:
            check(name, mode, "pyfuser")
            record["result"] = "ok"
        except Exception as e:
            record["result"] = "fail"
            record["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            record["trace"] = traceback.format_exc(limit=-8)
            try:
                check(name, mode, "aot_eager")
            except Exception as other:
                record["result"] = "not pyfuser's"
                record["aot_eager"] = f"{type(other).__name__}: {str(other).splitlines()[0][:200] if str(other) else ''}"
        record["seconds"] = round(time.perf_counter() - start, 1)
        records.append(record)
    return records


#: Largest difference of a first compiled bf16 result (output or loss) from eager bf16's, relative to its scale,
#: above which a timed case is marked wrong: several times the zoo's bf16 errors (``models.py``: 1e-2 to 4e-2)
TIMED_TOLERANCE = 0.1


def time_case(name: str, mode: str, device: str, lock: str | None = None) -> dict[str, Any]:
    """Eager, Inductor and pyfuser on one case: first calls (seconds, compilation included) under ``lock``
    shared, the steps timed interleaved under it alone, and each compiled first result against eager's."""
    training = mode == "training"
    record: dict[str, Any] = {"model": name, "mode": mode}
    steps: dict[str, Callable[[], Any]] = {}
    first: dict[str, float] = {}
    results: dict[str, torch.Tensor] = {}
    with timing_lock(lock, shared=True):
        built = build(name, True, torch.bfloat16, device)
        built.model.train(training)
        for variant in ("eager", "inductor", "pyfuser"):
            torch._dynamo.reset()
            run = built.model if variant == "eager" else torch.compile(
                built.model, backend=PyfuserBackend() if variant == "pyfuser" else "inductor")
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("error", KernelFallbackWarning)
                torch.manual_seed(2)
                results[variant] = step(run, built, training, checked=False)[0].float()
            torch.cuda.synchronize()
            first[variant] = round(time.perf_counter() - start, 1)
            steps[variant] = lambda run=run: step(run, built, training, checked=False)
    with timing_lock(lock):
        timed = time_ms_interleaved(steps, device, 5, 20)
    for variant, value in timed.items():
        if isinstance(value, BaseException):
            raise value
        record[variant] = round(value, 3)
    scale = max(results["eager"].abs().max().item(), 1e-30)
    for variant in ("inductor", "pyfuser"):
        record[f"{variant}_error"] = float(f"{(results[variant] - results['eager']).abs().max().item() / scale:.1e}")
    record["vs_inductor"] = round(record["inductor"] / record["pyfuser"], 3)
    record["vs_eager"] = round(record["eager"] / record["pyfuser"], 3)
    record["per_s"] = round(built.items / record["pyfuser"] * 1e3)
    record["first_s"] = first
    if record["pyfuser_error"] > max(TIMED_TOLERANCE, 2 * record["inductor_error"]):
        record["error"] = (f"wrong result: {record['pyfuser_error']:.1e} of its scale from eager's (Inductor's: "
                           f"{record['inductor_error']:.1e})")
    return record


def markdown_check(records: list[dict[str, Any]]) -> str:
    ok = sum(r["result"] == "ok" for r in records)
    lines = ["# Breadth check: architectures outside the zoo through pyfuser, CPU, tiny sizes", "",
             f"{ok} of {len(records)} cases pass; `training`: a training step in float64 (float32 for "
             f"{', '.join(n for n, a in ARCHS.items() if a.float32)}: ops without float64 kernels), regions as ATen calls; "
             "`inference_kernels`: float32, regions as generated kernels (Triton's interpreter), a kernel fallback "
             "failing the case; `training_kernels`: a float32 training step through generated kernels, each output "
             f"and gradient no further from the float64 step than {FLOAT32_FACTOR:g}x eager float32's distance "
             f"(+ {FLOAT32_FLOOR:g} of its scale; against eager float32 where float64 has no kernels), a kernel "
             "fallback failing the case."]
    modes = [m for m in [*CHECK_MODES, *REALISTIC_MODES] if any(r["mode"] == m for r in records)]
    if any(m in REALISTIC_MODES for m in modes):
        lines += ["", "`realistic_inference`, `realistic_training`: the timed configs (batch 2 of the timed inputs), "
                  f"float32, regions as ATen calls, each output within {REALISTIC_TOLERANCE:g} of its scale of eager's."]
    lines += ["", f"| model | {' | '.join(modes)} |", f"| --- | {' | '.join('---' for _ in modes)} |"]
    columns = set(modes)
    by_model: dict[str, dict[str, dict[str, Any]]] = {}
    for r in records:
        by_model.setdefault(r["model"], {})[r["mode"]] = r
    for model, modes in by_model.items():
        cells = [modes[m]["result"] + (f" ({modes[m].get('error', '')})" if modes[m]["result"] != "ok" else "")
                 if m in modes else "-" for m in [*CHECK_MODES, *REALISTIC_MODES] if m in columns]
        lines.append(f"| {model} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def _summary(records: list[dict[str, Any]]) -> str:
    ok = [r for r in records if "error" not in r]
    if not ok:
        return "no case timed"
    worst = min(ok, key=lambda r: r["vs_inductor"])
    geomean = math.exp(statistics.fmean(math.log(r["vs_inductor"]) for r in ok))
    faster = sum(r["first_s"]["pyfuser"] < r["first_s"]["inductor"] for r in ok)
    return (f"geomean {geomean:.2f}x of Inductor over {len(ok)} cases, worst {worst['vs_inductor']:.2f}x "
            f"({worst['model']} {worst['mode']}), {sum(r['vs_inductor'] < 0.95 for r in ok)} under 0.95x; first "
            f"call faster than Inductor's in {faster} of {len(ok)}")


def markdown_timing(records: list[dict[str, Any]], kind: str) -> str:
    modes = sorted({r["mode"] for r in records})
    lines = [f"# Breadth: architectures outside the zoo through torch.compile, {kind}, bf16", "",
             f"All: {_summary(records)}; failed: {sum('error' in r for r in records)}.", ""]
    lines += [f"- {mode}: {_summary([r for r in records if r['mode'] == mode])}" for mode in modes]
    lines += ["", "Ratios: Inductor's (eager's) ms over pyfuser's; errors: the first compiled result's (output or "
              "loss) largest difference from eager bf16's over its scale (a case above "
              f"max({TIMED_TOLERANCE:g}, 2x Inductor's) fails). Batch 8 x 512 tokens, 32 images, 8 x 1 s of audio.", "",
              "| model | mode | eager ms | inductor ms | pyfuser ms | vs inductor | vs eager | error, inductor / pyfuser "
              "| first call s, inductor / pyfuser |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in sorted(records, key=lambda r: (r["mode"], r.get("vs_inductor", 0.0))):
        if "vs_inductor" in r:
            first = f"{r['first_s']['inductor']} / {r['first_s']['pyfuser']}"
            error = (f"{r['inductor_error']:.0e} / {r['pyfuser_error']:.0e}" if "pyfuser_error" in r else "-") + \
                (" **wrong**" if "error" in r else "")
            lines.append(f"| {r['model']} | {r['mode']} | {r['eager']:.2f} | {r['inductor']:.2f} | {r['pyfuser']:.2f} | "
                         f"{r['vs_inductor']:.2f}x | {r['vs_eager']:.2f}x | {error} | {first} |")
        else:
            lines.append(f"| {r['model']} | {r['mode']} | failed: {r.get('error', '')} | | | | | | |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="CPU correctness of every architecture (or --models)")
    parser.add_argument("--realistic", action="store_true",
                        help="--check: also each architecture's timed config (batch 2), regions as ATen calls")
    parser.add_argument("--models", help="comma-separated architectures (default: all)")
    parser.add_argument("--cases", help="timing: model:mode,... (mode inference or training)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process of --check: one model, JSON on stdout
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per architecture of --check")
    parser.add_argument("--timing-lock", default=None, metavar="FILE",
                        help="timing: processes sharing a GPU compile in parallel and time alone (timing.timing_lock)")
    parser.add_argument("--budget-s", type=float, default=None, help="timing: start no case after this many seconds")
    parser.add_argument("--combine", nargs="+", type=Path, metavar="JSON",
                        help="write one results file of these timing runs' cases (a later file's case replaces)")
    args = parser.parse_args()
    torch._inductor.config.fx_graph_cache = False
    if args.one:
        print("RECORDS " + json.dumps(run_check(args.one, args.realistic)))
        return 0
    if args.combine:
        runs = [json.loads(path.read_text()) for path in args.combine]
        merged = {(r["model"], r["mode"]): r for run in runs for r in run["cases"]}
        kind = runs[-1]["run"]["machine_kind"].removeprefix("nvidia-").replace("-", "")
        records = list(merged.values())
        write_results("model_breadth", kind, {"cases": records}, markdown_timing(records, kind), args.out,
                      stamp=runs[-1]["run"]["date"])
        return 0
    names = args.models.split(",") if args.models else list(ARCHS)
    if args.check:
        modes = [*CHECK_MODES, *(REALISTIC_MODES if args.realistic else ())]
        records: list[dict[str, Any]] = []
        for name in names:
            try:
                done = subprocess.run([sys.executable, __file__, "--one", name, *(["--realistic"] if args.realistic else [])],
                                      capture_output=True, text=True, timeout=args.timeout)
                lines = [line for line in done.stdout.splitlines() if line.startswith("RECORDS ")]
                why = f"crashed: {done.stderr[-300:]}"
                got = json.loads(lines[-1].removeprefix("RECORDS ")) if lines else \
                    [{"model": name, "mode": m, "result": "fail", "error": why} for m in modes]
            except subprocess.TimeoutExpired:
                why = f"timed out ({args.timeout} s)"
                got = [{"model": name, "mode": m, "result": "fail", "error": why} for m in modes]
            for r in got:
                print(f"{r['model']} {r['mode']}: {r['result']} {r.get('error', '')}", flush=True)
            records += got
        write_results("model_breadth", "cpu", {"cases": records}, markdown_check(records), args.out, variant="check")
        return int(any(r["result"] == "fail" for r in records))
    if not torch.cuda.is_available():
        parser.error("timing needs a GPU (--check runs on a CPU)")
    kind = machine_kind(torch.cuda.get_device_name())
    cases = [c.split(":") for c in (args.cases or ",".join(f"{n}:inference,{n}:training" for n in names)).split(",")]
    records = []
    began = time.perf_counter()
    for name, mode in cases:
        if args.budget_s is not None and time.perf_counter() - began > args.budget_s:
            break
        try:
            record = time_case(name, mode, "cuda", args.timing_lock)
        except Exception as e:
            record = {"model": name, "mode": mode, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(json.dumps(record), flush=True)
        records.append(record)
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        write_results("model_breadth", kind, {"cases": records}, markdown_timing(records, kind), args.out)
    return int(any("error" in r for r in records))


if __name__ == "__main__":
    sys.exit(main())
