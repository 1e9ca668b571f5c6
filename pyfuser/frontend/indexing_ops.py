"""Indexing ops of ``fd.ops``: index_select, select, gather, take_along_axis, index, scatter,
embedding_fwd, index_put_accumulate and index_put (nvFuser's argument names; ``index`` and
``index_put`` are torch's advanced indexing, which nvFuser's API does not have). Definition-time checks cover
dtypes, ranks and static extents; index values are checked when the op runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyfuser.frontend.ops_base import Operand, OpsBase, clone_id, normalize_axis
from pyfuser.ir.base import Scalar, Val
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.iter_domain import IterDomain, IterType
from pyfuser.ir.ops.indexing import (
    EmbeddingFwdOp,
    GatherOp,
    IndexOp,
    IndexPutOp,
    IndexSelectOp,
    ScatterOp,
    SelectOp,
    TakeAlongAxisOp,
)
from pyfuser.ir.tensor_view import TensorView


def _check_index_dtype(op: str, index: Val) -> None:
    if index.dtype not in (DataType.Int, DataType.Int32):
        what = index.short_name if isinstance(index, TensorView) else str(index)
        raise TypeError(f"{op}: index {what} has dtype {index.dtype}; expected an integer (int64_t or int)")


def _check_rank(op: str, tv: TensorView, rank: int, what: str) -> None:
    if tv.ndim != rank:
        raise ValueError(f"{op}: {tv.short_name} has rank {tv.ndim} but {what}")


def _static_extent(i: IterDomain) -> int | None:
    return None if i.is_broadcast() else i.extent.value


class IndexingOps(OpsBase):
    def index_select(self, arg: TensorView, index: TensorView, dim: int) -> TensorView:
        """Slices of ``arg`` along ``dim`` at the positions in the 1-D integer ``index``; a 0-dim index
        is one position (the result keeps ``dim`` with size 1, as torch's)."""
        tv, idx = self._tv(arg, "index_select arg"), self._tv(index, "index_select index")
        _check_index_dtype("index_select", idx)
        if idx.ndim == 0:
            idx = self.broadcast(idx, [True])
        _check_rank("index_select", idx, 1, "index_select takes a 1-D or 0-dim index")
        axis = normalize_axis(dim, tv.ndim, tv, "index_select dim")
        ids = [clone_id(self, i) for i in tv.get_logical_domain(no_reductions=True)]
        ids[axis] = clone_id(self, idx.get_logical_domain(no_reductions=True)[0])
        out = self._new_tv(ids, tv.dtype)
        IndexSelectOp(self._fusion, out, tv, idx, axis)
        return out

    def select(self, arg: TensorView, index: Operand, dim: int) -> TensorView:
        """The slice of ``arg`` at ``index`` (an int or integer scalar, negative from the end) along
        ``dim``, which the result drops."""
        tv = self._tv(arg, "select arg")
        axis = normalize_axis(dim, tv.ndim, tv, "select dim")
        position = self._val(index, "select index")
        if isinstance(position, TensorView):
            raise TypeError(f"select: index must be an int or an integer scalar, got tensor {position.short_name}")
        _check_index_dtype("select", position)
        extent = _static_extent(tv.get_logical_domain(no_reductions=True)[axis])
        if isinstance(position, Scalar) and position.is_const and extent is not None and position.value is not None \
                and not -extent <= position.value < extent:
            raise ValueError(f"select: index {position.value} is out of range for {tv.short_name} axis {axis} of "
                             f"size {extent} (valid: {-extent}..{extent - 1})")
        ids = [clone_id(self, i) for d, i in enumerate(tv.get_logical_domain(no_reductions=True)) if d != axis]
        out = self._new_tv(ids, tv.dtype)
        SelectOp(self._fusion, out, tv, position, axis)
        return out

    def _gather(self, op: str, arg: TensorView, index: TensorView, dim: int) -> tuple[TensorView, TensorView, int]:
        tv, idx = self._tv(arg, f"{op} arg"), self._tv(index, f"{op} index")
        _check_index_dtype(op, idx)
        _check_rank(op, idx, tv.ndim, f"arg {tv.short_name} has rank {tv.ndim}; the index must have it too")
        axis = normalize_axis(dim, tv.ndim, tv, f"{op} dim")
        exact = op == "take_along_axis"
        for d, (a, i) in enumerate(zip(tv.get_logical_domain(no_reductions=True),
                                       idx.get_logical_domain(no_reductions=True), strict=True)):
            ea, ei = _static_extent(a), _static_extent(i)
            if d == axis or ea is None or ei is None:
                continue
            if (ei != ea) if exact else (ei > ea):
                relation = "equal" if exact else "at most"
                raise ValueError(f"{op}: {idx.short_name} axis {d} has extent {ei} but must be {relation} "
                                 f"{tv.short_name} axis {d}'s extent {ea}")
        return tv, idx, axis

    def gather(self, arg: TensorView, index: TensorView, dim: int) -> TensorView:
        """``out[i, j, k] = arg[i, index[i, j, k], k]`` for ``dim`` 1 (``torch.gather``); the result has
        ``index``'s shape, which may be smaller than ``arg``'s off ``dim``."""
        tv, idx, axis = self._gather("gather", arg, index, dim)
        out = self._new_tv([clone_id(self, i) for i in idx.get_logical_domain(no_reductions=True)], tv.dtype)
        GatherOp(self._fusion, out, tv, idx, axis)
        return out

    def take_along_axis(self, arg: TensorView, index: TensorView, dim: int) -> TensorView:
        """``gather`` whose ``index`` has ``arg``'s extents on every axis but ``dim``."""
        tv, idx, axis = self._gather("take_along_axis", arg, index, dim)
        ids = [clone_id(self, i if d == axis else a) for d, (a, i) in enumerate(
            zip(tv.get_logical_domain(no_reductions=True), idx.get_logical_domain(no_reductions=True), strict=True))]
        out = self._new_tv(ids, tv.dtype)
        TakeAlongAxisOp(self._fusion, out, tv, idx, axis)
        return out

    def index(self, arg: TensorView, indices: Sequence[TensorView | None]) -> TensorView:
        """``arg[indices]`` as torch's advanced indexing computes it: ``indices[d]`` (an integer tensor, or
        None for the whole axis) addresses ``arg``'s axis ``d``; the tensors broadcast together into the
        index shape, whose axes replace the indexed ones where those are adjacent and come first
        otherwise. Negative values count from the end of their axis. A 0-dim index tensor is an index tensor
        as in ``aten.index`` (Python's ``x[t, :, u]`` takes it for an integer, a select, instead)."""
        tv = self._tv(arg, "index arg")
        if len(indices) > tv.ndim:
            raise ValueError(f"index: {len(indices)} indices for {tv.short_name} of rank {tv.ndim}")
        given = [(d, self._tv(i, f"index indices[{d}]")) for d, i in enumerate(indices) if i is not None]
        if not given:
            raise ValueError(f"index: no index tensor among the indices of {tv.short_name} (all None)")
        for _, index in given:
            _check_index_dtype("index", index)
        dims = [d for d, _ in given]
        extents = self._pointwise_extents("index", [i for _, i in given])
        at = dims[0] if dims == list(range(dims[0], dims[-1] + 1)) else 0
        kept = [clone_id(self, i) for d, i in enumerate(tv.get_logical_domain(no_reductions=True)) if d not in dims]
        shape = [self._id(1, IterType.Broadcast) if e is None else self._id(e) for e in extents]
        out = self._new_tv(kept[:at] + shape + kept[at:], tv.dtype)
        IndexOp(self._fusion, out, tv, [i for _, i in given], dims, at, len(extents))
        return out

    def scatter(self, arg: TensorView, index: TensorView, src: Operand, dim: int) -> TensorView:
        """``arg`` with ``out[i, index[i, j, k], k] = src[i, j, k]`` for ``dim`` 1 (``torch.scatter``, out
        of place); ``src`` is a tensor of ``arg``'s dtype or a number."""
        tv, idx = self._tv(arg, "scatter arg"), self._tv(index, "scatter index")
        _check_index_dtype("scatter", idx)
        _check_rank("scatter", idx, tv.ndim, f"arg {tv.short_name} has rank {tv.ndim}; the index must have it too")
        axis = normalize_axis(dim, tv.ndim, tv, "scatter dim")
        value = self._val(src, "scatter src")
        if isinstance(value, TensorView):
            _check_rank("scatter", value, tv.ndim, f"arg {tv.short_name} has rank {tv.ndim}; src must have it too")
            if value.dtype != tv.dtype:
                raise TypeError(f"scatter: src {value.short_name} has dtype {value.dtype} but arg {tv.short_name} has "
                                f"{tv.dtype}; cast it first")
        out = self._new_tv([clone_id(self, i) for i in tv.get_logical_domain(no_reductions=True)], tv.dtype)
        ScatterOp(self._fusion, out, tv, idx, value, axis)
        return out

    def embedding_fwd(self, input: TensorView, weight: TensorView, padding_idx: Operand | None = None,
                      max_norm: Operand | None = None, norm_type: Operand | None = None,
                      scale_grad_by_freq: Operand | None = None, sparse: Operand | None = None) -> TensorView:
        """``F.embedding(input, weight, ...)``: the rows of the 2-D ``weight`` (of any dtype, as torch's)
        that the integer ``input`` picks; the result has ``input``'s shape plus ``weight``'s embedding dim."""
        indices, table = self._tv(input, "embedding_fwd input"), self._tv(weight, "embedding_fwd weight")
        _check_index_dtype("embedding_fwd", indices)
        _check_rank("embedding_fwd", table, 2, "the embedding weight must be 2-D [num_embeddings, embedding_dim]")
        given: dict[str, Any] = {"padding_idx": padding_idx, "max_norm": max_norm, "norm_type": norm_type,
                                 "scale_grad_by_freq": scale_grad_by_freq, "sparse": sparse}
        options: dict[str, Val | None] = {}
        for name, value in given.items():
            if value is None:
                options[name] = None
                continue
            val = self._val(value, f"embedding_fwd {name}")
            if isinstance(val, TensorView):
                raise TypeError(f"embedding_fwd: {name} must be a number or a scalar, got tensor {val.short_name}")
            options[name] = val
        ids = [clone_id(self, i) for i in indices.get_logical_domain(no_reductions=True)]
        ids.append(clone_id(self, table.get_logical_domain(no_reductions=True)[1]))
        out = self._new_tv(ids, table.dtype)
        EmbeddingFwdOp(self._fusion, out, indices, table, options)
        return out

    def index_put_accumulate(self, acc: TensorView, index: TensorView, value: TensorView, *,
                             wrap_negative: bool = False) -> TensorView:
        """``acc`` with each row ``value[i]`` added into row ``index[i]`` (``index_put`` with
        ``accumulate=True``): ``acc`` [N, ...], ``index`` [S], ``value`` [S, ...]. ``wrap_negative``
        (pyfuser's, as torch's ``index_put``): a negative index counts from the end."""
        return self._index_put(acc, index, value, wrap_negative, accumulate=True)

    def index_put(self, acc: TensorView, index: TensorView, value: TensorView, *,
                  wrap_negative: bool = False) -> TensorView:
        """``acc`` with row ``index[i]`` replaced by ``value[i]`` (torch's ``index_put`` of one index
        tensor, without accumulation; a row indexed twice gets one of its values, which one
        unspecified): shapes as ``index_put_accumulate``'s."""
        return self._index_put(acc, index, value, wrap_negative, accumulate=False)

    def _index_put(self, acc: TensorView, index: TensorView, value: TensorView, wrap_negative: bool,
                   accumulate: bool) -> TensorView:
        name = IndexPutOp.method_name(accumulate)
        tacc, idx = self._tv(acc, f"{name} acc"), self._tv(index, f"{name} index")
        tval = self._tv(value, f"{name} value")
        _check_index_dtype(name, idx)
        _check_rank(name, idx, 1, "the index must be 1-D")
        if tacc.ndim < 1:
            raise ValueError(f"{name}: acc {tacc.short_name} must have rank >= 1")
        _check_rank(name, tval, tacc.ndim, f"acc {tacc.short_name} has rank {tacc.ndim}; value "
                    "must have it too ([len(index), ...acc's other axes])")
        out = self._new_tv([clone_id(self, i) for i in tacc.get_logical_domain(no_reductions=True)], tacc.dtype)
        IndexPutOp(self._fusion, out, tacc, idx, tval, wrap_negative, accumulate)
        return out

