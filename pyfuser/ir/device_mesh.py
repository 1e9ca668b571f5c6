"""DeviceMesh: an N-D arrangement of ranks that tensors are placed on and sharded over."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from pyfuser.ir.iter_domain import ParallelType
from pyfuser.options import LaunchInfo

#: Device parallel types, innermost mesh axis first: ``mesh_x`` binds the last mesh axis, ``mesh_y``
#: the one before it, so a 1-D mesh is always ``mesh_x`` and a ``[dp, tp]`` mesh is ``[mesh_y, mesh_x]``.
_DEVICE_TYPES = (ParallelType.mesh_x, ParallelType.mesh_y, ParallelType.mesh_z)


class DeviceMesh:
    """Ranks laid out as an N-D array (at most 3-D); immutable and hashable.

    ``DeviceMesh(range(4))``, ``DeviceMesh([[0, 1], [2, 3]])`` or ``DeviceMesh(torch.arange(8).view(2, 4))``.
    """

    __slots__ = ("_ranks", "_shape")

    def __init__(self, ranks: Iterable[Any] | torch.Tensor) -> None:
        if isinstance(ranks, DeviceMesh):
            tensor = ranks.as_tensor()
        elif isinstance(ranks, torch.Tensor):
            tensor = ranks.detach().to("cpu")
        else:
            tensor = torch.tensor(_as_nested_list(ranks))
        if tensor.numel() == 0:
            raise ValueError("DeviceMesh needs at least one rank")
        if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
            raise TypeError(f"DeviceMesh ranks must be integers, got dtype {tensor.dtype}")
        if tensor.dim() == 0:
            tensor = tensor.reshape(1)
        if tensor.dim() > len(_DEVICE_TYPES):
            raise ValueError(f"DeviceMesh has {tensor.dim()} dimensions (shape {list(tensor.shape)}); at most "
                             f"{len(_DEVICE_TYPES)} are supported (mesh_x, mesh_y, mesh_z)")
        flat = [int(r) for r in tensor.reshape(-1).tolist()]
        if min(flat) < 0:
            raise ValueError(f"DeviceMesh ranks must be non-negative, got {flat}")
        if len(set(flat)) != len(flat):
            raise ValueError(f"DeviceMesh lists a rank twice: {flat}")
        self._ranks: tuple[int, ...] = tuple(flat)
        self._shape: tuple[int, ...] = tuple(int(s) for s in tensor.shape)

    # --- queries ------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        """Number of ranks (nvFuser's ``size()``); ``size_of(ptype)`` gives one axis' size."""
        return len(self._ranks)

    def __len__(self) -> int:
        return len(self._ranks)

    @property
    def ranks(self) -> tuple[int, ...]:
        """Ranks in row-major order."""
        return self._ranks

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor(self._ranks, dtype=torch.int64).reshape(self._shape)

    def __contains__(self, rank: object) -> bool:
        return rank in self._ranks

    def max_rank(self) -> int:
        return max(self._ranks)

    def axis_of(self, ptype: ParallelType) -> int:
        """The mesh axis a device parallel type binds."""
        if ptype not in _DEVICE_TYPES:
            raise ValueError(f"{ptype.name} is not a device parallel type (expected mesh_x, mesh_y or mesh_z)")
        axis = self.ndim - 1 - _DEVICE_TYPES.index(ptype)
        if axis < 0:
            raise ValueError(f"{ptype.name} ({ptype}) needs a mesh of at least {_DEVICE_TYPES.index(ptype) + 1} "
                             f"dimensions, but {self} has shape {list(self._shape)}")
        return axis

    def parallel_types(self) -> list[ParallelType]:
        """Device parallel types this mesh can bind, outermost mesh axis first."""
        return [_DEVICE_TYPES[self.ndim - 1 - axis] for axis in range(self.ndim)]

    def size_of(self, ptype: ParallelType) -> int:
        return self._shape[self.axis_of(ptype)]

    def coordinates(self, rank: int) -> tuple[int, ...]:
        """Index of ``rank`` in the mesh array."""
        try:
            flat = self._ranks.index(rank)
        except ValueError:
            raise ValueError(f"rank {rank} is not in {self}") from None
        coords = []
        for extent in reversed(self._shape):
            coords.append(flat % extent)
            flat //= extent
        return tuple(reversed(coords))

    def index(self, rank: int, ptype: ParallelType) -> int:
        """``rank``'s position along the mesh axis ``ptype`` binds: which shard it holds."""
        return self.coordinates(rank)[self.axis_of(ptype)]

    def team(self, rank: int, ptype: ParallelType) -> tuple[int, ...]:
        """Ranks that differ from ``rank`` only along ``ptype``'s mesh axis, in mesh order."""
        coords = list(self.coordinates(rank))
        axis = self.axis_of(ptype)
        members = []
        for k in range(self._shape[axis]):
            coords[axis] = k
            members.append(self.rank_at(coords))
        return tuple(members)

    def rank_at(self, coords: Sequence[int]) -> int:
        flat = 0
        for c, extent in zip(coords, self._shape, strict=True):
            flat = flat * extent + c
        return self._ranks[flat]

    # --- sharding -------------------------------------------------------------------------------
    def shard_tensor(self, tensor: torch.Tensor, dim: int, rank: int | None = None,
                     ptype: ParallelType = ParallelType.mesh_x) -> torch.Tensor:
        """``rank``'s (default: this process') contiguous shard of ``tensor`` along ``dim``, split over
        the mesh axis ``ptype`` binds."""
        if rank is None:
            rank = LaunchInfo.from_env().rank
        if not -tensor.dim() <= dim < tensor.dim():
            raise ValueError(f"shard_tensor: dim {dim} is out of range for a tensor of rank {tensor.dim()}")
        dim %= tensor.dim()
        parts = self.size_of(ptype)
        if tensor.shape[dim] % parts:
            raise ValueError(f"shard_tensor: axis {dim} has size {tensor.shape[dim]}, which is not divisible by the "
                             f"{parts} ranks of {self} along {ptype}")
        return tensor.chunk(parts, dim)[self.index(rank, ptype)].contiguous()

    # --- identity / printing ----------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceMesh) and self._ranks == other._ranks and self._shape == other._shape

    def __hash__(self) -> int:
        return hash((self._ranks, self._shape))

    def __deepcopy__(self, memo: dict[int, Any]) -> DeviceMesh:
        return self  # immutable

    def __str__(self) -> str:
        return f"DeviceMesh{_format(self._ranks, self._shape)}"

    __repr__ = __str__


def _as_nested_list(ranks: Iterable[Any]) -> list[Any]:
    return [(_as_nested_list(r) if isinstance(r, (list, tuple, range)) else r) for r in ranks]


def _format(ranks: Sequence[int], shape: Sequence[int]) -> str:
    if len(shape) == 1:
        return "{" + " ".join(map(str, ranks)) + "}"
    step = len(ranks) // shape[0]
    return "{" + " ".join(_format(ranks[k * step:(k + 1) * step], shape[1:]) for k in range(shape[0])) + "}"
