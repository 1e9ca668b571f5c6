"""Caching fusion inputs and giving on-chip caches an allocation that matches their loop (docs/cached_inputs.md).

The rule: a global-memory cache (transpose, matmul staging) keeps its input's allocation; a
local or shared-memory cache never keeps a copy of a global input's allocation once its loop
domain is scheduled. Its allocation is derived from the loop domain by replaying the loop
transforms onto its stride order (``derive_allocation_from_loop``), so the IDs left of the
compute-at position are IDs of the allocation domain the allocator can leave out.
"""

from __future__ import annotations

from pyfuser.ir.domain_replay import logical_ancestors, logical_order
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import IterDomain, ParallelType
from pyfuser.ir.ops.indexing import IndexedRead
from pyfuser.ir.tensor_view import MemoryType, TensorView

#: Parallel types whose loop IDs an on-chip buffer of each memory type does not materialize:
#: every block has its own shared memory, every thread its own registers.
_NOT_ALLOCATED: dict[MemoryType, frozenset[ParallelType]] = {
    MemoryType.Shared: frozenset({ParallelType.grid_x, ParallelType.grid_y, ParallelType.grid_z}),
    MemoryType.Local: frozenset({ParallelType.grid_x, ParallelType.grid_y, ParallelType.grid_z,
                                 ParallelType.block_x, ParallelType.block_y, ParallelType.block_z}),
}


def cache_inputs(fusion: Fusion, propagate_allocation_domain: bool,
                 memory_type: MemoryType = MemoryType.Local) -> list[TensorView]:
    """``cache_after`` every used tensor input but the lookup tensors of index_select / gather /
    embedding (read at indexed positions from global memory, never iterated: nvFuser caches none
    either); returns the caches in input order.

    ``propagate_allocation_domain``: the caches start with their input's allocation (as hints).
    Global caches keep it; on-chip caches must go through ``derive_allocation_from_loop`` once
    scheduled. Without it the caches start row-major (normalization and reduction schedulers).
    """
    caches = []
    looked_up = {id(e.lookup) for e in fusion.exprs() if isinstance(e, IndexedRead)}
    for tv in fusion.inputs():
        if isinstance(tv, TensorView) and not tv.is_cpu and tv.uses and id(tv) not in looked_up:
            caches.append(tv.cache_after(memory_type, propagate_allocation_domain))
    return caches


def derive_allocation_from_loop(tv: TensorView) -> TensorView:
    """Set an on-chip tensor's allocation to its stride order with each logical ID replaced, in
    place, by the loop IDs it was transformed into (in loop order).

    When a loop ID mixes logical IDs (a merge), stride order and loop cannot both be honoured;
    the buffer is private to the kernel, so it then follows the loop domain.
    """
    if tv.memory_type is MemoryType.Global:
        raise ValueError(f"{tv.short_name} is in global memory: its allocation is its input's or a requirement, "
                         "not derived from its loop domain")
    logical = tv.get_logical_domain()
    loop = tv.get_loop_domain()
    groups: dict[int, list[IterDomain]] = {id(i): [] for i in logical}
    separable = True
    for loop_id in loop:
        ancestors = logical_ancestors(loop_id, logical)
        if len(ancestors) != 1:
            separable = False
            break
        groups[id(ancestors[0])].append(loop_id)
    ids = [i for root in logical_order(tv) for i in groups[id(root)]] if separable else loop
    tv.set_allocation_domain(ids, True, hint=True)
    return tv


def allocated_ids(tv: TensorView) -> list[IterDomain]:
    """The allocation IDs a buffer for ``tv`` materializes.

    Global: all but device-parallel IDs (a sharded axis takes one shard per rank; a Stream ID is
    allocated whole). On-chip: the allocation IDs right of the compute-at position, minus IDs
    bound to parallel types that give each block / thread its own buffer.
    """
    alloc = tv.get_allocation_domain()
    if tv.memory_type is MemoryType.Global:
        return [i for i in alloc if not i.is_device_dim]
    check_allocation_matches_loop(tv)
    outer = {id(i) for i in tv.get_loop_domain()[:tv.compute_at_pos]}
    skip = _NOT_ALLOCATED[tv.memory_type]
    return [i for i in alloc if id(i) not in outer and i.parallel_type not in skip and not i.is_device_dim]


def check_allocation_matches_loop(tv: TensorView) -> None:
    """An on-chip tensor's allocation must hold the loop IDs left of its compute-at position.

    Otherwise the allocation is stale: typically a global input's allocation copied to a cache
    whose loop was split afterwards, which is the layout docs/cached_inputs.md found allocated wrongly.
    """
    if tv.memory_type is MemoryType.Global or tv.compute_at_pos == 0:
        return
    alloc = {id(i) for i in tv.get_allocation_domain()}
    missing = [i for i in tv.get_loop_domain()[:tv.compute_at_pos] if id(i) not in alloc]
    if missing:
        raise ValueError(
            f"{tv.short_name}: allocation domain ({', '.join(map(str, tv.get_allocation_domain()))}) does not match its "
            f"loop domain: loop IDs {', '.join(map(str, missing))} left of compute-at position {tv.compute_at_pos} "
            "are not in it; derive the allocation from the loop (derive_allocation_from_loop)")
