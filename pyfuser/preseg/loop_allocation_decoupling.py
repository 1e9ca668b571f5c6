"""The last preseg pass: decouple loop from allocation and finalize segment-boundary layouts (docs/loop_and_allocation.md).

After it, for every tensor:

* **loop**: device-parallel IDs first, then Stream IDs, then the other loop IDs ordered by the
  logical axis they come from (a stable sort, so the two halves of a split keep their order).
  Host IR lowering and schedulers can then take Stream / DID loops from the front. A tensor that
  already has a compute-at position keeps its loop domain: the user's inlining owns that order.
* **allocation**: the tensor's stride order (its allocation domain, else logical), allocated
  whole: a Stream split in an allocation domain is folded back into the ID it split (only when
  both halves are adjacent and contiguous, i.e. when folding does not change the layout), a
  Stream-parallel logical ID is allocated at full extent. A device split of the loop domain
  (``outer_split`` + ``mesh_x``) is written into the allocation, so a sharded tensor allocates
  ``extent / mesh size`` on each rank; a mesh ID already in an allocation domain stays.
* **finality**: the allocation of every tensor that can be a segment boundary is made explicit
  and frozen; changing it later raises ``ValueError`` naming the tensor.

Which tensors can be segment boundaries is ``ir.analysis.segment_boundaries``.

Inputs are given: an input's finalized allocation is marked a requirement even when it was only
bound from the concrete layout this program was compiled for.
"""

from __future__ import annotations

from pyfuser.ir.analysis.segment_boundaries import can_be_segment_boundary
from pyfuser.ir.domain_replay import logical_ancestors, strided_layout_violation
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import IterDomain, Split
from pyfuser.ir.tensor_domain import Contiguity
from pyfuser.ir.tensor_view import TensorView
from pyfuser.options import CompileOptions


def decouple_loop_and_allocation(fusion: Fusion, options: CompileOptions) -> None:
    for tv in fusion.tensors():
        if tv.compute_at_pos == 0:
            _order_loop(tv)
        _finalize_allocation(tv, can_be_segment_boundary(tv))
    for out in fusion.outputs():
        if isinstance(out, TensorView) and out.allocation_is_required and not out.is_fusion_input:
            _check_strided(out)


def _check_strided(out: TensorView) -> None:
    """A required output layout must be one a torch tensor can have (it is met stride for stride)."""
    bad = strided_layout_violation(out)
    if bad is not None:
        names = ", ".join(map(str, out.get_allocation_domain()))
        raise ValueError(f"{out.short_name}: required allocation domain ({names}) puts {bad[0]} outside {bad[1]}, "
                         "which no strided tensor can do: the IDs split from one logical axis must stay adjacent, "
                         "outer before inner")


# --- loop --------------------------------------------------------------------------------------------
def _order_loop(tv: TensorView) -> None:
    loop = tv.get_loop_domain()
    logical = tv.get_logical_domain()
    place = {id(i): k for k, i in enumerate(logical)}

    def logical_place(i: IterDomain) -> int:
        ancestors = logical_ancestors(i, logical)
        return min((place[id(a)] for a in ancestors), default=len(logical))

    devices = [i for i in loop if i.is_device_dim]
    streams = [i for i in loop if i.is_stream]
    rest = sorted((i for i in loop if not (i.is_device_dim or i.is_stream)), key=logical_place)
    ordered = devices + streams + rest
    if any(a is not b for a, b in zip(ordered, loop, strict=True)):
        tv.set_loop_domain(ordered)


# --- allocation --------------------------------------------------------------------------------------
def _finalize_allocation(tv: TensorView, boundary: bool) -> None:
    had_allocation = tv.has_allocation_domain()
    hint = not tv.is_fusion_input and (tv.domain().allocation_is_hint or not had_allocation)
    before = tv.get_allocation_domain()
    contiguity = _full_contiguity(before, tv.contiguity)
    ids, contiguity = _fold_stream_splits(tv, before, contiguity)
    ids, contiguity = _add_device_splits(tv, ids, contiguity)
    changed = [id(i) for i in ids] != [id(i) for i in before]
    if changed or (boundary and not had_allocation):
        kept = [c for i, c in zip(ids, contiguity, strict=True) if not i.is_reduction()]
        tv.set_allocation_domain(ids, kept, hint=hint)
    if boundary:
        tv.freeze_allocation()


def _full_contiguity(ids: list[IterDomain], contiguity: Contiguity) -> list[bool | None]:
    """Contiguity with one entry per ID, reductions included (None), to edit alongside ``ids``."""
    values = iter(contiguity)
    return [None if i.is_reduction() else next(values) for i in ids]


def _fold_stream_splits(tv: TensorView, ids: list[IterDomain],
                        contiguity: list[bool | None]) -> tuple[list[IterDomain], list[bool | None]]:
    while True:
        split = next((i.definition for i in ids if i.is_stream and isinstance(i.definition, Split)), None)
        if not isinstance(split, Split):
            return ids, contiguity
        k = next((k for k, i in enumerate(ids) if i is split.outer), None)
        if k is None or k + 1 >= len(ids) or ids[k + 1] is not split.inner or contiguity[k] is False:
            names = ", ".join(map(str, ids))
            raise ValueError(
                f"{tv.short_name}: allocation domain ({names}) holds Stream split '{split}' whose halves are not "
                "adjacent and contiguous; a tensor is allocated whole across stream iterations, so the stream "
                "split must not shape its layout")
        ids = [*ids[:k], split.in_id, *ids[k + 2:]]
        contiguity = [*contiguity[:k], contiguity[k + 1], *contiguity[k + 2:]]


def _add_device_splits(tv: TensorView, ids: list[IterDomain],
                       contiguity: list[bool | None]) -> tuple[list[IterDomain], list[bool | None]]:
    in_alloc = {id(i) for i in ids}
    for loop_id in tv.get_loop_domain():
        if not loop_id.is_device_dim or id(loop_id) in in_alloc:
            continue
        split = loop_id.definition
        if not isinstance(split, Split) or id(split.in_id) not in in_alloc:
            raise ValueError(
                f"{tv.short_name}: device-parallel loop ID {loop_id} is not a split of an ID of the allocation "
                f"domain ({', '.join(map(str, ids))}); shard with outer_split(axis, mesh size) on a logical axis")
        k = next(k for k, i in enumerate(ids) if i is split.in_id)
        ids = [*ids[:k], split.outer, split.inner, *ids[k + 1:]]
        contiguity = [*contiguity[:k], contiguity[k], contiguity[k], *contiguity[k + 1:]]
        in_alloc = {id(i) for i in ids}
    return ids, contiguity

