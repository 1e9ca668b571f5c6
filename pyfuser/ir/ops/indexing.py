"""Indexing ops: index_select, select, gather / take_along_axis, index, scatter, embedding and
index_put_accumulate, evaluated with ATen.

index_select, gather / take_along_axis, index and embedding are ``IndexedRead``s: the output reads
one operand (the lookup tensor) at positions integer tensors hold along some of its axes (one, or
several for ``index``), and at its own positions on the others. A generated kernel computes them as
an indirect load from the lookup tensor, which must then be a segment input in global memory
(nvFuser's lookup tv), while the index and the output are iterated by the loop nest like any tensor.

Every index is checked against the extent it indexes before ATen reads with it, never an
out-of-bounds read. On a CPU an out-of-range index is a ValueError naming the tensor, the axis, the
valid range and the offending value. On a GPU the check is a device-side assert (the program stops
with CUDA's "device-side assert triggered"; CUDA drops the message): reading the index's range back
to the host would make every step that embeds tokens wait for the device, and a CUDA-graph capture
cannot wait at all. Where ATen's CUDA kernel asserts each index it reads (gather, scatter,
index_select, embedding) that assert is the check: a separate one would read the indices once more
(DeBERTa's relative-position gathers: int64 indices of a whole attention map, a millisecond a step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from pyfuser.ir.base import Expr, PythonCall, Val
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.ops.common import call_string

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion
    from pyfuser.ir.iter_domain import IterDomain
    from pyfuser.ir.tensor_view import TensorView


def check_indices(op: str, index: torch.Tensor, index_tv: Any, size: int, target: Any, dim: int,
                  allow_negative: bool = False, asserted_by_aten: bool = True) -> None:
    """Raise ValueError when a value of ``index`` is outside ``[0, size)`` (``[-size, size)`` with
    ``allow_negative``), the extent of ``target``'s axis ``dim``; on a device other than the CPU, assert
    it there (the caller's stream carries on) unless ``asserted_by_aten``: the ATen kernel that reads
    the indices asserts them itself."""
    if index.numel() == 0 or (asserted_by_aten and index.device.type == "cuda"):
        return
    lower = -size if allow_negative else 0
    if index.device.type != "cpu":  # asserted on the device, without waiting for it
        in_range = ((index >= lower) & (index < size)).all()
        torch._assert_async(in_range, f"{op}: index {index_tv.short_name} holds a value out of range for "
                                      f"{target.short_name} axis {dim} of size {size} (valid: {lower}..{size - 1})")
        return
    low, high = (int(v) for v in torch.aminmax(index))
    if low < lower or high >= size:
        bad = low if low < lower else high
        raise ValueError(f"{op}: index {index_tv.short_name} holds {bad}, out of range for {target.short_name} axis "
                         f"{dim} of size {size} (valid: {lower}..{size - 1})")


def _positional(src_ids: list[IterDomain], dst_ids: list[IterDomain], skip_src: int | None = None,
                skip_dst: int | None = None) -> dict[IterDomain, IterDomain]:
    src = [i for k, i in enumerate(src_ids) if k != skip_src]
    dst = [i for k, i in enumerate(dst_ids) if k != skip_dst]
    return dict(zip(src, dst, strict=False))


class IndexedRead(Expr):
    """An op whose output reads ``lookup`` at the positions ``lookup_index`` holds along ``dim`` (each
    of ``index_reads`` where several axes are indexed), and on each other axis of ``lookup`` at the
    output's position along the axis ``lookup_axes`` pairs it with. Those pairs have one extent where
    ``lookup_exact`` (index_select, take_along_axis, index, embedding); a ``gather``'s index may be
    shorter than ``lookup`` there."""

    lookup_exact = True
    #: index values may count from the end (-1: the last position), as torch's advanced indexing's
    allows_negative = False
    #: the axis of ``lookup`` the index values address
    dim: int
    #: the op's name in messages (its ``fd.ops`` method)
    op_name: str
    #: the input positions of ``lookup`` and ``lookup_index``
    lookup_position, index_position = 0, 1

    @property
    def lookup(self) -> TensorView:
        return self.tensor_input(self.lookup_position)

    @property
    def lookup_index(self) -> TensorView:
        return self.tensor_input(self.index_position)

    def index_reads(self) -> list[tuple[int, TensorView]]:
        """(axis of ``lookup``, the integer tensor whose values address it) for each indexed axis."""
        return [(self.dim, self.lookup_index)]

    def lookup_axes(self) -> list[tuple[int, int]]:
        """(axis of ``lookup``, axis of the output) for every axis of ``lookup`` but ``dim``."""
        return [(d, d) for d in range(self.lookup.ndim) if d != self.dim]


def read_by_index_only(tv: TensorView, exprs: Sequence[Expr]) -> bool:
    """Whether every expr of ``exprs`` that reads ``tv`` (at least one) reads it as the lookup tensor of
    an ``IndexedRead``: such a tensor is addressed at computed positions, never iterated, so a schedule
    neither replays its axes nor caches it."""
    readers = [e for e in exprs if any(v is tv for v in e.inputs)]
    return bool(readers) and all(isinstance(e, IndexedRead) and e.lookup is tv and
                                 all(index is not tv for _, index in e.index_reads()) for e in readers)


class IndexSelectOp(IndexedRead):
    """``out = index_select(arg, dim, index)``: ``index`` (1-D integers) picks slices of ``arg`` along ``dim``."""

    op_name = "index_select"

    def __init__(self, fusion: Fusion, out: TensorView, arg: TensorView, index: TensorView, dim: int) -> None:
        super().__init__(fusion, [arg, index], [out])
        self.dim = dim

    def evaluate(self, ctx: EvalContext, x: torch.Tensor, index: torch.Tensor) -> list[Any]:
        arg, index_tv = self.defined_inputs
        check_indices("index_select", index, index_tv, x.shape[self.dim], arg, self.dim)
        return [torch.index_select(x, self.dim, index)]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        out_ids = self.output.get_logical_domain()
        ids = producer.get_logical_domain(no_reductions=True)
        if producer is self.inputs[1]:
            return {ids[0]: out_ids[self.dim]}
        return _positional(ids, out_ids, self.dim, self.dim)

    def python_call(self) -> PythonCall:
        return PythonCall("index_select", tuple(self.inputs), {"dim": self.dim})

    def to_string(self, indent: int = 0) -> str:
        return call_string(self.output, "index_select", self.inputs, f"dim = {self.dim}", indent)


class SelectOp(Expr):
    """``out = arg.select(dim, index)``: one slice along ``dim``, which the output drops."""

    def __init__(self, fusion: Fusion, out: TensorView, arg: TensorView, index: Val, dim: int) -> None:
        super().__init__(fusion, [arg, index], [out])
        self.dim = dim

    def evaluate(self, ctx: EvalContext, x: torch.Tensor, index: int) -> list[Any]:
        size = x.shape[self.dim]
        if not -size <= int(index) < size:
            raise ValueError(f"select: index {index} is out of range for {self.tensor_input(0, as_defined=True).short_name} axis "
                             f"{self.dim} of size {size} (valid: {-size}..{size - 1})")
        return [x.select(self.dim, int(index))]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        if producer is not self.inputs[0]:
            return {}
        return _positional(producer.get_logical_domain(no_reductions=True), self.output.get_logical_domain(),
                           skip_src=self.dim)

    def python_call(self) -> PythonCall:
        return PythonCall("select", tuple(self.inputs), {"dim": self.dim})

    def to_string(self, indent: int = 0) -> str:
        return call_string(self.output, "select", self.inputs, f"dim = {self.dim}", indent)


class GatherOp(IndexedRead):
    """``out[..., j, ...] = arg[..., index[..., j, ...], ...]`` along ``dim`` (``torch.gather``):
    ``index`` may be shorter than ``arg`` on the other axes, so a stream loop cannot chunk the
    two alike."""

    chunkable = False
    #: every other axis of index equals arg's (take_along_axis)
    exact = False
    lookup_exact = False
    op_name = "gather"

    def __init__(self, fusion: Fusion, out: TensorView, arg: TensorView, index: TensorView, dim: int) -> None:
        super().__init__(fusion, [arg, index], [out])
        self.dim = dim

    def evaluate(self, ctx: EvalContext, x: torch.Tensor, index: torch.Tensor) -> list[Any]:
        arg, index_tv = self.defined_inputs
        for d in range(x.dim()):
            if d == self.dim:
                continue
            if (index.shape[d] != x.shape[d]) if self.exact else (index.shape[d] > x.shape[d]):
                relation = "equal" if self.exact else "at most"
                arg, index_tv = self.tensor_input(0, as_defined=True), self.tensor_input(1, as_defined=True)
                raise ValueError(f"{self.op_name}: {index_tv.short_name} axis {d} has size {index.shape[d]} but must be "
                                 f"{relation} {arg.short_name} axis {d}'s size {x.shape[d]}")
        check_indices(self.op_name, index, index_tv, x.shape[self.dim], arg, self.dim)
        return [torch.gather(x, self.dim, index)]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        out_ids = self.output.get_logical_domain()
        ids = producer.get_logical_domain(no_reductions=True)
        if producer is self.inputs[1]:
            return _positional(ids, out_ids)
        return _positional(ids, out_ids, self.dim, self.dim) if self.exact else {}

    def python_call(self) -> PythonCall:
        return PythonCall(self.op_name, tuple(self.inputs), {"dim": self.dim})

    def to_string(self, indent: int = 0) -> str:
        return call_string(self.output, self.op_name, self.inputs, f"dim = {self.dim}", indent)


class TakeAlongAxisOp(GatherOp):
    """``gather`` whose index equals ``arg`` on every other axis (``take_along_axis``): those axes
    map onto the output, so a stream loop chunks arg, index and out alike."""

    chunkable = True
    exact = True
    lookup_exact = True
    op_name = "take_along_axis"


class IndexOp(IndexedRead):
    """``out = arg[indices]``: torch's advanced indexing by integer tensors (``aten.index.Tensor``). The
    tensors index the axes ``dims`` of ``arg``; aligned right, they broadcast together into the index
    shape of ``width`` axes; ``arg``'s other axes are kept whole. In the output the index shape's axes
    start at ``at``: where the indexed axes were when they are adjacent, first otherwise (torch's rule),
    the kept axes around them in order. Negative values count from the end of their axis."""

    chunkable = False
    returns_new_memory = True
    allows_negative = True
    op_name = "index"

    def __init__(self, fusion: Fusion, out: TensorView, arg: TensorView, indices: Sequence[TensorView],
                 dims: Sequence[int], at: int, width: int) -> None:
        super().__init__(fusion, [arg, *indices], [out])
        self.dims, self.at, self.width = tuple(dims), at, width
        self.dim = self.dims[0]

    def index_reads(self) -> list[tuple[int, TensorView]]:
        return [(d, self.tensor_input(k + 1)) for k, d in enumerate(self.dims)]

    def _by_axis(self, indices: Sequence[Any]) -> list[Any]:
        """``indices`` (one per indexed axis) at their axes' places, None at the axes kept whole: the
        argument of ``aten.index.Tensor`` and ``fd.ops.index``."""
        key: list[Any] = [None] * (max(self.dims) + 1)
        for d, index in zip(self.dims, indices, strict=True):
            key[d] = index
        return key

    def lookup_axes(self) -> list[tuple[int, int]]:
        kept = [d for d in range(self.lookup.ndim) if d not in self.dims]
        return [(d, k if k < self.at else k + self.width) for k, d in enumerate(kept)]

    def evaluate(self, ctx: EvalContext, x: torch.Tensor, *indices: torch.Tensor) -> list[Any]:
        arg = self.tensor_input(0, as_defined=True)
        for k, (d, index) in enumerate(zip(self.dims, indices, strict=True)):
            check_indices("index", index, self.tensor_input(k + 1, as_defined=True), x.shape[d], arg, d,
                          allow_negative=True)
        # ATen's op, not ``x[...]``: Python indexing by a 0-dim tensor is a view (a select), never a copy
        return [torch.ops.aten.index.Tensor(x, self._by_axis(indices))]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        out_ids = self.output.get_logical_domain()
        ids = producer.get_logical_domain(no_reductions=True)
        if producer is self.inputs[0]:
            return {ids[a]: out_ids[o] for a, o in self.lookup_axes()}
        start = self.at + self.width - len(ids)
        return {i: out_ids[start + j] for j, i in enumerate(ids)}

    def python_call(self) -> PythonCall:
        return PythonCall("index", (self.inputs[0], self._by_axis(self.inputs[1:])))

    def to_string(self, indent: int = 0) -> str:
        return call_string(self.output, "index", self.inputs, f"dims = {list(self.dims)}", indent)


class ScatterOp(Expr):
    """``out = arg`` with ``out[..., index[..., j, ...], ...] = src[..., j, ...]`` along ``dim``
    (``torch.scatter``, out of place); ``src`` is a tensor or a scalar."""

    #: index and src may be shorter than arg on every axis: chunks of them do not line up
    chunkable = False

    def __init__(self, fusion: Fusion, out: TensorView, arg: TensorView, index: TensorView, src: Val,
                 dim: int) -> None:
        super().__init__(fusion, [arg, index, src], [out])
        self.dim = dim

    def evaluate(self, ctx: EvalContext, x: torch.Tensor, index: torch.Tensor, src: Any) -> list[Any]:
        arg, index_tv = self.tensor_input(0, as_defined=True), self.tensor_input(1, as_defined=True)
        for d in range(x.dim()):  # torch.scatter's shape rule: index fits in src, and in arg off dim
            bounds = ([(arg, x.shape[d])] if d != self.dim else []) + \
                ([(self.tensor_input(2, as_defined=True), src.shape[d])] if isinstance(src, torch.Tensor) else [])
            for tv, size in bounds:
                if index.shape[d] > size:
                    raise ValueError(f"scatter: {index_tv.short_name} axis {d} has size {index.shape[d]} but must be "
                                     f"at most {tv.short_name} axis {d}'s size {size}")
        check_indices("scatter", index, index_tv, x.shape[self.dim], arg, self.dim)
        if not isinstance(src, torch.Tensor):
            return [torch.scatter(x, self.dim, index, src)]
        return [torch.scatter(x, self.dim, index, src.to(x.dtype))]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        if producer is not self.inputs[0]:
            return {}
        return _positional(producer.get_logical_domain(no_reductions=True), self.output.get_logical_domain())

    def python_call(self) -> PythonCall:
        return PythonCall("scatter", tuple(self.inputs), {"dim": self.dim})

    def to_string(self, indent: int = 0) -> str:
        return call_string(self.output, "scatter", self.inputs, f"dim = {self.dim}", indent)


class EmbeddingFwdOp(IndexedRead):
    """``out = F.embedding(input, weight, padding_idx, max_norm, norm_type, ...)``: rows of
    ``weight`` picked by the integer ``input``; out has ``input``'s shape plus the embedding dim.

    With ``max_norm`` torch renormalizes the rows it reads in place; here a copy is renormalized,
    so the fusion never writes its input.
    """

    OPTIONS = ("padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse")
    #: the index values address weight's rows
    dim = 0
    op_name = "embedding_fwd"
    lookup_position, index_position = 1, 0

    def __init__(self, fusion: Fusion, out: TensorView, indices: TensorView, weight: TensorView,
                 options: dict[str, Val | None]) -> None:
        given = [v for k in self.OPTIONS if (v := options.get(k)) is not None]
        super().__init__(fusion, [indices, weight, *given], [out])
        self.given = tuple(k for k in self.OPTIONS if options.get(k) is not None)

    def lookup_axes(self) -> list[tuple[int, int]]:
        return [(1, self.output.ndim - 1)]

    def option(self, name: str) -> Val | None:
        """The value given for option ``name`` (None: not given)."""
        return self.inputs[2 + self.given.index(name)] if name in self.given else None

    def evaluate(self, ctx: EvalContext, indices: torch.Tensor, weight: torch.Tensor, *values: Any) -> list[Any]:
        options = dict(zip(self.given, values, strict=True))
        index_tv, weight_tv = self.defined_inputs[:2]
        check_indices("embedding_fwd", indices, index_tv, weight.shape[0], weight_tv, 0)
        padding_idx = options.get("padding_idx")
        if padding_idx is not None and not -weight.shape[0] <= int(padding_idx) < weight.shape[0]:
            raise ValueError(f"embedding_fwd: padding_idx {padding_idx} is out of range for "
                             f"{self.tensor_input(1, as_defined=True).short_name} "
                             f"of {weight.shape[0]} rows")
        if options.get("max_norm") is not None:
            weight = weight.clone()
        return [F.embedding(indices, weight, None if padding_idx is None else int(padding_idx),
                            options.get("max_norm"), float(options.get("norm_type", 2.0)),
                            bool(options.get("scale_grad_by_freq", False)), bool(options.get("sparse", False)))]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        out_ids = self.output.get_logical_domain()
        ids = producer.get_logical_domain(no_reductions=True)
        if producer is self.inputs[0]:
            return _positional(ids, out_ids[:-1])
        if producer is self.inputs[1]:
            return {ids[1]: out_ids[-1]}
        return {}

    def python_call(self) -> PythonCall:
        return PythonCall("embedding_fwd", tuple(self.inputs[:2]), dict(zip(self.given, self.inputs[2:], strict=True)))

    def to_string(self, indent: int = 0) -> str:
        attrs = ", ".join(f"{k} = {v}" for k, v in zip(self.given, self.inputs[2:], strict=True))
        return call_string(self.output, "embedding", self.inputs[:2], attrs, indent)


class IndexPutOp(Expr):
    """``out = acc`` with ``out[index[i]] += value[i]`` (``index_put`` with ``accumulate=True``: the
    backward of an embedding, rows of ``value`` summed into the rows of ``acc`` they index), or with
    ``out[index[i]] = value[i]`` where not ``accumulate`` (an MoE's inverse permutation; a row indexed
    twice gets one of its values, which one unspecified, as ATen's). With ``wrap_negative`` (torch's
    ``index_put``) a negative index counts from the end; nvFuser's ``index_put_accumulate`` takes none."""

    #: index values address whole rows of acc: a chunk of acc's rows cannot take them
    chunkable = False

    def __init__(self, fusion: Fusion, out: TensorView, acc: TensorView, index: TensorView, value: TensorView,
                 wrap_negative: bool = False, accumulate: bool = True) -> None:
        super().__init__(fusion, [acc, index, value], [out])
        self.wrap_negative = wrap_negative
        self.accumulate = accumulate

    @staticmethod
    def method_name(accumulate: bool) -> str:
        """The ``fd.ops`` method of the op (and its name in messages)."""
        return "index_put_accumulate" if accumulate else "index_put"

    @property
    def op_name(self) -> str:
        return IndexPutOp.method_name(self.accumulate)

    def evaluate(self, ctx: EvalContext, acc: torch.Tensor, index: torch.Tensor, value: torch.Tensor) -> list[Any]:
        acc_tv, index_tv, value_tv = self.defined_inputs
        want = (index.shape[0], *acc.shape[1:])
        if tuple(value.shape) != want:
            acc_tv, index_tv, value_tv = (self.tensor_input(k, as_defined=True) for k in range(3))
            raise ValueError(f"{self.op_name}: value {value_tv.short_name} has shape {tuple(value.shape)} but "
                             f"must be {want} (one row per index of {index_tv.short_name}, shaped like a row of "
                             f"{acc_tv.short_name})")
        # CUDA's accumulating index_put sorts the indices and reads without a bounds assert.
        check_indices(self.op_name, index, index_tv, acc.shape[0], acc_tv, 0,
                      allow_negative=self.wrap_negative, asserted_by_aten=not self.accumulate)
        return [torch.index_put(acc, (index,), value.to(acc.dtype), accumulate=self.accumulate)]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        """``acc`` maps onto the output axis by axis; ``value`` on every axis but the indexed one (a
        row of value is added into a row of the output, so they are one size: a kernel's launch
        checks it); ``index`` onto none."""
        out_ids = self.output.get_logical_domain()
        ids = producer.get_logical_domain(no_reductions=True)
        if producer is self.inputs[0]:
            return _positional(ids, out_ids)
        if producer is self.inputs[2]:
            return _positional(ids, out_ids, 0, 0)
        return {}

    def python_call(self) -> PythonCall:
        return PythonCall(self.op_name, tuple(self.inputs), {"wrap_negative": self.wrap_negative or None})

    def to_string(self, indent: int = 0) -> str:
        return call_string(self.output, self.op_name, self.inputs, "", indent)
