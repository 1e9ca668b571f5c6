"""Casts, tensor creation, reductions, contractions and indexing ATen ops onto ``fd.ops``."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch.fx import Node

from pyfuser.integrations.torch_compile.lowering import (
    Lowering,
    LoweringContext,
    OpClass,
    arg,
    device_arg,
    meta_of,
    swapped_dims,
)
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.tensor_view import TensorView

aten = torch.ops.aten


def _normalize(dim: int, rank: int) -> int:
    return dim % rank if rank else 0


# --- casts -------------------------------------------------------------------------------------------
def _to_copy(ctx: LoweringContext, x: Any, **kwargs: Any) -> Any:
    dtype = ctx.meta.dtype
    value = x if x.dtype.torch_dtype == dtype else ctx.ops.cast(x, dtype)
    if _moves_a_cpu_scalar(ctx.node):
        # The region's value of a 0-dim CPU tensor moved to its device: computed there (a kernel reads
        # the scalar as an argument), it is a device tensor like the region's own creations.
        value = ctx.ops.where(ctx.ops.full([], True, torch.bool), value, value)
    return value


def _moves_a_cpu_scalar(node: Node) -> bool:
    """``_to_copy`` of a 0-dim CPU tensor to another device (``torch.tensor(c).to(x)``, ``type_as``:
    a constant of the model's code). Left to ATen it is a copy from pageable memory, which waits for
    the stream on every call; in the region it is a scalar argument."""
    source, device = meta_of(node.args[0]), node.kwargs.get("device")
    return device is not None and source.device.type == "cpu" and source.dim() == 0 and \
        device_arg(device).type != "cpu"


def _check_to_copy(node: Node) -> str | None:
    source = meta_of(node.args[0])
    device = node.kwargs.get("device")
    if device is not None and device_arg(device) != source.device and not _moves_a_cpu_scalar(node):
        return f"_to_copy moves {source.device} -> {device_arg(device)}"
    if node.kwargs.get("layout") not in (None, torch.strided):
        return f"_to_copy to layout {node.kwargs['layout']}"
    # (a region writes each output in its example value's layout, whichever format made it)
    if node.kwargs.get("memory_format") not in (None, torch.preserve_format, torch.contiguous_format,
                                                torch.channels_last, torch.channels_last_3d):
        return f"_to_copy to memory_format {node.kwargs['memory_format']}"
    return None


def _triangle(lower: bool) -> Any:
    """``tril`` / ``triu``: the elements on the kept side of diagonal ``diagonal`` of the last two axes, the
    others zero (Falcon's causal mask)."""
    def build(ctx: LoweringContext, x: Any, diagonal: int = 0) -> Any:
        rows, cols = (ctx.ops.size(x, x.ndim - k) for k in (2, 1))
        row = ctx.ops.broadcast(ctx.ops.iota(rows), [False, True])
        col = ctx.ops.broadcast(ctx.ops.iota(cols), [True, False])
        offset = ctx.ops.sub(col, row)
        keep = ctx.tensor(ctx.ops.le(offset, diagonal) if lower else ctx.ops.ge(offset, diagonal))
        if x.ndim > 2:
            keep = ctx.ops.broadcast(keep, [True] * (x.ndim - 2) + [False, False])
        return ctx.ops.where(keep, x, ctx.ops.full([], 0, ctx.meta.dtype))
    return build


def _check_triangle(node: Node) -> str | None:
    return None if isinstance(arg(node, 1, "diagonal", 0), int) else "tril / triu of a symbolic diagonal"


class _Windows(NamedTuple):
    sizes: list[int]
    kernel: list[int]
    windows: list[int]


def _pool_windows(input_node: Any, kernel_size: Any, stride: Any) -> _Windows | str:
    """The sizes of an average pool of ``input_node`` whose windows tile it (stride = kernel, every spatial
    extent a multiple of the kernel): ``(sizes, kernel, windows)`` over the last two axes, else why it is
    not one."""
    shape = meta_of(input_node).shape
    kernel = [int(k) for k in ([kernel_size] * 2 if isinstance(kernel_size, int) else kernel_size)]
    steps = kernel if not stride else [int(s) for s in ([stride] * 2 if isinstance(stride, int) else stride)]
    kernel, steps = kernel * (2 // len(kernel)), steps * (2 // len(steps))
    if not all(isinstance(s, int) for s in shape):
        return "avg_pool2d of symbolic sizes"
    spatial = [int(s) for s in shape[-2:]]
    if steps != kernel or any(e % k for e, k in zip(spatial, kernel, strict=True)):
        return "avg_pool2d of overlapping or ragged windows"
    return _Windows([int(s) for s in shape], kernel, [e // k for e, k in zip(spatial, kernel, strict=True)])


def _tiled(input_node: Any, kernel_size: Any, stride: Any) -> _Windows:
    """``_pool_windows`` of a pool its check accepted."""
    windows = _pool_windows(input_node, kernel_size, stride)
    if isinstance(windows, str):
        raise ValueError(windows)
    return windows


def _check_pool(node: Node, first: int) -> str | None:
    """Refusals of an average pool (``first``: the position of its kernel size, 1 forward, 2 backward)."""
    kernel_size, stride, padding = (arg(node, first + k, n, d) for k, n, d in ((0, "kernel_size", None),
                                                                               (1, "stride", []), (2, "padding", 0)))
    if any(int(p) for p in ([padding] if isinstance(padding, int) else padding)):
        return "avg_pool2d with padding"
    if arg(node, first + 5, "divisor_override", None) is not None:
        return "avg_pool2d with a divisor override"
    why = _pool_windows(node.args[first - 1], kernel_size, stride)
    return why if isinstance(why, str) else None


def _avg_pool2d(ctx: LoweringContext, x: Any, kernel_size: Any, stride: Any = (), *args: Any, **kwargs: Any) -> Any:
    """An average pool of windows that tile the input (Funnel's sequence pooling, a global pool): the
    spatial axes split into (windows, kernel) and the kernel axes averaged."""
    sizes, kernel, windows = _tiled(ctx.node.args[0], kernel_size, stride)
    split = ctx.ops.reshape(x, [*sizes[:-2], windows[0], kernel[0], windows[1], kernel[1]])
    rank = len(sizes) + 2
    return ctx.ops.div(ctx.ops.sum(split, [rank - 3, rank - 1]), kernel[0] * kernel[1])


def _avg_pool2d_backward(ctx: LoweringContext, grad: Any, x: Any, kernel_size: Any, stride: Any = (), *args: Any,
                         **kwargs: Any) -> Any:
    """Each window's gradient spread evenly over the window."""
    sizes, kernel, windows = _tiled(ctx.node.args[1], kernel_size, stride)
    lead = sizes[:-2]
    spread = ctx.ops.broadcast(grad, [False] * len(lead) + [False, True, False, True])
    spread = ctx.ops.expand(spread, [*lead, windows[0], kernel[0], windows[1], kernel[1]])
    return ctx.ops.reshape(ctx.tensor(ctx.ops.div(spread, kernel[0] * kernel[1])), sizes)


# --- creation ----------------------------------------------------------------------------------------
def _full(ctx: LoweringContext, size: Any, fill_value: Any, **kwargs: Any) -> Any:
    return ctx.ops.full(list(size), fill_value, ctx.meta.dtype)


def _constant(value: int) -> Any:
    def build(ctx: LoweringContext, size: Any, **kwargs: Any) -> Any:
        return ctx.ops.full(list(size), value, ctx.meta.dtype)
    return build


def _constant_like(value: int | None) -> Any:
    def build(ctx: LoweringContext, x: Any, *args: Any, **kwargs: Any) -> Any:
        fill = args[0] if value is None else value
        return ctx.ops.full(ctx.ops.shape(x), fill, ctx.meta.dtype)
    return build


def _new_constant(value: int | None) -> Any:
    def build(ctx: LoweringContext, x: Any, size: Any, *args: Any, **kwargs: Any) -> Any:
        fill = args[0] if value is None else value
        return ctx.ops.full(list(size), fill, ctx.meta.dtype)
    return build


def _scalar_tensor(ctx: LoweringContext, s: Any, **kwargs: Any) -> Any:
    return ctx.ops.full([], s, ctx.meta.dtype)


def _arange_bounds(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """``(start, end, step)`` of one of arange's overloads."""
    names = {aten.arange.default: ("end",), aten.arange.start: ("start", "end"),
             aten.arange.start_step: ("start", "end", "step")}[target]
    given = dict(zip(names, args, strict=False)) | {n: kwargs[n] for n in names if n in kwargs}
    return given.get("start", 0), given["end"], given.get("step", 1)


def _arange(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    start, end, step = _arange_bounds(ctx.node.target, args, kwargs)
    length = ctx.meta.shape[0]
    return ctx.ops.iota(length if isinstance(length, int) else end, start, step, ctx.meta.dtype)


def _check_arange(node: Node) -> str | None:
    start, _, step = _arange_bounds(node.target, node.args, dict(node.kwargs))
    if any(isinstance(v, Node) for v in (start, step)):
        return "arange with a symbolic start or step"
    if isinstance(meta_of(node).shape[0], int) or (start == 0 and step == 1):
        return None  # a static length, or arange(n) of a symbolic n (whose length is n)
    return "arange of a symbolic length other than arange(n)"


def _factory_check(node: Node) -> str | None:
    layout = node.kwargs.get("layout")
    if layout not in (None, torch.strided):
        return f"{node.target} with layout {layout}"
    return None


# --- reductions --------------------------------------------------------------------------------------
def _dims(dim: Any) -> Any:
    """ATen's ``dim=None`` and ``dim=[]`` both reduce every axis."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    return dim


def _reduction(name: str, all_axes: bool = False) -> Any:
    """A reduction; a ``dtype=`` argument casts the input first (torch accumulates in that dtype),
    and the result takes the traced dtype (``sum`` of integers is int64, as torch's)."""
    def build(ctx: LoweringContext, x: Any, dim: Any = None, keepdim: bool = False, *,
              dtype: torch.dtype | None = None) -> Any:
        if dtype is not None and x.dtype.torch_dtype != dtype:
            x = ctx.ops.cast(x, dtype)
        result = getattr(ctx.ops, name)(x, None if all_axes else _dims(dim), False if all_axes else keepdim)
        wanted = ctx.meta.dtype
        return result if result.dtype.torch_dtype == wanted else ctx.ops.cast(result, wanted)
    if all_axes:
        return lambda ctx, x, *, dtype=None: build(ctx, x, dtype=dtype)
    return build


def _logical_reduction(name: str, all_axes: bool = False) -> Any:
    """``all`` or ``any`` of the operand's truth over ``dim``: a count (an int64 sum, whose identity
    gives an empty axis torch's answer: ``all`` true, ``any`` false) of the false values (``all``) or
    the true ones (``any``) compared with 0; the result takes the traced dtype (bool, uint8 for uint8)."""
    def build(ctx: LoweringContext, x: Any, dim: Any = None, keepdim: bool = False) -> Any:
        truth = x if x.dtype.torch_dtype is torch.bool else ctx.ops.ne(x, 0)
        counted = ctx.ops.logical_not(truth) if name == "all" else truth
        count = ctx.ops.sum(ctx.tensor(ctx.ops.cast(counted, torch.int64)), None if all_axes else _dims(dim),
                            False if all_axes else keepdim)
        result = ctx.ops.eq(count, 0) if name == "all" else ctx.ops.ne(count, 0)
        return ctx.ops.cast(result, ctx.meta.dtype)
    if all_axes:
        return lambda ctx, x: build(ctx, x)
    return build


def _var(ctx: LoweringContext, x: Any, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
    return ctx.ops.var(x, _dims(dim), 1 if correction is None else correction, keepdim)


def _var_mean(ctx: LoweringContext, x: Any, dim: Any = None, *, correction: Any = None,
              keepdim: bool = False) -> list[Any]:
    return list(ctx.ops.var_mean(x, _dims(dim), 1 if correction is None else correction, keepdim))


def _check_correction(node: Node) -> str | None:
    correction = node.kwargs.get("correction")
    if correction is not None and not isinstance(correction, int):
        return f"{node.target} with a non-integer correction {correction!r}"
    return None


def _arg_reduction(name: str) -> Any:
    def build(ctx: LoweringContext, x: Any, dim: Any = None, keepdim: bool = False) -> Any:
        return getattr(ctx.ops, name)(x, dim, keepdim)
    return build


def _cumsum(ctx: LoweringContext, x: TensorView, dim: int, dtype: torch.dtype | None = None) -> TensorView:
    """One scan: ``dtype=`` is the scan's own, not casts around it (each its own kernel beside the scan's ATen
    call); without it the frontend promotes as torch does."""
    return ctx.ops.cumsum(x, dim, dtype=None if dtype is None else DataType.from_torch(dtype))


# --- contractions ------------------------------------------------------------------------------------
def _transposed_matrix(ctx: LoweringContext, operand: Any) -> Any | None:
    """``w`` when ``operand`` is ``w.t()`` (or the same by transpose / permute) of a 2-D ``w``: ``mm(x,
    w.t())`` is ``linear(x, w)``, which reads ``w`` as it is laid out instead of copying its transpose."""
    if not isinstance(operand, Node) or operand not in ctx._env or swapped_dims(operand) != (0, 1):
        return None
    source = operand.args[0]
    if not isinstance(source, Node) or meta_of(source) is None or meta_of(source).dim() != 2:
        return None
    return ctx.value_of(source) if source in ctx._env else None


def _flattened_rows(ctx: LoweringContext, operand: Any) -> Any | None:
    """The N-D tensor ``x`` when ``operand`` is ``x.view(-1, K)`` (static sizes, rank of ``x`` >= 3):
    AOTAutograd lowers a linear on ``[B, S, K]`` to ``view -> mm -> _unsafe_view``; the matmul reads
    ``x`` itself, and the two reshapes around it cancel (``shape_lowerings._reshape``), so no ATen
    reshape runs on either side of the GEMM."""
    if not isinstance(operand, Node) or operand.op != "call_function" or operand not in ctx._env:
        return None
    if operand.target not in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
        return None
    source = operand.args[0] if operand.args else None
    if not isinstance(source, Node) or source not in ctx._env:
        return None
    flat, full = meta_of(operand), meta_of(source)
    if flat is None or full is None or flat.dim() != 2 or full.dim() < 3:
        return None
    if not all(isinstance(s, int) for s in (*flat.shape, *full.shape)):
        return None
    if full.shape[-1] != flat.shape[1] or math.prod(full.shape[:-1]) != flat.shape[0]:
        return None
    return ctx.value_of(source)


def _mm(ctx: LoweringContext, a: Any, b: Any) -> Any:
    weight = _transposed_matrix(ctx, ctx.node.args[1])
    rows = _flattened_rows(ctx, ctx.node.args[0])
    x = a if rows is None else rows
    product = ctx.ops.linear(x, weight) if weight is not None else ctx.ops.matmul(x, b)
    return product if rows is None else ctx.ops.reshape(product, list(ctx.meta.shape))


def _bmm(ctx: LoweringContext, a: Any, b: Any) -> Any:
    return ctx.ops.matmul(a, b)


def _baddbmm(ctx: LoweringContext, bias: Any, a: Any, b: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    """``beta * bias + alpha * (a @ b)`` (attention with an additive bias: BLOOM's ALiBi, torch's
    ``multi_head_attention_forward`` with a float mask): the batched GEMM, then the bias added by the
    kernel that reads the scores. With ``beta`` 0 the bias is not read (torch: its NaNs do not spread)."""
    product = ctx.ops.matmul(a, b)
    scaled = product if alpha == 1 else ctx.ops.mul(product, alpha)
    if beta == 0:
        return ctx.ops.set(ctx.tensor(scaled))
    return ctx.tensor(ctx.ops.add(bias if beta == 1 else ctx.ops.mul(bias, beta), scaled))


def _addmm(ctx: LoweringContext, bias: Any, a: Any, b: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    weight = _transposed_matrix(ctx, ctx.node.args[2])
    rows = _flattened_rows(ctx, ctx.node.args[1])
    x = a if rows is None else rows
    if weight is not None and beta == 1 and alpha == 1 and bias.ndim == 1:
        result = ctx.ops.linear(x, weight, bias)
    else:
        if bias.ndim == 2 and rows is not None:  # a [M, N] bias does not broadcast against [..., N]
            x, rows = a, None
        product = ctx.ops.matmul(x, b)
        scaled = product if alpha == 1 else ctx.ops.mul(product, alpha)
        result = ctx.tensor(ctx.ops.add(bias if beta == 1 else ctx.ops.mul(bias, beta), scaled))
    return result if rows is None else ctx.ops.reshape(result, list(ctx.meta.shape))


# --- indexing ----------------------------------------------------------------------------------------
def _embedding(ctx: LoweringContext, weight: Any, indices: Any, *args: Any, **kwargs: Any) -> Any:
    return ctx.ops.embedding_fwd(indices, weight)


def _index_select(ctx: LoweringContext, x: Any, dim: int, index: Any) -> Any:
    return ctx.ops.index_select(x, index, dim)


def _gather(ctx: LoweringContext, x: Any, dim: int, index: Any, *, sparse_grad: bool = False) -> Any:
    return ctx.ops.gather(x, index, dim)


def _index(ctx: LoweringContext, x: Any, indices: Any) -> Any:
    return ctx.ops.index(x, list(indices))


def _check_index(node: Node) -> str | None:
    """Integer index tensors only: a boolean mask selects a number of values known once it is read."""
    for index in arg(node, 1, "indices"):
        meta = meta_of(index)
        if index is not None and (not isinstance(meta, torch.Tensor) or meta.dtype not in (torch.int64, torch.int32)):
            return f"index.Tensor by a {getattr(meta, 'dtype', type(meta).__name__)} index (data-dependent shape)"
    return None


def _index_put(ctx: LoweringContext, x: Any, indices: Any, values: Any, accumulate: bool = False) -> Any:
    """``x[index] += values`` (the backward of ``x[index]``, an MoE's combine) as the atomic scatter-add
    kernel of ``index_put_accumulate``, negative indices counting from the end as torch's. Half-precision
    rows are summed in float32 and rounded once, as ATen's sorted index_put sums them (and as the
    kernel's atomic adds can: they add float32), so an MoE's bfloat16 combine is a kernel too.
    ``x[index] = values`` (an MoE's inverse permutation) is the same kernel storing the rows."""
    (index,) = indices
    if not accumulate:
        return ctx.ops.index_put(x, index, values, wrap_negative=True)
    dtype = ctx.meta.dtype
    if dtype not in (torch.float16, torch.bfloat16):
        return ctx.ops.index_put_accumulate(x, index, values, wrap_negative=True)
    wide = ctx.ops.index_put_accumulate(ctx.ops.cast(x, torch.float32), index, ctx.ops.cast(values, torch.float32),
                                        wrap_negative=True)
    return ctx.ops.cast(wide, dtype)


def _check_index_put(node: Node) -> str | None:
    """By one 1-D integer index of axis 0, values one row per index value (no broadcast) of x's dtype."""
    x, indices, values = (meta_of(a) for a in node.args[:3])
    if len(indices) != 1 or indices[0] is None:
        return "index_put with other than one index tensor (of axis 0)"
    index = meta_of(indices[0])
    if index.dim() != 1 or index.dtype not in (torch.int64, torch.int32):
        return f"index_put by a {index.dim()}-D {index.dtype} index"
    if values.dtype != x.dtype or list(values.shape) != [index.shape[0], *x.shape[1:]]:
        return f"index_put of {values.dtype} values {list(values.shape)} into {x.dtype} {list(x.shape)} (broadcast)"
    return None


def _scatter(ctx: LoweringContext, x: Any, dim: int, index: Any, src: Any) -> Any:
    return ctx.ops.scatter(x, index, src, dim)


def _embedding_dense_backward(ctx: LoweringContext, grad: Any, indices: Any, num_weights: Any, padding_idx: int,
                              scale_grad_by_freq: bool) -> Any:
    """The weight's gradient as Inductor computes it: each index's gradient row added into a zeroed
    float32 table (an atomic scatter-add kernel), the rows of ``padding_idx`` left out, cast back to
    the gradient's dtype."""
    width = ctx.meta.shape[-1]
    accumulate = torch.float64 if ctx.meta.dtype == torch.float64 else torch.float32
    rows = ctx.ops.reshape(indices, [-1])
    values = ctx.ops.reshape(grad, [-1, width])
    if values.dtype.torch_dtype != accumulate:
        values = ctx.ops.cast(values, accumulate)
    if padding_idx >= 0:
        kept = ctx.ops.broadcast(ctx.tensor(ctx.ops.ne(rows, padding_idx)), [False, True])
        values = ctx.tensor(ctx.ops.where(kept, values, 0.0))
    table = ctx.ops.index_put_accumulate(ctx.ops.full([num_weights, width], 0.0, accumulate), rows, values)
    return table if ctx.meta.dtype == accumulate else ctx.ops.cast(table, ctx.meta.dtype)


def _check_embedding_dense_backward(node: Node) -> str | None:
    grad = meta_of(node.args[0])
    if arg(node, 4, "scale_grad_by_freq", False):
        return "embedding_dense_backward scaled by frequency (ATen counts the indices)"
    if torch.are_deterministic_algorithms_enabled():
        return "embedding_dense_backward with deterministic algorithms on (ATen's sorted sum; atomics are not)"
    if grad.dtype not in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
        return f"embedding_dense_backward of a {grad.dtype} gradient"
    return None


def _triu(ctx: LoweringContext, x: Any, diagonal: int = 0) -> Any:
    return ctx.ops.triu(x, diagonal)


ATEN = OpClass.aten

TENSOR_LOWERINGS: dict[Any, Lowering] = {
    aten._to_copy.default: Lowering(_to_copy, check=_check_to_copy),
    aten.full.default: Lowering(_full, check=_factory_check),
    aten.zeros.default: Lowering(_constant(0), check=_factory_check),
    aten.ones.default: Lowering(_constant(1), check=_factory_check),
    aten.zeros_like.default: Lowering(_constant_like(0), check=_factory_check),
    # (uninitialized memory: nothing reads it before writing, so zeros serve)
    aten.empty_like.default: Lowering(_constant_like(0), check=_factory_check),
    aten.new_empty.default: Lowering(_new_constant(0), check=_factory_check),
    aten.new_empty_strided.default: Lowering(_new_constant(0), check=_factory_check),
    aten.ones_like.default: Lowering(_constant_like(1), check=_factory_check),
    aten.full_like.default: Lowering(_constant_like(None), check=_factory_check),
    aten.new_zeros.default: Lowering(_new_constant(0), check=_factory_check),
    aten.new_ones.default: Lowering(_new_constant(1), check=_factory_check),
    aten.new_full.default: Lowering(_new_constant(None), check=_factory_check),
    aten.scalar_tensor.default: Lowering(_scalar_tensor, check=_factory_check),
    aten.arange.default: Lowering(_arange, check=_check_arange),
    aten.arange.start: Lowering(_arange, check=_check_arange),
    aten.arange.start_step: Lowering(_arange, check=_check_arange),
    aten.sum.dim_IntList: Lowering(_reduction("sum")),
    aten.sum.default: Lowering(_reduction("sum", all_axes=True)),
    aten.mean.dim: Lowering(_reduction("mean")),
    aten.mean.default: Lowering(_reduction("mean", all_axes=True)),
    aten.prod.dim_int: Lowering(_reduction("prod")),
    aten.prod.default: Lowering(_reduction("prod", all_axes=True)),
    aten.amax.default: Lowering(_reduction("max")),
    aten.amin.default: Lowering(_reduction("min")),
    aten.max.default: Lowering(_reduction("max", all_axes=True)),
    aten.min.default: Lowering(_reduction("min", all_axes=True)),
    aten.all.dim: Lowering(_logical_reduction("all")),
    aten.all.dims: Lowering(_logical_reduction("all")),
    aten.all.default: Lowering(_logical_reduction("all", all_axes=True)),
    aten.any.dim: Lowering(_logical_reduction("any")),
    aten.any.dims: Lowering(_logical_reduction("any")),
    aten.any.default: Lowering(_logical_reduction("any", all_axes=True)),
    aten.var.correction: Lowering(_var, check=_check_correction),
    aten.var_mean.correction: Lowering(_var_mean, check=_check_correction),
    aten.argmax.default: Lowering(_arg_reduction("argmax")),
    aten.argmin.default: Lowering(_arg_reduction("argmin")),
    aten.cumsum.default: Lowering(_cumsum),
    aten.mm.default: Lowering(_mm, ATEN),
    aten.bmm.default: Lowering(_bmm, ATEN),
    aten.baddbmm.default: Lowering(_baddbmm, ATEN),
    aten.addmm.default: Lowering(_addmm, ATEN),
    aten.embedding.default: Lowering(_embedding),
    aten.index_select.default: Lowering(_index_select),
    aten.gather.default: Lowering(_gather),
    aten.index.Tensor: Lowering(_index, check=_check_index),
    aten._unsafe_index.Tensor: Lowering(_index, check=_check_index),
    aten.index_put.default: Lowering(_index_put, check=_check_index_put),
    aten._unsafe_index_put.default: Lowering(_index_put, check=_check_index_put),
    aten.tril.default: Lowering(_triangle(lower=True), check=_check_triangle),
    aten.triu.default: Lowering(_triangle(lower=False), check=_check_triangle),
    aten.avg_pool2d.default: Lowering(_avg_pool2d, check=lambda node: _check_pool(node, 1)),
    aten.avg_pool2d_backward.default: Lowering(_avg_pool2d_backward, check=lambda node: _check_pool(node, 2)),
    aten.scatter.src: Lowering(_scatter),
    aten.scatter.value: Lowering(_scatter),
    aten.embedding_dense_backward.default: Lowering(_embedding_dense_backward, check=_check_embedding_dense_backward),
    aten.triu.default: Lowering(_triu),
}
