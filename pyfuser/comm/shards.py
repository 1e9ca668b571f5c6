"""Cutting a full (global) tensor into the shard a rank holds, as a TensorView's sharding says."""

from __future__ import annotations

import torch

from pyfuser.ir.analysis.sharding import local_extent, non_reduction_dims, sharding_of
from pyfuser.ir.tensor_view import TensorView
from pyfuser.options import LaunchInfo


def shard_tensor(tensor: torch.Tensor, tv: TensorView, rank: int | None = None) -> torch.Tensor:
    """A full (global) tensor -> ``rank``'s (default: this process') shard, by ``tv``'s mesh and sharding."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"shard_tensor expects a torch.Tensor, got {type(tensor).__name__}")
    sharding = sharding_of(tv)
    if tensor.dim() != tv.ndim:
        raise ValueError(f"shard_tensor: {tv.short_name} has rank {tv.ndim} but the tensor has rank {tensor.dim()}")
    if not sharding.is_sharded:
        return tensor
    if rank is None:
        rank = LaunchInfo.from_env().rank
    mesh = sharding.mesh
    if mesh is None or rank not in mesh:
        raise ValueError(f"shard_tensor: rank {rank} is not in {tv.short_name}'s {mesh}; it holds no shard")
    dims = non_reduction_dims(tv)
    for axis, ptype in sharding.axes.items():
        dim = dims[axis]
        if dim is None:
            continue
        parts = mesh.size_of(ptype)
        local_extent(tensor.shape[dim], tv, axis, ptype)  # divisibility check with a clear message
        tensor = tensor.chunk(parts, dim)[mesh.index(rank, ptype)]
    return tensor.contiguous()
