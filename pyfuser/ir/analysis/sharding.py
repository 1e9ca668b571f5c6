"""How a TensorView is sharded over its DeviceMesh, and the local (per-rank) shapes that follow.

Semantics (global SPMD): shapes in a definition are global. A logical axis is *sharded* on a device
parallel type ``P`` when the tensor's allocation domain (or, when the allocation domain has no device
IDs, its loop domain) holds either

* the logical ID itself parallelized on ``P`` -- its extent must equal the mesh size along ``P``, and each
  rank holds one element of it (docs/allgather_gemm.md's ``x[S, D, M/(S*D), K]``), or
* the outer output of ``outer_split(axis, d)`` parallelized on ``P``, with ``d`` the mesh size along
  ``P`` -- each rank holds ``extent / d`` contiguous elements, or
* the outer output of ``inner_split(axis, k)`` (nvFuser's ``split``) parallelized on ``P``, whose
  ``ceilDiv(extent, k)`` is the mesh size -- the same contiguous shards, of ``k`` elements (checked
  when the extent is known; a fusion input's shard must have ``k`` elements).

A sharded *reduction* ID marks partial results: every rank holds the reduction over its slice only,
and a communication must combine them (Allreduce / ReduceScatter / Reduce).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pyfuser.ir.analysis.reshape import reshape_groups, shard_pairs
from pyfuser.ir.base import Expr
from pyfuser.ir.device_mesh import DeviceMesh
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import IterDomain, ParallelType, Split
from pyfuser.ir.ops import LoadStoreOp, ReshapeOp
from pyfuser.ir.symbolic import SymExpr
from pyfuser.ir.tensor_view import TensorView


@dataclass(frozen=True, slots=True)
class Sharding:
    """Mesh plus ``{logical position (reductions included): device parallel type}``."""

    mesh: DeviceMesh | None
    axes: Mapping[int, ParallelType] = field(default_factory=dict)

    @property
    def is_sharded(self) -> bool:
        return bool(self.axes)

    def axis_sharded_on(self, parallel_type: ParallelType) -> int:
        """The logical position sharded on ``parallel_type``, -1 when none is (nvFuser's query)."""
        return next((axis for axis, p in self.axes.items() if p is parallel_type), -1)

    def __str__(self) -> str:
        parts = ", ".join(f"axis {a} on {p}" for a, p in sorted(self.axes.items()))
        return f"{self.mesh} [{parts or 'replicated'}]"


def device_ids(tv: TensorView) -> list[IterDomain]:
    """Device-parallel IDs that define ``tv``'s sharding (allocation first, else loop)."""
    if tv.has_allocation_domain():
        in_allocation = [i for i in tv.get_allocation_domain() if i.is_device_dim]
        if in_allocation:
            return in_allocation
    return [i for i in tv.get_loop_domain() if i.is_device_dim]


def sharding_of(tv: TensorView) -> Sharding:
    """Read ``tv``'s sharding from its domains; ValueError when a device ID is not a shard of one axis."""
    logical = tv.get_logical_domain()
    position = {id(i): pos for pos, i in enumerate(logical)}
    axes: dict[int, ParallelType] = {}
    for i in device_ids(tv):
        ptype = i.parallel_type
        where = f"{tv.short_name} ({i})"
        if tv.device_mesh is None:
            raise ValueError(f"{where} is parallelized on {ptype} but {tv.short_name} has no device mesh; "
                             "call set_device_mesh first")
        size = tv.device_mesh.size_of(ptype)
        if id(i) in position:
            axis = position[id(i)]
            if i.extent.is_const and i.extent.value != size:
                raise ValueError(f"{tv.short_name} axis {axis} ({i}) is parallelized on {ptype} directly, so its "
                                 f"extent must equal the mesh size {size} along {ptype}; got {i.extent} (use "
                                 f"outer_split({axis}, {size}) and parallelize the outer ID instead)")
        else:
            split = i.definition
            if not (isinstance(split, Split) and split.outer is i and id(split.in_id) in position):
                raise ValueError(f"{where} is parallelized on {ptype} but is not a logical ID nor the outer ID of "
                                 "a split of one; shard an axis with outer_split(axis, mesh size) and "
                                 "parallelize the outer ID")
            axis = position[id(split.in_id)]
            _check_device_split(tv, axis, split, size, ptype)
        if axis in axes:
            raise ValueError(f"{tv.short_name} axis {axis} is sharded on both {axes[axis]} and {ptype}")
        axes[axis] = ptype
    return Sharding(tv.device_mesh, axes)


def _check_device_split(tv: TensorView, axis: int, split: Split, size: int, ptype: ParallelType) -> None:
    """The outer ID of ``split`` must have the mesh size along ``ptype`` as its extent."""
    if not split.inner_split:
        if split.factor.value != size:
            raise ValueError(f"{tv.short_name} axis {axis}: device split factor {split.factor} must equal the "
                             f"mesh size {size} along {ptype} of {tv.device_mesh}")
        return
    factor, extent = split.factor.value, split.in_id.extent.value
    if factor is None:
        raise ValueError(f"{tv.short_name} axis {axis}: an inner split sharded on {ptype} needs a constant factor "
                         f"(the shard size), got {split.factor}; or use outer_split(axis, {size})")
    if extent is not None and extent != factor * size:
        raise ValueError(f"{tv.short_name} axis {axis}: inner_split by {factor} of extent {extent} gives "
                         f"{split.outer.extent} shards, but the mesh has {size} ranks along {ptype} (the extent "
                         f"must be {factor} * {size})")


def shard_size(tv: TensorView, axis: int) -> int | None:
    """Elements per rank of logical ``axis`` when its device split fixes them (an inner split's factor)."""
    for i in device_ids(tv):
        split = i.definition
        if isinstance(split, Split) and split.inner_split and split.in_id is tv.get_logical_domain()[axis]:
            return split.factor.value
    return None


def shard_map(expr: Expr, producer: TensorView, ptype: ParallelType,
              output: TensorView | None = None) -> dict[IterDomain, IterDomain]:
    """Producer logical ID -> ``output`` logical ID (None: ``logical_map``'s) such that ``expr`` computes that
    output axis's shard along ``ptype`` from the producer axis's shard: the IDs the op preserves, and through
    a reshape the pairs of ``shard_pairs`` for the mesh size along ``ptype``. Both sharding passes read it, so
    a sharding propagates exactly where the op then runs on the shards."""
    if isinstance(expr, ReshapeOp):
        mesh = expr.output.device_mesh
        return {} if mesh is None else shard_pairs(expr, mesh.size_of(ptype))
    return expr.logical_map(producer) if output is None else expr.output_map(producer, output)


def regroups_a_shard(expr: Expr) -> bool:
    """Whether ``expr`` is a reshape that runs on shards of an axis it splits or merges. Its shard sizes there
    come from the output's shard factors (``ReshapeOp.run_on_shards``); a generated kernel on shards reads
    sizes from the tensors it gets and takes any other extent as global (a split's outer axis, which no
    operand holds), so such a reshape runs as an ATen call."""
    if not isinstance(expr, ReshapeOp) or expr.output.device_mesh is None:
        return False
    factors = shard_factors(expr.output)
    groups = reshape_groups(expr)
    if groups is None:
        return any(f > 1 for f in factors)
    regrouped = {d for g in groups if not len(g.inputs) == len(g.outputs) == 1 for d in g.outputs}
    return any(f > 1 and d in regrouped for d, f in enumerate(factors))


# --- local shapes ------------------------------------------------------------------------------------
def local_extent(global_extent: int, tv: TensorView, axis: int, ptype: ParallelType) -> int:
    mesh = tv.device_mesh
    if mesh is None:
        raise ValueError(f"{tv.short_name} axis {axis} is parallelized on {ptype} but {tv.short_name} has no device mesh")
    size = mesh.size_of(ptype)
    if global_extent % size:
        raise ValueError(f"{tv.short_name} axis {axis} has extent {global_extent}, which is not divisible by the "
                         f"{size} ranks of {mesh} along {ptype}")
    return global_extent // size


def local_sizes(tv: TensorView, env: Mapping[str, int]) -> list[int]:
    """Sizes of this rank's piece of ``tv`` (reductions dropped), from bound global extents."""
    sharding = sharding_of(tv)
    sizes = []
    for axis, i in enumerate(tv.get_logical_domain()):
        if i.is_reduction():
            continue
        extent = i.extent.evaluate(env)
        ptype = sharding.axes.get(axis)
        sizes.append(local_extent(extent, tv, axis, ptype) if ptype is not None else extent)
    return sizes


def non_reduction_dims(tv: TensorView) -> dict[int, int | None]:
    """Logical position -> dim of the materialized tensor (None for reduction IDs)."""
    result: dict[int, int | None] = {}
    dim = 0
    for pos, i in enumerate(tv.get_logical_domain()):
        if i.is_reduction():
            result[pos] = None
        else:
            result[pos] = dim
            dim += 1
    return result


def tensor_dim(tv: TensorView, axis: int) -> int:
    """Dim of the materialized tensor for logical position ``axis`` (a non-reduction ID)."""
    dim = non_reduction_dims(tv)[axis]
    if dim is None:
        raise ValueError(f"{tv.short_name} axis {axis} is a reduction ID and has no tensor dim")
    return dim


def shard_factors(tv: TensorView) -> list[int]:
    """Per non-reduction logical axis: how many ranks split it (1 when not sharded)."""
    if tv.device_mesh is None:
        return [1] * tv.ndim
    sharding = sharding_of(tv)
    factors = []
    for axis, i in enumerate(tv.get_logical_domain()):
        if not i.is_reduction():
            ptype = sharding.axes.get(axis)
            factors.append(tv.device_mesh.size_of(ptype) if ptype is not None else 1)
    return factors


def local_extents(tv: TensorView) -> list[SymExpr]:
    """Symbolic extents of this rank's piece of ``tv`` (reductions dropped)."""
    ids = tv.get_logical_domain(no_reductions=True)
    return [i.extent if f == 1 else i.extent // f for i, f in zip(ids, shard_factors(tv), strict=True)]


def local_static_size(tv: TensorView, axis: int) -> int | None:
    """The size this rank's shard of ``tv`` has along non-reduction ``axis``, when known before execution."""
    i = tv.get_logical_domain(no_reductions=True)[axis]
    factor = shard_factors(tv)[axis]
    if factor == 1:
        return i.extent.value
    if i.is_device_dim:
        return 1  # the logical ID itself is parallelized: one element per rank
    logical_axis = next(p for p, j in enumerate(tv.get_logical_domain()) if j is i)
    fixed = shard_size(tv, logical_axis)
    if fixed is not None:
        return fixed  # an inner split's factor: the shard size, also for a symbolic extent
    extent = i.extent.value
    if extent is not None and extent % factor:
        raise ValueError(f"{tv.short_name} axis {axis} has extent {extent}, which is not divisible by the {factor} "
                         f"ranks of {tv.device_mesh} it is sharded over")
    return None if extent is None else extent // factor


def is_multidevice(fusion: Fusion) -> bool:
    """Some tensor is on a device mesh. A mesh-parallel axis without any mesh in the fusion is a ValueError:
    run on one device, the axis would silently not be sharded."""
    tvs = fusion.tensors()
    if any(tv.device_mesh is not None for tv in tvs):
        return True
    for tv in tvs:
        for pos, i in enumerate(tv.get_loop_domain()):
            if i.is_device_dim:
                raise ValueError(f"{tv.short_name} axis {pos} ({i}) is parallelized on {i.parallel_type.name} but no "
                                 f"tensor of the fusion has a device mesh to shard it over; call "
                                 f"{tv.short_name}.set_device_mesh(DeviceMesh(...)) first")
    return False


def check_meshes_fit(fusion: Fusion, world_size: int) -> None:
    """ValueError when a tensor's mesh names a rank the launcher did not start."""
    for tv in fusion.tensors():
        mesh = tv.device_mesh
        if mesh is not None and mesh.max_rank() >= world_size:
            raise ValueError(f"{tv.short_name} is on {mesh}, which needs rank {mesh.max_rank()}, but the world has "
                             f"only {world_size} processes (ranks 0..{world_size - 1}); launch more processes or "
                             "use a smaller mesh")


def is_resharding(expr: Expr) -> bool:
    """Whether ``expr`` moves data between ranks: a ``set`` whose input and output differ in mesh or
    sharding. After ``decompose_resharding`` every other expr runs on local shards."""
    if not isinstance(expr, LoadStoreOp) or len(expr.tensor_inputs) != 1:
        return False
    producer, consumer = expr.tensor_inputs[0], expr.output
    if producer.device_mesh is None or consumer.device_mesh is None:
        return False
    return sharding_of(producer) != sharding_of(consumer)
