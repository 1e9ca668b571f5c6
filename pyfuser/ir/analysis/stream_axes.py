"""Which logical axis of a tensor a stream loop iterates over, and in which chunks.

A stream-parallel loop ID must be a logical ID or reached from one through outer outputs of
splits only, so every iteration covers one contiguous chunk of a logical axis (a view, no copy).
Exprs relate the axes of their operands through ``Expr.logical_map`` (producer logical ID ->
consumer logical ID); two tensors' stream axes *map* when that map takes one to the other and
they are chunked by the same chain of splits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from pyfuser.ir.analysis.fused_exprs import FusedExprs
from pyfuser.ir.analysis.sharding import is_resharding
from pyfuser.ir.base import Expr
from pyfuser.ir.iter_domain import IterDomain, ParallelType, Split
from pyfuser.ir.symbolic import SymConst, SymExpr
from pyfuser.ir.tensor_view import TensorView

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion

#: (factor, inner_split) of each split from the logical ID out to the stream ID.
SplitChain = tuple[tuple[SymExpr, bool], ...]


@dataclass(frozen=True, eq=False)
class StreamAxis:
    """``tv`` is produced (or read) in ``count`` chunks of ``chunk`` elements of ``logical``."""

    tv: TensorView
    logical: IterDomain
    loop_id: IterDomain  # the stream ID that names the loop
    chunk: SymExpr
    count: SymExpr
    splits: SplitChain
    #: the stream ID's ``swizzle1d``: iteration ``i`` takes chunk ``(i + p) % count`` on team position ``p``
    swizzle: ParallelType | None = None

    @property
    def dim(self) -> int:
        """Position of the chunked axis in the runtime tensor (logical order, reductions dropped)."""
        return _dim_of(self.tv, self.logical)

    def maps_to(self, other: StreamAxis) -> bool:
        """Whether this chunking can join ``other``'s loop: the same splits, and no swizzle other than the
        loop's (a chunking without one follows the loop's order, as nvFuser propagates a swizzle)."""
        return self.splits == other.splits and self.swizzle in (None, other.swizzle)

    def on(self, tv: TensorView, logical: IterDomain) -> StreamAxis:
        """The same chunking applied to ``logical`` of another tensor."""
        return StreamAxis(tv, logical, self.loop_id, self.chunk, self.count, self.splits, self.swizzle)

    def describe(self) -> str:
        """The scheduled stream ID, named on the tensor the user parallelized."""
        owner = self.loop_id.tensor or self.tv
        return f"{owner.short_name} axis {owner.loop_position(self.loop_id)} ({self.loop_id})"


def _dim_of(tv: TensorView, logical: IterDomain) -> int:
    for d, i in enumerate(tv.get_logical_domain(no_reductions=True)):
        if i is logical:
            return d
    raise ValueError(f"{tv.short_name}: {logical} is not a non-reduction logical ID of the tensor")


def walk_outer_splits(node: IterDomain, logical: Sequence[IterDomain]) -> tuple[IterDomain, list[Split]]:
    """Follow ``node`` back through the splits whose *outer* output it is, to a logical ID.

    Returns the ID reached and the splits crossed, outermost (the one producing ``node``) last. The
    walk stops early at a transform that is not such a split (a merge, an inner output): then the ID
    returned is not in ``logical`` and its ``definition`` says why.
    """
    logical_ids = {id(i) for i in logical}
    splits: list[Split] = []
    while id(node) not in logical_ids:
        definition = node.definition
        if not (isinstance(definition, Split) and definition.outer is node):
            break
        splits.append(definition)
        node = definition.in_id
    return node, splits[::-1]


def stream_axis_of(tv: TensorView) -> StreamAxis | None:
    """The stream chunking ``tv``'s loop domain asks for, or None (none, or a broadcast ID on stream: one
    chunk, the whole tensor); ValueError when it cannot be one."""
    loop = tv.get_loop_domain()
    streams = [i for i in loop if i.is_stream]
    if not streams:
        return None
    if len(streams) > 1:
        axes = ", ".join(f"axis {tv.loop_position(i)} ({i})" for i in streams)
        raise ValueError(f"{tv.short_name} has {len(streams)} stream-parallel loop IDs ({axes}); a tensor is "
                         "produced by one stream loop, so at most one loop ID may be parallelized on stream")
    sid = streams[0]
    where = f"{tv.short_name} axis {tv.loop_position(sid)} ({sid})"
    if sid.is_reduction():
        raise ValueError(f"{where} is a reduction ID parallelized on stream; a host loop cannot split a "
                         "reduction: parallelize an iteration axis instead")
    if sid.is_broadcast():  # one element: the loop would run once, on the whole tensor (nvFuser's S = 1)
        return None
    logical = tv.get_logical_domain()
    node, splits = walk_outer_splits(sid, logical)
    if all(node is not i for i in logical):
        how = "the inner output of a split" if isinstance(node.definition, Split) else "produced by a merge"
        raise ValueError(f"{where} is {how}; a stream loop iterates over contiguous chunks of one logical "
                         "axis: parallelize a logical ID or the outer output of a split")
    chunk: SymExpr = SymConst(1)
    for split in reversed(splits):
        chunk = split.inner.extent * chunk
    return StreamAxis(tv, node, sid, chunk, sid.extent, tuple((s.factor, s.inner_split) for s in splits), sid.swizzle)


def producer_id(expr: Expr | FusedExprs, producer: TensorView, consumer_id: IterDomain) -> IterDomain | None:
    """The non-broadcast logical ID of ``producer`` that ``expr`` maps to ``consumer_id``, if any."""
    for p, c in expr.logical_map(producer).items():
        if c is consumer_id and not p.is_broadcast() and not p.is_reduction():
            return p
    return None


def operand_id(expr: Expr | FusedExprs, position: int, consumer_id: IterDomain) -> IterDomain | None:
    """The non-broadcast logical ID of ``expr``'s input at ``position`` that ``expr`` maps to
    ``consumer_id``, if any. By position, not by tensor: ``matmul(x, x)`` chunked by rows reads
    the first ``x`` by rows and the second whole."""
    for p, c in expr.operand_map(position).items():
        if c is consumer_id and not p.is_broadcast() and not p.is_reduction():
            return p
    return None


def tensor_operands(expr: Expr | FusedExprs) -> list[tuple[int, TensorView]]:
    """``(position, tensor)`` of each tensor input of ``expr`` (a tensor read twice appears twice)."""
    return [(k, v) for k, v in enumerate(expr.inputs) if isinstance(v, TensorView)]


def expr_stream_axis(expr: Expr | FusedExprs, inherited: Mapping[int, StreamAxis] | None = None) -> StreamAxis | None:
    """The stream chunking of ``expr``'s first output: its own schedule, or propagated from a fusion
    input scheduled on stream (scheduling an input's axis puts its consumers in the loop), and from
    there on through consumers that have no schedule of their own (``inherited``: tensor id -> the
    chunking propagated to it, see ``inherited_stream_axes``). An inherited chunking that an expr
    cannot take (it reduces or drops the axis, cannot run chunk-wise, or has other chunks) stops
    there instead: the expr runs after the loop on whole tensors."""
    outputs = expr.tensor_outputs
    if not outputs:
        return None
    out = outputs[0]
    candidates: list[StreamAxis] = []
    for o in outputs:
        axis = stream_axis_of(o)
        if axis is not None:
            candidates.append(axis if o is out else _on_first_output(expr, axis))
    for p in dict.fromkeys(v for _, v in tensor_operands(expr)):
        if not p.is_fusion_input:
            continue
        axis = stream_axis_of(p)
        if axis is None:
            continue
        # A tensor read at several positions (``matmul(x, x)``) is chunked where the consumer keeps
        # the axis and read whole where it contracts it.
        targets = [expr.operand_map(k).get(axis.logical) for k, v in tensor_operands(expr) if v is p]
        kept = [t for t in targets if t is not None and not t.is_reduction()]
        if not kept:
            target = targets[0]
            what = f"the reduction ID {target}" if target is not None else "no axis"
            raise ValueError(f"{axis.describe()} is parallelized on stream, but its consumer {out.short_name} "
                             f"({expr.op_description}) maps it to {what}; only an axis the consumer keeps can "
                             "be iterated by a stream loop")
        candidates.extend(axis.on(out, t) for t in kept)
    if not candidates:
        return _inherited(expr, out, inherited or {})
    first = candidates[0]
    for other in candidates[1:]:
        if other.logical is not first.logical or not other.maps_to(first):
            raise ValueError(
                f"stream IDs of one expr neither map nor nest: {first.describe()} iterates "
                f"{first.count} chunks of {first.logical} but {other.describe()} iterates {other.count} chunks "
                f"of {other.logical} (computing {out.short_name} with {expr.op_description}); parallelize "
                "axes that the expr maps onto each other, split the same way")
    if not expr.chunkable:
        raise ValueError(f"{first.describe()} is parallelized on stream, but {out.short_name} is computed by "
                         f"{expr.op_description}, which cannot run chunk-wise (its attributes depend on the "
                         "full extent of each axis); move the stream axis to a tensor after it")
    return first


def _inherited(expr: Expr | FusedExprs, out: TensorView, inherited: Mapping[int, StreamAxis]) -> StreamAxis | None:
    """The chunking ``expr`` takes over from producers it was propagated to, if it can take one (a
    communication keeps the place the user gave it: it is never pulled into a loop)."""
    if not expr.chunkable or (isinstance(expr, Expr) and is_resharding(expr)):
        return None
    taken: StreamAxis | None = None
    for p in expr.tensor_inputs:
        axis = inherited.get(id(p))
        if axis is None:
            continue
        target = expr.logical_map(p).get(axis.logical)
        if target is None or target.is_reduction():
            return None
        candidate = axis.on(out, target)
        if taken is not None and (candidate.logical is not taken.logical or not candidate.maps_to(taken)):
            return None
        taken = candidate
    return taken


def inherited_stream_axes(exprs: Sequence[Expr]) -> dict[int, StreamAxis]:
    """Tensor id -> the chunking propagated to it from a stream-parallel fusion input, for every
    tensor without a stream schedule of its own that an input's chunking reaches (``exprs`` in
    topological order)."""
    inherited: dict[int, StreamAxis] = {}
    for expr in exprs:
        axis = expr_stream_axis(expr, inherited)  # also validates every expr's own schedule
        outputs = expr.tensor_outputs
        if axis is not None and stream_axis_of(outputs[0]) is None:
            inherited[id(outputs[0])] = axis
    return inherited


#: each fusion's ``inherited_stream_axes``, with the fusion's version it was computed at
_BY_FUSION: WeakKeyDictionary[Fusion, tuple[int, dict[int, StreamAxis]]] = WeakKeyDictionary()


def fusion_stream_axes(fusion: Fusion) -> Mapping[int, StreamAxis]:
    """``inherited_stream_axes`` of ``fusion``'s exprs, computed once per version of the fusion: the
    segmenter (which exprs a segment may join), the kernel stage (which kernels run on chunks) and
    stream lowering (which nodes a loop takes) read the same propagation."""
    cached = _BY_FUSION.get(fusion)
    if cached is None or cached[0] != fusion.version:
        cached = _BY_FUSION[fusion] = (fusion.version, inherited_stream_axes(fusion.exprs()))
    return cached[1]


def _on_first_output(expr: Expr | FusedExprs, axis: StreamAxis) -> StreamAxis:
    """A stream axis scheduled on a secondary output, moved to the same position of the first."""
    out = expr.tensor_outputs[0]
    ids = out.get_logical_domain(no_reductions=True)
    dim = axis.dim
    if dim >= len(ids) or ids[dim].extent != axis.logical.extent:
        raise ValueError(f"{axis.describe()} is parallelized on stream, but {out.short_name} (the first output "
                         f"of the same {expr.op_description}) has no matching axis {dim}")
    return axis.on(out, ids[dim])


def check_stream_schedules(fusion: Fusion) -> None:
    """Validate every stream schedule of the fusion as the user wrote it (before passes reorder
    loop domains), so errors name the axes the user parallelized."""
    for tv in fusion.tensors():
        for i in tv.get_loop_domain():
            if i.swizzle is not None and not i.is_stream:
                raise ValueError(f"{tv.short_name} axis {tv.loop_position(i)} ({i}) is swizzled (swizzle1d) but not "
                                 "parallelized on stream: the swizzle orders a stream loop's chunks by rank")
        stream_axis_of(tv)
    inherited_stream_axes(fusion.exprs())  # every expr's chunking, own or propagated
