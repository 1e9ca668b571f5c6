"""The decomposition table AOTAutograd traces with: composite ATen ops replaced by the ops the
translator lowers, so their math fuses with their neighbours instead of running as one opaque
ATen call. PyTorch's own decompositions (``torch._decomp``) are used; nothing is re-derived here.

Decomposed (each entry's forward and, where listed, backward):

* normalizations: ``native_layer_norm``, ``native_group_norm``, ``_fused_rms_norm`` (and
  their backwards): ``var_mean`` / ``mean`` / ``rsqrt`` and pointwise math;
* softmax: ``_softmax``, ``_safe_softmax``, ``_log_softmax`` and their backwards, ``logsumexp``:
  ``amax`` / ``sum`` and pointwise math;
* activation backwards: ``silu``, ``gelu``, ``tanh``, ``sigmoid``, ``threshold`` (relu),
  ``leaky_relu``, ``hardtanh``, ``elu``, ``softplus``, ``hardswish``, ``hardsigmoid``, ``mish``,
  ``glu``, ``logit``; and the forwards of those without an ``fd.ops`` method (``leaky_relu``,
  ``hardtanh``, ``elu``, ``softplus``, ``hardswish``, ``hardsigmoid``, ``mish``, ``glu``, ``logit``);
* ``native_dropout_backward`` (a mask multiply), ``masked_fill``, ``mse_loss`` and its backward,
  ``std``, ``nan_to_num``, ``isneginf``.

Deliberately *not* decomposed, so they stay one ATen call (or one lowering): ``addmm`` / ``mm`` /
``bmm`` (cuBLAS), scaled-dot-product attention (torch's fused kernels), ``native_dropout`` (torch's
RNG stream: results match eager), ``embedding_dense_backward`` and ``nll_loss`` (scatters),
``native_batch_norm`` (updates running statistics in place).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
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
)


def decomposition_table() -> dict[Any, Callable[..., Any]]:
    """OpOverload -> decomposition, for ``aot_autograd(decompositions=...)``."""
    return get_decompositions(list(DECOMPOSED_OPS))
