"""The model zoo: Hugging Face ``transformers`` architectures built from configs in code (random weights,
nothing downloaded), at named sizes, with the inputs and labels of one step.

One definition serves both ``benchmarks/models.py`` (the ``small`` / ``default`` / ``large`` sizes a user
runs) and ``tests/integrations/test_model_zoo.py`` (the ``tiny`` size, forward and backward on a CPU), so
the tests check the very graphs the benchmark times. Every source of randomness inside a step (dropout,
stochastic depth, layer drop, SpecAugment masks, router jitter) is off: a compiled step must match eager
bit for bit in its math, and training mode then differs from inference only in what autograd records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import transformers


@dataclass(frozen=True)
class Size:
    """The dimensions of one zoo scale. Transformers share ``hidden`` / ``layers`` / ``heads``; CNNs take
    their own stage widths and depths; ``inter`` is a gated MLP's width, ``ffn`` a plain MLP's."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    inter: int
    ffn: int
    seq: int
    batch: int
    vocab: int
    experts: int
    expert_inter: int
    image: int
    patch: int
    image_batch: int
    labels: int
    convnext_dims: tuple[int, ...]
    convnext_depths: tuple[int, ...]
    resnet_dims: tuple[int, ...]
    resnet_depths: tuple[int, ...]
    resnet_block: str
    mel_bins: int
    frames: int
    dec_seq: int
    audio_batch: int
    samples: int
    conv_dims: tuple[int, ...]
    conv_kernels: tuple[int, ...]
    conv_strides: tuple[int, ...]
    rel_buckets: int


_WAV2VEC2_CONV = {"conv_dims": (512,) * 7, "conv_kernels": (10, 3, 3, 3, 3, 2, 2), "conv_strides": (5, 2, 2, 2, 2, 2, 2)}

SIZES: dict[str, Size] = {
    # CPU tests: every shape small enough for the Triton interpreter, still with GQA (4 heads / 2 KV heads),
    # a sliding window shorter than the sequence and relative positions past their log buckets.
    "tiny": Size(hidden=32, layers=1, heads=4, kv_heads=2, inter=64, ffn=64, seq=8, batch=2, vocab=64, experts=4,
                 expert_inter=32, image=32, patch=8, image_batch=2, labels=10, convnext_dims=(8, 16, 32, 64),
                 convnext_depths=(1, 1, 1, 1), resnet_dims=(8, 16, 32, 64), resnet_depths=(1, 1, 1, 1),
                 resnet_block="basic", mel_bins=8, frames=16, dec_seq=6, audio_batch=2, samples=400,
                 conv_dims=(16, 16), conv_kernels=(10, 3), conv_strides=(5, 2), rel_buckets=8),
    # Host-bound scale: small layers where launch and host time weigh most.
    "small": Size(hidden=256, layers=2, heads=4, kv_heads=2, inter=704, ffn=1024, seq=128, batch=4, vocab=8000,
                  experts=4, expert_inter=352, image=224, patch=16, image_batch=8, labels=1000,
                  convnext_dims=(64, 128, 256, 512), convnext_depths=(2, 2, 6, 2), resnet_dims=(64, 128, 256, 512),
                  resnet_depths=(2, 2, 2, 2), resnet_block="basic", mel_bins=80, frames=3000, dec_seq=64,
                  audio_batch=2, samples=16000, rel_buckets=256, **_WAV2VEC2_CONV),
    # Issue 30's shapes: hidden 1024, 4 layers, 16 heads / 4 KV heads, sequence 512, batch 8, vocabulary
    # 32000; images 224x224 batch 32 (ConvNeXt-T, ResNet-50); Whisper 80 mels x 3000 frames (30 s) batch 8.
    "default": Size(hidden=1024, layers=4, heads=16, kv_heads=4, inter=2816, ffn=4096, seq=512, batch=8, vocab=32000,
                    experts=8, expert_inter=1408, image=224, patch=16, image_batch=32, labels=1000,
                    convnext_dims=(96, 192, 384, 768), convnext_depths=(3, 3, 9, 3),
                    resnet_dims=(256, 512, 1024, 2048), resnet_depths=(3, 4, 6, 3), resnet_block="bottleneck",
                    mel_bins=80, frames=3000, dec_seq=128, audio_batch=8, samples=80000, rel_buckets=256,
                    **_WAV2VEC2_CONV),
    # Compute-bound scale: head dim 128, longer sequences, ConvNeXt-B, ResNet-101.
    "large": Size(hidden=2048, layers=8, heads=16, kv_heads=4, inter=5632, ffn=8192, seq=1024, batch=8, vocab=32000,
                  experts=8, expert_inter=2816, image=224, patch=16, image_batch=64, labels=1000,
                  convnext_dims=(128, 256, 512, 1024), convnext_depths=(3, 3, 27, 3),
                  resnet_dims=(256, 512, 1024, 2048), resnet_depths=(3, 4, 23, 3), resnet_block="bottleneck",
                  mel_bins=80, frames=3000, dec_seq=256, audio_batch=16, samples=160000, rel_buckets=256,
                  **_WAV2VEC2_CONV),
}


@dataclass
class Batch:
    """One step's keyword arguments: ``inference`` (what a forward call takes) and ``training`` (the same
    plus labels, so the model returns its loss); ``units`` of ``unit`` processed per step."""

    inference: dict[str, torch.Tensor]
    training: dict[str, torch.Tensor]
    units: float
    unit: str

    def kwargs(self, training: bool) -> dict[str, torch.Tensor]:
        return self.training if training else self.inference


@dataclass(frozen=True)
class Arch:
    """A zoo architecture: ``config(size)`` the model's config, ``model_class`` what is built from it, ``batch``
    the inputs of one step; ``attention`` forces an attention implementation where the default would drop
    part of the model's math (Gemma2's soft-capping exists only in eager attention); ``float32_inside``: the
    model computes part of its step in float32 whatever its dtype (Wav2Vec2's CTC loss), so a float64 run
    matches another only to float32's precision."""

    name: str
    family: str
    config: Callable[[Size], transformers.PretrainedConfig]
    model_class: Callable[[], type[torch.nn.Module]]
    batch: Callable[[Size, torch.Generator], Batch]
    attention: str | None = None
    note: str = ""
    float32_inside: bool = False


def _decoder_common(s: Size) -> dict[str, Any]:
    return {"vocab_size": s.vocab, "hidden_size": s.hidden, "intermediate_size": s.inter,
            "num_hidden_layers": s.layers, "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
            "max_position_embeddings": max(2 * s.seq, 128), "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def _tokens(s: Size, g: torch.Generator, length: int | None = None, low: int = 3) -> torch.Tensor:
    """Token ids above the special ones (pad / bos / eos), so no padding logic changes the math."""
    return torch.randint(low, s.vocab, (s.batch, length or s.seq), generator=g)


def _causal_lm_batch(s: Size, g: torch.Generator) -> Batch:
    ids = _tokens(s, g)
    return Batch({"input_ids": ids, "use_cache": False}, {"input_ids": ids, "labels": ids, "use_cache": False},
                 s.batch * s.seq, "tokens")


def _masked_lm_batch(s: Size, g: torch.Generator) -> Batch:
    ids = _tokens(s, g)
    masked = torch.rand(ids.shape, generator=g) < 0.15
    masked[:, 0] = True  # every row has a loss term
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    return Batch({"input_ids": ids}, {"input_ids": ids, "labels": labels}, s.batch * s.seq, "tokens")


def _seq2seq_batch(s: Size, g: torch.Generator) -> Batch:
    ids, target = _tokens(s, g), _tokens(s, g, s.dec_seq)
    return Batch({"input_ids": ids, "decoder_input_ids": target, "use_cache": False},
                 {"input_ids": ids, "labels": target, "use_cache": False}, s.batch * (s.seq + s.dec_seq), "tokens")


def _image_batch(s: Size, g: torch.Generator) -> Batch:
    pixels = torch.randn(s.image_batch, 3, s.image, s.image, generator=g)
    labels = torch.randint(0, s.labels, (s.image_batch,), generator=g)
    return Batch({"pixel_values": pixels}, {"pixel_values": pixels, "labels": labels}, s.image_batch, "images")


def _whisper_batch(s: Size, g: torch.Generator) -> Batch:
    features = torch.randn(s.audio_batch, s.mel_bins, s.frames, generator=g)
    target = torch.randint(3, s.vocab, (s.audio_batch, s.dec_seq), generator=g)
    seconds = s.audio_batch * s.frames / 100  # 100 mel frames per second of audio
    return Batch({"input_features": features, "decoder_input_ids": target, "use_cache": False},
                 {"input_features": features, "labels": target, "use_cache": False}, seconds, "audio s")


def _ctc_frames(s: Size) -> int:
    frames = s.samples
    for kernel, stride in zip(s.conv_kernels, s.conv_strides, strict=True):
        frames = (frames - kernel) // stride + 1
    return frames


def _ctc_batch(s: Size, g: torch.Generator) -> Batch:
    values = torch.randn(s.audio_batch, s.samples, generator=g)
    labels = torch.randint(1, 32, (s.audio_batch, max(2, _ctc_frames(s) // 4)), generator=g)
    return Batch({"input_values": values}, {"input_values": values, "labels": labels}, s.audio_batch * s.samples / 16000,
                 "audio s")


def _llama(s: Size) -> transformers.PretrainedConfig:
    return transformers.LlamaConfig(**_decoder_common(s))


def _qwen2(s: Size) -> transformers.PretrainedConfig:
    return transformers.Qwen2Config(**_decoder_common(s))


def _mistral(s: Size) -> transformers.PretrainedConfig:
    return transformers.MistralConfig(**_decoder_common(s), sliding_window=s.seq // 2)


def _gemma2(s: Size) -> transformers.PretrainedConfig:
    common = _decoder_common(s) | {"num_hidden_layers": max(2, s.layers)}  # sliding and global layers alternate
    return transformers.Gemma2Config(**common, head_dim=s.hidden // s.heads, query_pre_attn_scalar=s.hidden // s.heads,
                                     sliding_window=s.seq // 2, attn_logit_softcapping=50.0, final_logit_softcapping=30.0)


def _phi3(s: Size) -> transformers.PretrainedConfig:
    return transformers.Phi3Config(**_decoder_common(s))


def _mixtral(s: Size) -> transformers.PretrainedConfig:
    common = _decoder_common(s) | {"intermediate_size": s.expert_inter}
    return transformers.MixtralConfig(**common, num_local_experts=s.experts, num_experts_per_tok=2, router_jitter_noise=0.0)


def _gpt2(s: Size) -> transformers.PretrainedConfig:
    return transformers.GPT2Config(vocab_size=s.vocab, n_embd=s.hidden, n_layer=s.layers, n_head=s.heads, n_inner=s.ffn,
                                   n_positions=max(2 * s.seq, 128), bos_token_id=1, eos_token_id=2)


def _bert(s: Size) -> transformers.PretrainedConfig:
    return transformers.BertConfig(vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
                                   num_attention_heads=s.heads, intermediate_size=s.ffn,
                                   max_position_embeddings=max(s.seq, 128), pad_token_id=0)


def _deberta_v2(s: Size) -> transformers.PretrainedConfig:
    """DeBERTa-v3's settings: relative attention (content-to-position both ways) over log buckets, shared
    position keys, layer-normed relative embeddings, no absolute positions."""
    return transformers.DebertaV2Config(vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
                                        num_attention_heads=s.heads, intermediate_size=s.ffn,
                                        max_position_embeddings=max(s.seq, 128), relative_attention=True,
                                        position_buckets=s.rel_buckets, max_relative_positions=-1,
                                        pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", share_att_key=True,
                                        position_biased_input=False, type_vocab_size=0, pad_token_id=0)


def _t5(s: Size) -> transformers.PretrainedConfig:
    """T5 v1.1's layout: gated GELU MLP, untied output projection."""
    return transformers.T5Config(vocab_size=s.vocab, d_model=s.hidden, d_kv=s.hidden // s.heads, d_ff=s.inter,
                                 num_layers=s.layers, num_decoder_layers=s.layers, num_heads=s.heads,
                                 feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                                 relative_attention_num_buckets=min(32, 2 * s.seq),
                                 relative_attention_max_distance=min(128, 4 * s.seq),
                                 pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)


def _bart(s: Size) -> transformers.PretrainedConfig:
    return transformers.BartConfig(vocab_size=s.vocab, d_model=s.hidden, encoder_layers=s.layers,
                                   decoder_layers=s.layers, encoder_attention_heads=s.heads,
                                   decoder_attention_heads=s.heads, encoder_ffn_dim=s.ffn, decoder_ffn_dim=s.ffn,
                                   max_position_embeddings=max(s.seq, s.dec_seq, 128), pad_token_id=1,
                                   bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None)


def _vit(s: Size) -> transformers.PretrainedConfig:
    return transformers.ViTConfig(hidden_size=s.hidden, num_hidden_layers=s.layers, num_attention_heads=s.heads,
                                  intermediate_size=s.ffn, image_size=s.image, patch_size=s.patch, num_labels=s.labels)


def _convnext(s: Size) -> transformers.PretrainedConfig:
    return transformers.ConvNextConfig(hidden_sizes=list(s.convnext_dims), depths=list(s.convnext_depths),
                                       image_size=s.image, num_labels=s.labels)


def _resnet(s: Size) -> transformers.PretrainedConfig:
    return transformers.ResNetConfig(embedding_size=min(64, s.resnet_dims[0]), hidden_sizes=list(s.resnet_dims),
                                     depths=list(s.resnet_depths), layer_type=s.resnet_block, num_labels=s.labels)


def _whisper(s: Size) -> transformers.PretrainedConfig:
    return transformers.WhisperConfig(vocab_size=s.vocab, num_mel_bins=s.mel_bins, d_model=s.hidden,
                                      encoder_layers=s.layers, decoder_layers=s.layers, encoder_attention_heads=s.heads,
                                      decoder_attention_heads=s.heads, encoder_ffn_dim=s.ffn, decoder_ffn_dim=s.ffn,
                                      max_source_positions=s.frames // 2, max_target_positions=max(s.dec_seq, 32),
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                                      suppress_tokens=None, begin_suppress_tokens=None)


def _wav2vec2(s: Size) -> transformers.PretrainedConfig:
    """Wav2Vec2 fine-tuned for CTC as users run it: mean-reduced loss, infinite losses zeroed."""
    groups = min(16, s.hidden // 2)
    return transformers.Wav2Vec2Config(vocab_size=32, hidden_size=s.hidden, num_hidden_layers=s.layers,
                                       num_attention_heads=s.heads, intermediate_size=s.ffn,
                                       conv_dim=list(s.conv_dims), conv_kernel=list(s.conv_kernels),
                                       conv_stride=list(s.conv_strides), num_conv_pos_embeddings=min(128, 2 * groups),
                                       num_conv_pos_embedding_groups=groups, mask_time_prob=0.0,
                                       ctc_loss_reduction="mean", ctc_zero_infinity=True, pad_token_id=0)


ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("llama", "causal-lm", _llama, lambda: transformers.LlamaForCausalLM, _causal_lm_batch, note="GQA, RoPE, SwiGLU"),
    Arch("qwen2", "causal-lm", _qwen2, lambda: transformers.Qwen2ForCausalLM, _causal_lm_batch,
         note="GQA with q/k/v biases"),
    Arch("mistral", "causal-lm", _mistral, lambda: transformers.MistralForCausalLM, _causal_lm_batch,
         note="GQA, sliding window of half the sequence"),
    Arch("gemma2", "causal-lm", _gemma2, lambda: transformers.Gemma2ForCausalLM, _causal_lm_batch, attention="eager",
         note="GQA, sliding and global layers, attention and logit soft-capping (eager attention)"),
    Arch("phi3", "causal-lm", _phi3, lambda: transformers.Phi3ForCausalLM, _causal_lm_batch,
         note="GQA, fused qkv and gate/up projections"),
    Arch("gpt2", "causal-lm", _gpt2, lambda: transformers.GPT2LMHeadModel, _causal_lm_batch,
         note="learned positions, GELU (tanh), Conv1D projections"),
    Arch("mixtral", "causal-lm", _mixtral, lambda: transformers.MixtralForCausalLM, _causal_lm_batch,
         note="MoE: top-2 of the experts per token"),
    Arch("bert", "masked-lm", _bert, lambda: transformers.BertForMaskedLM, _masked_lm_batch, note="encoder, post-norm"),
    Arch("deberta_v2", "masked-lm", _deberta_v2, lambda: transformers.DebertaV2ForMaskedLM, _masked_lm_batch,
         attention="eager", note="relative attention as in DeBERTa-v3 (eager: no SDPA)"),
    Arch("t5", "seq2seq", _t5, lambda: transformers.T5ForConditionalGeneration, _seq2seq_batch,
         note="encoder-decoder, relative position buckets, gated GELU"),
    Arch("bart", "seq2seq", _bart, lambda: transformers.BartForConditionalGeneration, _seq2seq_batch,
         note="encoder-decoder, learned positions"),
    Arch("vit", "image", _vit, lambda: transformers.ViTForImageClassification, _image_batch,
         note="vision transformer"),
    Arch("convnext", "image", _convnext, lambda: transformers.ConvNextForImageClassification, _image_batch,
         note="depthwise convolutions, channels-last layer norms"),
    Arch("resnet", "image", _resnet, lambda: transformers.ResNetForImageClassification, _image_batch,
         note="convolutions and batch norm"),
    Arch("whisper", "speech-seq2seq", _whisper, lambda: transformers.WhisperForConditionalGeneration, _whisper_batch,
         note="audio encoder-decoder, log-mel input"),
    Arch("wav2vec2", "ctc", _wav2vec2, lambda: transformers.Wav2Vec2ForCTC, _ctc_batch,
         note="raw audio, convolutional feature encoder, CTC loss", float32_inside=True),
)}


def _without_randomness(config: transformers.PretrainedConfig) -> transformers.PretrainedConfig:
    """Zero every dropout, drop-path and layer-drop probability of ``config`` (and its sub-configs)."""
    for name in list(vars(config)):
        value = getattr(config, name)
        if isinstance(value, transformers.PretrainedConfig):
            _without_randomness(value)
        elif isinstance(value, float) and ("dropout" in name or "pdrop" in name or "layerdrop" in name
                                           or name in ("drop_path_rate", "mask_time_prob", "mask_feature_prob")):
            setattr(config, name, 0.0)
    return config


def build_config(name: str, size: Size) -> transformers.PretrainedConfig:
    arch = ARCHS[name]
    config = _without_randomness(arch.config(size))
    if arch.attention is not None:
        config._attn_implementation = arch.attention
    return config


def build_model(name: str, size: Size | str, device: str | torch.device = "cpu", seed: int = 0) -> torch.nn.Module:
    """The model with random weights drawn from ``seed`` (the same weights for the same seed, device and
    size), float32, in eval mode."""
    size = SIZES[size] if isinstance(size, str) else size
    config = build_config(name, size)
    with torch.random.fork_rng(devices=[torch.device(device)] if torch.device(device).type == "cuda" else []):
        torch.manual_seed(seed)
        with torch.device(device):
            model = ARCHS[name].model_class()(config)
    return model.eval()


def make_batch(name: str, size: Size | str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
               seed: int = 0) -> Batch:
    """One step's inputs, drawn on the CPU from ``seed`` (identical on every device), floating ones in ``dtype``."""
    size = SIZES[size] if isinstance(size, str) else size
    batch = ARCHS[name].batch(size, torch.Generator().manual_seed(seed))

    def place(kwargs: dict[str, Any]) -> dict[str, Any]:
        return {k: (v.to(device, dtype if v.is_floating_point() else v.dtype) if isinstance(v, torch.Tensor) else v)
                for k, v in kwargs.items()}

    return dataclasses.replace(batch, inference=place(batch.inference), training=place(batch.training))


def output_logits(output: Any) -> torch.Tensor:
    """The output a step is checked by: every zoo head returns ``logits``."""
    return output.logits


def output_loss(output: Any) -> torch.Tensor:
    return output.loss
