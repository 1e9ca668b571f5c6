"""Data movement and shape ops: set, broadcast, squeeze, expand, permute, reshape, slice, cat, pad."""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from pyfuser.ir.base import Expr, PythonCall, Val
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.ops.common import bool_flags, call_string, checked_sizes, header, int_list, positional_map
from pyfuser.ir.symbolic import SymConst, SymExpr

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion
    from pyfuser.ir.iter_domain import IterDomain
    from pyfuser.ir.tensor_view import TensorView


class LoadStoreOpType(Enum):
    """The copy kinds; the value is the printed name."""

    #: a copy; schedulers pick where it lives
    set = "Set"
    #: a copy that also forces a segment boundary
    segment_set = "SegmenterSet"
    # nvFuser's hardware copies (its ``LoadStoreOpType``): named so that nvFuser code reads the same,
    # refused by ``cache_after`` / ``cache_before`` (UnsupportedFeatureError): Triton picks them itself.
    load_matrix = "LdMatrix"
    cp_async = "CpAsync"
    tma = "CpAsyncBulkTensorTile"

    @property
    def is_hardware_copy(self) -> bool:
        """A copy instruction of nvFuser's CUDA backend, which pyfuser's kernels do not name."""
        return self not in (LoadStoreOpType.set, LoadStoreOpType.segment_set)


class LoadStoreOp(Expr):
    """``out = in`` (a copy). Between tensors of different meshes or shardings it is a communication."""

    def __init__(self, fusion: Fusion, out: TensorView, inp: TensorView,
                 kind: LoadStoreOpType = LoadStoreOpType.set, stride_order: Sequence[int] | None = None) -> None:
        super().__init__(fusion, [inp], [out])
        self.kind = kind
        #: ``fd.ops.stride_order``: the copy exists to give ``out`` this memory layout (a requirement
        #: on its allocation domain), not just to copy.
        self.stride_order = None if stride_order is None else list(stride_order)

    def evaluate(self, ctx: EvalContext, x: Any) -> list[Any]:
        return [x]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return positional_map(producer, self.output)

    def python_call(self) -> PythonCall:
        if self.stride_order is not None:
            return PythonCall("stride_order", (self.inputs[0],), {"stride_order": self.stride_order})
        return PythonCall(self.kind.name, (self.inputs[0],))

    def to_string(self, indent: int = 0) -> str:
        return f"{header(self.output, indent)}{self.kind.value}( {self.inputs[0]}, cache_op=Streaming )\n"


class BroadcastOp(Expr):
    """Insert size-1 broadcast axes where ``flags`` (one per output axis) is True."""


    def __init__(self, fusion: Fusion, out: TensorView, inp: TensorView, flags: Sequence[bool],
                 implicit: bool = False) -> None:
        super().__init__(fusion, [inp], [out])
        self.flags = tuple(flags)
        self._index = tuple(None if f else slice(None) for f in self.flags)
        #: Inserted by a pointwise op to align its operands' ranks (numpy-style), not written by the
        #: user: the Python definition passes the operand itself, so a 0-dim operand keeps promoting
        #: like a number when the definition is rebuilt.
        self.implicit = implicit

    def evaluate(self, ctx: EvalContext, x: torch.Tensor) -> list[Any]:
        return [x[self._index]]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return positional_map(producer, self.output, [i for i, f in enumerate(self.flags) if f])

    def python_call(self) -> PythonCall:
        return PythonCall("broadcast", (self.inputs[0],), {"is_broadcast_dim": list(self.flags)})

    def to_string(self, indent: int = 0) -> str:
        return call_string(self.output, "broadcast", self.inputs, f"flags = {bool_flags(self.flags)}", indent)


class SqueezeOp(Expr):
    """Remove size-1 axes where ``flags`` (one per input axis) is True."""


    def __init__(self, fusion: Fusion, out: TensorView, inp: TensorView, flags: Sequence[bool]) -> None:
        super().__init__(fusion, [inp], [out])
        self.flags = tuple(flags)
        self.dims = tuple(i for i, f in enumerate(self.flags) if f)
        in_ids = inp.get_logical_domain(no_reductions=True)
        #: Expanded broadcast axes (stride 0, any size): squeezed by keeping their first slice.
        self.expanded = [d for d in self.dims if in_ids[d].expanded]
        self.runtime_checked = [d for d in self.dims if not in_ids[d].is_broadcast() and in_ids[d].extent.value != 1
                                and d not in self.expanded]

    def evaluate(self, ctx: EvalContext, x: torch.Tensor) -> list[Any]:
        for d in self.runtime_checked:
            if x.shape[d] != 1:
                raise ValueError(f"squeeze: {self.tensor_input(0).short_name} axis {d} has size {x.shape[d]}; "
                                 "only size-1 axes can be squeezed")
        if self.expanded:
            x = x.narrow(self.expanded[0], 0, 1) if len(self.expanded) == 1 else x[
                tuple(slice(0, 1) if d in self.expanded else slice(None) for d in range(x.dim()))]
        return [x.squeeze(self.dims) if self.dims else x]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        kept = [p for p, f in zip(producer.get_logical_domain(no_reductions=True), self.flags, strict=True) if not f]
        return dict(zip(kept, self.output.get_logical_domain(), strict=True))

    def python_call(self) -> PythonCall:
        extra = {"squeeze_expanded": True} if self.expanded else {}
        return PythonCall("squeeze", (self.inputs[0],), {"dims": list(self.dims), **extra})

    def to_string(self, indent: int = 0) -> str:
        return call_string(self.output, "squeeze", self.inputs, f"flags = {bool_flags(self.flags)}", indent)


class ExpandOp(Expr):
    """Expand broadcast axes to the output's extents (a stride-0 view)."""


    def __init__(self, fusion: Fusion, out: TensorView, inp: TensorView,
                 size_checks: Sequence[tuple[int, SymExpr]] = (), shape: Sequence[SymExpr | None] | None = None) -> None:
        super().__init__(fusion, [inp], [out])
        #: the shape as given (None: -1, keep the extent), printed by the Python definition
        self.shape = list(shape) if shape is not None else [i.extent for i in out.get_logical_domain()]
        in_ids = inp.get_logical_domain(no_reductions=True)
        out_ids = out.get_logical_domain()
        self._expanded = [(d, o.extent) for d, (i, o) in enumerate(zip(in_ids, out_ids, strict=True))
                          if i.is_broadcast() and not (o.is_broadcast() and o.extent.value == 1)]
        #: (axis, size) of non-broadcast axes the user gave a size whose equality with the axis's
        #: extent is only known at execution
        self.size_checks = list(size_checks)
        #: (axis, the axis's extent, size): compared on bound extents, not on the tensor the op gets,
        #: which may be one chunk of a stream loop
        self._extent_checks = [(d, in_ids[d].extent, size) for d, size in self.size_checks]

    @property
    def expanded_axes(self) -> list[int]:
        """The axes expanded from broadcasts (a value repeated along each)."""
        return [d for d, _ in self._expanded]

    def _check_sizes(self, ctx: EvalContext, x: torch.Tensor) -> None:
        for d, extent, size in self._extent_checks:
            have, want = extent.evaluate(ctx.env), size.evaluate(ctx.env)
            if have != want:
                raise ValueError(f"expand: {self.tensor_input(0, as_defined=True).short_name} axis {d} has size {have} and "
                                 f"is not a broadcast axis; cannot expand it to {want}")

    def evaluate(self, ctx: EvalContext, x: torch.Tensor) -> list[Any]:
        if self.size_checks:
            self._check_sizes(ctx, x)
        sizes = list(x.shape)
        for d, extent in self._expanded:
            sizes[d] = extent.evaluate(ctx.env)
        return [x.expand(checked_sizes(f"expand {self.output.short_name}", sizes))]

    def evaluate_into(self, ctx: EvalContext, out: torch.Tensor, x: torch.Tensor) -> None:
        """``out`` may be a chunk of the expanded axis (stream loop): broadcasting fills it."""
        if self.size_checks:
            self._check_sizes(ctx, x)
        out.copy_(x)

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return positional_map(producer, self.output)

    def python_call(self) -> PythonCall:
        return PythonCall("expand", (self.inputs[0],), {"shape": [-1 if e is None else e for e in self.shape]})

    def to_string(self, indent: int = 0) -> str:
        extents = [str(i.extent) for i in self.output.get_logical_domain()]
        return call_string(self.output, "expand", self.inputs, f"{{{', '.join(extents)}}}", indent)


class PermuteOp(Expr):
    """``out`` axis i is ``in`` axis ``dims[i]``."""


    def __init__(self, fusion: Fusion, out: TensorView, inp: TensorView, dims: Sequence[int]) -> None:
        super().__init__(fusion, [inp], [out])
        self.dims = tuple(dims)

    def evaluate(self, ctx: EvalContext, x: torch.Tensor) -> list[Any]:
        return [x.permute(self.dims)]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        p_ids = producer.get_logical_domain(no_reductions=True)
        return {p_ids[src]: c for src, c in zip(self.dims, self.output.get_logical_domain(), strict=True)}

    def python_call(self) -> PythonCall:
        return PythonCall("permute", (self.inputs[0],), {"dims": list(self.dims)})

    def to_string(self, indent: int = 0) -> str:
        return f"{header(self.output, indent)}Set.Permute( {self.inputs[0]}, cache_op=Streaming )\n"


class ReshapeOp(Expr):
    """Reshape to the output's logical extents (evaluated from bound sizes), each divided by the output
    axis's shard factor when the op runs on one rank's shard (``run_on_shards``)."""

    chunkable = False

    def __init__(self, fusion: Fusion, out: TensorView, inp: TensorView,
                 new_shape: Sequence[SymExpr | None] | None = None) -> None:
        super().__init__(fusion, [inp], [out])
        self._extents = [i.extent for i in out.get_logical_domain()]
        #: the shape as given (None: the -1 entry), printed by the Python definition
        self.new_shape = list(new_shape) if new_shape is not None else list(self._extents)
        #: per output axis, how many ranks split it; empty: the op reshapes whole tensors
        self.shard_factors: tuple[int, ...] = ()
        self._set_static()

    def _set_static(self) -> None:
        """The output sizes when all are constant (shapes torch.compile marks static), and their product."""
        known = [e.value for e in self._extents if e.value is not None]
        if self.shard_factors and len(known) == len(self._extents):
            known = self._local(known)
        self._static = tuple(known) if len(known) == len(self._extents) else None
        self._static_numel = math.prod(self._static) if self._static is not None else -1

    def run_on_shards(self, factors: Sequence[int]) -> None:
        """Reshape one rank's shard: output axis ``d`` is split over ``factors[d]`` ranks (``decompose_resharding``
        lets a reshape run on shards only where a shard of its operand is exactly a shard of its result)."""
        self.shard_factors = tuple(factors) if any(f > 1 for f in factors) else ()
        self._set_static()

    def _local(self, sizes: Sequence[int]) -> list[int]:
        """The output's global ``sizes`` divided by the shard factors: what one rank's shard holds."""
        for d, (n, f) in enumerate(zip(sizes, self.shard_factors, strict=True)):
            if n % f:
                raise ValueError(f"reshape: {self.output.short_name} axis {d} has extent {n}, which is not divisible "
                                 f"by the {f} ranks it is sharded over")
        return [n // f for n, f in zip(sizes, self.shard_factors, strict=True)]

    def evaluate(self, ctx: EvalContext, x: torch.Tensor) -> list[Any]:
        if self._static is not None and (ctx.binding is not None or x.numel() == self._static_numel):
            return [x.reshape(self._static)]  # the hot path of a static shape (a binding fixes the sizes)
        try:
            sizes = [e.evaluate(ctx.env) for e in self._extents]
        except ZeroDivisionError:  # a -1 entry next to sizes that multiply to 0
            raise ValueError(f"reshape: cannot reshape {self.tensor_input(0, as_defined=True).short_name} "
                             f"(shape {list(x.shape)}) into {self.output}: the -1 entry is ambiguous when the other "
                             "sizes multiply to 0") from None
        negative = next((d for d, n in enumerate(sizes) if n < 0), None)
        if negative is not None:  # a size computed from scalars: only known now
            raise ValueError(f"reshape: {self.tensor_input(0, as_defined=True).short_name} cannot be reshaped to {sizes}: "
                             f"new_shape[{negative}] is negative")
        if self.shard_factors:
            sizes = self._local(sizes)
        if math.prod(sizes) != x.numel():  # symbolic sizes: only known now
            raise ValueError(f"reshape: {self.tensor_input(0, as_defined=True).short_name} has {x.numel()} elements "
                             f"(shape {list(x.shape)}) and cannot be reshaped to {sizes}")
        return [x.reshape(sizes)]

    def python_call(self) -> PythonCall:
        return PythonCall("reshape", (self.inputs[0],), {"new_shape": [-1 if e is None else e for e in self.new_shape]})

    def to_string(self, indent: int = 0) -> str:
        return call_string(self.output, "view", self.inputs, "", indent)


class SliceOp(Expr):
    """Slice each axis by ``(start, stop, step)``, already normalized to ``0 <= start <= stop <= extent``."""

    chunkable = False

    def __init__(self, fusion: Fusion, out: TensorView, inp: TensorView,
                 ranges: Sequence[tuple[SymExpr, SymExpr, int]],
                 given: Sequence[tuple[SymExpr, SymExpr, int]] | None = None) -> None:
        super().__init__(fusion, [inp], [out])
        self.ranges = list(ranges)
        #: the bounds as given (before Python's normalization), printed by the Python definition
        self.given = list(given) if given is not None else list(self.ranges)
        in_ids = inp.get_logical_domain(no_reductions=True)
        self._untouched = [d for d, ((start, stop, step), i) in enumerate(zip(self.ranges, in_ids, strict=True))
                           if start.value == 0 and stop == i.extent and step == 1]

    def evaluate(self, ctx: EvalContext, x: torch.Tensor) -> list[Any]:
        env = ctx.env
        index = tuple(slice(start.evaluate(env), stop.evaluate(env), step) for start, stop, step in self.ranges)
        return [x[index]]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        p_ids = producer.get_logical_domain(no_reductions=True)
        c_ids = self.output.get_logical_domain()
        return {p_ids[d]: c_ids[d] for d in self._untouched}

    def shardable_axes(self) -> set[int]:
        """The axes it takes whole: a shard of them is sliced like the whole tensor."""
        return set(self._untouched)

    def python_call(self) -> PythonCall:
        """nvFuser prints the normalized bounds with ``manual_normalization=True``; a bound whose
        normalized form is symbolic (a ``min`` / ``max`` against an extent) is printed as given
        instead, and then the flag is left out so that the rebuilt slice normalizes it again."""
        starts: list[SymExpr] = []
        stops: list[SymExpr] = []
        normalized = True
        for (lo, hi, _), (first, last, _) in zip(self.ranges, self.given, strict=True):
            for bound, as_given, printed in ((lo, first, starts), (hi, last, stops)):
                if bound.is_const or bound == as_given:
                    printed.append(bound)
                else:
                    printed.append(as_given)
                    normalized = False
        return PythonCall("slice", (self.inputs[0],), {"start_indices": starts, "end_indices": stops,
                                                       "strides": [g[2] for g in self.given],
                                                       "manual_normalization": True if normalized else None})

    def to_string(self, indent: int = 0) -> str:
        ranges = ", ".join(f"{a} : {b} : {c}" for a, b, c in self.ranges)
        return call_string(self.output, "slice", self.inputs, f"{{{ranges}}}", indent)


class CatOp(Expr):
    chunkable = False

    def __init__(self, fusion: Fusion, out: TensorView, inputs: Sequence[TensorView], dim: int) -> None:
        super().__init__(fusion, list(inputs), [out])
        self.dim = dim
        first = inputs[0]
        self._checks = [c for k in range(1, len(inputs)) for d in range(first.ndim) if d != dim
                        for c in unproven_equal(inputs, k, d, 0, d)]

    def evaluate(self, ctx: EvalContext, *xs: torch.Tensor) -> list[Any]:
        if self._checks:
            check_same_sizes("cat", self._checks, self.defined_inputs, xs)
        return [torch.cat(xs, self.dim)]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        mapping = positional_map(producer, self.output)
        return {p: c for d, (p, c) in enumerate(mapping.items()) if d != self.dim}

    def shardable_axes(self) -> set[int]:
        """All but the axis it concatenates along: shards of the operands there concatenate to a shard."""
        return set(range(self.output.ndim)) - {self.dim}

    def python_call(self) -> PythonCall:
        return PythonCall("cat", (list(self.inputs),), {"dim": self.dim})

    def to_string(self, indent: int = 0) -> str:
        return call_string(self.output, "cat", self.inputs, str(self.dim), indent)


class PadOp(Expr):
    """Constant padding; ``widths`` in torch's ``F.pad`` order (last axis first)."""

    chunkable = False

    def __init__(self, fusion: Fusion, out: TensorView, inp: TensorView, widths: Sequence[SymExpr],
                 value: Val) -> None:
        super().__init__(fusion, [inp, value], [out])
        self.widths = list(widths)

    def evaluate(self, ctx: EvalContext, x: torch.Tensor, value: Any) -> list[Any]:
        pads = [w.evaluate(ctx.env) for w in self.widths]
        what = f"pad {self.output.short_name} (of {self.tensor_input(0, as_defined=True).short_name} with widths {pads})"
        sizes = list(x.shape)
        for k in range(0, len(pads), 2):
            d, left, right = len(sizes) - 1 - k // 2, pads[k], pads[k + 1]
            crop = -min(left, 0) - min(right, 0)
            if crop > sizes[d]:  # torch crops before it pads
                raise ValueError(f"{what}: axis {d} has size {sizes[d]}; widths {left}, {right} would crop "
                                 f"{crop - sizes[d]} elements more than it has")
            sizes[d] += left + right
        checked_sizes(what, sizes, self.output.dtype.itemsize)
        return [F.pad(x, pads, value=value)]

    def axis_widths(self, dim: int) -> tuple[SymExpr, SymExpr]:
        """The (left, right) widths of axis ``dim`` (0 for an axis ``widths`` does not reach)."""
        k = (self.tensor_input(0).ndim - 1 - dim) * 2
        return (self.widths[k], self.widths[k + 1]) if k + 1 < len(self.widths) else (SymConst(0), SymConst(0))

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        rank = producer.ndim
        padded = {rank - 1 - k // 2 for k, w in enumerate(self.widths) if w.value != 0}
        mapping = positional_map(producer, self.output)
        return {p: c for d, (p, c) in enumerate(mapping.items()) if d not in padded}

    def shardable_axes(self) -> set[int]:
        """The axes it does not pad: a shard of them is padded like the whole tensor."""
        mapped = set(self.logical_map(self.tensor_input(0)).values())
        return {d for d, i in enumerate(self.output.get_logical_domain()) if i in mapped}

    def python_call(self) -> PythonCall:
        return PythonCall("pad", (self.inputs[0],), {"pad_widths": list(self.widths), "value": self.inputs[1]})

    def to_string(self, indent: int = 0) -> str:
        return call_string(self.output, "pad", self.inputs[:1], f"{int_list(self.widths)}, {self.inputs[1]}", indent)


# --- runtime size checks ---------------------------------------------------------------------------
#: ``(operand, axis, other operand, other axis)``: two operand axes whose runtime sizes must agree.
SizeCheck = tuple[int, int, int, int]


def describe_axis(val: Any, axis: int) -> str:
    """``T1 axis 0`` for axis ``axis`` of ``val``, seen through broadcasts that fd.ops inserted
    (so a runtime error names the tensor the user defined, not an internal one)."""
    while isinstance(val.definition, BroadcastOp) and not val.is_fusion_input:
        flags = val.definition.flags
        if flags[axis]:
            break
        axis -= sum(flags[:axis])
        val = val.definition.inputs[0]
    return f"{val.short_name} axis {axis}"


def unproven_equal(operands: Sequence[Any], ka: int, da: int, kb: int, db: int) -> list[SizeCheck]:
    """``[(ka, da, kb, db)]`` when those operand axes must match but their extents are not provably
    equal at definition (so the sizes are compared at execution)."""
    ia = operands[ka].get_logical_domain(no_reductions=True)[da]
    ib = operands[kb].get_logical_domain(no_reductions=True)[db]
    if ia.is_broadcast() or ib.is_broadcast() or ia.extent == ib.extent:
        return []
    return [(ka, da, kb, db)]


def check_same_sizes(op: str, checks: Sequence[SizeCheck], operands: Sequence[Any], args: Sequence[Any]) -> None:
    """Raise ValueError naming both tensors and axes when runtime sizes of a check differ.
    Index-based, so it costs a few tuple lookups per execution."""
    for ka, da, kb, db in checks:
        sa, sb = args[ka].shape[da], args[kb].shape[db]
        if sa != sb:
            raise ValueError(f"{op}: {describe_axis(operands[ka], da)} has size {sa} but "
                             f"{describe_axis(operands[kb], db)} has size {sb}; they must be equal "
                             "(declare an axis with size 1 to broadcast it)")
