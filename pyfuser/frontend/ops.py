"""``fd.ops``: builds op nodes with shape inference and torch's type promotion.

Output dtypes come from running the torch reference on tiny tensors, so promotion matches torch
exactly; shapes are inferred symbolically so printing and scheduling see real extents. Operand
handling lives in ``ops_base.py``, pointwise ops in ``pointwise_ops.py``, reductions, matmul and
linear in ``reduction_ops.py``; this module adds data movement and creation. Every op is a method
of ``Ops``, so ``help(fd.ops)`` and type checkers see each signature.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pyfuser.frontend.attention_ops import AttentionOps
from pyfuser.frontend.indexing_ops import IndexingOps
from pyfuser.frontend.ops_base import Operand, OpsBase, SizeLike, clone_id, normalize_axis
from pyfuser.frontend.random_ops import RandomOps
from pyfuser.frontend.reduction_ops import ReductionOps
from pyfuser.frontend.scan_ops import ScanOps
from pyfuser.ir.base import Scalar
from pyfuser.ir.dtypes import DataType, as_data_type
from pyfuser.ir.iter_domain import IterDomain, IterType
from pyfuser.ir.layout import allocation_permutation, check_stride_order
from pyfuser.ir.ops import (
    BroadcastOp,
    CatOp,
    ExpandOp,
    FullOp,
    IotaOp,
    LoadStoreOp,
    LoadStoreOpType,
    PadOp,
    PermuteOp,
    ReshapeOp,
    SliceOp,
    SqueezeOp,
)
from pyfuser.ir.ops.promotion import result_dtype
from pyfuser.ir.symbolic import SymConst, SymExpr, ceil_div, product, sym_max, sym_min
from pyfuser.ir.tensor_view import TensorView


class Ops(IndexingOps, ScanOps, RandomOps, AttentionOps, ReductionOps):
    """The op namespace of one FusionDefinition (``fd.ops``)."""

    # --- data movement -----------------------------------------------------------------------
    def set(self, x: TensorView) -> TensorView:
        return self._copy(x, LoadStoreOpType.set)

    def segment_set(self, x: TensorView) -> TensorView:
        """A copy that forces a segment boundary."""
        return self._copy(x, LoadStoreOpType.segment_set)

    def stride_order(self, arg: TensorView, stride_order: Sequence[int]) -> TensorView:
        """A copy of ``arg`` laid out in ``stride_order`` (``stride_order[i]``: axis i's place from the
        innermost): a layout requirement, met when it is an output or a segment boundary."""
        tv = self._tv(arg, "stride_order")
        order = check_stride_order(stride_order, tv.ndim, f"stride_order {tv.short_name}")
        out = self._new_tv([self._id(i.extent, i.iter_type) for i in tv.get_logical_domain(no_reductions=True)],
                           tv.dtype)
        LoadStoreOp(self._fusion, out, tv, LoadStoreOpType.set, order)
        logical = out.get_logical_domain()
        out.set_allocation_domain([logical[d] for d in allocation_permutation(order)], True)
        return out

    def _copy(self, x: TensorView, kind: LoadStoreOpType) -> TensorView:
        tv = self._tv(x, kind.name)
        out = self._new_tv([self._id(i.extent, i.iter_type) for i in tv.get_logical_domain(no_reductions=True)],
                           tv.dtype)
        LoadStoreOp(self._fusion, out, tv, kind)
        return out

    def broadcast(self, x: TensorView, is_broadcast_dim: Sequence[bool]) -> TensorView:
        tv = self._tv(x, "broadcast")
        flags = [bool(f) for f in is_broadcast_dim]
        if sum(not f for f in flags) != tv.ndim:
            raise ValueError(f"broadcast: {tv.short_name} has rank {tv.ndim} but is_broadcast_dim {list(flags)} "
                             f"keeps {sum(not f for f in flags)} axes")
        in_ids = iter(tv.get_logical_domain(no_reductions=True))
        ids = [self._id(1, IterType.Broadcast) if f else clone_id(self, next(in_ids)) for f in flags]
        out = self._new_tv(ids, tv.dtype)
        BroadcastOp(self._fusion, out, tv, flags)
        return out

    def broadcast_in_dim(self, x: TensorView, shape: Sequence[SizeLike], broadcast_dims: Sequence[int]) -> TensorView:
        tv = self._tv(x, "broadcast_in_dim")
        rank = len(shape)
        dims = [normalize_axis(d, rank, tv, "broadcast_dims") for d in broadcast_dims]
        if len(dims) != tv.ndim:
            raise ValueError(f"broadcast_in_dim: {tv.short_name} has rank {tv.ndim} but broadcast_dims {list(broadcast_dims)} "
                             f"has {len(dims)} entries")
        if dims != sorted(set(dims)):
            raise ValueError(f"broadcast_in_dim: broadcast_dims {list(broadcast_dims)} must be strictly increasing")
        flags = [d not in dims for d in range(rank)]
        out = self.broadcast(tv, flags) if any(flags) else tv
        return self.expand(out, shape)

    def expand(self, x: TensorView, shape: Sequence[SizeLike]) -> TensorView:
        tv = self._tv(x, "expand")
        in_ids = tv.get_logical_domain(no_reductions=True)
        if len(shape) != len(in_ids):
            raise ValueError(f"expand: {tv.short_name} has rank {len(in_ids)} but the shape {list(shape)} has "
                             f"{len(shape)} entries")
        targets = [self._size(size, f"expand {tv.short_name} axis {d}", allow_minus_one=True)
                   for d, size in enumerate(shape)]
        ids = []
        #: non-broadcast axes given a size not provably their extent: compared at execution, as torch does
        size_checks: list[tuple[int, SymExpr]] = []
        for d, (i, target) in enumerate(zip(in_ids, targets, strict=True)):
            if target is None or (i.is_broadcast() and target.value == 1) or not i.is_broadcast():
                if target is not None and not i.is_broadcast() and target != i.extent:
                    if target.is_const and i.extent.is_const:
                        raise ValueError(f"expand: {tv.short_name} axis {d} has extent {i.extent} and is not a "
                                         f"broadcast axis; cannot expand it to {target}")
                    size_checks.append((d, target))
                    ids.append(self._id(target if target.is_const else i.extent))
                    continue
                ids.append(clone_id(self, i))
            else:
                ids.append(self._id(target))
        if not size_checks and all(a.extent == b.extent and a.iter_type == b.iter_type
                                   for a, b in zip(ids, in_ids, strict=True)):
            return tv
        out = self._new_tv(ids, tv.dtype)
        ExpandOp(self._fusion, out, tv, size_checks, targets)
        return out

    def squeeze(self, x: TensorView, dims: Sequence[int] | int, squeeze_expanded: bool = False) -> TensorView:
        """Drop size-1 axes. An expanded broadcast axis (an input declared with stride 0 and a size
        other than 1) is dropped only with ``squeeze_expanded=True``, which keeps its first slice."""
        tv = self._tv(x, "squeeze")
        rank = tv.ndim
        dims_list = [dims] if isinstance(dims, int) else list(dims)
        axes = {normalize_axis(d, rank, tv, "squeeze dims") for d in dims_list}
        in_ids = tv.get_logical_domain(no_reductions=True)
        for d in axes:
            if in_ids[d].expanded:
                if not squeeze_expanded:
                    raise ValueError(f"squeeze: {tv.short_name} axis {d} is an expanded broadcast (extent "
                                     f"{in_ids[d].extent}); refusing to squeeze it without squeeze_expanded=True")
                continue
            extent = in_ids[d].extent.value
            if extent is not None and extent != 1:
                raise ValueError(f"squeeze: {tv.short_name} axis {d} has extent {extent}; only size-1 axes can be squeezed")
        flags = [d in axes for d in range(rank)]
        out = self._new_tv([clone_id(self, i) for i, f in zip(in_ids, flags, strict=True) if not f], tv.dtype)
        SqueezeOp(self._fusion, out, tv, flags)
        return out

    def permute(self, x: TensorView, dims: Sequence[int]) -> TensorView:
        tv = self._tv(x, "permute")
        rank = tv.ndim
        perm = [normalize_axis(d, rank, tv, "permute dims") for d in dims]
        if sorted(perm) != list(range(rank)):
            raise ValueError(f"permute: dims {list(dims)} is not a permutation of {tv.short_name}'s {rank} axes")
        in_ids = tv.get_logical_domain(no_reductions=True)
        out = self._new_tv([clone_id(self, in_ids[d]) for d in perm], tv.dtype)
        PermuteOp(self._fusion, out, tv, perm)
        return out

    def reshape(self, x: TensorView, new_shape: Sequence[SizeLike]) -> TensorView:
        tv = self._tv(x, "reshape")
        in_extent = product([i.extent for i in tv.get_logical_domain(no_reductions=True)])
        extents: list[SymExpr | None] = []
        for d, size in enumerate(new_shape):
            extents.append(self._size(size, f"reshape {tv.short_name} new_shape[{d}]", allow_minus_one=True))
        given = list(extents)
        unknown = [d for d, e in enumerate(extents) if e is None]
        if len(unknown) > 1:
            raise ValueError(f"reshape: new_shape {list(new_shape)} for {tv.short_name} has more than one -1")
        if unknown:
            known = product([e for e in extents if e is not None])
            if known.value == 0:
                raise ValueError(f"reshape: new_shape {list(new_shape)} for {tv.short_name} has a -1 next to a size "
                                 "0: the -1 entry is ambiguous")
            extents[unknown[0]] = in_extent // known
        final = [e for e in extents if e is not None]
        total = product(final)
        if total.is_const and in_extent.is_const and total != in_extent:
            raise ValueError(f"reshape: cannot reshape {tv.short_name} of {in_extent} elements into {list(new_shape)} "
                             f"({total} elements)")
        ids = [self._id(1, IterType.Broadcast) if e.value == 1 else self._id(e) for e in final]
        out = self._new_tv(ids, tv.dtype)
        ReshapeOp(self._fusion, out, tv, given)
        return out

    def slice(self, x: TensorView, start_indices: Sequence[SizeLike], end_indices: Sequence[SizeLike],
              strides: Sequence[int] | None = None, manual_normalization: bool = False) -> TensorView:
        """Python slicing per axis (negative indices count from the end, out-of-range ones clamp).
        ``manual_normalization`` (nvFuser: the indices are already in ``[0, extent]``) changes
        nothing here: normalizing such indices leaves them as they are."""
        tv = self._tv(x, "slice")
        in_ids = tv.get_logical_domain(no_reductions=True)
        rank = len(in_ids)
        steps = list(strides) if strides is not None else [1] * rank
        for name, seq in (("start_indices", start_indices), ("end_indices", end_indices), ("strides", steps)):
            if len(seq) != rank:
                raise ValueError(f"slice: {tv.short_name} has rank {rank} but {name} has {len(seq)} entries")
        ranges: list[tuple[SymExpr, SymExpr, int]] = []
        given: list[tuple[SymExpr, SymExpr, int]] = []
        for d, (i, start, stop, step) in enumerate(zip(in_ids, start_indices, end_indices, steps, strict=True)):
            if isinstance(step, bool) or not isinstance(step, int) or step <= 0:
                raise ValueError(f"slice: {tv.short_name} axis {d}: stride must be a positive int, got {step!r}")
            first = self._size(start, f"slice {tv.short_name} axis {d} start", allow_negative=True)
            last = self._size(stop, f"slice {tv.short_name} axis {d} end", allow_negative=True)
            given.append((first, last, step))
            lo = _normalize_index(first, i.extent)
            hi = _normalize_index(last, i.extent)
            ranges.append((lo, hi if lo.value == 0 else sym_max(lo, hi), step))
        resized: dict[int, SymExpr] = {}
        for d, (i, (lo, hi, step)) in enumerate(zip(in_ids, ranges, strict=True)):
            extent = ceil_div(hi - lo, step)
            if extent != i.extent:
                resized[d] = extent
        out = self._new_tv(_resized_ids(self, in_ids, resized), tv.dtype)
        SliceOp(self._fusion, out, tv, ranges, given)
        return out

    def cat(self, tensors: Sequence[TensorView], dim: int = 0, manual_padding: bool = False) -> TensorView:
        """Concatenate along ``dim``. ``manual_padding=True`` (nvFuser's translation of its own cat):
        every input is already ``pad``-ded to the result's extent at its place along ``dim``."""
        tvs = [self._tv(t, f"cat input {k}") for k, t in enumerate(tensors)]
        if not tvs:
            raise ValueError("cat: needs at least one tensor")
        if manual_padding:
            tvs = _unpadded_cat_inputs(tvs, normalize_axis(dim, tvs[0].ndim, tvs[0], "cat dim"))
        rank = tvs[0].ndim
        for tv in tvs:
            if tv.ndim != rank:
                raise ValueError(f"cat: {tv.short_name} has rank {tv.ndim} but {tvs[0].short_name} has rank {rank}")
        axis = normalize_axis(dim, rank, tvs[0], "cat dim")
        dtype = result_dtype(lambda *xs: torch.cat(xs), tvs)
        domains = [tv.get_logical_domain(no_reductions=True) for tv in tvs]
        ids = []
        for d in range(rank):
            if d == axis:
                ids.append(self._id(_sum([dom[d].extent for dom in domains])))
                continue
            ref = domains[0][d]
            for tv, dom in zip(tvs[1:], domains[1:], strict=True):
                e = dom[d].extent
                if e.is_const and ref.extent.is_const and e != ref.extent:
                    raise ValueError(f"cat: {tv.short_name} axis {d} has extent {e} but {tvs[0].short_name} axis {d} "
                                     f"has extent {ref.extent}; only the cat axis may differ")
            ids.append(clone_id(self, ref))
        out = self._new_tv(ids, dtype)
        CatOp(self._fusion, out, [self.cast(t, dtype) if t.dtype != dtype else t for t in tvs], axis)
        return out

    def pad(self, x: TensorView, pad_widths: Sequence[SizeLike], value: Operand | None = None) -> TensorView:
        tv = self._tv(x, "pad")
        rank = tv.ndim
        # Negative widths crop, as in torch's constant ``F.pad``.
        widths = [self._size(w, f"pad {tv.short_name} pad_widths[{k}]", allow_negative=True,
                             negative_input_ok=True)
                  for k, w in enumerate(pad_widths)]
        if len(widths) % 2 or len(widths) > 2 * rank:
            raise ValueError(f"pad: pad_widths {list(pad_widths)} must have an even number of entries, at most "
                             f"{2 * rank} for {tv.short_name} of rank {rank}")
        in_ids = tv.get_logical_domain(no_reductions=True)
        padded: dict[int, SymExpr] = {}
        for k in range(0, len(widths), 2):
            d = rank - 1 - k // 2
            left, right = widths[k], widths[k + 1]
            if left.value == 0 and right.value == 0:
                continue
            extent = in_ids[d].extent + left + right
            cropped = in_ids[d].extent + sym_min(left, 0) + sym_min(right, 0)
            if cropped.value is not None and cropped.value < 0:  # torch crops before it pads
                raise ValueError(f"pad: {tv.short_name} axis {d} has extent {in_ids[d].extent}; pad widths "
                                 f"{left}, {right} would crop {-cropped.value} elements more than it has")
            padded[d] = extent
        fill = self._val(0 if value is None else value, "pad value")
        out = self._new_tv(_resized_ids(self, in_ids, padded), tv.dtype)
        PadOp(self._fusion, out, tv, widths, fill)
        return out

    # --- sizes ---------------------------------------------------------------------------------
    def size(self, arg: TensorView, dim: int) -> Scalar:
        """The extent of ``arg``'s logical axis ``dim`` as an integer scalar: a size other ops take
        (reshape to a computed shape, pad widths, slice bounds), or a value."""
        return self._tv(arg, "size").size(dim)

    def shape(self, arg: TensorView) -> list[Scalar]:
        """Every logical extent of ``arg`` as an integer scalar."""
        return self._tv(arg, "shape").shape()

    # --- creation ------------------------------------------------------------------------------
    def full(self, shape: Sequence[SizeLike], fill_value: Operand, dtype: DataType | torch.dtype) -> TensorView:
        dt = as_data_type(dtype)
        extents = self._shape(shape, "full shape")
        fill = self._val(fill_value, "full fill_value")
        if isinstance(fill, TensorView):
            raise TypeError(f"full: fill_value must be a number or a scalar, got tensor {fill.short_name}")
        if isinstance(fill, Scalar) and fill.is_const and fill.value is not None:
            try:  # a constant torch cannot store (1e5 as half, a complex as float) fails now, not at execution
                torch.full((1,), fill.value, dtype=dt.torch_dtype)
            except RuntimeError as e:
                raise ValueError(f"full: fill_value {fill_value!r} cannot be stored as {dt}: {e}") from None
        ids = [self._id(1, IterType.Broadcast) if e.value == 1 else self._id(e) for e in extents]
        out = self._new_tv(ids, dt)
        FullOp(self._fusion, out, fill)
        return out

    def iota(self, length: SizeLike, start: Operand | None = None, step: Operand | None = None,
             dtype: DataType | torch.dtype = DataType.Int) -> TensorView:
        dt = as_data_type(dtype)
        if dt is DataType.Bool or not (dt.is_integral or dt.is_floating):
            raise TypeError(f"iota: dtype must be an integer or floating-point type, got {dt}")
        extent = self._size(length, "iota length")
        default_start, default_step = (0, 1) if dt.is_integral else (0.0, 1.0)
        if isinstance(length, SymExpr) and extent.value is None:
            raise ValueError(f"iota: length {length} is a symbolic extent; pass an int or an integer scalar "
                             "(fd.ops.size) instead")
        length_val = self._val(extent.value if isinstance(length, SymExpr) else length, "iota length")
        out = self._new_tv([self._id(extent)], dt)
        IotaOp(self._fusion, out, length_val, self._val(default_start if start is None else start, "iota start"),
               self._val(default_step if step is None else step, "iota step"))
        return out


# --- helpers -------------------------------------------------------------------------------------
def _resized_ids(ops: OpsBase, in_ids: Sequence[IterDomain], resized: dict[int, SymExpr]) -> list[IterDomain]:
    """The axes of a slice's or pad's output (``resized``: the new extent of each resized axis). A
    resized axis of the constant extent 1 is a broadcast, as nvFuser's resize makes it, so it
    broadcasts against other operands and reducing it is a squeeze; unless no axis would be left to
    iterate (a result of one element, which a kernel iterating nothing wrote wrong where the sliced
    axes came from a reshape: fuzz seed 5500)."""
    ones = {d for d, extent in resized.items() if extent.value == 1}
    if ones and all(d in ones or i.is_broadcast() for d, i in enumerate(in_ids)):
        ones = set()
    return [ops._id(1, IterType.Broadcast) if d in ones else ops._id(resized[d]) if d in resized
            else clone_id(ops, i) for d, i in enumerate(in_ids)]


def _sum(extents: list[SymExpr]) -> SymExpr:
    total: SymExpr = SymConst(0)
    for e in extents:
        total = total + e
    return total


def _normalize_index(index: SymExpr | None, extent: SymExpr) -> SymExpr:
    """Python slicing rules for constant indices: negative counts from the end, out-of-range clamps.

    The result is never negative (extents are not), which lets a slice from 0 skip a ``max``.
    A symbolic index (an integer scalar input) must be non-negative at run time.
    """
    if index is None:
        raise ValueError("slice indices must be ints or integer scalars, not -1 placeholders")
    value = index.value
    if value == 0:
        return index
    if value is not None and value < 0:
        return sym_max(extent + value, 0)
    return sym_min(index, extent)


def _unpadded_cat_inputs(tvs: list[TensorView], axis: int) -> list[TensorView]:
    """The tensors padded into place for a manually padded cat: each input must be a ``pad`` along
    ``axis`` only, whose left width is the extent of the pieces before it (nvFuser's CatOp of padded
    inputs then reads each piece in its own range, which is the cat of the pieces)."""
    pieces: list[TensorView] = []
    offset: SymExpr = SymConst(0)
    for k, tv in enumerate(tvs):
        pad = tv.definition
        if not isinstance(pad, PadOp):
            raise ValueError(f"cat: manual_padding=True expects every input to be a pad; input {k} ({tv.short_name}) "
                             f"is defined by {type(pad).__name__ if pad is not None else 'nothing (an input)'}")
        piece = pad.tensor_input(0)
        for d in range(tv.ndim):
            left, right = pad.axis_widths(d)
            if d != axis and (left.value, right.value) != (0, 0):
                raise ValueError(f"cat: manual_padding=True: {tv.short_name} is padded on axis {d}, not only on the "
                                 f"cat axis {axis}")
        left, right = pad.axis_widths(axis)
        if (left - offset).value != 0:
            raise ValueError(f"cat: manual_padding=True: {tv.short_name} is padded by {left} before it on axis {axis}; "
                             f"the pieces before it span {offset}")
        offset = offset + piece.get_logical_domain(no_reductions=True)[axis].extent
        pieces.append(piece)
        if k == len(tvs) - 1 and right.value != 0:
            raise ValueError(f"cat: manual_padding=True: the last input {tv.short_name} is padded by {right} "
                             f"after it on axis {axis}; the pieces must fill the result")
    return pieces

