"""The decomposition table AOTAutograd traces with: composite ATen ops replaced by the ops the
translator lowers, so their math fuses with their neighbours instead of running as one opaque
ATen call. PyTorch's own decompositions (``torch._decomp``) are used where torch has one; the few
written here are said below.

Decomposed (each entry's forward and, where listed, backward):

* normalizations: ``native_layer_norm``, ``native_group_norm``, ``_fused_rms_norm`` (and
  their backwards): ``var_mean`` / ``mean`` / ``rsqrt`` and pointwise math;
* softmax: ``_softmax``, ``_safe_softmax``, ``_log_softmax`` and their backwards, ``logsumexp``:
  ``amax`` / ``sum`` and pointwise math;
* activation backwards: ``silu``, ``gelu``, ``tanh``, ``sigmoid``, ``threshold`` (relu),
  ``leaky_relu``, ``hardtanh``, ``elu``, ``softplus``, ``hardswish``, ``hardsigmoid``, ``mish``,
  ``glu``, ``logit``; and the forwards of those without an ``fd.ops`` method (``leaky_relu``,
  ``hardtanh``, ``elu``, ``softplus``, ``hardswish``, ``hardsigmoid``, ``mish``, ``glu``, ``logit``);
* batch norm in eval mode (``_native_batch_norm_legit_no_training``): pointwise math with the
  running statistics, fused with the convolution's neighbours (ReLU, the residual add). Written
  here: torch's entry calls ``_native_batch_norm_legit``, an op that may update the statistics in
  place, which AOTAutograd refuses in a functional graph;
* batch norm in training: the functional form AOTAutograd traces (``_native_batch_norm_legit_functional``,
  which returns the new running statistics; AOTAutograd writes them back into the buffers) and
  ``native_batch_norm_backward``: statistics and gradient sums as reductions, the normalization, the
  running statistics' update and the backward's input gradient fused with their neighbours (ATen's
  kernels were four launches per batch norm, its running statistics a cast and a copy each);
* ``native_dropout_backward`` (a mask multiply), ``masked_fill``, ``mse_loss`` and its backward,
  ``std``, ``nan_to_num``, ``isneginf``, ``linalg_vector_norm`` and ``norm``;
* weight normalization (``_weight_norm_interface``, what ``weight_norm`` parametrizations call on a
  weight's first or last axis: wav2vec2's positional convolution): the norm is a reduction fused with
  the scaling. Its backward (``_weight_norm_interface_backward``, which torch does not decompose) is
  written here from the same math, ``grad_v = g / |v| * (grad_w - v * sum(grad_w * v) / |v|^2)`` and
  ``grad_g = sum(grad_w * v) / |v|``. ATen's last-axis kernel took 538 us for wav2vec2's
  ``[768, 48, 128]`` weight on an H200, Inductor's fused one 9 us;
* ``nll_loss_forward`` / ``nll_loss_backward``: derived here (as is the weight-norm backward), since torch's
  gathers the target's class and scatters into zeros (each an ATen call and, for the backward, a
  logits-sized fill). Here the target's class is ``arange(classes) == target``: the forward is a
  reduction over the classes that fuses with the log-softmax's own (one pass over the logits), the
  backward a pointwise ``where`` that fuses into the log-softmax backward (no fill). A target out of
  range is a device-side assert (``_assert_async``, as ATen's CUDA kernel asserts), not a wrong loss.

Deliberately *not* decomposed, so they stay one ATen call (or one lowering): ``addmm`` / ``mm`` /
``bmm`` (cuBLAS), scaled-dot-product attention (torch's fused kernels), ``native_dropout`` (torch's
RNG stream: results match eager), ``embedding_dense_backward`` (lowered as an atomic scatter-add).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch._decomp.decompositions
from torch._decomp import get_decompositions

aten = torch.ops.aten

DECOMPOSED_OPS: tuple[Any, ...] = (
    aten.native_layer_norm, aten.native_layer_norm_backward,
    aten.native_group_norm, aten.native_group_norm_backward,
    aten._fused_rms_norm, aten._fused_rms_norm_backward,
    aten._softmax, aten._safe_softmax, aten._softmax_backward_data,
    aten._log_softmax, aten._log_softmax_backward_data, aten.logsumexp,
    aten.silu_backward, aten.gelu_backward, aten.tanh_backward, aten.sigmoid_backward, aten.threshold_backward,
    aten.leaky_relu, aten.leaky_relu_backward, aten.hardtanh, aten.hardtanh_backward,
    aten.elu, aten.elu_backward, aten.softplus, aten.softplus_backward,
    aten.hardswish, aten.hardswish_backward, aten.hardsigmoid, aten.hardsigmoid_backward,
    aten.mish, aten.mish_backward, aten.glu, aten.glu_backward, aten.logit, aten.logit_backward,
    aten.native_dropout_backward, aten.masked_fill, aten.mse_loss, aten.mse_loss_backward,
    aten.std, aten.nan_to_num, aten.isneginf,
    aten._native_batch_norm_legit_functional, aten.native_batch_norm_backward,
    aten.linalg_vector_norm, aten.norm, aten._weight_norm_interface,
)


#: ``reduction`` of the loss ops (torch's ``Reduction`` enum)
_NONE, _MEAN, _SUM = 0, 1, 2


def _target_class(logp: torch.Tensor, target: torch.Tensor, ignore_index: int,
                  check: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(valid, hit)``: ``valid`` where ``target`` is not ``ignore_index``; ``hit`` (shaped like ``logp``)
    true at each valid row's target class. ``check``: assert every valid target names a class (the
    forward checks; its backward reads the same targets)."""
    classes = logp.shape[-1]
    valid = target != ignore_index
    safe = torch.where(valid, target, 0)
    if check and safe.numel() > 0:  # (no rows: nothing to check, and no minimum)
        # min over the rows of each target (-1 for one past the classes): a reduction that fuses with the
        # count of valid targets, leaving only the assert to run outside the region
        lowest = torch.where(safe < classes, safe, -1).amin() if safe.dim() else torch.where(safe < classes, safe, -1)
        count = f"{classes} classes" if isinstance(classes, int) else "the classes"  # (a symbolic size)
        torch._assert_async(lowest >= 0,
                            f"nll_loss: a target is out of range for {count} (and is not ignore_index {ignore_index})")
    return valid, torch.arange(classes, device=logp.device) == safe.unsqueeze(-1)


def _nll_loss_forward(logp: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, reduction: int,
                      ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``nll_loss_forward`` as torch's decomposition defines it, the target's class picked by a sum over
    the classes of ``where(hit, logp, 0)`` (exact: every other term is zero)."""
    if not (logp.dim() == 2 and target.dim() == 1) and not (logp.dim() == 1 and target.dim() == 0):
        return torch._decomp.decompositions.nll_loss_forward(logp, target, weight, reduction, ignore_index)
    valid, hit = _target_class(logp, target, ignore_index, check=True)
    result = -torch.where(hit, logp, 0).sum(-1)
    picked_weight = torch.where(hit, weight, 0).sum(-1) if weight is not None else None
    if picked_weight is not None:
        result = result * picked_weight
    result = torch.where(valid, result, 0)
    if reduction == _NONE and logp.dim() > 1:
        return result, logp.new_full((), 0.0)
    if picked_weight is not None:
        total_weight = torch.where(valid, picked_weight, 0).sum()
    else:
        total_weight = valid.sum().to(logp.dtype)
    if reduction == _SUM:
        result = result.sum()
    elif reduction == _MEAN:
        result = result.sum() / total_weight
    return result, total_weight


def _nll_loss_backward(grad_output: torch.Tensor, logp: torch.Tensor, target: torch.Tensor,
                       weight: torch.Tensor | None, reduction: int, ignore_index: int,
                       total_weight: torch.Tensor) -> torch.Tensor:
    """``nll_loss_backward`` as torch's decomposition defines it: ``-grad`` (times the class's weight)
    where ``hit``, else 0, written by the kernel that reads it instead of scattered into zeros."""
    if not (logp.dim() == 2 and target.dim() == 1) and not (logp.dim() == 1 and target.dim() == 0):
        return torch._decomp.decompositions.nll_loss_backward(grad_output, logp, target, weight, reduction,
                                                              ignore_index, total_weight)
    if reduction == _MEAN:
        grad_output = grad_output / total_weight
    valid, hit = _target_class(logp, target, ignore_index, check=False)
    if grad_output.dim() > 0 and logp.dim() == 2:  # reduction none: one gradient per row
        grad_output = grad_output.unsqueeze(1)
    if weight is not None:
        grad_output = grad_output * weight
    grad_output = torch.where(valid.unsqueeze(-1), grad_output, 0)
    return torch.where(hit, -grad_output, 0).to(torch.result_type(logp, grad_output))


def _batch_norm_in_eval_mode(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                             running_mean: torch.Tensor, running_var: torch.Tensor, momentum: float,
                             eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` per channel (axis 1), in float32 for reduced
    precision inputs as ATen computes it; the saved statistics are empty, as ATen's are in eval mode."""
    compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    shape = [1, -1] + [1] * (x.dim() - 2)
    scale = torch.rsqrt(running_var.to(compute) + eps)
    if weight is not None:
        scale = scale * weight.to(compute)
    out = (x.to(compute) - running_mean.to(compute).reshape(shape)) * scale.reshape(shape)
    if bias is not None:
        out = out + bias.to(compute).reshape(shape)
    empty = x.new_zeros((0,))
    return out.to(x.dtype), empty, empty


def _weight_norm_backward(grad_w: torch.Tensor, saved_v: torch.Tensor, saved_g: torch.Tensor,
                          saved_norms: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad_v, grad_g)`` of ``w = v * g / |v|``, the norm over every axis but ``dim`` (as the forward's
    decomposition reads ``dim``: an axis index, any other value reducing every axis); in float32 for
    reduced precision, as ATen accumulates, each gradient in its input's dtype."""
    reduced = [d for d in range(saved_v.dim()) if d != dim]
    compute = torch.float32 if saved_v.dtype in (torch.float16, torch.bfloat16) else saved_v.dtype
    grad, v, g, norms = (t.to(compute) for t in (grad_w, saved_v, saved_g, saved_norms))
    sums = (grad * v).sum(reduced, keepdim=True)
    grad_v = g / norms * (grad - v * (sums / (norms * norms)))
    return grad_v.to(saved_v.dtype), (sums / norms).to(saved_g.dtype)


def decomposition_table() -> dict[Any, Callable[..., Any]]:
    """OpOverload -> decomposition, for ``aot_autograd(decompositions=...)``."""
    return get_decompositions(list(DECOMPOSED_OPS)) | {
        aten.nll_loss_forward.default: _nll_loss_forward, aten.nll_loss_backward.default: _nll_loss_backward,
        aten._native_batch_norm_legit_no_training.default: _batch_norm_in_eval_mode,
        aten._weight_norm_interface_backward.default: _weight_norm_backward}
