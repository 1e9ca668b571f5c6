"""Reductions, matmul and linear of ``fd.ops``: ops whose output drops or contracts axes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from pyfuser.frontend.ops_base import OpsBase, check_same_extent, clone_id, normalize_axis
from pyfuser.frontend.pointwise_ops import PointwiseOps
from pyfuser.ir.dtypes import DataType, as_data_type
from pyfuser.ir.iter_domain import IterDomain, IterType
from pyfuser.ir.ops import LinearOp, MatmulOp, ReductionOp, ReductionOpType, VarMeanOp, WelfordOp
from pyfuser.ir.ops.matmul import GroupedMmOp
from pyfuser.ir.ops.promotion import result_dtype
from pyfuser.ir.tensor_view import TensorView

#: What torch's reduction computes for a dtype probe (``mean`` keeps its input's dtype).
_DTYPE_PROBES: dict[ReductionOpType, Callable[[torch.Tensor, int], torch.Tensor]] = {
    ReductionOpType.sum: torch.sum, ReductionOpType.prod: torch.prod, ReductionOpType.max: torch.amax,
                 ReductionOpType.min: torch.amin}


class ReductionOps(PointwiseOps):
    """Reductions (sum, max, ..., var_mean), matmul and linear."""

    # --- reductions ----------------------------------------------------------------------------
    def _reduce(self, kind: ReductionOpType, x: TensorView, dims: Sequence[int] | int | None, keepdim: bool,
                dtype: DataType | torch.dtype) -> TensorView:
        op = kind.name
        tv = self._tv(x, op)
        axes = _reduction_axes(tv, dims, op)
        in_ids = tv.get_logical_domain(no_reductions=True)
        trivial = [d for d in axes if in_ids[d].is_broadcast() and in_ids[d].extent.value == 1]
        if trivial and len(trivial) < len(axes):
            # Reducing a size-1 broadcast axis is squeezing it (nvFuser's trivial reductions): the
            # reduction then iterates real axes only, as another reduction of the same tensor does
            # (a norm's weight gradient, summed over batch and rows, beside its per-row sum).
            squeezed = self.squeeze(tv, trivial)
            rest = [d - sum(t < d for t in trivial) for d in axes if d not in trivial]
            out = self._reduce(kind, squeezed, rest, False, dtype)
            return self._keepdim(out, axes, tv.ndim) if keepdim else out
        probe = _DTYPE_PROBES.get(kind)
        # Probed even when dtype= is given: it rejects what torch cannot reduce (max of complex).
        inferred = result_dtype(lambda t: probe(t, 0) if probe is not None else t, [tv])
        requested = as_data_type(dtype, allow_null=True) is not DataType.Null
        out_dtype = as_data_type(dtype) if requested else inferred
        if kind is ReductionOpType.mean and not (out_dtype.is_floating or out_dtype.is_complex):
            if requested:
                raise TypeError(f"mean: dtype={out_dtype} was requested for {tv.short_name}; mean needs a "
                                "floating-point or complex dtype")
            raise TypeError(f"mean: {tv.short_name} has dtype {tv.dtype}; mean needs a floating-point dtype "
                            "(pass dtype= or cast first)")
        if trivial:
            # Every reduced axis is a size-1 broadcast: the result is the input in the result's dtype,
            # squeezed (nvFuser builds the same cast and squeeze, and prints it so).
            cast = self.cast(tv, out_dtype) if out_dtype != tv.dtype else tv
            out = self.squeeze(cast, trivial)
            return self._keepdim(out, axes, tv.ndim) if keepdim else out
        out = self._new_tv(_reduced_ids(self, tv, axes), out_dtype)
        ReductionOp(self._fusion, kind, out, tv, axes)
        return self._keepdim(out, axes, tv.ndim) if keepdim else out

    def _keepdim(self, tv: TensorView, axes: list[int], rank: int) -> TensorView:
        """``tv`` (a reduction of a rank-``rank`` tensor over ``axes``) with those axes back as broadcasts."""
        return self.broadcast(tv, [d in axes for d in range(rank)])

    def sum(self, x: TensorView, dims: Sequence[int] | int | DataType | None = None, keepdim: bool = False,
            dtype: DataType | torch.dtype = DataType.Null, *, dim: int | None = None) -> TensorView:
        return self._reduce(ReductionOpType.sum, x, _dims(dims, dim, "sum"), keepdim, _dtype(dims, dtype))

    def prod(self, x: TensorView, dims: Sequence[int] | int | DataType | None = None, keepdim: bool = False,
             dtype: DataType | torch.dtype = DataType.Null, *, dim: int | None = None) -> TensorView:
        return self._reduce(ReductionOpType.prod, x, _dims(dims, dim, "prod"), keepdim, _dtype(dims, dtype))

    def max(self, x: TensorView, dims: Sequence[int] | int | DataType | None = None, keepdim: bool = False,
            dtype: DataType | torch.dtype = DataType.Null, *, dim: int | None = None) -> TensorView:
        return self._reduce(ReductionOpType.max, x, _dims(dims, dim, "max"), keepdim, _dtype(dims, dtype))

    def min(self, x: TensorView, dims: Sequence[int] | int | DataType | None = None, keepdim: bool = False,
            dtype: DataType | torch.dtype = DataType.Null, *, dim: int | None = None) -> TensorView:
        return self._reduce(ReductionOpType.min, x, _dims(dims, dim, "min"), keepdim, _dtype(dims, dtype))

    def mean(self, x: TensorView, dims: Sequence[int] | int | DataType | None = None, keepdim: bool = False,
             dtype: DataType | torch.dtype = DataType.Null, *, dim: int | None = None) -> TensorView:
        return self._reduce(ReductionOpType.mean, x, _dims(dims, dim, "mean"), keepdim, _dtype(dims, dtype))

    def var_mean(self, x: TensorView, dims: Sequence[int] | int | None = None, correction: int = 1,
                 keepdim: bool = False) -> tuple[TensorView, TensorView]:
        tv = self._tv(x, "var_mean")
        if not (tv.dtype.is_floating or tv.dtype.is_complex):
            raise TypeError(f"var_mean: {tv.short_name} has dtype {tv.dtype}; expected a floating-point tensor")
        axes = _reduction_axes(tv, dims, "var_mean")
        var_dtype = result_dtype(lambda t: torch.var_mean(t, 0, correction=0)[0], [tv])
        var = self._new_tv(_reduced_ids(self, tv, axes), var_dtype)
        mean = self._new_tv(_reduced_ids(self, tv, axes), tv.dtype)
        VarMeanOp(self._fusion, var, mean, tv, axes, int(correction))
        if keepdim:
            return self._keepdim(var, axes, tv.ndim), self._keepdim(mean, axes, tv.ndim)
        return var, mean

    def welford(self, arg: TensorView, dims: Sequence[int] | int) -> tuple[TensorView, TensorView, TensorView]:
        """``(avg, var_sum, n)`` over ``dims``: the mean, the sum of squared deviations (the
        variance times n) and the count n (int64), as nvFuser's Welford reduction returns them."""
        tv = self._tv(arg, "welford")
        if not tv.dtype.is_floating:
            raise TypeError(f"welford: {tv.short_name} has dtype {tv.dtype}; expected a floating-point tensor")
        axes = _reduction_axes(tv, dims, "welford")
        avg = self._new_tv(_reduced_ids(self, tv, axes), tv.dtype)
        var_sum = self._new_tv(_reduced_ids(self, tv, axes), tv.dtype)
        n = self._new_tv(_reduced_ids(self, tv, axes), DataType.Int)
        WelfordOp(self._fusion, avg, var_sum, n, tv, axes)
        return avg, var_sum, n

    def var(self, x: TensorView, dims: Sequence[int] | int | None = None, correction: int = 1,
            keepdim: bool = False) -> TensorView:
        return self.var_mean(x, dims, correction, keepdim)[0]

    # --- matmul ------------------------------------------------------------------------------
    def matmul(self, a: TensorView, b: TensorView) -> TensorView:
        ta, tb = self._tv(a, "matmul a"), self._tv(b, "matmul b")
        if ta.ndim == 0 or tb.ndim == 0:
            raise ValueError(f"matmul: operands must have rank >= 1, got {ta.short_name} rank {ta.ndim} and "
                             f"{tb.short_name} rank {tb.ndim}")
        ia, ib = ta.get_logical_domain(no_reductions=True), tb.get_logical_domain(no_reductions=True)
        ka = ia[-1]
        kb = ib[0] if tb.ndim == 1 else ib[-2]
        check_same_extent("matmul", ta, ta.ndim - 1, ka, tb, 0 if tb.ndim == 1 else tb.ndim - 2, kb)
        batch_a, batch_b = ia[:-2], ib[:-2]
        batch = self._batch_ids(ta, batch_a, tb, batch_b)
        ids = batch
        if ta.ndim >= 2:
            ids.append(clone_id(self, ia[-2]))
        if tb.ndim >= 2:
            ids.append(clone_id(self, ib[-1]))
        ids.append(self._id(ka.extent, IterType.Reduction))
        out = self._new_tv(ids, result_dtype(torch.matmul, [ta, tb]))
        MatmulOp(self._fusion, out, ta, tb)
        return out

    def _batch_ids(self, ta: TensorView, ia: list[IterDomain], tb: TensorView, ib: list[IterDomain]) -> list[IterDomain]:
        rank = max(len(ia), len(ib))
        padded_a: list[IterDomain | None] = [*([None] * (rank - len(ia))), *ia]
        padded_b: list[IterDomain | None] = [*([None] * (rank - len(ib))), *ib]
        ids = []
        for x, y in zip(padded_a, padded_b, strict=True):
            live = [i for i in (x, y) if i is not None and not i.is_broadcast()]
            if len(live) == 2 and live[0].extent.is_const and live[1].extent.is_const and live[0].extent != live[1].extent:
                raise ValueError(f"matmul: batch axes of {ta.short_name} and {tb.short_name} have incompatible extents "
                                 f"{live[0].extent} and {live[1].extent}")
            ids.append(self._id(live[0].extent) if live else self._id(1, IterType.Broadcast))
        return ids

    def linear(self, x: TensorView, weight: TensorView, bias: TensorView | None = None) -> TensorView:
        """``F.linear``: x ``[..., k]``, weight ``[n, k]`` (or ``[k]``), bias ``[n]``; a weight of rank
        >= 3 is ``[*wb, n, k]`` (leading axes split over devices, as nvFuser allows), giving
        ``[*wb, ..., n]`` with bias ``[*wb, n]`` or ``[n]``."""
        tx, tw = self._tv(x, "linear input"), self._tv(weight, "linear weight")
        tb = self._tv(bias, "linear bias") if bias is not None else None
        if tx.ndim < 1 or tw.ndim < 1:
            raise ValueError(f"linear: expected input and weight of rank >= 1, got {tx.short_name} rank {tx.ndim} "
                             f"and {tw.short_name} rank {tw.ndim}")
        ix, iw = tx.get_logical_domain(no_reductions=True), tw.get_logical_domain(no_reductions=True)
        check_same_extent("linear", tx, tx.ndim - 1, ix[-1], tw, tw.ndim - 1, iw[-1])
        batch = iw[:-2]
        ids = [clone_id(self, i) for i in batch] + [clone_id(self, i) for i in ix[:-1]]
        if tw.ndim >= 2:
            ids.append(clone_id(self, iw[-2]))
        if tb is not None:
            allowed = (0, 1) if tw.ndim <= 2 else (1, len(batch) + 1)
            if tb.ndim not in allowed:
                raise ValueError(f"linear: bias {tb.short_name} must have rank {' or '.join(map(str, allowed))} for "
                                 f"weight {tw.short_name} of rank {tw.ndim}, got {tb.ndim}")
            ib = tb.get_logical_domain(no_reductions=True)
            if tb.ndim >= 1 and tw.ndim >= 2:
                check_same_extent("linear", tb, tb.ndim - 1, ib[-1], tw, tw.ndim - 2, iw[-2])
                for d in range(tb.ndim - 1):
                    check_same_extent("linear", tb, d, ib[d], tw, d, iw[d])
        ids.append(self._id(ix[-1].extent, IterType.Reduction))
        args = [tx, tw] + ([tb] if tb is not None else [])
        dtype = result_dtype(torch.nn.functional.linear if tw.ndim <= 2 else _batched_linear, args)
        out = self._new_tv(ids, dtype)
        LinearOp(self._fusion, out, tx, tw, tb)
        return out

    def grouped_mm(self, mat1: TensorView, mat2: TensorView, offsets: TensorView) -> TensorView:
        """Matmuls of groups of rows, columns or the contraction, split by ``offsets`` (the end of each
        group, 1-D integers): ``[M, K] x [K, N] -> [G, M, N]``, ``[G, M, K] x [K, N] -> [M, N]`` or
        ``[M, K] x [G, K, N] -> [M, N]``."""
        a, b = self._tv(mat1, "grouped_mm mat1"), self._tv(mat2, "grouped_mm mat2")
        offs = self._tv(offsets, "grouped_mm offsets")
        if offs.ndim != 1 or offs.dtype not in (DataType.Int, DataType.Int32):
            raise ValueError(f"grouped_mm: offsets {offs.short_name} must be a 1-D integer tensor, got rank "
                             f"{offs.ndim} {offs.dtype}")
        if (a.ndim, b.ndim) not in ((2, 2), (3, 2), (2, 3)):
            raise ValueError(f"grouped_mm: expected ranks (2, 2), (3, 2) or (2, 3), got {a.short_name} rank {a.ndim} "
                             f"and {b.short_name} rank {b.ndim} (two stacks of matrices: use matmul)")
        ia, ib, io = (t.get_logical_domain(no_reductions=True) for t in (a, b, offs))
        check_same_extent("grouped_mm", a, a.ndim - 1, ia[-1], b, b.ndim - 2, ib[-2])
        stacked = a if a.ndim == 3 else b if b.ndim == 3 else None
        if stacked is not None:
            check_same_extent("grouped_mm", offs, 0, io[0], stacked, 0, stacked.get_logical_domain()[0])
        if a.ndim == 2 and b.ndim == 2:
            ids = [clone_id(self, io[0]), clone_id(self, ia[0]), clone_id(self, ib[1])]
        elif a.ndim == 3:
            ids = [clone_id(self, ia[1]), clone_id(self, ib[1])]
        else:
            ids = [clone_id(self, ia[0]), clone_id(self, ib[2])]
        ids.append(self._id(ia[-1].extent, IterType.Reduction))
        out = self._new_tv(ids, result_dtype(torch.matmul, [a, b]))
        GroupedMmOp(self._fusion, out, a, b, offs)
        return out


def _batched_linear(x: torch.Tensor, w: torch.Tensor, *bias: torch.Tensor) -> torch.Tensor:
    """The dtype rule of a linear with a weight of rank >= 3 (its probe: one-element tensors)."""
    return torch.matmul(x, w.transpose(-1, -2)) + (bias[0] if bias else 0)


def _dims(dims: Sequence[int] | int | DataType | torch.dtype | None, dim: int | None,
          op: str) -> Sequence[int] | int | None:
    """The reduced axes of nvFuser's three forms: ``(arg, dtype)`` (every axis), ``(arg, dim, ...)``
    and ``(arg, dims, ...)``; ``dim=`` is the keyword of the second."""
    if dim is not None:
        if dims is not None:
            raise TypeError(f"{op}: pass dims or dim, not both")
        return dim
    return None if isinstance(dims, (DataType, torch.dtype)) else dims


def _dtype(dims: object, dtype: DataType | torch.dtype) -> DataType | torch.dtype:
    """``(arg, dtype)``: a dtype in the place of dims is the result dtype."""
    if isinstance(dims, (DataType, torch.dtype)):
        if as_data_type(dtype, allow_null=True) is not DataType.Null:
            raise TypeError(f"a reduction got two dtypes: {dims} in the place of dims and dtype={dtype}")
        return dims
    return dtype


def _reduction_axes(tv: TensorView, dims: Sequence[int] | int | None, op: str) -> list[int]:
    rank = tv.ndim
    if dims is None:
        return list(range(rank))
    dims_list = [dims] if isinstance(dims, int) else list(dims)
    axes = sorted({normalize_axis(d, rank, tv, f"{op} dims") for d in dims_list})
    if len(axes) != len(dims_list):
        raise ValueError(f"{op}: dims {dims_list} of {tv.short_name} name an axis twice")
    return axes


def _reduced_ids(ops: OpsBase, tv: TensorView, axes: list[int]) -> list[IterDomain]:
    ids = []
    for d, i in enumerate(tv.get_logical_domain(no_reductions=True)):
        if d in axes:
            ids.append(ops._id(i.extent, IterType.Reduction))
        else:
            ids.append(clone_id(ops, i))
    return ids
