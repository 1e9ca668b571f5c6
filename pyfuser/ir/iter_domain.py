"""IterDomains (one axis of a tensor's iteration space) and the transforms between them."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from pyfuser.ir.symbolic import SymExpr, as_sym, ceil_div

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion
    from pyfuser.ir.tensor_view import TensorView


class IterType(Enum):
    Iteration = "i"
    Reduction = "r"
    Broadcast = "b"


class ParallelType(Enum):
    """How a loop ID is executed. The value is the printed spelling."""

    serial = "S"
    stream = "StreamIdx"
    mesh_x = "deviceIdx.x"
    mesh_y = "deviceIdx.y"
    mesh_z = "deviceIdx.z"
    grid_x = "blockIdx.x"
    grid_y = "blockIdx.y"
    grid_z = "blockIdx.z"
    block_x = "threadIdx.x"
    block_y = "threadIdx.y"
    block_z = "threadIdx.z"
    vectorize = "V"
    unroll = "UR"
    unswitch = "US"
    tma = "B"

    # nvFuser spellings, so code written against nvFuser reads naturally.
    Serial = "S"
    Stream = "StreamIdx"
    DIDx = "deviceIdx.x"
    DIDy = "deviceIdx.y"
    DIDz = "deviceIdx.z"
    BIDx = "blockIdx.x"
    BIDy = "blockIdx.y"
    BIDz = "blockIdx.z"
    TIDx = "threadIdx.x"
    TIDy = "threadIdx.y"
    TIDz = "threadIdx.z"

    @property
    def is_device(self) -> bool:
        return self in DEVICE_PARALLEL_TYPES

    @property
    def is_stream(self) -> bool:
        return self is ParallelType.stream

    def __str__(self) -> str:
        return self.value


DEVICE_PARALLEL_TYPES = frozenset({ParallelType.mesh_x, ParallelType.mesh_y, ParallelType.mesh_z})
#: The parallel types of a kernel's grid: one program per index (a loop across programs).
GRID_PARALLEL_TYPES = frozenset({ParallelType.grid_x, ParallelType.grid_y, ParallelType.grid_z})


class IterDomain:
    """One axis: an extent, an iter type and a parallel type.

    An ID belongs to exactly one TensorView (``tensor``); IDs of one tensor are linked by
    ``Split`` / ``Merge`` expressions into a DAG whose frontiers are the tensor's domains.
    """

    __slots__ = ("fusion", "name", "extent", "iter_type", "parallel_type", "definition",
                 "uses", "tensor", "expanded", "swizzle")

    def __init__(self, fusion: Fusion, extent: SymExpr | int, iter_type: IterType = IterType.Iteration,
                 parallel_type: ParallelType = ParallelType.serial) -> None:
        self.fusion = fusion
        self.name = fusion.next_name("id")
        self.extent = as_sym(extent)
        self.iter_type = iter_type
        self.parallel_type = parallel_type
        self.definition: IdTransform | None = None
        self.uses: list[IdTransform] = []
        self.tensor: TensorView | None = None
        #: An input axis declared expanded (contiguity None with an extent other than 1): a
        #: broadcast materialized with stride 0, as ``x.expand(...)`` gives. It iterates like any
        #: axis; its input must have stride 0 there.
        self.expanded = False
        #: nvFuser's ``Swizzle1D`` of a stream ID (``TensorView.swizzle1d``): iteration ``i`` of its loop takes
        #: chunk ``(i + p) % n`` on the rank at position ``p`` of the team along this device parallel type
        self.swizzle: ParallelType | None = None

    # --- queries -------------------------------------------------------------------------
    def is_reduction(self) -> bool:
        return self.iter_type is IterType.Reduction

    def is_broadcast(self) -> bool:
        return self.iter_type is IterType.Broadcast

    @property
    def is_stream(self) -> bool:
        return self.parallel_type is ParallelType.stream

    @property
    def is_device_dim(self) -> bool:
        return self.parallel_type.is_device

    def clone(self, fusion: Fusion | None = None, *, iter_type: IterType | None = None,
              keep_parallel: bool = False) -> IterDomain:
        """A fresh ID with the same extent (and iter type unless given), no history."""
        clone = IterDomain(fusion or self.fusion, self.extent, iter_type or self.iter_type,
                           self.parallel_type if keep_parallel else ParallelType.serial)
        return clone

    # --- scheduling ----------------------------------------------------------------------
    def parallelize(self, parallel_type: ParallelType) -> IterDomain:
        if not isinstance(parallel_type, ParallelType):
            raise TypeError(f"parallelize expects a ParallelType, got {type(parallel_type).__name__}")
        owner = self.tensor
        where = f"{owner.short_name} axis {owner.loop_position(self)}" if owner is not None else str(self)
        if parallel_type is ParallelType.stream and self.is_reduction():
            raise ValueError(f"{where} ({self}) is a reduction ID and cannot be parallelized on stream: "
                             "a host loop cannot split a reduction")
        if parallel_type is not ParallelType.serial and owner is not None:
            for other in owner.get_loop_domain():
                # A reduction ID and an iteration ID on one device type: partial sums reduce-scattered
                # along the iteration ID (nvFuser's reduce-scatter pattern).
                reduce_scatter = parallel_type.is_device and other.is_reduction() != self.is_reduction()
                if other is not self and other.parallel_type is parallel_type and not reduce_scatter:
                    raise ValueError(
                        f"{owner.short_name} axis {owner.loop_position(self)} cannot be parallelized on "
                        f"{parallel_type.name}: axis {owner.loop_position(other)} ({other}) already is; "
                        "each parallel type may bind at most one loop ID of a tensor")
        self.parallel_type = parallel_type
        self.fusion.mark_changed()
        return self

    # --- printing --------------------------------------------------------------------------
    def __str__(self) -> str:
        swizzle = f"(swizzle1d {self.swizzle.value})" if self.swizzle is not None else ""
        return f"{self.iter_type.value}{self.parallel_type.value}{self.name}{{{self.extent}}}{swizzle}"

    __repr__ = __str__


class IdTransform:
    """An expression between IterDomains (Split or Merge)."""

    inputs: tuple[IterDomain, ...]
    outputs: tuple[IterDomain, ...]

    def _link(self) -> None:
        for out in self.outputs:
            out.definition = self
        for inp in self.inputs:
            inp.uses.append(self)


class Split(IdTransform):
    """``in -> (outer, inner)``. Inner split: inner has extent ``factor``; outer split: outer does.

    A non-divisible split is allowed; the partial last chunk is tracked by ``is_divisible``.
    """

    def __init__(self, in_id: IterDomain, factor: int | SymExpr, inner_split: bool = True) -> None:
        factor_sym = as_sym(factor)
        fusion = in_id.fusion
        rest = ceil_div(in_id.extent, factor_sym)
        outer_extent, inner_extent = (rest, factor_sym) if inner_split else (factor_sym, rest)
        self.in_id = in_id
        self.factor = factor_sym
        self.inner_split = inner_split
        self.outer = IterDomain(fusion, outer_extent, in_id.iter_type)
        self.inner = IterDomain(fusion, inner_extent, in_id.iter_type)
        for out in (self.outer, self.inner):
            out.tensor = in_id.tensor
        self.inputs = (in_id,)
        self.outputs = (self.outer, self.inner)
        self._link()

    def is_divisible(self, env: dict[str, int] | None = None) -> bool | None:
        """True / False when decidable (statically or with ``env``), else None."""
        extent, factor = self.in_id.extent, self.factor
        try:
            e = extent.evaluate(env or {})
            f = factor.evaluate(env or {})
        except ValueError:
            return None
        return e % f == 0

    def __str__(self) -> str:
        kind = "Split" if self.inner_split else "Outer split"
        return f"{kind}: {self.in_id} by factor {self.factor} -> {self.outer}, {self.inner}"


class Merge(IdTransform):
    """``(outer, inner) -> out`` with extent ``outer * inner``."""

    def __init__(self, outer: IterDomain, inner: IterDomain) -> None:
        if outer.is_reduction() != inner.is_reduction() and not (outer.is_broadcast() or inner.is_broadcast()):
            red, it = (outer, inner) if outer.is_reduction() else (inner, outer)
            owner = outer.tensor.short_name if outer.tensor is not None else "tensor"
            raise ValueError(f"{owner}: cannot merge reduction ID {red} with iteration ID {it}; "
                             "merge IDs of the same iter type")
        if outer.is_broadcast() and inner.is_broadcast():
            iter_type = IterType.Broadcast
        elif outer.is_reduction() or inner.is_reduction():
            iter_type = IterType.Reduction
        else:
            iter_type = IterType.Iteration
        self.outer = outer
        self.inner = inner
        self.out = IterDomain(outer.fusion, outer.extent * inner.extent, iter_type)
        self.out.tensor = outer.tensor
        self.inputs = (outer, inner)
        self.outputs = (self.out,)
        self._link()

    def __str__(self) -> str:
        return f"Merge: {self.outer} and {self.inner} -> {self.out}"
