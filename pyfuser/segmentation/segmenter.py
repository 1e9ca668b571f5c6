"""The segmenter: which exprs share an executor (nvFuser's segmenter, greedy).

Start from one segment per expr: a resharding ``set`` is a communication, an expr a kernel
scheduler accepts is a kernel segment, anything else runs as ATen calls (``expr_eval``, with the
reason). Then merge neighbours: a producer and its consumer, then siblings that read the same
tensor, while a kernel scheduler accepts the union, no cycle forms through a third segment, and
both iterate the same stream loop (or none); then pointwise segments that each write single values
(a training step's per-layer counters: one launch, not one each). ``segment_set`` forces a
boundary. Segment boundary tensors are global memory, as is everything an ATen call or a
communication produces; tensors inside a kernel segment stay local.
"""

from __future__ import annotations

from pyfuser.ir.analysis.reshape import is_view_of
from pyfuser.ir.analysis.sharding import is_resharding, regroups_a_shard
from pyfuser.ir.analysis.stream_axes import StreamAxis, expr_stream_axis, fusion_stream_axes, producer_id
from pyfuser.ir.base import Expr
from pyfuser.ir.domain_replay import logical_order
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.ops import (
    BroadcastOp,
    ExpandOp,
    LoadStoreOp,
    LoadStoreOpType,
    PermuteOp,
    ReshapeOp,
    SliceOp,
    SqueezeOp,
)
from pyfuser.ir.tensor_view import MemoryType, TensorView, user_scheduled
from pyfuser.options import CompileOptions
from pyfuser.scheduler.registry import SchedulerType, SegmentView
from pyfuser.scheduler.schedulers import KERNEL_SCHEDULERS, is_kernel, kernel_scheduler_for
from pyfuser.segmentation.segmented_fusion import SegmentedFusion, SegmentedGroup, boundaries

#: Exprs that only change how an input is viewed: a segment of nothing else computes nothing.
INPUT_VIEW_OPS = (BroadcastOp, ExpandOp, SqueezeOp, SliceOp)
#: Ops that end a kernel as a view of its output where only ATen calls read them, and what each is.
_VIEWS_AT_KERNEL_ENDS: dict[type, str] = {PermuteOp: "a permute", ExpandOp: "an expand", BroadcastOp: "a broadcast"}

#: Why an ATen segment is not a kernel when kernels are off.
KERNELS_OFF = "generated kernels are off (they run on CUDA, or with _enable_options=['triton_interpreter'])"


class _Segmenter:
    def __init__(self, fusion: Fusion, kernels: bool) -> None:
        self.fusion = fusion
        self.kernels = kernels
        self.exprs = fusion.exprs()
        self.live = {id(e) for e in self.exprs}
        self.position = {id(e): k for k, e in enumerate(self.exprs)}
        self.group_of: dict[int, SegmentedGroup] = {}
        # Each expr's chunking as stream lowering will see it: its own, or propagated from a stream-
        # parallel input through consumers without a schedule of their own.
        inherited = fusion_stream_axes(fusion)
        self.stream: dict[int, StreamAxis | None] = {id(e): expr_stream_axis(e, inherited) for e in self.exprs}
        self.fixed: set[int] = set()  # groups that never merge (communications, segment_set)
        #: The kernel scheduler that takes each set of exprs tried (None: none does), by the exprs' ids
        #: in order: the graph does not change while it is segmented, so neither does a verdict, and a
        #: merge refused once is tried again (a producer read twice, the second round of merges).
        self.verdicts: dict[tuple[int, ...], SchedulerType | None] = {}
        self.readers: dict[int, tuple[SegmentedGroup, list[Expr]]] = {}
        #: The groups in an order where each comes after every group it reads from (kept through merges,
        #: ``_reorder``), and each group's place in it: a path to a group only passes groups before it,
        #: so a cycle check walks the groups between the two it merges, not everything downstream.
        self.order: list[SegmentedGroup | None] = []  # None: a place left by a merge
        self.rank: dict[int, int] = {}
        #: Whether groups holding a reshape may merge: only once every other merge was made (``run``).
        self.reshapes_merge = False

    def run(self) -> list[SegmentedGroup]:
        for expr in self.exprs:
            group = self._single(expr)
            self.group_of[id(expr)] = group
            self.rank[id(group)] = len(self.order)
            self.order.append(group)
        if self.kernels:
            self._merge_rounds()
            # Reshapes join kernels last: a reduction or normalization kernel computes only those of
            # kept axes (``ir/analysis/reshape.py``), so a reshape of a row merged early would pull its
            # producers and consumers away from the reduction kernels they join (a norm's input read
            # through a reshape). Merged after, a reshape joins the kernels left on either side of it:
            # a pointwise one, or a reduction's where it regroups kept axes (a loss's gradient over
            # [B * S, V] added to a [B, S, V] one).
            self.reshapes_merge = True
            self._merge_rounds()
            self._merge_horizontally()
            self._views_read_by_aten_as_views()
            self._input_broadcasts_as_views()
            self._reshapes_as_views()
        groups = self._topological(list(dict.fromkeys(self.group_of[id(e)] for e in self.exprs)))
        for group in groups:
            group.inputs, group.outputs = boundaries(self.fusion, group.exprs, self.live)
        return groups

    def _merge_rounds(self) -> None:
        self._merge_producers_into_consumers()
        self._merge_siblings()
        # Siblings merged may now take their producer, which neither took alone (a value that two
        # slices of a rotary backward read: with one of them it had two outputs of other axes).
        count = len(set(map(id, self.group_of.values())))
        self._merge_producers_into_consumers()
        if len(set(map(id, self.group_of.values()))) < count:
            self._merge_siblings()

    def _topological(self, groups: list[SegmentedGroup]) -> list[SegmentedGroup]:
        """Groups in an order where each runs after the groups it reads from (merging can move a
        group's consumer ahead of another group it also reads); ties keep expr order."""
        indegree = {id(g): 0 for g in groups}
        for g in groups:
            for c in self._consumers(g):
                indegree[id(c)] += 1
        ready = [g for g in groups if indegree[id(g)] == 0]
        order: list[SegmentedGroup] = []
        while ready:
            ready.sort(key=lambda g: min(self.position[id(e)] for e in g.exprs))
            g = ready.pop(0)
            order.append(g)
            for c in self._consumers(g):
                indegree[id(c)] -= 1
                if indegree[id(c)] == 0:
                    ready.append(c)
        return order

    # --- one expr -------------------------------------------------------------------------------------
    def _single(self, expr: Expr) -> SegmentedGroup:
        if is_resharding(expr):
            group = SegmentedGroup([expr], SchedulerType.communication)
            self.fixed.add(id(group))
            return group
        if isinstance(expr, LoadStoreOp) and expr.kind is LoadStoreOpType.segment_set:
            group = self._scheduled([expr]) or SegmentedGroup([expr], SchedulerType.expr_eval,
                                                              reason="segment_set (a copy)")
            self.fixed.add(id(group))
            return group
        return self._scheduled([expr]) or SegmentedGroup([expr], SchedulerType.expr_eval,
                                                         reason=self._rejection([expr]))

    def _view(self, exprs: list[Expr]) -> SegmentView:
        inputs, outputs = boundaries(self.fusion, exprs, self.live)
        return SegmentView(exprs, inputs, outputs)

    def _scheduled(self, exprs: list[Expr]) -> SegmentedGroup | None:
        """A kernel segment of ``exprs`` if a kernel scheduler accepts them."""
        if not self.kernels or not self._one_mesh(exprs):
            return None
        if self._selects_an_axis(exprs) or any(map(regroups_a_shard, exprs)):
            return None
        key = tuple(map(id, exprs))
        if key not in self.verdicts:
            view = self._view(exprs)
            self.verdicts[key] = kernel_scheduler_for(view)
        verdict = self.verdicts[key]
        return None if verdict is None else SegmentedGroup(exprs, verdict)

    def _selects_an_axis(self, exprs: list[Expr]) -> bool:
        """Whether a stream loop runs ``exprs`` one index of an unsplit axis at a time: its chunks
        drop that axis, which a kernel compiled for the whole tensors' rank cannot take."""
        return any((axis := self.stream[id(e)]) is not None and not axis.splits for e in exprs)

    def _rejection(self, exprs: list[Expr]) -> str:
        if not self.kernels:
            return KERNELS_OFF
        if self._selects_an_axis(exprs):
            return ("in a stream loop over single indices of an unsplit axis (chunks drop the axis); split the "
                    "axis (outer_split) for kernels in the loop")
        if any(map(regroups_a_shard, exprs)):
            return "a reshape of shards that splits or merges a sharded axis (its shard sizes are the op's, not a tensor's)"
        view = self._view(exprs)
        reasons = [f"{s.type.name}: {s.can_schedule(view)[1]}" for s in KERNEL_SCHEDULERS]
        return "; ".join(reasons)

    @staticmethod
    def _one_mesh(exprs: list[Expr]) -> bool:
        meshes = {tv.device_mesh for e in exprs for tv in (*e.tensor_inputs, *e.tensor_outputs)}
        return len(meshes) <= 1

    def _views_read_by_aten_as_views(self) -> None:
        """A permute at the end of a kernel whose result only ATen calls read (a matmul of a
        transpose, as every weight gradient of a backward pass) is a view of the kernel's output,
        not a transposed copy: it leaves the kernel as an ATen call of its own. So is a permute that
        is a kernel of its own (a transpose kernel copying a tensor for a matmul that reads either
        layout). So are an expand and a broadcast: an ATen call reads stride-0 axes as they are
        (DeBERTa's relative-position gathers: the kernel wrote each [1, S, S] index expanded to a
        [batch x heads, S, S] int64 tensor). Reshapes the permute reads through, each a view of its
        operand's layout, leave with it, and so do the kernel's other reshapes that only ATen calls read
        (a loss gradient viewed [tokens, vocabulary], transposed for the head's weight gradient and viewed
        again for the input gradient: a reduction kernel returns no reshape of a value it also returns,
        so the kernel wrote the gradient twice)."""
        outputs = {id(v) for v in self.fusion.outputs()}
        for expr in self.exprs:
            group = self.group_of[id(expr)]
            what = _VIEWS_AT_KERNEL_ENDS.get(type(expr))
            if what is None or not self._mergeable(group) or not is_kernel(group.scheduler):
                continue
            out = expr.outputs[0]
            readers = [self.group_of[id(u)] for u in out.uses if id(u) in self.live]
            if id(out) in outputs or not readers or any(is_kernel(g.scheduler) for g in readers):
                continue
            reason = f"{what} only ATen calls read: a view"
            peeled = self._with_reshapes_read(expr, group, outputs)
            rest = [e for e in group.exprs if e not in peeled]
            # the kernel's other reshapes that only ATen calls read: views of the value it then writes once
            reshapes = [e for e in rest if self._reshape_only_aten_reads(e, group, peeled, outputs)]
            rest = [e for e in rest if e not in reshapes]
            if rest:
                remaining = self._scheduled(rest)
                if remaining is None:
                    continue
                for e in rest:
                    self.group_of[id(e)] = remaining
            self._run_as_view(peeled, reason)
            for r in reshapes:
                self._run_as_view([r], "a reshape only ATen calls read: a view")

    def _run_as_view(self, exprs: list[Expr], reason: str) -> None:
        """``exprs`` one ATen segment (views: no kernel writes them)."""
        view = SegmentedGroup(exprs, SchedulerType.expr_eval, reason=reason)
        for e in exprs:
            self.group_of[id(e)] = view

    def _reshape_only_aten_reads(self, expr: Expr, group: SegmentedGroup, peeled: list[Expr], outputs: set[int]) -> bool:
        """Whether ``expr`` (of ``group``) is a reshape, a view of its operand's layout and no fusion output,
        whose result only ATen calls (or the views ``peeled``) read."""
        if not isinstance(expr, ReshapeOp) or id(expr.outputs[0]) in outputs:
            return False
        uses = [u for u in expr.outputs[0].uses if id(u) in self.live]
        if not uses or any(u not in peeled and (self.group_of[id(u)] is group or is_kernel(self.group_of[id(u)].scheduler))
                           for u in uses):
            return False
        return is_view_of(expr, logical_order(expr.tensor_inputs[0]))

    def _with_reshapes_read(self, expr: Expr, group: SegmentedGroup, outputs: set[int]) -> list[Expr]:
        """``expr`` and the chain of ``group``'s reshapes it reads through that only ATen calls and the
        chain read (``_reshape_only_aten_reads``), in expr order."""
        chain = [expr]
        members = {id(e) for e in group.exprs}
        while ((producer := chain[0].tensor_inputs[0].definition) is not None and id(producer) in members
               and self._reshape_only_aten_reads(producer, group, chain, outputs)):
            chain.insert(0, producer)
        return chain

    def _is_input_broadcast(self, group: SegmentedGroup) -> bool:
        """Whether ``group`` only broadcasts, expands, squeezes or slices fusion inputs, as defined (a
        schedule the user gave them is kept as a kernel): it computes nothing."""
        inside = {id(t) for e in group.exprs for t in e.outputs}
        return all(isinstance(e, INPUT_VIEW_OPS) and all(v.is_fusion_input or id(v) in inside for v in e.inputs)
                   and not any(user_scheduled(t) for t in e.tensor_outputs) for e in group.exprs)

    def _input_broadcasts_as_views(self) -> None:
        """A broadcast of a fusion input that no kernel took in as a producer is read by ATen calls or
        returned: as a kernel it would copy the input out for nothing (a view is free), and the
        kernel it joined as a sibling would have to write it although its grid, shaped by the other
        outputs, does not cover it (no program at all when they are empty)."""
        for group in dict.fromkeys(self.group_of[id(e)] for e in self.exprs):
            if self._mergeable(group) and self._is_input_broadcast(group):
                view = SegmentedGroup(group.exprs, SchedulerType.expr_eval,
                                      reason="a broadcast of a fusion input that no kernel reads: a view")
                for e in group.exprs:
                    self.group_of[id(e)] = view

    def _reshapes_as_views(self) -> None:
        """A kernel that computes nothing but reshapes, each a view of its operand's layout (a kernel's
        result reshaped for a matmul, a reshape of a dense input), would copy what ATen views for free:
        it is an ATen call. A reshape ATen would copy (merging axes a permute or an expand separated in
        memory) stays a kernel, one that writes the new shape in one pass."""
        for group in dict.fromkeys(self.group_of[id(e)] for e in self.exprs):
            if self._mergeable(group) and all(isinstance(e, ReshapeOp) and is_view_of(e, logical_order(e.tensor_inputs[0]))
                                              for e in group.exprs):
                view = SegmentedGroup(group.exprs, SchedulerType.expr_eval,
                                      reason="a reshape its operand's layout makes a view")
                for e in group.exprs:
                    self.group_of[id(e)] = view

    # --- merging --------------------------------------------------------------------------------------
    def _merge_producers_into_consumers(self) -> None:
        for expr in self.exprs:
            group = self.group_of[id(expr)]
            if not self._mergeable(group):
                continue
            for tv in expr.tensor_inputs:
                producer_expr = tv.definition
                if producer_expr is None or id(producer_expr) not in self.live:
                    continue
                producer = self.group_of[id(producer_expr)]
                if producer is group or not self._mergeable(producer):
                    continue
                if not self._same_stream_loop(producer_expr, expr, tv):
                    continue
                merged = self._try_merge(producer, group)
                if merged is not None:
                    group = merged

    def _merge_siblings(self) -> None:
        for tv in self.fusion.tensors():
            readers = [self.group_of[id(e)] for e in tv.uses if id(e) in self.live]
            # A broadcast of an input joins the kernels that read it (as a producer), never a sibling.
            readers = [g for g in dict.fromkeys(readers) if self._mergeable(g) and not self._is_input_broadcast(g)]
            while len(readers) > 1:
                first = readers.pop(0)
                for other in list(readers):
                    if self.stream[id(first.exprs[0])] is not None or self.stream[id(other.exprs[0])] is not None:
                        continue
                    merged = self._try_merge(first, other)
                    if merged is not None:
                        readers.remove(other)
                        first = merged

    def _merge_horizontally(self) -> None:
        """Pointwise segments outside stream loops that write only single values (0-dim or all-size-1
        tensors: a training step's per-layer counters, ``num_batches_tracked + 1``) are merged into one
        kernel where no path joins them through a third segment: 53 of them in a ResNet-50 step were
        53 launches. (Segments that share nothing but a larger shape stay apart: a pointwise kernel
        iterates one output's axes, and unrelated inputs' axes do not map onto them.)"""
        scalars = [g for g in dict.fromkeys(self.group_of[id(e)] for e in self.exprs)
                   if g.scheduler is SchedulerType.pointwise and self._mergeable(g) and self._writes_single_values(g)
                   and all(self.stream[id(e)] is None for e in g.exprs)]
        if scalars:
            merged = scalars[0]
            for other in scalars[1:]:
                merged = self._try_merge(merged, other) or other

    def _writes_single_values(self, group: SegmentedGroup) -> bool:
        """Whether every tensor ``group`` writes for another segment or as a fusion output has only
        constant extents of 1."""
        inside = {id(e) for e in group.exprs}
        for e in group.exprs:
            for tv in e.tensor_outputs:
                if not tv.is_fusion_output and all(id(u) in inside for u in tv.uses if id(u) in self.live):
                    continue
                if not all(i.extent.is_const and i.extent.value == 1 for i in tv.get_logical_domain(no_reductions=True)):
                    return False
        return True

    def _mergeable(self, group: SegmentedGroup) -> bool:
        return is_kernel(group.scheduler) and id(group) not in self.fixed

    def _same_stream_loop(self, producer_expr: Expr, consumer_expr: Expr, tv: TensorView) -> bool:
        """Both exprs run outside stream loops, or in one loop chunking ``tv`` the same way."""
        a, b = self.stream[id(producer_expr)], self.stream[id(consumer_expr)]
        if a is None or b is None:
            return a is None and b is None
        if not a.maps_to(b):
            return False
        return producer_id(consumer_expr, tv, b.logical) is a.logical

    def _try_merge(self, a: SegmentedGroup, b: SegmentedGroup) -> SegmentedGroup | None:
        if not self.reshapes_merge and any(isinstance(e, ReshapeOp) for e in (*a.exprs, *b.exprs)):
            return None
        if self._creates_cycle(a, b):
            return None
        exprs = sorted([*a.exprs, *b.exprs], key=lambda e: self.position[id(e)])
        merged = self._scheduled(exprs)
        if merged is None:
            return None
        self._reorder(a, b, merged)
        for e in exprs:
            self.group_of[id(e)] = merged
        return merged

    def _reorder(self, a: SegmentedGroup, b: SegmentedGroup, merged: SegmentedGroup) -> None:
        """Put ``merged`` in the order in place of ``a`` and ``b`` (no path joins them through a third
        group): the groups between them that the earlier one leads to move after it, the others stay
        before it (the later one's producers among them), which keeps every edge pointing forward."""
        lo, hi = sorted((self.rank[id(a)], self.rank[id(b)]))
        first = a if self.rank[id(a)] == lo else b
        after = {id(g) for g in self._reachable(first, hi)}
        between = [g for g in self.order[lo + 1:hi] if g is not None]
        # The places of the groups between keep their count; one place of the two merged is left empty.
        moved = [None, *(g for g in between if id(g) not in after), merged, *(g for g in between if id(g) in after)]
        self.order[lo:lo + len(moved)] = moved
        self.order[lo + len(moved):hi + 1] = [None] * (hi + 1 - lo - len(moved))
        del self.rank[id(a)], self.rank[id(b)]
        for k, g in enumerate(moved, lo):
            if g is not None:
                self.rank[id(g)] = k

    def _creates_cycle(self, a: SegmentedGroup, b: SegmentedGroup) -> bool:
        """Whether a path leads from one group to the other through a third group."""
        return self._reaches_through_other(a, b) or self._reaches_through_other(b, a)

    def _reaches_through_other(self, src: SegmentedGroup, dst: SegmentedGroup) -> bool:
        return any(dst in self._consumers(g) for g in self._reachable(src, self.rank[id(dst)], dst))

    def _reachable(self, src: SegmentedGroup, before: int, skip: SegmentedGroup | None = None,
                   ) -> list[SegmentedGroup]:
        """The groups placed before ``before`` that a path from ``src`` leads to, except through ``skip``."""
        stack = [g for g in self._consumers(src) if g is not skip and self.rank[id(g)] < before]
        seen = {id(g) for g in stack}
        found = list(stack)
        while stack:
            for nxt in self._consumers(stack.pop()):
                if id(nxt) not in seen and nxt is not skip and self.rank[id(nxt)] < before:
                    seen.add(id(nxt))
                    stack.append(nxt)
                    found.append(nxt)
        return found

    def _consumers(self, group: SegmentedGroup) -> list[SegmentedGroup]:
        result: dict[int, SegmentedGroup] = {}
        for use in self._readers(group):
            g = self.group_of[id(use)]
            if g is not group:
                result[id(g)] = g
        return list(result.values())

    def _readers(self, group: SegmentedGroup) -> list[Expr]:
        """The live exprs outside ``group`` that read what it computes: fixed for a group (its exprs do
        not change, a merge makes a new group), so found once while cycle checks walk it many times.
        The group is kept beside them, so its id names no other group while the segmenter lives."""
        cached = self.readers.get(id(group))
        if cached is None:
            members = {id(e) for e in group.exprs}
            uses = {id(u): u for e in group.exprs for tv in e.outputs for u in tv.uses
                    if id(u) in self.live and id(u) not in members}
            cached = self.readers[id(group)] = (group, list(uses.values()))
        return cached[1]


def kernels_enabled(options: CompileOptions) -> bool:
    """Generated kernels run on CUDA unless disabled, and on CPU through Triton's interpreter when asked."""
    return options.kernels


def segment_fusion(fusion: Fusion, options: CompileOptions) -> SegmentedFusion:
    groups = _Segmenter(fusion, kernels_enabled(options)).run()
    for group in groups:
        materialized = group.outputs if is_kernel(group.scheduler) else \
            [t for e in group.exprs for t in e.tensor_outputs]
        for tv in materialized:
            tv.memory_type = MemoryType.Global
    return SegmentedFusion(fusion, groups)
