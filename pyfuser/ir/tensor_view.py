"""TensorView: a tensor of the fusion and its scheduling API (acts on the loop domain)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from pyfuser.ir.base import KindFlag, Scalar, UnsupportedFeatureError, Val
from pyfuser.ir.device_mesh import DeviceMesh
from pyfuser.ir.domain_replay import replay_allocation
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.iter_domain import IterDomain, Merge, ParallelType, Split
from pyfuser.ir.ops.rfactor import rfactor
from pyfuser.ir.ops.shape import LoadStoreOp, LoadStoreOpType
from pyfuser.ir.ops.sizes import SizeOp
from pyfuser.ir.symbolic import SymExpr
from pyfuser.ir.tensor_domain import (
    Contiguity,
    DomainCoverageError,
    TensorDomain,
    check_covers,
    default_contiguity,
    format_contiguity,
    no_reductions,
    transforms_between,
)

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion


class MemoryType(Enum):
    Global = "g"
    Local = "l"
    Shared = "s"
    #: global memory every rank of a team maps (a Host IR buffer that peers write with the copy engines)
    Symmetric = "sym"
    # nvFuser's spellings (``global`` is a Python keyword: MemoryType.Global)
    local = "l"
    shared = "s"
    symmetric = "sym"


class TensorView(Val):
    is_tensor: ClassVar[KindFlag] = KindFlag(True)

    def __init__(self, fusion: Fusion, domain: TensorDomain, dtype: DataType,
                 memory_type: MemoryType = MemoryType.Local) -> None:
        super().__init__(fusion, dtype)
        self.name = fusion.next_name("tv")
        self._domain = domain
        self.memory_type = memory_type
        self.compute_at_pos = 0
        self.device_mesh: DeviceMesh | None = None
        #: A CPU scalar tensor input of a fusion that otherwise runs on a GPU.
        self.is_cpu = False
        for i in (*domain.logical, *(domain.root or ())):
            i.tensor = self

    # --- naming / printing ---------------------------------------------------------------
    @property
    def short_name(self) -> str:
        return f"T{self.name}"

    def __str__(self) -> str:
        ids = ", ".join(map(str, self._domain.loop))
        text = f"T{self.name}_{self.memory_type.value}_{self.dtype.value}[{ids}]"
        if self.compute_at_pos > 0:
            text += f" ca_pos( {self.compute_at_pos} )"
        if self.device_mesh is not None:
            text += f" ({self.device_mesh})"
        return text

    __repr__ = __str__

    def transforms_string(self) -> str:
        d = self._domain
        lines = [str(self)]
        if d.root is not None:
            lines.append(f" root domain : ({_ids(d.root)})")
        lines.append(f" logical domain : ({_ids(d.logical)})")
        if d.allocation is not None:
            hint = " (hint)" if d.allocation_is_hint else ""
            lines.append(f" allocation domain : ({_ids(d.allocation)}){hint}")
        lines.append(f" contiguity: {format_contiguity(d.contiguity)}")
        targets = [*d.loop, *(d.allocation or ())]
        if d.root is not None:
            lines.extend(f"  {t}" for t in transforms_between(d.root, d.logical))
        lines.extend(f"  {t}" for t in transforms_between(d.logical, targets))
        lines.append(f" loop domain : ({_ids(d.loop)})")
        return "\n".join(lines)

    def print_transforms(self) -> str:
        text = self.transforms_string()
        print(text)
        return text

    # --- domains -----------------------------------------------------------------------------
    def domain(self) -> TensorDomain:
        return self._domain

    def get_logical_domain(self, no_reductions: bool = False) -> list[IterDomain]:
        ids = self._domain.logical
        return [i for i in ids if not i.is_reduction()] if no_reductions else list(ids)

    def get_loop_domain(self) -> list[IterDomain]:
        return list(self._domain.loop)

    def get_allocation_domain(self) -> list[IterDomain]:
        """The allocation domain, or the logical domain when none is set (as nvFuser's
        ``getMaybeAllocationDomain``)."""
        return list(self._domain.maybe_allocation)

    def has_allocation_domain(self) -> bool:
        return self._domain.has_allocation

    def has_root(self) -> bool:
        """Whether the logical domain derives from a separate root domain (an rfactor's output).
        A reshape output has none in pyfuser: reshape is an op on whole tensors, not root-to-logical
        ID transforms as in nvFuser."""
        return self._domain.root is not None

    def get_root_domain(self) -> list[IterDomain]:
        """The root domain, or the logical domain when there is none (nvFuser's ``getMaybeRootDomain``)."""
        return list(self._domain.root if self._domain.root is not None else self._domain.logical)

    @property
    def contiguity(self) -> Contiguity:
        return list(self._domain.contiguity)

    def size(self, dim: int) -> Scalar:
        """The extent of logical axis ``dim`` as an integer scalar (usable as another op's size)."""
        rank = self.ndim
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"{self.short_name}: size dim must be an int, got {type(dim).__name__}")
        if not -rank <= dim < max(rank, 1) or rank == 0:
            raise ValueError(f"{self.short_name}: size dim {dim} is out of range for rank {rank}")
        out = Scalar(self.fusion, DataType.Int)
        SizeOp(self.fusion, out, self, dim % rank)
        return out

    def shape(self) -> list[Scalar]:
        """Every logical extent as an integer scalar (``tv.size(d)`` for each axis)."""
        return [self.size(d) for d in range(self.ndim)]

    @property
    def ndim(self) -> int:
        return len(self.get_logical_domain(no_reductions=True))

    @property
    def allocation_is_required(self) -> bool:
        return self._domain.has_allocation and not self._domain.allocation_is_hint

    # --- axis helpers ----------------------------------------------------------------------
    def _loop_index(self, axis: int, what: str = "axis") -> int:
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise TypeError(f"{self.short_name}: {what} must be an int, got {type(axis).__name__}")
        n = len(self._domain.loop)
        if not -n <= axis < n:
            raise ValueError(f"{self.short_name}: {what} {axis} is out of range for a loop domain of {n} IDs "
                             f"(valid: {-n}..{n - 1})")
        return axis % n

    def axis(self, i: int) -> IterDomain:
        return self._domain.loop[self._loop_index(i)]

    def loop_position(self, iter_domain: IterDomain) -> int:
        for pos, i in enumerate(self._domain.loop):
            if i is iter_domain:
                return pos
        return -1

    def _adopt(self, ids: Sequence[IterDomain]) -> None:
        for i in ids:
            i.tensor = self
        self.fusion.mark_changed()

    # --- loop transforms ---------------------------------------------------------------------
    def split(self, axis: int, factor: int | SymExpr | Any, inner_split: bool = True) -> TensorView:
        pos = self._loop_index(axis)
        factor = _as_factor(factor, f"{self.short_name} axis {pos}", self.fusion)
        split = Split(self._domain.loop[pos], factor, inner_split)
        self._adopt(split.outputs)
        self._domain.loop[pos:pos + 1] = [split.outer, split.inner]
        return self

    def inner_split(self, axis: int, factor: int | SymExpr | Any) -> TensorView:
        return self.split(axis, factor, inner_split=True)

    def outer_split(self, axis: int, factor: int | SymExpr | Any) -> TensorView:
        return self.split(axis, factor, inner_split=False)

    def swizzle1d(self, axis: int, parallel_type: ParallelType) -> TensorView:
        """nvFuser's cyclic shift of a loop ID by the rank's index along ``parallel_type``: once the ID is
        parallelized on stream, iteration ``i`` of its loop takes chunk ``(i + p) % n`` on the rank at
        position ``p`` of its team (``n`` ranks), so the ranks gather the shards of a stream loop in a ring
        (a collective permute per iteration) instead of each from one root."""
        if not isinstance(parallel_type, ParallelType) or not parallel_type.is_device:
            raise ValueError(f"{self.short_name}.swizzle1d: the parallel type must be a device one (mesh_x, mesh_y, "
                             f"mesh_z), got {parallel_type!r}")
        loop_id = self._domain.loop[self._loop_index(axis)]
        loop_id.swizzle = parallel_type
        self.fusion.mark_changed()
        return self

    def merge(self, axis: int, axis2: int | None = None) -> TensorView:
        outer_pos = self._loop_index(axis)
        inner_pos = outer_pos + 1 if axis2 is None else self._loop_index(axis2, "axis2")
        if inner_pos >= len(self._domain.loop):
            raise ValueError(f"{self.short_name}: cannot merge axis {outer_pos} with the next axis: it is the last loop ID")
        if inner_pos == outer_pos:
            raise ValueError(f"{self.short_name}: cannot merge axis {outer_pos} with itself")
        loop = self._domain.loop
        merge = Merge(loop[outer_pos], loop[inner_pos])
        self._adopt(merge.outputs)
        at = min(outer_pos, inner_pos)
        for pos in sorted((outer_pos, inner_pos), reverse=True):
            del loop[pos]
        loop.insert(at, merge.out)
        return self

    def reorder(self, old2new: Mapping[int, int]) -> TensorView:
        loop = self._domain.loop
        n = len(loop)
        moves = {self._loop_index(o, "reorder source"): self._loop_index(nw, "reorder target")
                 for o, nw in dict(old2new).items()}
        if len(set(moves.values())) != len(moves):
            raise ValueError(f"{self.short_name}: reorder {dict(old2new)} sends two axes to the same position")
        result: list[IterDomain | None] = [None] * n
        for old, new in moves.items():
            result[new] = loop[old]
        rest = iter(loop[i] for i in range(n) if i not in moves)
        self._domain.loop = [r if r is not None else next(rest) for r in result]
        self.fusion.mark_changed()
        return self

    def set_loop_domain(self, ids: Sequence[IterDomain]) -> TensorView:
        ids = list(ids)
        try:
            check_covers(ids, self._domain.logical, f"{self.short_name} loop domain")
        except DomainCoverageError as e:
            raise ValueError(str(e)) from None
        self._adopt(ids)
        self._domain.loop = ids
        return self

    # --- allocation --------------------------------------------------------------------------
    def set_allocation_domain(self, ids: Sequence[IterDomain], contiguity: bool | Sequence[bool | None] = True,
                              *, hint: bool = False) -> TensorView:
        """Set how the tensor is laid out. A user's call is a requirement; passes pass ``hint=True``."""
        d = self._domain
        if d.allocation_frozen:
            raise ValueError(f"{self.short_name}: allocation domain is final after pre-segmentation passes "
                             "(this tensor can be a segment boundary); it cannot be changed")
        if hint and d.has_allocation and not d.allocation_is_hint:
            raise ValueError(f"{self.short_name}: allocation domain ({_ids(d.allocation or [])}) is a user "
                             "requirement and cannot be replaced by an inferred layout")
        if hint and self.is_fusion_output and self.fusion.get_output_stride_order(self) is not None:
            raise ValueError(f"{self.short_name}: output stride order {self.fusion.get_output_stride_order(self)} "
                             "is a user requirement and cannot be replaced by an inferred layout")
        ids = list(ids)
        for i in ids:
            if not isinstance(i, IterDomain):
                raise TypeError(f"{self.short_name}: allocation domain entries must be IterDomains, got {type(i).__name__}")
        try:
            check_covers(ids, d.logical, f"{self.short_name} allocation domain")
        except DomainCoverageError as e:
            raise ValueError(str(e)) from None
        d.contiguity = _normalize_contiguity(self.short_name, ids, contiguity)
        d.allocation = ids
        d.allocation_is_hint = hint
        self.fusion.mark_changed()
        return self

    def clear_allocation_domain(self) -> TensorView:
        d = self._domain
        if d.allocation_frozen:
            raise ValueError(f"{self.short_name}: allocation domain is final and cannot be cleared")
        d.allocation = None
        d.allocation_is_hint = False
        d.contiguity = default_contiguity(d.logical)
        self.fusion.mark_changed()
        return self

    def freeze_allocation(self) -> None:
        self._domain.allocation_frozen = True

    def set_memory_type(self, memory_type: MemoryType) -> TensorView:
        if not isinstance(memory_type, MemoryType):
            raise TypeError(f"{self.short_name}: expected a MemoryType, got {type(memory_type).__name__}")
        self.memory_type = memory_type
        self.fusion.mark_changed()
        return self

    def set_device_mesh(self, mesh: DeviceMesh | None) -> TensorView:
        """Place the tensor on ``mesh``; None (a copy of a tensor without a mesh) leaves it unplaced."""
        self.device_mesh = mesh
        self.fusion.mark_changed()
        return self

    # --- caches ------------------------------------------------------------------------------
    def cache_after(self, memory_type: MemoryType | LoadStoreOpType = MemoryType.Local,
                    propagate_allocation_domain: bool = True) -> TensorView:
        """Insert ``cache = set(self)`` and make every consumer read ``cache``.

        With ``propagate_allocation_domain`` the cache starts with ``self``'s allocation replayed
        onto its own IDs, as a hint. A global-memory cache (transpose, matmul staging) keeps that
        layout. An on-chip (local / shared) cache's layout is only valid until its loop domain is
        transformed: the scheduler must then re-derive it from the loop domain
        (``pyfuser.scheduler.cache.derive_allocation_from_loop``) rather than keep a copy of the
        global input's allocation (docs/cached_inputs.md).

        nvFuser's first argument, a ``LoadStoreOpType``, is taken too: ``set`` is a local cache.
        """
        memory_type = _cache_memory_type(self, memory_type, "cache_after")
        uses = list(self.uses)
        cache = new_like(self)
        cache.memory_type = memory_type
        op = LoadStoreOp(self.fusion, cache, self)
        for use in uses:
            use.replace_input(self, cache)
        if propagate_allocation_domain and self.has_allocation_domain():
            alloc = replay_allocation(self, cache, op.logical_map(self))
            cache.set_allocation_domain(alloc, True, hint=True)
        return cache

    def rfactor(self, axes: Sequence[int]) -> TensorView:
        """Reduce the loop axes ``axes`` of this reduction into a new partial tensor, which this
        tensor then reduces over its other reduction axes (nvFuser's ``rFactor``); returns the
        partial tensor. Each step can then be parallelized on its own."""
        return rfactor(self, axes)

    def cache_before(self, memory_type: MemoryType | LoadStoreOpType = MemoryType.Local) -> TensorView:
        """Make ``self``'s definition write a new tensor ``cache``, then ``self = set(cache)``.

        ``self`` keeps its layout (requirement, hint or finalized allocation): only its IDs are
        renewed when the reduction moves into the cache. The cache gets no allocation domain;
        an on-chip cache's layout is derived from its loop domain by the scheduler.
        """
        memory_type = _cache_memory_type(self, memory_type, "cache_before")
        definition = self.definition
        if definition is None:
            raise ValueError(f"{self.short_name} has no definition (it is a fusion input); use cache_after")
        d = self._domain
        reduces = any(i.is_reduction() for i in d.logical)
        if reduces and d.allocation is not None and any(i.definition is not None for i in d.allocation):
            raise ValueError(f"{self.short_name}: cache_before cannot move a reduction out of a tensor whose "
                             f"allocation domain ({_ids(d.allocation)}) is transformed; call cache_before first")
        cache_logical = [i.clone() for i in d.logical]
        cache = TensorView(self.fusion, TensorDomain(cache_logical), self.dtype, memory_type)
        definition.replace_output(self, cache)
        if reduces:
            # The reduction now happens in the cache; self only copies its result, in its own layout.
            kept = no_reductions(d.logical)
            renewed = {id(old): old.clone() for old in kept}
            d.logical = [renewed[id(i)] for i in kept]
            self._adopt(d.logical)
            d.loop = list(d.logical)
            if d.allocation is not None:
                d.allocation = [renewed[id(i)] for i in d.allocation if not i.is_reduction()]
        LoadStoreOp(self.fusion, self, cache)
        return cache


def _cache_memory_type(tv: TensorView, kind: MemoryType | LoadStoreOpType, what: str) -> MemoryType:
    """The memory a cache lives in: a MemoryType, or nvFuser's copy kind (``set``: local memory). A
    hardware copy (TMA, ldmatrix, cp.async) is nvFuser's CUDA code generator's; Triton chooses its
    own copy instructions for a tile, so asking for one is refused where it is asked."""
    if isinstance(kind, LoadStoreOpType):
        if kind.is_hardware_copy:
            raise UnsupportedFeatureError(
                f"{tv.short_name}.{what}(LoadStoreOpType.{kind.name}) (a {kind.value} copy, a GPU copy instruction of "
                "nvFuser's CUDA code generator)",
                f"use {what}() or {what}(LoadStoreOpType.set): Triton chooses the copy instructions of a tile itself")
        if kind is not LoadStoreOpType.set:
            raise ValueError(f"{tv.short_name}: {what} takes LoadStoreOpType.set (a local cache), got {kind.name}; "
                             "fd.ops.segment_set makes a segment boundary")
        return MemoryType.Local
    if not isinstance(kind, MemoryType):
        raise TypeError(f"{tv.short_name}: {what} expects a MemoryType or a LoadStoreOpType, got {type(kind).__name__}")
    return kind


def user_scheduled(tv: TensorView) -> bool:
    """True when the loop domain differs from the logical domain or has a parallelized ID."""
    loop, logical = tv.get_loop_domain(), tv.get_logical_domain()
    if len(loop) != len(logical) or any(a is not b for a, b in zip(loop, logical, strict=True)):
        return True
    return any(i.parallel_type is not ParallelType.serial for i in loop)


def as_defined(tv: TensorView) -> bool:
    """Nothing set on ``tv`` since its definition: no schedule (``user_scheduled``), allocation domain
    or inlining position. A pass may rewrite such a tensor freely."""
    return not tv.has_allocation_domain() and tv.compute_at_pos == 0 and not user_scheduled(tv)


def new_like(tv: TensorView, dtype: DataType | None = None) -> TensorView:
    """A fresh local tensor with ``tv``'s logical shape (reductions dropped), in ``tv``'s dtype or ``dtype``."""
    logical = [i.clone() for i in tv.get_logical_domain(no_reductions=True)]
    return TensorView(tv.fusion, TensorDomain(logical), tv.dtype if dtype is None else dtype)


def _ids(ids: Sequence[IterDomain]) -> str:
    return ", ".join(map(str, ids))


def _as_factor(factor: Any, where: str, fusion: Fusion) -> int | SymExpr:
    if isinstance(factor, Scalar):
        if factor.fusion is not fusion:
            raise ValueError(f"{where}: split factor {factor} belongs to another FusionDefinition")
        if not (factor.is_const or factor.is_fusion_input):
            raise ValueError(f"{where}: split factor {factor} must be a constant or an input scalar of the fusion "
                             "(its value is needed before any op runs)")
        if factor.is_fusion_input:
            factor.require_at_least(1, f"{where} split factor")
        factor = factor.as_extent()
    if isinstance(factor, SymExpr):
        value = factor.value
        if value is not None and value <= 0:
            raise ValueError(f"{where}: split factor must be positive, got {value}")
        return factor
    if isinstance(factor, bool) or not isinstance(factor, int):
        raise TypeError(f"{where}: split factor must be a positive int, got {type(factor).__name__}")
    if factor <= 0:
        raise ValueError(f"{where}: split factor must be positive, got {factor}")
    return factor


def _normalize_contiguity(name: str, ids: Sequence[IterDomain], contiguity: bool | Sequence[bool | None]) -> Contiguity:
    kept = no_reductions(ids)
    if isinstance(contiguity, bool):
        return default_contiguity(kept, contiguity)
    values = list(contiguity)
    if len(values) != len(kept):
        raise ValueError(f"{name}: contiguity {values} has {len(values)} entries but the allocation domain has "
                         f"{len(kept)} non-reduction IDs ({_ids(kept)})")
    result: Contiguity = []
    for i, c in zip(kept, values, strict=True):
        if i.is_broadcast():
            result.append(None)
        elif c is None:
            raise ValueError(f"{name}: contiguity of non-broadcast ID {i} must be True or False, got None")
        else:
            result.append(bool(c))
    return result
