"""Operand handling and shape helpers shared by every group of ``fd.ops``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, overload

from pyfuser.ir.base import Scalar, Val
from pyfuser.ir.dtypes import DataType, check_scalar_in_range, data_type_of_python
from pyfuser.ir.iter_domain import IterDomain, IterType
from pyfuser.ir.ops.shape import BroadcastOp, ExpandOp
from pyfuser.ir.symbolic import SymExpr, as_sym
from pyfuser.ir.tensor_domain import TensorDomain
from pyfuser.ir.tensor_view import TensorView

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from pyfuser.ir.fusion import Fusion

Operand = TensorView | Scalar | int | float | bool | complex
#: What a pointwise op returns: a tensor when any operand is one, else a scalar (host arithmetic),
#: itself an operand of further ops.
PointwiseResult = TensorView | Scalar
SizeLike = int | Scalar | SymExpr


class OpsBase:
    """Operand checks, ID creation and broadcasting shared by the op groups."""

    def __init__(self, fusion: Fusion) -> None:
        self._fusion = fusion
        #: (tensor name, rank) -> the broadcast inserted to bring that tensor to that rank, reused so
        #: ``x + b`` and ``x - b`` do not broadcast ``b`` twice.
        self._rank_broadcasts: dict[tuple[int, int], TensorView] = {}

    if TYPE_CHECKING:  # ops of other groups that shared helpers build on (``Ops`` joins the groups)
        def broadcast(self, x: TensorView, is_broadcast_dim: Sequence[bool]) -> TensorView: ...

        def squeeze(self, x: TensorView, dims: Sequence[int] | int, squeeze_expanded: bool = False) -> TensorView: ...

        @overload
        def cast(self, x: TensorView, dtype: DataType | torch.dtype) -> TensorView: ...

        @overload
        def cast(self, x: Scalar | int | float | bool | complex, dtype: DataType | torch.dtype) -> Scalar: ...

        def cast(self, x: Operand, dtype: DataType | torch.dtype) -> PointwiseResult: ...

        def expand(self, x: TensorView, shape: Sequence[SizeLike]) -> TensorView: ...

    # --- operand handling ------------------------------------------------------------------
    def _check_operand(self, x: Any, what: str) -> None:
        if isinstance(x, Val):
            if x.fusion is not self._fusion:
                raise ValueError(f"{what}: {x} belongs to another FusionDefinition")
        elif not isinstance(x, (bool, int, float, complex)):
            raise TypeError(f"{what}: expected a tensor, scalar or Python number, got {type(x).__name__}")

    def _val(self, x: Any, what: str) -> Val:
        self._check_operand(x, what)
        if isinstance(x, Val):
            return x
        dtype = data_type_of_python(x)
        check_scalar_in_range(x, dtype, what)
        return Scalar(self._fusion, dtype, x)

    def _tv(self, x: Any, what: str) -> TensorView:
        val = self._val(x, what)
        if not isinstance(val, TensorView):
            raise TypeError(f"{what}: expected a tensor, got {val}")
        return val

    def _new_tv(self, ids: list[IterDomain], dtype: DataType) -> TensorView:
        return TensorView(self._fusion, TensorDomain(ids), dtype)

    def _id(self, extent: SymExpr | int, iter_type: IterType = IterType.Iteration) -> IterDomain:
        return IterDomain(self._fusion, extent, iter_type)

    def _shape(self, shape: Sequence[Any], what: str) -> list[SymExpr]:
        """Each size of a new tensor's ``shape`` as an extent (``what[k]`` names it in errors; -1 refused)."""
        return [self._size(size, f"{what}[{k}]") for k, size in enumerate(shape)]

    @overload
    def _size(self, size: Any, what: str, allow_minus_one: Literal[False] = False, allow_negative: bool = False,
              negative_input_ok: bool = False) -> SymExpr: ...

    @overload
    def _size(self, size: Any, what: str, allow_minus_one: Literal[True], allow_negative: bool = False,
              negative_input_ok: bool = False) -> SymExpr | None: ...

    def _size(self, size: Any, what: str, allow_minus_one: bool = False, allow_negative: bool = False,
              negative_input_ok: bool = False) -> SymExpr | None:
        """A size argument as an extent (None for a -1 placeholder when allowed).

        ``allow_negative``: a negative constant is meaningful (pad widths crop, slice indices count
        from the end). An input scalar is checked to be non-negative when it is bound, unless
        ``negative_input_ok`` (pad widths).
        """
        if isinstance(size, Scalar):
            if size.fusion is not self._fusion:
                raise ValueError(f"{what}: {size} belongs to another FusionDefinition")
            if not size.is_size_like:
                raise ValueError(f"{what}: {size} must be a constant, an input scalar of the fusion or computed "
                                 "from sizes (fd.ops.size): sizes are known before any op runs")
            extent = size.as_extent()
            if size.is_fusion_input and not negative_input_ok:
                size.require_at_least(0, what)
            elif extent.value is not None and not allow_negative and extent.value < 0:
                raise ValueError(f"{what}: expected a non-negative size, got {size}")
            return extent
        if isinstance(size, SymExpr):
            return size
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"{what}: expected an int or an integer scalar, got {type(size).__name__}")
        check_scalar_in_range(size, DataType.Int, what)
        if size == -1 and allow_minus_one:
            return None
        if size < 0 and not allow_negative:
            raise ValueError(f"{what}: expected a non-negative size, got {size}")
        return as_sym(size)

    # --- shapes ----------------------------------------------------------------------------
    def _broadcast_to_rank(self, tv: TensorView, rank: int) -> TensorView:
        """numpy-style: prepend broadcast axes so ``tv`` has ``rank`` axes."""
        missing = rank - tv.ndim
        if missing <= 0:
            return tv
        key = (tv.name, rank)
        if key not in self._rank_broadcasts:
            bcast = self.broadcast(tv, [True] * missing + [False] * tv.ndim)
            definition = bcast.definition
            assert isinstance(definition, BroadcastOp)  # axes were added
            definition.implicit = True
            self._rank_broadcasts[key] = bcast
        return self._rank_broadcasts[key]

    @staticmethod
    def _expanded_positions(tensors: Sequence[TensorView]) -> dict[int, set[int]]:
        """Per tensor (by id): output positions (operands aligned right) of its axes that an ``expand``
        made from broadcast axes.

        An expanded broadcast holds one value along the axis, and nvFuser keeps it a broadcast whose
        expanded extent gives way to any other axis it meets (``broadcast_in_dim`` of a mask to
        ``[b, n, n, c]`` then ``where`` on a ``[b, n, n, 2 * c]`` tensor); torch's rule, which the
        other axes follow, would reject the pair."""
        rank = max(t.ndim for t in tensors)
        result = {}
        for tv in tensors:
            definition = tv.definition
            axes = definition.expanded_axes if isinstance(definition, ExpandOp) else []
            result[id(tv)] = {d + rank - tv.ndim for d in axes}
        return result

    def _meet_expanded(self, operands: list[Any], extents: list[SymExpr | None],
                       expanded: dict[int, set[int]]) -> list[Any]:
        """``operands`` with each one whose expanded axes differ from the op's output ``extents`` expanded
        again, from its broadcast axes, to those extents."""
        rank = len(extents)
        result = []
        for x in operands:
            if isinstance(x, TensorView) and expanded[id(x)]:
                ids = x.get_logical_domain(no_reductions=True)
                shape = [i.extent for i in ids]
                for pos in range(len(ids)):
                    want = extents[pos + rank - x.ndim]
                    if pos + rank - x.ndim in expanded[id(x)] and want is not None:
                        shape[pos] = want
                if shape != [i.extent for i in ids]:
                    definition = x.definition
                    assert isinstance(definition, ExpandOp)  # x is in expanded: an ExpandOp defines it
                    x = self.expand(definition.tensor_input(0), shape)
            result.append(x)
        return result

    @staticmethod
    def _pointwise_extents(op: str, tensors: list[TensorView],
                           expanded: dict[int, set[int]] | None = None) -> list[SymExpr | None]:
        """Output extents of a pointwise op (None: broadcast), numpy-style (operands aligned right);
        an ``expanded`` axis (``_expanded_positions``) counts only where no other axis is concrete.

        Checks static extents on the operands as the user wrote them, before anything is created,
        so a rejected op leaves the fusion untouched and the error names the user's axes.
        """
        rank = max(t.ndim for t in tensors)
        domains = [t.get_logical_domain(no_reductions=True) for t in tensors]
        expanded = expanded or {}
        out: list[SymExpr | None] = []
        for d in range(rank):
            chosen: IterDomain | None = None
            owner = ""
            concrete = {id(tv) for tv, ids in zip(tensors, domains, strict=True)
                        if d - (rank - len(ids)) >= 0 and not ids[d - (rank - len(ids))].is_broadcast()
                        and d not in expanded.get(id(tv), ())}
            for tv, ids in zip(tensors, domains, strict=True):
                pos = d - (rank - len(ids))
                if pos < 0 or ids[pos].is_broadcast() or (concrete and id(tv) not in concrete):
                    continue
                i = ids[pos]
                where = f"{tv.short_name} axis {pos}" + (f" (output axis {d})" if pos != d else "")
                if chosen is None:
                    chosen, owner = i, where
                elif chosen.extent.is_const and i.extent.is_const and chosen.extent != i.extent:
                    raise ValueError(f"{op}: incompatible broadcast shapes: {owner} has extent {chosen.extent} but "
                                     f"{where} has extent {i.extent}; declare an axis with size 1 to broadcast it")
                elif not chosen.extent.is_const and i.extent.is_const:
                    chosen = i  # prefer the static extent
            out.append(None if chosen is None else chosen.extent)
        return out


def clone_id(ops: OpsBase, i: IterDomain) -> IterDomain:
    return ops._id(i.extent, IterType.Broadcast if i.is_broadcast() else IterType.Iteration)


def normalize_axis(axis: int, rank: int, tv: TensorView, what: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"{tv.short_name}: {what} must be ints, got {axis!r}")
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"{tv.short_name}: {what} entry {axis} is out of range for rank {rank} "
                         f"(valid: {-rank}..{rank - 1})")
    return axis % rank if rank else 0


def check_same_extent(op: str, ta: TensorView, da: int, ia: IterDomain, tb: TensorView, db: int, ib: IterDomain) -> None:
    if ia.extent.is_const and ib.extent.is_const and ia.extent != ib.extent:
        raise ValueError(f"{op}: {ta.short_name} axis {da} has extent {ia.extent} but {tb.short_name} axis {db} has "
                         f"extent {ib.extent}; they are contracted (or matched) and must be equal")
