"""Scaled dot-product attention, forward and backward (nvFuser's ``sdpfa_fwd`` / ``sdpfa_bwd``).

Both are evaluated by attention's definition with ATen ops (matmul, logsumexp, softmax), computed
in float32 (float64 for double inputs) as a flash kernel accumulates: ``scores = q @ k^T * scale
(+ bias + mask)`` (a boolean mask drops its False entries), causal masking keeps the lower triangle
(top-left aligned, as torch's), ``lse`` is the row-wise logsumexp (float32), dropout drops with
probability ``p`` and rescales. The forward returns nvFuser's four outputs; its RNG state is
``philox_seed = [seed, offset]`` (uint64, drawn from torch's generator of the device when dropout
is on) and an empty ``philox_offset``, so the backward regenerates the same dropout mask. The
backward recomputes the forward from q, k, v and differentiates it with autograd; like nvFuser's,
it takes no bias or mask. Without dropout on a CPU, both run torch's fused CPU kernel instead,
whose results torch's own attention gives.

On CUDA, as nvFuser: half / bfloat16 attention without bias or mask runs ATen's flash attention
(forward and backward), so the dropout mask comes from the flash kernel's philox state drawn from
the CUDA generator, the same mask torch's flash attention draws, and that state is the
``philox_seed`` / ``philox_offset`` pair the backward replays. With a bias or mask (no dropout) the
output is torch's ``scaled_dot_product_attention`` of the combined additive mask, whatever kernel
torch picks (a row that masks every key then matches torch's too).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from pyfuser.ir.base import Expr, PythonCall, Val
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.ops.common import header
from pyfuser.ir.ops.random import seeded_generator

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion
    from pyfuser.ir.iter_domain import IterDomain
    from pyfuser.ir.tensor_view import TensorView


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
              mask: torch.Tensor | None, dropout_p: float, is_causal: bool, scale: float | None,
              seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` in the compute dtype (float32, or float64 for double inputs)."""
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    additive = _additive_mask(bias, mask)
    if dropout_p == 0 and _cpu_flash_takes(q, k, v):
        # torch's own fused CPU kernel: the same numbers as F.scaled_dot_product_attention, as nvFuser
        # (which calls ATen's flash attention) gives torch's on CUDA.
        scores_shape = (*q.shape[:-1], k.shape[-2])
        attn_mask = None if additive is None else additive.to(q.dtype).expand(scores_shape)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, is_causal, attn_mask=attn_mask, scale=scale)
        return out, lse
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q.to(compute), k.to(compute).transpose(-2, -1)) * scale
    if additive is not None:
        scores = scores + additive.to(compute)
    if is_causal:
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    probs = torch.exp(scores - lse.unsqueeze(-1))
    if dropout_p > 0:
        generator = seeded_generator(q.device, seed, 0)
        kept = torch.rand(probs.shape, generator=generator, device=probs.device, dtype=compute) >= dropout_p
        probs = probs * kept / (1 - dropout_p)
    return torch.matmul(probs, v.to(compute)), lse


#: dtypes torch's fused CPU attention kernel takes
_CPU_FLASH_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _cpu_flash_takes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether torch's fused CPU kernel computes this attention: [N, H, L, E] operands of one head size
    and one batch, in a dtype it takes."""
    return (q.device.type == "cpu" and q.dtype in _CPU_FLASH_DTYPES and q.dtype == k.dtype == v.dtype
            and q.ndim == k.ndim == v.ndim == 4
            and q.shape[-1] == k.shape[-1] == v.shape[-1] and q.shape[:2] == k.shape[:2] == v.shape[:2])


def _additive_mask(bias: torch.Tensor | None, mask: torch.Tensor | None) -> torch.Tensor | None:
    """``bias + mask`` as one additive term; a boolean mask keeps its True entries (0) and drops the
    others (-inf), as torch's ``attn_mask`` and nvFuser's."""
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.where(mask, 0.0, float("-inf"))
    if bias is None or mask is None:
        return bias if mask is None else mask
    return bias + mask


#: dtypes ATen's flash attention takes on CUDA
_FLASH_DTYPES = (torch.bfloat16, torch.float16)


def _cuda_flash_takes(*tensors: torch.Tensor) -> bool:
    """Whether ATen's CUDA flash attention computes these [N, H, L, E] operands: one half dtype, head
    sizes a multiple of 8 up to 256 (what the kernel takes without padding), unit inner strides."""
    q = tensors[0]
    return (q.device.type == "cuda" and q.dtype in _FLASH_DTYPES and all(t.dtype == q.dtype for t in tensors)
            and all(t.ndim == 4 and t.stride(-1) == 1 for t in tensors)
            and all(t.shape[-1] == q.shape[-1] for t in tensors) and q.shape[-1] % 8 == 0 and q.shape[-1] <= 256
            and torch.backends.cuda.flash_sdp_enabled())


def _cuda_flash_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, is_causal: bool,
                    scale: float | None) -> list[torch.Tensor]:
    """``out, lse, philox_seed, philox_offset`` by ATen's flash attention (nvFuser's CUDA evaluation)."""
    out, lse, _, _, _, _, rng_state, offset, _ = torch.ops.aten._scaled_dot_product_flash_attention(
        q, k, v, dropout_p, is_causal, return_debug_mask=False, scale=scale)
    rng = (rng_state.reshape(2).to(torch.uint64) if rng_state.numel() == 2
           else torch.zeros(2, dtype=torch.uint64, device=q.device))
    off = (offset.reshape(()).to(torch.uint64) if offset.numel() == 1
           else torch.zeros((), dtype=torch.uint64, device=q.device))
    return [out, lse.to(torch.float32), rng, off]


def _cuda_masked_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, additive: torch.Tensor, is_causal: bool,
                     scale: float | None) -> list[torch.Tensor]:
    """Attention with an additive mask on CUDA (no dropout): torch's own attention computes the output,
    the logsumexp is the scores' (float32), and the RNG state is empty."""
    scores_shape = (*q.shape[:-1], k.shape[-2])
    mask = additive.to(torch.float32).expand(scores_shape)
    if is_causal:  # torch takes a mask or is_causal, not both: the causal mask joins the additive one
        keep = torch.ones(scores_shape[-2:], dtype=torch.bool, device=q.device).tril()
        mask = mask.masked_fill(~keep, float("-inf"))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), scale=scale)
    _, lse = attention(q, k, v, None, mask, 0.0, False, scale, 0)
    return [out, lse.to(torch.float32), torch.zeros(2, dtype=torch.uint64, device=q.device),
            torch.zeros((), dtype=torch.uint64, device=q.device)]


def _flag(value: Any, default: Any) -> Any:
    return default if value is None else value


def _flash_lse(lse: torch.Tensor) -> torch.Tensor:
    """The logsumexp as ATen's flash backward reads it: float32 with unit inner stride."""
    return lse.to(torch.float32).contiguous()


class SdpaFwdOp(Expr):
    """``out, lse, philox_seed, philox_offset = sdpfa_fwd(q, k, v, bias, mask, dropout_p, is_causal, scale)``."""

    #: a causal mask is relative to the whole query axis, and softmax needs whole key rows
    chunkable = False

    OPTIONS = ("bias", "mask", "dropout_p", "is_causal", "scale")

    def __init__(self, fusion: Fusion, outputs: list[TensorView], q: TensorView, k: TensorView, v: TensorView,
                 options: dict[str, Val | None]) -> None:
        given = {name: val for name in self.OPTIONS if (val := options.get(name)) is not None}
        self.given = tuple(given)
        super().__init__(fusion, [q, k, v, *given.values()], outputs)

    def evaluate(self, ctx: EvalContext, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: Any) -> list[Any]:
        opts = dict(zip(self.given, rest, strict=True))
        dropout_p = float(_flag(opts.get("dropout_p"), 0.0))
        if not 0.0 <= dropout_p < 1.0:
            raise ValueError(f"sdpfa_fwd: dropout_p must be in [0, 1), got {dropout_p} (producing "
                             f"{self.output.short_name})")
        is_causal, scale = bool(_flag(opts.get("is_causal"), False)), opts.get("scale")
        bias, mask = opts.get("bias"), opts.get("mask")
        if bias is None and mask is None and _cuda_flash_takes(q, k, v):
            return _cuda_flash_fwd(q, k, v, dropout_p, is_causal, scale)
        additive = _additive_mask(bias, mask)
        if additive is not None and dropout_p == 0 and q.device.type == "cuda":
            out, lse, seed_t, offset_t = _cuda_masked_fwd(q, k, v, additive, is_causal, scale)
            return [out.to(q.dtype), lse, seed_t, offset_t]
        seed = int(torch.randint(0, 2**62, (), device=q.device).item()) if dropout_p > 0 else 0
        out, lse = attention(q, k, v, bias, mask, dropout_p, is_causal, scale, seed)
        philox_seed = torch.tensor([seed, 0], dtype=torch.uint64, device=q.device)
        philox_offset = torch.zeros((), dtype=torch.uint64, device=q.device)
        return [out.to(q.dtype), lse.to(torch.float32), philox_seed, philox_offset]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        """q's batch, head and query axes map onto the output's and lse's; v's value dim onto the output's."""
        ids = producer.get_logical_domain(no_reductions=True)
        out_ids = self.output.get_logical_domain()
        if producer is self.inputs[0]:
            return dict(zip(ids[:-1], out_ids[:-1], strict=True))
        if producer is self.inputs[2]:
            return {**dict(zip(ids[:-2], out_ids[:-2], strict=True)), ids[-1]: out_ids[-1]}
        if producer is self.inputs[1]:
            return dict(zip(ids[:-2], out_ids[:-2], strict=True))
        return {}

    def shardable_axes(self) -> set[int]:
        """The batch and head axes (all but the sequence and the embedding): each shard of them attends on
        its own, as nvFuser's head-parallel sdpa."""
        return set(range(len(self.output.get_logical_domain()) - 2))

    def output_map(self, producer: TensorView, output: TensorView) -> dict[IterDomain, IterDomain]:
        """The attention as ``logical_map``; the log-sum-exp ``[..., H, S]`` takes q's axes but the last;
        the philox seed and offset map nothing (one state per call, no axis of the inputs)."""
        if output is self.output:
            return self.logical_map(producer)
        if output is self.tensor_outputs[1] and producer is self.inputs[0]:
            ids = producer.get_logical_domain(no_reductions=True)
            return dict(zip(ids[:-1], output.get_logical_domain(), strict=True))
        return {}

    def python_call(self) -> PythonCall:
        return PythonCall("sdpfa_fwd", tuple(self.inputs[:3]), dict(zip(self.given, self.inputs[3:], strict=True)))

    def to_string(self, indent: int = 0) -> str:
        outs = ",\n   ".join(str(o) for o in self.outputs)
        attrs = "".join(f", {name} = {v}" for name, v in zip(self.given, self.inputs[3:], strict=True))
        q, k, v = self.inputs[:3]
        return f"{header(outs, indent)}sdpa_fwd( {q}, {k}, {v}{attrs} )\n"


class SdpaBwdOp(Expr):
    """``grad_q, grad_k, grad_v = sdpfa_bwd(grad_output, q, k, v, output, logsumexp, dropout_p,
    is_causal, philox_seed, philox_offset, scale)``."""

    chunkable = False
    NAMES = ("grad_output", "query", "key", "value", "output", "logsumexp", "dropout_p", "is_causal",
             "philox_seed", "philox_offset", "scale")

    def __init__(self, fusion: Fusion, outputs: list[TensorView], inputs: list[Val]) -> None:
        super().__init__(fusion, inputs, outputs)

    def evaluate(self, ctx: EvalContext, grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 output: torch.Tensor, lse: torch.Tensor, dropout_p: Any, is_causal: Any, philox_seed: torch.Tensor,
                 philox_offset: torch.Tensor, scale: Any = None) -> list[Any]:
        if _cuda_flash_takes(q, k, v, grad_out, output) and philox_seed.numel() == 2:
            grads = torch.ops.aten._scaled_dot_product_flash_attention_backward(
                grad_out, q, k, v, output, _flash_lse(lse), None, None, q.shape[-2], k.shape[-2],
                float(dropout_p), bool(is_causal), philox_seed, philox_offset, scale=scale)
            return [g.to(t.dtype) for g, t in zip(grads, (q, k, v), strict=True)]
        seed = int(philox_seed.reshape(-1)[0].item()) if philox_seed.numel() else 0
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            q_leaf, k_leaf, v_leaf = leaves
            out, _ = attention(q_leaf, k_leaf, v_leaf, None, None, float(dropout_p), bool(is_causal), scale, seed)
            grads = torch.autograd.grad(out, leaves, grad_out.to(out.dtype))
        return [g.to(t.dtype) for g, t in zip(grads, (q, k, v), strict=True)]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        """query, key and value map onto their gradients; the output's gradient, the output and the
        log-sum-exp map their batch, head and query axes onto the query gradient's."""
        ids = producer.get_logical_domain(no_reductions=True)
        for k in (1, 2, 3):
            if producer is self.inputs[k]:
                grad = self.tensor_outputs[k - 1]  # every output is a tensor: dq, dk, dv
                return dict(zip(ids, grad.get_logical_domain(), strict=True))
        leading = self.tensor_outputs[0].get_logical_domain()[:-1]
        if producer is self.inputs[0] or producer is self.inputs[4]:  # grad_output, output: [..., H, S, Ev]
            return dict(zip(ids[:-1], leading, strict=True))
        if producer is self.inputs[5]:  # logsumexp [..., H, S]
            return dict(zip(ids, leading, strict=True))
        return {}

    def shardable_axes(self) -> set[int]:
        """The batch and head axes, as the forward's."""
        return set(range(len(self.tensor_outputs[0].get_logical_domain()) - 2))

    def output_map(self, producer: TensorView, output: TensorView) -> dict[IterDomain, IterDomain]:
        """query, key and value map onto their own gradients only."""
        k = self.tensor_outputs.index(output) + 1
        return self.logical_map(producer) if producer is self.inputs[k] else {}

    def python_call(self) -> PythonCall:
        args = list(self.inputs) + [None] * (len(self.NAMES) - len(self.inputs))  # scale None: 1 / sqrt(E)
        return PythonCall("sdpfa_bwd", tuple(args))

    def to_string(self, indent: int = 0) -> str:
        outs = ",\n   ".join(str(o) for o in self.outputs)
        return f"{header(outs, indent)}sdpa_bwd( {', '.join(str(v) for v in self.inputs)} )\n"
