"""Scans, sorting and searches of ``fd.ops``: cumsum / cumprod / cummin / cummax, topk, argsort,
argmax / argmin, and triu (nvFuser's argument names, torch's dtypes)."""

from __future__ import annotations

import torch

from pyfuser.frontend.ops_base import Operand, OpsBase, SizeLike, clone_id, normalize_axis
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.iter_domain import IterType
from pyfuser.ir.ops.promotion import result_dtype
from pyfuser.ir.ops.scan import ArgReductionOp, ArgsortOp, ScanOp, ScanOpType, TopKOp, TriuOp
from pyfuser.ir.tensor_view import TensorView


class ScanOps(OpsBase):
    def _scan(self, kind: ScanOpType, arg: TensorView, dim: int, dtype: DataType | None = None) -> TensorView:
        tv = self._tv(arg, kind.name)
        if tv.ndim == 0:
            raise ValueError(f"{kind.name}: {tv.short_name} is 0-dim; a scan needs an axis")
        axis = normalize_axis(dim, tv.ndim, tv, f"{kind.name} dim")
        if dtype is not None and not isinstance(dtype, DataType):
            raise TypeError(f"{kind.name}: dtype must be a DataType (or None), got {dtype!r}")
        result = dtype if dtype is not None else result_dtype(lambda t: kind(t, 0), [tv])
        out = self._new_tv([clone_id(self, i) for i in tv.get_logical_domain(no_reductions=True)], result)
        ScanOp(self._fusion, kind, out, tv, axis, dtype)
        return out

    def cumsum(self, arg: TensorView, dim: int, dtype: DataType | None = None) -> TensorView:
        """Inclusive prefix sums along ``dim``: integers accumulate in int64, as torch's, unless ``dtype``
        (torch's ``dtype=``: the operand cast to it, the sums in it) says otherwise."""
        return self._scan(ScanOpType.cumsum, arg, dim, dtype)

    def cumprod(self, arg: TensorView, dim: int, dtype: DataType | None = None) -> TensorView:
        """Inclusive prefix products along ``dim`` (``dtype`` as ``cumsum``'s)."""
        return self._scan(ScanOpType.cumprod, arg, dim, dtype)

    def cummin(self, arg: TensorView, dim: int) -> TensorView:
        """The running minimum along ``dim`` (values only)."""
        return self._scan(ScanOpType.cummin, arg, dim)

    def cummax(self, arg: TensorView, dim: int) -> TensorView:
        """The running maximum along ``dim`` (values only)."""
        return self._scan(ScanOpType.cummax, arg, dim)

    def topk(self, arg: TensorView, k: SizeLike, dim: int = -1, largest: bool = True,
             sorted: bool = False) -> tuple[TensorView, TensorView]:
        """``(values, indices)`` of the ``k`` largest (or smallest) elements along ``dim``; ``k`` is an
        int or an integer scalar (checked against the axis when the op runs)."""
        tv = self._tv(arg, "topk")
        if tv.ndim == 0:
            raise ValueError(f"topk: {tv.short_name} is 0-dim; topk needs an axis")
        axis = normalize_axis(dim, tv.ndim, tv, "topk dim")
        count = self._size(k, f"topk {tv.short_name} k")
        extent = tv.get_logical_domain(no_reductions=True)[axis].extent
        if count.value is not None and extent.value is not None and count.value > extent.value:
            raise ValueError(f"topk: k = {count} is larger than {tv.short_name} axis {axis}'s extent {extent}")
        result_dtype(lambda t: torch.topk(t, 1, 0).values, [tv])  # rejects what torch cannot order (complex)
        ids = [clone_id(self, i) for i in tv.get_logical_domain(no_reductions=True)]
        ids[axis] = self._id(count, IterType.Broadcast if count.value == 1 else IterType.Iteration)
        values = self._new_tv(ids, tv.dtype)
        indices = self._new_tv([clone_id(self, i) for i in ids], DataType.Int)
        TopKOp(self._fusion, values, indices, tv, count, axis, bool(largest), bool(sorted))
        return values, indices

    def argsort(self, arg: TensorView, dim: int, descending: bool = False, stable: bool = False) -> TensorView:
        """The indices that sort ``arg`` along ``dim``."""
        tv = self._tv(arg, "argsort")
        if tv.ndim == 0:
            raise ValueError(f"argsort: {tv.short_name} is 0-dim; argsort needs an axis")
        axis = normalize_axis(dim, tv.ndim, tv, "argsort dim")
        result_dtype(lambda t: torch.argsort(t, dim=0), [tv])
        out = self._new_tv([clone_id(self, i) for i in tv.get_logical_domain(no_reductions=True)], DataType.Int)
        ArgsortOp(self._fusion, out, tv, axis, bool(descending), bool(stable))
        return out

    def _arg_reduction(self, largest: bool, arg: TensorView, dim: int | None, keepdim: bool) -> TensorView:
        op = "argmax" if largest else "argmin"
        tv = self._tv(arg, op)
        axis = None if dim is None else normalize_axis(dim, tv.ndim, tv, f"{op} dim")
        result_dtype(lambda t: torch.argmax(t), [tv])  # rejects what torch cannot compare (complex)
        ids = [self._id(i.extent, IterType.Reduction) if axis is None or d == axis else clone_id(self, i)
               for d, i in enumerate(tv.get_logical_domain(no_reductions=True))]
        out = self._new_tv(ids, DataType.Int)
        ArgReductionOp(self._fusion, out, tv, axis, largest)
        if not keepdim:
            return out
        return self.broadcast(out, [axis is None or d == axis for d in range(tv.ndim)])

    def argmax(self, arg: TensorView, dim: int | None = None, keepdim: bool = False) -> TensorView:
        """The index of the largest element along ``dim`` (of the flattened tensor when None)."""
        return self._arg_reduction(True, arg, dim, keepdim)

    def argmin(self, arg: TensorView, dim: int | None = None, keepdim: bool = False) -> TensorView:
        """The index of the smallest element along ``dim`` (of the flattened tensor when None)."""
        return self._arg_reduction(False, arg, dim, keepdim)

    def triu(self, arg: TensorView, diagonal: Operand = 0) -> TensorView:
        """``arg`` with the elements below the ``diagonal``-th diagonal of its last two axes zeroed."""
        tv = self._tv(arg, "triu")
        if tv.ndim < 2:
            raise ValueError(f"triu: {tv.short_name} has rank {tv.ndim}; triu needs at least 2 axes")
        offset = self._val(diagonal, "triu diagonal")
        if isinstance(offset, TensorView) or not offset.dtype.is_integral:
            raise TypeError(f"triu: diagonal must be an int or an integer scalar, got {offset}")
        out = self._new_tv([clone_id(self, i) for i in tv.get_logical_domain(no_reductions=True)], tv.dtype)
        TriuOp(self._fusion, out, tv, offset)
        return out
