"""Scheduling tools shared by the schedulers and offered to users (nvFuser's ``schedule`` module):
propagate a reference tensor's loop transforms and parallel types to the rest of a fusion, and
set compute-at (inlining) positions.

They only transform loop domains, with the same public API a user calls; the code generator reads
the result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyfuser.ir.analysis.id_graph import IdGraph
from pyfuser.ir.analysis.reshape import Key, Regroupings, reshape_regroupings
from pyfuser.ir.domain_replay import logical_ancestors, replay
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import IdTransform, IterDomain, Merge, ParallelType
from pyfuser.ir.ops.indexing import read_by_index_only
from pyfuser.ir.tensor_domain import transforms_between
from pyfuser.ir.tensor_view import TensorView

#: Parallel types a kernel loop keeps; host loops and devices are scheduled by preseg.
KERNEL_PARALLEL_TYPES = frozenset({ParallelType.grid_x, ParallelType.grid_y, ParallelType.grid_z,
                                   ParallelType.block_x, ParallelType.block_y, ParallelType.block_z,
                                   ParallelType.vectorize, ParallelType.unroll, ParallelType.unswitch})


def _targets(ref: TensorView, tvs: Sequence[TensorView] | None) -> list[TensorView]:
    """``tvs``, or every tensor of ``ref``'s fusion but the lookup tensors that index_select / gather /
    embedding alone read (addressed at indexed positions: the axis they index has no counterpart in
    any loop, so replaying a schedule on them would leave it a loop of its own)."""
    fusion = ref.fusion
    if tvs is None:
        exprs = fusion.exprs()
        chosen = [tv for tv in fusion.tensors() if not (tv.is_fusion_input and read_by_index_only(tv, exprs))]
    else:
        chosen = list(tvs)
    for tv in chosen:
        if not isinstance(tv, TensorView) or tv.fusion is not fusion:
            raise ValueError(f"{tv} is not a tensor of the fusion of {ref.short_name}")
    return [tv for tv in chosen if tv is not ref]


def transform_like(ref: TensorView, tvs: Sequence[TensorView] | None = None) -> None:
    """Replay ``ref``'s loop transforms on ``tvs`` (default: every other tensor of the fusion).

    Each target's logical IDs are matched with ``ref``'s through the exprs' logical maps (a
    broadcast ID matches the ID it is broadcast to); a transform whose inputs have no counterpart
    in the target is skipped, and the target's unmatched IDs go after the replayed ones. Parallel
    types are not copied (``parallelize_like`` does that).

    Across reshapes (``ir/analysis/reshape.py``), an ID of ``ref`` (logical, or a merge of its
    transforms) that a reshape's group of axes regroups matches the target's axis of that group, or the
    target's axes of the group merged row-major: ``[B * S, rV]``'s ``B * S`` is ``merge(B, S)`` of a
    ``[B, S, V]`` it was reshaped into, and the replay goes on from there.
    """
    fusion = ref.fusion
    graph = IdGraph(fusion.tensors(), fusion.exprs(), map_broadcast=True, through_transforms=False)
    regrouped = reshape_regroupings(fusion.exprs(), graph.class_of, graph.forwards)
    transforms = transforms_between(ref.get_logical_domain(), ref.get_loop_domain())
    keyed = [(r, graph.key(r)) for r in (*ref.get_logical_domain(), *(t.out for t in transforms if isinstance(t, Merge)))]
    keyed = [(r, key) for r, key in keyed if key in regrouped]
    for tv in _targets(ref, tvs):
        id_map: dict[int, IterDomain] = {}
        taken: set[int] = set()
        for r in ref.get_logical_domain():
            match = next((i for i in tv.get_logical_domain() if id(i) not in taken and graph.mapped(r, i)), None)
            if match is not None:
                id_map[id(r)] = match
                taken.add(id(match))
        for r, key in keyed:
            if id(r) not in id_map and not any(id(a) in id_map for a in logical_ancestors(r, ref.get_logical_domain())):
                found = _regrouped(tv, key, regrouped, graph, taken)
                if found is not None:
                    id_map[id(r)] = found
        replay(transforms, id_map, tv, partial=True, copy_parallel=False, forwards=graph.forwards)
        loop = [id_map[id(i)] for i in ref.get_loop_domain() if id(i) in id_map]
        loop += _unused_pieces(transforms, id_map, loop)
        covered = {id(a) for i in loop for a in logical_ancestors(i, tv.get_logical_domain())}
        loop += [i for i in tv.get_logical_domain() if id(i) not in covered]
        tv.set_loop_domain(loop)


def one_per_class(candidates: Sequence[IterDomain], classes: Sequence[int],
                  class_of: Callable[[IterDomain], int]) -> list[IterDomain] | None:
    """A distinct ID of ``candidates`` for each of ``classes``, in their order (None where one has none)."""
    chosen: list[IterDomain] = []
    for c in classes:
        match = next((i for i in candidates if class_of(i) == c and all(i is not j for j in chosen)), None)
        if match is None:
            return None
        chosen.append(match)
    return chosen


def _regrouped(tv: TensorView, key: Key, regrouped: Regroupings, graph: IdGraph, taken: set[int]) -> IterDomain | None:
    """``tv``'s ID of an iteration equivalent to ``key`` through reshapes: a logical ID of it, or
    ``tv``'s logical IDs of an equivalent group merged outer first (the merges made here); ``taken``
    (IDs already matched) grows by the IDs used."""
    options = sorted((k for k in regrouped.keys() if regrouped.same(key, k)), key=len)
    free = [i for i in tv.get_logical_domain() if id(i) not in taken and not i.is_reduction()]
    for option in options:
        chosen = one_per_class(free, option, graph.class_of)
        if chosen is not None:
            merged = chosen[0]
            for inner in chosen[1:]:
                merged = Merge(merged, inner).out
                merged.tensor = tv
            taken.update(id(i) for i in chosen)
            return merged
    return None


def _unused_pieces(transforms: Sequence[IdTransform], id_map: dict[int, IterDomain],
                   loop: list[IterDomain]) -> list[IterDomain]:
    """Outputs of replayed transforms that no later replayed transform consumes and that are not in
    ``loop``: the outer piece of a split whose merge with an ID the target lacks was skipped (a 1-D
    tensor under a 2-D tiling) must stay in the target's loop domain, or it would not cover its axis."""
    consumed: set[int] = set()
    produced: list[IterDomain] = []
    for t in transforms:
        if all(id(o) in id_map for o in t.outputs) and all(id(i) in id_map for i in t.inputs):
            consumed.update(id(id_map[id(i)]) for i in t.inputs)
            produced += [id_map[id(o)] for o in t.outputs]
    in_loop = {id(i) for i in loop}
    return [i for i in dict.fromkeys(produced) if id(i) not in consumed and id(i) not in in_loop]


def parallelize_like(ref: TensorView, tvs: Sequence[TensorView] | None = None,
                     parallel_types: Sequence[ParallelType] | None = None) -> None:
    """Give every loop ID of ``tvs`` mapped to a loop ID of ``ref`` that ID's parallel type (only
    kernel parallel types, or those listed). Two IDs of one tensor can map to one class (``x * x.t()``:
    both axes have ``x``'s extent): the k-th of them takes the k-th loop ID of ``ref`` mapped to it,
    as the code generator indexes them, so no parallel type binds two IDs of a tensor."""
    fusion = ref.fusion
    graph = IdGraph(fusion.tensors(), fusion.exprs(), map_broadcast=True)
    allowed = frozenset(parallel_types) if parallel_types is not None else KERNEL_PARALLEL_TYPES
    ref_loop = ref.get_loop_domain()
    for tv in _targets(ref, tvs):
        taken: set[int] = set()
        for i in tv.get_loop_domain():
            match = next((r for r in ref_loop if id(r) not in taken and graph.mapped(r, i)), None)
            if match is None:
                continue
            taken.add(id(match))
            if match.parallel_type in allowed and i.parallel_type is not match.parallel_type:
                i.parallelize(match.parallel_type)


def set_compute_at(tv: TensorView, position: int) -> TensorView:
    """Record that ``tv``'s loop IDs left of ``position`` are shared with its consumer's loop nest."""
    if isinstance(position, bool) or not isinstance(position, int):
        raise TypeError(f"{tv.short_name}: compute-at position must be an int, got {type(position).__name__}")
    n = len(tv.get_loop_domain())
    if not 0 <= position <= n:
        raise ValueError(f"{tv.short_name}: compute-at position {position} is out of range for a loop domain of "
                         f"{n} IDs (valid: 0..{n})")
    tv.compute_at_pos = position
    tv.fusion.mark_changed()
    return tv


def inline_at(tv: TensorView, pos: int = -1, tvs: Sequence[TensorView] | None = None) -> None:
    """Compute ``tvs`` (default: every producer computed in a kernel) inside ``tv``'s first ``pos``
    loops (``-1``: all of them), as far as their loop IDs map onto ``tv``'s."""
    fusion = tv.fusion
    n = len(tv.get_loop_domain())
    depth = n if pos == -1 else pos
    if not 0 <= depth <= n:
        raise ValueError(f"{tv.short_name}: inline position {pos} is out of range for a loop domain of {n} IDs")
    graph = IdGraph(fusion.tensors(), fusion.exprs(), map_broadcast=True)
    ref_loop = tv.get_loop_domain()[:depth]
    for other in (_computed(fusion) if tvs is None else list(tvs)):
        if other is tv:
            continue
        shared = 0
        for i, r in zip(other.get_loop_domain(), ref_loop, strict=False):
            if not graph.mapped(i, r):
                break
            shared += 1
        set_compute_at(other, shared)


def inline_most(tvs: Sequence[TensorView] | None = None, fusion: Fusion | None = None) -> None:
    """Inline every tensor computed in a kernel as deep as its consumers' loops allow: its compute-at
    position is the longest prefix of its loop IDs mapped to each consumer's (nvFuser's ``inlineMost``)."""
    if fusion is None:
        if not tvs:
            raise ValueError("inline_most needs the tensors to inline or the fusion they belong to")
        fusion = tvs[0].fusion
    graph = IdGraph(fusion.tensors(), fusion.exprs(), map_broadcast=True)
    for tv in (_computed(fusion) if tvs is None else list(tvs)):
        consumers = [c for use in tv.uses for c in use.tensor_outputs]
        if not consumers:
            continue
        depth = len(tv.get_loop_domain())
        for c in consumers:
            shared = 0
            for i, r in zip(tv.get_loop_domain(), c.get_loop_domain(), strict=False):
                if not graph.mapped(i, r):
                    break
                shared += 1
            depth = min(depth, shared)
        set_compute_at(tv, depth)


def _computed(fusion: Fusion) -> list[TensorView]:
    """Tensors a kernel computes: neither inputs nor outputs of the fusion."""
    return [tv for tv in fusion.tensors() if not tv.is_fusion_input and not tv.is_fusion_output]


def reset_schedule(fusion: Fusion) -> None:
    """Every tensor's loop domain back to its logical domain, serial, not inlined (to schedule a
    fusion cut out of a scheduled one afresh)."""
    for tv in fusion.tensors():
        d = tv.domain()
        d.loop = list(d.logical)
        for i in d.logical:
            i.parallel_type = ParallelType.serial
        tv.compute_at_pos = 0
    fusion.mark_changed()
