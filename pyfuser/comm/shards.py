"""Cutting a full (global) tensor into the shard a rank holds, as a TensorView's sharding says."""

from __future__ import annotations

import torch

from pyfuser.ir.analysis.sharding import device_ids, local_extent, non_reduction_dims, sharding_of
from pyfuser.ir.iter_domain import IterDomain, Split
from pyfuser.ir.tensor_view import TensorView
from pyfuser.options import LaunchInfo


def shard_tensor(tensor: torch.Tensor, tv: TensorView, rank: int | None = None) -> torch.Tensor:
    """A full (global) tensor -> ``rank``'s (default: this process') shard, by ``tv``'s mesh and sharding.

    A device ID may sit anywhere in a chain of splits of one logical axis (an inner split, a split of a
    split, two mesh axes on one logical axis, as nvFuser's ``shard_tensor`` takes them): the axis is viewed
    as the chain's leaves (row-major, as splits index), each device leaf is taken at ``rank``'s position on
    its mesh axis, and the leaves left are flattened back into the axis."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"shard_tensor expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() != tv.ndim:
        raise ValueError(f"shard_tensor: {tv.short_name} has rank {tv.ndim} but the tensor has rank {tensor.dim()}")
    chains = _split_chains(tv)
    if chains is not None:
        return _shard_by_chains(tensor, tv, chains, _rank_in_mesh(tv, rank))
    sharding = sharding_of(tv)
    if not sharding.is_sharded:
        return tensor
    rank = _rank_in_mesh(tv, rank)
    mesh = sharding.mesh
    assert mesh is not None  # a sharded tensor has one (sharding_of checks)
    dims = non_reduction_dims(tv)
    for axis, ptype in sharding.axes.items():
        dim = dims[axis]
        if dim is None:
            continue
        parts = mesh.size_of(ptype)
        local_extent(tensor.shape[dim], tv, axis, ptype)  # divisibility check with a clear message
        tensor = tensor.chunk(parts, dim)[mesh.index(rank, ptype)]
    return tensor.contiguous()


def _rank_in_mesh(tv: TensorView, rank: int | None) -> int:
    rank = LaunchInfo.from_env().rank if rank is None else rank
    if tv.device_mesh is None or rank not in tv.device_mesh:
        raise ValueError(f"shard_tensor: rank {rank} is not in {tv.short_name}'s {tv.device_mesh}; it holds no shard")
    return rank


def _split_chains(tv: TensorView) -> dict[int, Split] | None:
    """The splits between ``tv``'s logical IDs and its device IDs, by ``id`` of the split ID, when some
    device ID is not a logical ID nor the outer ID of a split of one (the shapes ``sharding_of`` reads);
    None otherwise. A device ID reached through anything but splits is a ValueError."""
    logical = {id(i) for i in tv.get_logical_domain()}
    chains: dict[int, Split] = {}
    general = False
    for device in device_ids(tv):
        current, depth = device, 0
        while id(current) not in logical:
            split = current.definition
            if not isinstance(split, Split):
                raise ValueError(f"{tv.short_name} ({device}) is parallelized on {device.parallel_type} but is not "
                                 "reached from a logical ID by splits; shard an axis with outer_split(axis, mesh size)")
            general |= depth > 0 or split.outer is not current
            chains[id(split.in_id)] = split
            current, depth = split.in_id, depth + 1
    return chains if general else None


def _leaves(i: IterDomain, chains: dict[int, Split]) -> list[IterDomain]:
    split = chains.get(id(i))
    return [i] if split is None else _leaves(split.outer, chains) + _leaves(split.inner, chains)


def _leaf_extents(i: IterDomain, extent: int, chains: dict[int, Split], tv: TensorView, axis: int) -> list[int]:
    split = chains.get(id(i))
    if split is None:
        return [extent]
    factor = split.factor.value
    if factor is None or extent % factor:
        raise ValueError(f"shard_tensor: {tv.short_name} axis {axis} has extent {extent} here, which its split by "
                         f"{split.factor} does not divide")
    outer, inner = (extent // factor, factor) if split.inner_split else (factor, extent // factor)
    return _leaf_extents(split.outer, outer, chains, tv, axis) + _leaf_extents(split.inner, inner, chains, tv, axis)


def _shard_by_chains(tensor: torch.Tensor, tv: TensorView, chains: dict[int, Split], rank: int) -> torch.Tensor:
    mesh = tv.device_mesh
    assert mesh is not None  # _rank_in_mesh checked it
    dims = non_reduction_dims(tv)
    shape: list[int] = []
    taken: dict[int, int] = {}  # dim of the leaf view -> index taken on it
    local: list[int] = []
    for axis, logical_id in enumerate(tv.get_logical_domain()):
        dim = dims[axis]
        if dim is None:
            continue
        leaves = _leaves(logical_id, chains)
        extents = _leaf_extents(logical_id, tensor.shape[dim], chains, tv, axis)
        kept = 1
        for leaf, extent in zip(leaves, extents, strict=True):
            if leaf.is_device_dim:
                if extent != mesh.size_of(leaf.parallel_type):
                    raise ValueError(f"shard_tensor: {tv.short_name} axis {axis}: {leaf} has extent {extent} here, "
                                     f"but the mesh has {mesh.size_of(leaf.parallel_type)} ranks along "
                                     f"{leaf.parallel_type}")
                taken[len(shape)] = mesh.index(rank, leaf.parallel_type)
            else:
                kept *= extent
            shape.append(extent)
        local.append(kept)
    view = tensor.reshape(shape)
    index = tuple(taken.get(d, slice(None)) for d in range(len(shape)))
    return view[index].reshape(local).contiguous()
