"""Shape and layout ATen ops (views, slicing, concatenation, padding) onto ``fd.ops``.

Inside a region layouts are pyfuser's to choose, so ``clone`` / ``alias`` / ``detach`` are the
identity; the strides the traced graph promises are met where a value leaves the region (the
translator requires them of each output).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.fx import Node

from pyfuser.integrations.torch_compile.lowering import Lowering, LoweringContext, OpClass, arg, list_arg, meta_of
from pyfuser.ir.ops import BroadcastOp, ReshapeOp

aten = torch.ops.aten


def _rank(node: Node, position: int = 0) -> int:
    return meta_of(node.args[position]).dim()


def _normalize(dim: int, rank: int) -> int:
    return dim % rank if rank else 0


def _identity(ctx: LoweringContext, x: Any, *args: Any, **kwargs: Any) -> Any:
    return x


def _check_clone(node: Node) -> str | None:
    fmt = node.kwargs.get("memory_format")
    if fmt not in (None, torch.preserve_format, torch.contiguous_format):
        return f"clone(memory_format={fmt}) is not translated"
    return None


def static_sizes(tv: Any) -> list[int] | None:
    """A pyfuser tensor's sizes when all are constant (None when one is symbolic)."""
    sizes = [i.extent.value for i in tv.get_logical_domain(no_reductions=True)]
    known = [s for s in sizes if s is not None]
    return known if len(known) == len(sizes) else None


def _reshape(ctx: LoweringContext, x: Any, size: Any) -> Any:
    """A reshape back to the shape its operand was reshaped from is that tensor, and a reshape to
    the operand's own shape is the operand (AOTAutograd's ``view -> mm -> _unsafe_view`` of a
    linear, once the matmul reads the N-D input: see ``tensor_lowerings._mm``)."""
    target = list(size)
    if all(isinstance(s, int) and s >= 0 for s in target):
        if static_sizes(x) == target:
            return x
        source = x.definition.inputs[0] if isinstance(x.definition, ReshapeOp | BroadcastOp) else None
        if source is not None and static_sizes(source) == target:
            return source
    unit = _unit_axes(ctx, x)
    return unit if unit is not None else ctx.ops.reshape(x, target)


def _same_size(a: Any, b: Any) -> bool:
    """Whether two traced sizes are the same size (a symbolic one: the same expression, with no guard)."""
    if isinstance(a, int) or isinstance(b, int):
        return isinstance(a, int) and isinstance(b, int) and a == b
    return bool(a.node.expr == b.node.expr)


def _unit_axes(ctx: LoweringContext, x: Any) -> Any:
    """A reshape that only drops and inserts size-1 axes (``view(w, [1, -1, 1, 1])`` of a per-channel
    vector; GroupNorm's statistics view ``[N, C, 1, L]`` back to ``[N, C, L]``) as a squeeze and a
    broadcast, which kernels compute: the segmenter fuses them into the kernel that reads the result (a
    per-channel scale recomputed per element there; a normalization's output read by the pointwise ops
    after it), where a reshape would end the kernel computing its operand and start another. None for
    any other reshape."""
    source, target = meta_of(ctx.node.args[0]).shape, ctx.meta.shape
    dropped: list[bool] = []
    inserted: list[bool] = []
    s = t = 0
    while s < len(source) or t < len(target):
        if s < len(source) and t < len(target) and _same_size(source[s], target[t]):
            dropped.append(False)
            inserted.append(False)
            s, t = s + 1, t + 1
        elif s < len(source) and isinstance(source[s], int) and source[s] == 1:
            dropped.append(True)
            s += 1
        elif t < len(target) and isinstance(target[t], int) and target[t] == 1:
            inserted.append(True)
            t += 1
        else:
            return None
    if not any(dropped) and not any(inserted):
        return None
    if any(dropped):
        x = ctx.ops.squeeze(x, [d for d, drop in enumerate(dropped) if drop])
    return ctx.ops.broadcast(x, inserted) if any(inserted) else x


def _expand(ctx: LoweringContext, x: Any, size: Any, implicit: bool = False) -> Any:
    sizes = list(size)
    new = len(sizes) - x.ndim
    if new > 0:  # torch's expand adds leading axes
        x = ctx.ops.broadcast(x, [True] * new + [False] * x.ndim)
    return ctx.ops.expand(x, sizes)


def _copy(ctx: LoweringContext, dst: Any, src: Any, non_blocking: bool = False) -> Any:
    """The functional ``copy(dst, src)`` (what AOTAutograd makes of ``dst.copy_(src)`` and of a slice
    assignment ``x[..., a:b] = y``): ``src`` expanded to ``dst``'s shape in ``dst``'s dtype; ``dst``'s values
    are not read."""
    return _in_dtype(ctx, _expand(ctx, src, ctx.ops.shape(dst)))


def _fill_tensor(ctx: LoweringContext, x: Any, value: Any) -> Any:
    """``fill(x, value)``: ``x``'s shape, every element the 0-dim ``value`` in ``x``'s dtype."""
    return _in_dtype(ctx, _expand(ctx, value, ctx.ops.shape(x)))


def _in_dtype(ctx: LoweringContext, value: Any) -> Any:
    """``value`` in the node's traced dtype."""
    return value if value.dtype.torch_dtype == ctx.meta.dtype else ctx.ops.cast(value, ctx.meta.dtype)


def _repeat(ctx: LoweringContext, x: Any, repeats: Any) -> Any:
    """``x.repeat(repeats)``: new leading axes broadcast, a new axis broadcast before each repeated one,
    both expanded to their count, then a reshape merging each count with the axis it repeats (the copy
    eager's repeat writes, now inside the region: a repeat between two regions no longer splits them)."""
    counts = [int(r) for r in repeats]
    sizes = [int(s) for s in meta_of(ctx.node.args[0]).shape]
    lead = len(counts) - len(sizes)
    if lead:
        x = ctx.ops.broadcast(x, [True] * lead + [False] * len(sizes))
    sizes = [1] * lead + sizes
    flags: list[bool] = []
    expanded: list[int] = []
    for k, (count, size) in enumerate(zip(counts, sizes, strict=True)):
        if count == 1 or k < lead:  # a new leading axis is a broadcast already: expanded to the count
            flags.append(False)
            expanded.append(count * size)
        else:
            flags += [True, False]
            expanded += [count, size]
    if any(flags):
        x = ctx.ops.broadcast(x, flags)
    x = ctx.ops.expand(x, expanded)
    target = [c * s for c, s in zip(counts, sizes, strict=True)]
    return x if expanded == target else ctx.ops.reshape(x, target)


def _check_repeat(node: Node) -> str | None:
    repeats, shape = arg(node, 1, "repeats"), meta_of(node.args[0]).shape
    if not all(isinstance(v, int) for v in (*repeats, *shape)):
        return "repeat of symbolic sizes or counts"
    return None


def _permute(ctx: LoweringContext, x: Any, dims: Any) -> Any:
    return ctx.ops.permute(x, list(dims))


def _transpose(ctx: LoweringContext, x: Any, dim0: int, dim1: int) -> Any:
    rank = x.ndim
    if rank < 2:
        return x
    perm = list(range(rank))
    a, b = _normalize(dim0, rank), _normalize(dim1, rank)
    perm[a], perm[b] = perm[b], perm[a]
    return x if a == b else ctx.ops.permute(x, perm)


def _t(ctx: LoweringContext, x: Any) -> Any:
    return _transpose(ctx, x, 0, 1)


def _unsqueeze(ctx: LoweringContext, x: Any, dim: int) -> Any:
    rank = x.ndim + 1
    axis = _normalize(dim, rank)
    return ctx.ops.broadcast(x, [d == axis for d in range(rank)])


def _squeeze(ctx: LoweringContext, x: Any, dims: Any = None) -> Any:
    """torch's squeeze leaves axes whose size is not 1 alone; the traced sizes say which are 1 (a
    symbolic size never is: dynamo specializes sizes 0 and 1)."""
    shape = meta_of(ctx.node.args[0]).shape
    rank = len(shape)
    wanted: Sequence[int]
    if dims is None:
        wanted = range(rank)
    else:
        wanted = [_normalize(d, rank) for d in ([dims] if isinstance(dims, int) else dims)]
    ones = sorted({d for d in wanted if isinstance(shape[d], int) and shape[d] == 1})
    return ctx.ops.squeeze(x, ones) if ones else x


def _full_ranges(ctx: LoweringContext, x: Any) -> tuple[list[Any], list[Any], list[int]]:
    rank = x.ndim
    return [0] * rank, [ctx.ops.size(x, d) for d in range(rank)], [1] * rank


def _along(ctx: LoweringContext, x: Any, axis: int, start: Any, end: Any) -> Any:
    """``x``'s elements ``[start, end)`` along ``axis``, all of the other axes."""
    starts, ends, steps = _full_ranges(ctx, x)
    starts[axis], ends[axis] = start, end
    return ctx.ops.slice(x, starts, ends, steps)


def _slice(ctx: LoweringContext, x: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
    starts, ends, steps = _full_ranges(ctx, x)
    axis = _normalize(dim, x.ndim)
    if start is not None:
        starts[axis] = start
    if end is not None:
        ends[axis] = end
    steps[axis] = step
    return ctx.ops.slice(x, starts, ends, steps)


def _check_slice(node: Node) -> str | None:
    step = arg(node, 4, "step", 1)
    if not isinstance(step, int) or step < 1:
        return f"slice step {step!r} is not a positive constant"
    return None


def _select(ctx: LoweringContext, x: Any, dim: int, index: Any) -> Any:
    return ctx.ops.select(x, index, dim)


def _is_legacy_empty(meta: torch.Tensor, rank: int) -> bool:
    """torch's cat skips 1-D operands of size 0 next to tensors of another rank (an empty cache)."""
    return meta.dim() == 1 and meta.dim() != rank and isinstance(meta.shape[0], int) and meta.shape[0] == 0


def _cat(ctx: LoweringContext, tensors: Any, dim: int = 0) -> Any:
    rank = ctx.meta.dim()
    kept = [t for t, a in zip(tensors, list_arg(ctx.node, 0), strict=True) if not _is_legacy_empty(meta_of(a), rank)]
    return ctx.ops.cat(kept, dim) if len(kept) > 1 else ctx.ops.set(kept[0])


def _check_cat(node: Node) -> str | None:
    rank = meta_of(node).dim()
    metas = [meta_of(t) for t in list_arg(node, 0)]
    kept = [m for m in metas if not _is_legacy_empty(m, rank)]
    if not kept or any(m.dim() != rank for m in kept):
        return "cat of tensors of different ranks"
    return None


def _stack(ctx: LoweringContext, tensors: Any, dim: int = 0) -> Any:
    """``torch.stack``: a cat of the operands, each with the new axis inserted (GPT-J's rotary
    ``stack((-x2, x1), -1).flatten(-2)``: one kernel interleaving the halves)."""
    axis = _normalize(dim, ctx.meta.dim())
    pieces = [_unsqueeze(ctx, t, axis) for t in tensors]
    return ctx.ops.cat(pieces, axis) if len(pieces) > 1 else ctx.ops.set(pieces[0])


def _roll(ctx: LoweringContext, x: Any, shifts: Sequence[int], dims: Sequence[int] = ()) -> Any:
    """``torch.roll`` along given axes: per axis, its last ``shift`` elements, then the others -- a ``cat``
    of two slices, which the kernel computing the result reads through (Inductor indexes a roll inside its
    kernels too; Swin's shifted windows roll every block's activations)."""
    shape = meta_of(ctx.node.args[0]).shape
    for shift, dim in zip(shifts, dims, strict=True):
        axis = _normalize(dim, x.ndim)
        extent = shape[axis]
        cut = extent - shift % extent
        if cut == extent:
            continue
        x = ctx.ops.cat([_along(ctx, x, axis, cut, extent), _along(ctx, x, axis, 0, cut)], axis)
    return ctx.ops.set(x)


def _check_roll(node: Node) -> str | None:
    shifts, dims = list_arg(node, 1), arg(node, 2, "dims", [])
    shape = meta_of(node.args[0]).shape
    if not dims or len(dims) != len(shifts):
        return "roll of the flattened tensor (no dims)"
    if not all(isinstance(v, int) for v in (*shifts, *dims)):
        return "roll by shifts that are not constants"
    if not all(isinstance(shape[d], int) and shape[d] > 0 for d in dims):
        return "roll of an axis of symbolic or zero extent"
    return None


def _split_sizes(ctx: LoweringContext) -> list[int]:
    return [t.shape[_normalize(arg(ctx.node, 2, "dim", 0), t.dim())] for t in ctx.meta]


def _split_by(ctx: LoweringContext, x: Any, sizes: list[Any], dim: int) -> list[Any]:
    axis = _normalize(dim, x.ndim)
    pieces, offset = [], 0
    for size in sizes:
        pieces.append(_along(ctx, x, axis, offset, offset + size))
        offset += size
    return pieces


def _split(ctx: LoweringContext, x: Any, split_size: Any, dim: int = 0) -> list[Any]:
    return _split_by(ctx, x, _split_sizes(ctx), dim)


def _split_with_sizes(ctx: LoweringContext, x: Any, split_sizes: Any, dim: int = 0) -> list[Any]:
    return _split_by(ctx, x, _split_sizes(ctx), dim)


def _check_static_pieces(node: Node) -> str | None:
    """Each piece's extent along the split axis must be known when the region is translated."""
    dim = arg(node, 2, "dim", 0)
    pieces = meta_of(node)
    if not all(isinstance(t.shape[_normalize(dim, t.dim())], int) for t in pieces):
        return "split of a symbolic size"
    return None


def _unbind(ctx: LoweringContext, x: Any, dim: int = 0) -> list[Any]:
    axis = _normalize(dim, x.ndim)
    return [ctx.ops.select(x, k, axis) for k in range(len(ctx.meta))]


def _check_unbind(node: Node) -> str | None:
    shape = meta_of(node.args[0]).shape
    dim = _normalize(arg(node, 1, "dim", 0), len(shape))
    return None if isinstance(shape[dim], int) else "unbind of a symbolic size"


def _pad(ctx: LoweringContext, x: Any, pad: Any, value: Any = 0) -> Any:
    return ctx.ops.pad(x, list(pad), value)


def _slice_backward(ctx: LoweringContext, grad: Any, input_sizes: Any, dim: int, start: int, end: int,
                    step: int) -> Any:
    """The gradient of a slice: ``grad`` padded with zeros back to the input's extent."""
    rank = grad.ndim
    axis = _normalize(dim, rank)
    extent = input_sizes[axis]
    lo, hi = slice(start, end).indices(extent)[:2]
    widths = [0] * (2 * rank)
    widths[2 * (rank - 1 - axis)] = lo
    widths[2 * (rank - 1 - axis) + 1] = extent - max(lo, hi)
    return ctx.ops.pad(grad, widths, 0)


def _check_slice_backward(node: Node) -> str | None:
    sizes, dim, start, end, step = (arg(node, k, n) for k, n in ((1, "input_sizes"), (2, "dim"), (3, "start"),
                                                                  (4, "end"), (5, "step")))
    if step != 1:
        return f"slice_backward with step {step!r}"
    axis = _normalize(dim, len(sizes))
    if not all(isinstance(v, int) for v in (sizes[axis], start, end)):
        return "slice_backward of a symbolic size or bound"
    return None


def _select_backward(ctx: LoweringContext, grad: Any, input_sizes: Any, dim: int, index: int) -> Any:
    rank = len(input_sizes)
    axis = _normalize(dim, rank)
    at = index % input_sizes[axis]
    widths = [0] * (2 * rank)
    widths[2 * (rank - 1 - axis)] = at
    widths[2 * (rank - 1 - axis) + 1] = input_sizes[axis] - at - 1
    return ctx.ops.pad(_unsqueeze(ctx, grad, axis), widths, 0)


def _check_select_backward(node: Node) -> str | None:
    sizes, dim, index = (arg(node, k, n) for k, n in ((1, "input_sizes"), (2, "dim"), (3, "index")))
    axis = _normalize(dim, len(sizes))
    if not all(isinstance(v, int) for v in (sizes[axis], index)):
        return "select_backward of a symbolic size or index"
    return None


def _scattered_bounds(node: Node, axis_arg: int, start: Any, end: Any) -> tuple[int, int, int]:
    """``(axis, lo, hi)``: the range a slice or select scatter writes, its bounds clamped as torch does."""
    shape = meta_of(node.args[0]).shape
    axis = _normalize(arg(node, axis_arg, "dim", 0), len(shape))
    lo, hi = slice(start, end).indices(int(shape[axis]))[:2]
    return axis, lo, max(lo, hi)


def _write_range(ctx: LoweringContext, base: Any, part: Any, axis: int, lo: int, hi: int) -> Any:
    """``base`` with ``[lo, hi)`` along ``axis`` replaced by ``part``: a cat of the base's slice before, the part
    and the base's slice after (each kernel computing the result reads through it, as through a roll)."""
    extent = int(meta_of(ctx.node.args[0]).shape[axis])
    before = _along(ctx, base, axis, 0, lo) if lo > 0 else None
    after = _along(ctx, base, axis, hi, extent) if hi < extent else None
    kept = [p for p in (before, part, after) if p is not None]
    return ctx.ops.cat(kept, axis) if len(kept) > 1 else ctx.ops.set(kept[0])


def _slice_scatter(ctx: LoweringContext, base: Any, src: Any, dim: int = 0, start: Any = None, end: Any = None,
                   step: int = 1) -> Any:
    """``base`` with ``src`` written into ``base[..., start:end]`` (a functionalized slice assignment:
    Funnel's relative shift, a cache update)."""
    axis, lo, hi = _scattered_bounds(ctx.node, 2, start, end)
    return _write_range(ctx, base, src, axis, lo, hi)


def _check_slice_scatter(node: Node) -> str | None:
    shape = meta_of(node.args[0]).shape
    dim, start, end, step = (arg(node, k, n, d) for k, n, d in ((2, "dim", 0), (3, "start", None), (4, "end", None),
                                                                (5, "step", 1)))
    if step != 1:
        return f"slice_scatter with step {step!r}"
    if not isinstance(shape[_normalize(dim, len(shape))], int) or not all(
            v is None or isinstance(v, int) for v in (start, end)):
        return "slice_scatter of a symbolic size or bound"
    return None


def _select_scatter(ctx: LoweringContext, base: Any, src: Any, dim: int, index: int) -> Any:
    """``base`` with ``src`` written into ``base.select(dim, index)``."""
    shape = meta_of(ctx.node.args[0]).shape
    axis = _normalize(dim, len(shape))
    at = index % int(shape[axis])
    return _write_range(ctx, base, _unsqueeze(ctx, src, axis), axis, at, at + 1)


def _check_select_scatter(node: Node) -> str | None:
    shape = meta_of(node.args[0]).shape
    dim, index = arg(node, 2, "dim"), arg(node, 3, "index")
    if not isinstance(shape[_normalize(dim, len(shape))], int) or not isinstance(index, int):
        return "select_scatter of a symbolic size or index"
    return None


VIEW = OpClass.view
VIEW = OpClass.view

SHAPE_LOWERINGS: dict[Any, Lowering] = {
    aten.alias.default: Lowering(_identity, VIEW),
    aten.detach.default: Lowering(_identity, VIEW),
    aten.clone.default: Lowering(_identity, OpClass.copy, check=_check_clone),
    aten.view.default: Lowering(_reshape, VIEW),
    aten._unsafe_view.default: Lowering(_reshape, VIEW),
    aten.expand.default: Lowering(_expand, VIEW),
    aten.repeat.default: Lowering(_repeat, OpClass.copy, check=_check_repeat),
    aten.permute.default: Lowering(_permute, VIEW),
    aten.transpose.int: Lowering(_transpose, VIEW),
    aten.t.default: Lowering(_t, VIEW),
    aten.unsqueeze.default: Lowering(_unsqueeze, VIEW),
    aten.squeeze.default: Lowering(_squeeze, VIEW),
    aten.squeeze.dim: Lowering(_squeeze, VIEW),
    aten.squeeze.dims: Lowering(_squeeze, VIEW),
    aten.slice.Tensor: Lowering(_slice, VIEW, check=_check_slice),
    aten.select.int: Lowering(_select, VIEW),
    aten.split.Tensor: Lowering(_split, VIEW, check=_check_static_pieces),
    aten.split_with_sizes.default: Lowering(_split_with_sizes, VIEW, check=_check_static_pieces),
    aten.unbind.int: Lowering(_unbind, VIEW, check=_check_unbind),
    aten.cat.default: Lowering(_cat, check=_check_cat),
    aten.stack.default: Lowering(_stack),
    aten.roll.default: Lowering(_roll, OpClass.copy, check=_check_roll),
    aten.constant_pad_nd.default: Lowering(_pad),
    aten.slice_backward.default: Lowering(_slice_backward, check=_check_slice_backward),
    aten.select_backward.default: Lowering(_select_backward, check=_check_select_backward),
    aten.copy.default: Lowering(_copy),  # (operands on several devices: refused by support.py)
    aten.fill.Tensor: Lowering(_fill_tensor),
    aten.slice_scatter.default: Lowering(_slice_scatter, check=_check_slice_scatter),
    aten.select_scatter.default: Lowering(_select_scatter, check=_check_select_scatter),
}
