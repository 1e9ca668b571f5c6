"""ID-DAG helpers for layout code: ancestry, allocation orders and replay.

A tensor's domains are frontiers of one DAG of Split / Merge transforms rooted at its logical
domain; these helpers answer the questions layout code keeps asking of that DAG: which logical
IDs an ID comes from, the logical order an allocation domain implies, and how to replay one
tensor's transforms onto another (a cache, a consumer). They live in ``ir`` because
``TensorView.cache_after`` needs them as much as the passes and schedulers do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING

from pyfuser.ir.iter_domain import IdTransform, IterDomain, Merge, Split
from pyfuser.ir.tensor_domain import no_reductions, transforms_between

if TYPE_CHECKING:
    from pyfuser.ir.tensor_view import TensorView


def logical_ancestors(node: IterDomain, logical: Sequence[IterDomain]) -> list[IterDomain]:
    """The logical IDs ``node`` is derived from, in logical order (``node`` itself if logical)."""
    logical_ids = {id(i) for i in logical}
    found: set[int] = set()
    stack = [node]
    while stack:
        cur = stack.pop()
        if id(cur) in logical_ids:
            found.add(id(cur))
        elif cur.definition is not None:
            stack.extend(cur.definition.inputs)
    return [i for i in logical if id(i) in found]


def logical_order(tv: TensorView) -> list[IterDomain]:
    """Logical IDs (reductions included) in the order the allocation domain lays them out.

    A split allocation ID (``[mesh, i0/d, i1]``) contributes its logical ancestor at its first
    appearance, so a sharded row-major tensor still reads as row-major.
    """
    logical = tv.get_logical_domain()
    order: list[IterDomain] = []
    seen: set[int] = set()
    for alloc_id in tv.get_allocation_domain():
        for anc in logical_ancestors(alloc_id, logical):
            if id(anc) not in seen:
                seen.add(id(anc))
                order.append(anc)
    order.extend(i for i in logical if id(i) not in seen)
    return order


def strided_layout_violation(tv: TensorView) -> tuple[IterDomain, IterDomain] | None:
    """Two allocation IDs whose order no strided (torch) tensor can have, or None.

    A dense tensor lays each logical ID out whole: the IDs split from it must be adjacent and in
    outer-to-inner order (``[i0, i1/2, 2]`` is row-major, ``[i0, 2, i1/2]`` or ``[i1/2, i0, 2]``
    is no stride pattern). Device-parallel IDs (a shard is one slice of them), broadcasts and
    reductions take no memory and are skipped; an ID made by a merge is not judged.
    """
    place = {id(i): k for k, i in enumerate(logical_order(tv))}
    keyed: list[tuple[tuple[int, tuple[int, ...]], IterDomain]] = []
    for alloc_id in tv.get_allocation_domain():
        if alloc_id.is_device_dim or alloc_id.is_reduction() or alloc_id.is_broadcast():
            continue
        path: list[int] = []
        cur = alloc_id
        while id(cur) not in place:
            split = cur.definition
            if not isinstance(split, Split):
                return None  # a merge (or no path): not judged
            path.append(0 if cur is split.outer else 1)
            cur = split.in_id
        keyed.append(((place[id(cur)], tuple(reversed(path))), alloc_id))
    for (ka, a), (kb, b) in pairwise(keyed):
        if ka > kb:
            return a, b
    return None


def is_permutation_of_logical(tv: TensorView, ids: Iterable[IterDomain]) -> bool:
    logical = {id(i) for i in tv.get_logical_domain()}
    ids = list(ids)
    return len(ids) == len(logical) and {id(i) for i in ids} == logical


def non_trivial(ids: Iterable[IterDomain]) -> list[IterDomain]:
    """IDs that occupy memory: neither reductions nor broadcasts."""
    return [i for i in no_reductions(ids) if not i.is_broadcast()]


def same_memory_order(a: Sequence[IterDomain], b: Sequence[IterDomain]) -> bool:
    """Whether two orders of the same IDs lay memory out identically (broadcasts and
    reductions take no memory, so their places do not matter)."""
    return [id(i) for i in non_trivial(a)] == [id(i) for i in non_trivial(b)]


def replay(transforms: Iterable[IdTransform], id_map: dict[int, IterDomain], owner: TensorView,
           partial: bool = False, copy_parallel: bool = True,
           forwards: Callable[[IterDomain], bool] | None = None) -> None:
    """Apply ``transforms`` (in topological order) to the IDs ``id_map`` maps their inputs to.

    ``id_map`` (``id(source ID) -> target ID``) is extended with the outputs; parallel types are
    copied so a replayed device split stays device-parallel. A transform with an input that has no
    counterpart is an error, or skipped with ``partial`` (e.g. a reduction ID a copy does not have).

    ``forwards``: which IDs of one position a merge may be forwarded through (``IdGraph.forwards``): a
    merge of such an ID the target lacks (a squeeze's output, a tensor of lower rank, a reduction of a
    broadcast the target's own broadcast does not map to) with one it has maps
    to the latter, as nvFuser's replay forwards it. The merge's extent is the other input's, so the
    transforms after it still apply and the target follows the source's loop nest instead of
    keeping an axis of its own.
    """
    for t in transforms:
        if forwards is not None and isinstance(t, Merge):
            absent = [i for i in t.inputs if id(i) not in id_map]
            if len(absent) == 1 and forwards(absent[0]):
                present = t.inner if absent[0] is t.outer else t.outer
                id_map[id(t.out)] = id_map[id(present)]
                continue
        if any(id(i) not in id_map for i in t.inputs):
            if partial:
                continue
            missing = ", ".join(str(i) for i in t.inputs if id(i) not in id_map)
            raise ValueError(f"{owner.short_name}: cannot replay '{t}': {missing} has no counterpart")
        if isinstance(t, Split):
            new: IdTransform = Split(id_map[id(t.in_id)], t.factor, t.inner_split)
        elif isinstance(t, Merge):
            new = Merge(id_map[id(t.outer)], id_map[id(t.inner)])
        else:  # pragma: no cover - only Split and Merge exist
            raise TypeError(f"cannot replay {type(t).__name__}")
        for old_out, new_out in zip(t.outputs, new.outputs, strict=True):
            if copy_parallel:
                new_out.parallel_type = old_out.parallel_type
            new_out.tensor = owner
            id_map[id(old_out)] = new_out


def replay_allocation(source: TensorView, target: TensorView,
                      logical_map: Mapping[IterDomain, IterDomain]) -> list[IterDomain]:
    """``source``'s allocation domain expressed on ``target``'s IDs (``logical_map``: source
    logical -> target logical). Target logical IDs without a source counterpart go last."""
    id_map = {id(s): t for s, t in logical_map.items()}
    alloc = source.get_allocation_domain()
    replay(transforms_between(source.get_logical_domain(), alloc), id_map, target, partial=True)
    result = [id_map[id(i)] for i in alloc if id(i) in id_map]
    covered = {id(i) for r in result for i in logical_ancestors(r, target.get_logical_domain())}
    result.extend(i for i in target.get_logical_domain() if id(i) not in covered)
    return result
