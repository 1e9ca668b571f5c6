"""Values in a generated kernel: loads, pointwise ops, and reductions, each at a loop point.

A mixin of ``KernelBuilder`` (it shares the builder's code writer, indexing and arguments). A value
is computed where a consumer first reads it and remembered by its tensor and indices, so two
consumers reading it at the same loop point share it (within the scope that computed it).

Half and bfloat16 are computed in float32 and rounded where the fusion stores or casts them, as
nvFuser does. Reductions accumulate in float32 for floating inputs (the output's dtype otherwise).

Floating reductions are as accurate as torch's, also on data far from 0 (rows of mean 1e4, std 1):

* a sum or mean read in a loop keeps, per lane, what each add's rounding lost in a second
  accumulator (a lane adds up one value per iteration, where a long row's rounding errors would
  otherwise build up), then adds the lanes' sums and losses in float64 (once per lane: the tree's
  levels round at the scale of the whole sum);
* ``var_mean`` of a row on chip takes the corrected two-pass: a first mean, then the sums of the
  deviations from it and of their squares, which correct the mean and give the spread exactly;
* ``var_mean`` of a row read in a loop is Welford's update per lane on the lane's values less its
  first value (a shift), so the running mean is a small number that rounds little, then the lanes
  combine by sums (Chan's formula at once): a centre near the mean, then the lanes' deviations from
  it and their squared deviations summed in float64;
* the programs' partial sums of a reduction across programs add up in float64 in the last launch;
* a sum or mean of float32 data on chip, on a GPU, adds pairs of a sum and what its rounding lost
  (``_two_sum``, Knuth's exact sum): a GPU thread adds its share of the tile (32 values of a row of
  2048 on 2 warps) one after another before the tree across threads, where torch's kernel gives a
  thread about 4 of a row of 1500 (an rmsnorm row's mean of squares rounded twice torch's error).
  Tiles of at most ``PLAIN_SUM_ELEMENTS`` reduced values keep the plain sum: a thread adds at most 8
  of them (Triton gives a row's tile 32 threads, 4 values each, before it spreads rows), as torch's
  threads do, and the pairs' operations made such sums instruction-bound (the mean of float32 rows
  of 127: 0.38x of Inductor on an H200).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

import torch

from pyfuser.codegen.kernel_source import KernelError
from pyfuser.codegen.triton_ops import TRITON_POINTWISE
from pyfuser.codegen.triton_support import NAN, compute_dtype, int_expr, literal, triton_dtype
from pyfuser.ir.analysis.resize import branched_parts
from pyfuser.ir.analysis.value_range import integer_bounds
from pyfuser.ir.base import Expr, Scalar, Val
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.iter_domain import GRID_PARALLEL_TYPES, IterDomain, ParallelType
from pyfuser.ir.ops import (
    BinaryOp,
    BinaryOpType,
    BroadcastOp,
    CatOp,
    ExpandOp,
    FullOp,
    IotaOp,
    LoadStoreOp,
    PadOp,
    PermuteOp,
    ReductionOp,
    ReductionOpType,
    ReshapeOp,
    SliceOp,
    SqueezeOp,
    TernaryOp,
    TernaryOpType,
    UnaryOp,
    UnaryOpType,
    VarMeanOp,
)
from pyfuser.ir.ops.indexing import IndexedRead
from pyfuser.ir.ops.promotion import result_dtype
from pyfuser.ir.ops.rfactor import WelfordCombineOp, WelfordPartialOp
from pyfuser.ir.tensor_domain import transforms_between
from pyfuser.ir.tensor_view import TensorView

if TYPE_CHECKING:
    from pyfuser.codegen.code_writer import CodeWriter
    from pyfuser.ir.symbolic import SymExpr

#: Exprs a kernel computes by indexing their producer differently; the value passes through.
INDEX_ONLY_OPS = (LoadStoreOp, BroadcastOp, ExpandOp, SqueezeOp, PermuteOp)
#: predicates: boolean results of operands compared in their promoted dtype (isnan / isinf of one)
_COMPARISONS = frozenset({BinaryOpType.eq, BinaryOpType.ne, BinaryOpType.lt, BinaryOpType.le, BinaryOpType.gt,
                          BinaryOpType.ge, UnaryOpType.isnan, UnaryOpType.isinf})
_LOGICAL = frozenset({BinaryOpType.logical_and, BinaryOpType.logical_or, UnaryOpType.logical_not})
#: ops whose boolean results are computed on booleans (not widened to int32 and compared): the logical
#: ones, casts, and ``~`` (of a widened True, -2: nonzero)
_IN_BOOL = _LOGICAL | {UnaryOpType.cast, UnaryOpType.bitwise_not}
#: reduction kind -> (combine function of the prelude, identity as a function of the accumulator dtype)
_COMBINE = {ReductionOpType.sum: "_add", ReductionOpType.mean: "_add", ReductionOpType.prod: "_mul",
            ReductionOpType.max: "_max", ReductionOpType.min: "_min"}
#: What a masked lane adds to a floating accumulator: the combine's identity.
_NEUTRAL = {ReductionOpType.sum: "0.0", ReductionOpType.mean: "0.0", ReductionOpType.max: "-_INF",
            ReductionOpType.min: "_INF"}


def _domain_ids(tv: TensorView) -> list[IterDomain]:
    """Every ID of ``tv``'s domain from its root (or logical) domain to its loop domain."""
    start = tv.domain().root or tv.get_logical_domain()
    loop = tv.get_loop_domain()
    between = [i for t in transforms_between(start, loop) for i in (*t.inputs, *t.outputs)]
    return list({id(i): i for i in (*start, *between, *loop)}.values())


_EVICT_LAST = ", eviction_policy='evict_last'"
_EVICT_FIRST = ", eviction_policy='evict_first'"


class L2Hint(Enum):
    """What a kernel's loads ask of L2 (Triton's ``eviction_policy``). ``keep``: every load's lines stay
    (``evict_last``: read again soon, a normalization's row between its passes); ``keep_until_last``: so
    do they, but the pass that reads the widest inputs for the last time (the one writing a looped
    normalization's outputs) lets their lines go first (``evict_first``), as Inductor's looped
    normalizations do, leaving L2 to the rows other programs still read again; ``stream``: the lines of
    the inputs the kernel streams through once, its widest, go first (``evict_first``: a plain reduction's
    input; narrower inputs, broadcast and read by many programs, take no hint); ``none``: no hint."""

    keep = "keep"
    keep_until_last = "keep_until_last"
    stream = "stream"
    none = "none"


def _identity(kind: ReductionOpType, dtype: DataType) -> object:
    if kind in (ReductionOpType.sum, ReductionOpType.mean):
        return 0
    if kind is ReductionOpType.prod:
        return 1
    if dtype.is_floating:
        return float("-inf") if kind is ReductionOpType.max else float("inf")
    info = torch.iinfo(dtype.torch_dtype)
    return info.min if kind is ReductionOpType.max else info.max


def _to(src: DataType, dst: DataType) -> str:
    if src is dst:
        return ""
    if dst is DataType.Bool:
        return " != 0"
    return f".to({triton_dtype(dst)})"


def _rounded(value: str, dtype: DataType) -> str:
    """``value`` (float32) rounded to ``dtype`` when that is half or bfloat16, which are computed in
    float32: every tensor of those dtypes holds rounded values, as in ATen and in nvFuser's
    registers, so a comparison or a steep op after it sees what they see."""
    if dtype is DataType.BFloat16:
        return f"_round_bf16({value})"
    if dtype is DataType.Half:
        return f"({value}).to(tl.float16).to(tl.float32)"
    return value


def _widened(value: str, dtype: DataType) -> str:
    """A loaded ``value`` of ``dtype`` in the dtype it is computed in (half and bfloat16: float32)."""
    if dtype is DataType.BFloat16:
        return f"_from_bf16({value})"  # the prelude's conversion (the interpreter's own mangles subnormals)
    return f"{value}{_to(dtype, compute_dtype(dtype))}"


def accumulator_dtype(out: DataType) -> DataType:
    """Floating reductions accumulate in float32 (or double); integers and bools in their output type
    (a bool max / min in int32, then compared)."""
    dtype = compute_dtype(out)
    return DataType.Int32 if dtype is DataType.Bool else dtype


#: ``x ** c`` for the constant exponents ATen computes without ``pow`` (its ``pow_tensor_scalar``
#: kernels): a multiplication or a root, not the general ``exp2(c * log2(x))`` with its special cases.
_POW_BY_CONSTANT = {1.0: "{0}", 2.0: "{0} * {0}", 3.0: "{0} * {0} * {0}", 0.5: "tl.sqrt({0})", -0.5: "tl.rsqrt({0})",
                    -1.0: "1.0 / {0}", -2.0: "1.0 / ({0} * {0})"}


def _pow_by_constant(expr: UnaryOp | BinaryOp | TernaryOp) -> str | None:
    exponent = expr.inputs[1]
    value = exponent.value if isinstance(exponent, Scalar) else None
    if value is None or isinstance(value, complex):
        return None
    return _POW_BY_CONSTANT.get(float(value))


def promoted_dtype(expr: UnaryOp | BinaryOp | TernaryOp) -> DataType:
    """The dtype torch converts an op's operands to: its output's, except for comparisons and the
    predicates ``isnan`` / ``isinf`` (the operands' common type, by torch's promotion)."""
    if expr.kind in _COMPARISONS:
        if isinstance(expr, UnaryOp):
            return expr.inputs[0].dtype
        # an operand that was a 0-dim tensor (a full reduction's result) promotes like a number, as it
        # did when the op was defined: ``min(x) >= x.bfloat16()`` compares in bfloat16
        return result_dtype(torch.add, expr.inputs, expr.number_like)
    return expr.outputs[0].dtype


def _in_range(index: TensorView, axis: IterDomain) -> bool:
    """Whether every value of ``index`` is a position of the constant-extent ``axis``."""
    bounds = integer_bounds(index)
    extent = 1 if axis.is_broadcast() else axis.extent.value if axis.extent.is_const else None
    return bounds is not None and isinstance(extent, int) and 0 <= bounds[0] and bounds[1] < extent


def op_dtype(expr: UnaryOp | BinaryOp | TernaryOp) -> DataType:
    """The dtype an op computes in: the promoted one (half and bfloat16 in float32), except bool
    arithmetic (torch saturates True + True: computed wide, then != 0)."""
    if expr.kind in _COMPARISONS:
        return compute_dtype(promoted_dtype(expr))
    out = compute_dtype(expr.outputs[0].dtype)
    if out is DataType.Bool and expr.kind not in _IN_BOOL:
        return DataType.Int32
    return out


#: The most values of a tile a float32 sum on chip adds without ``_two_sum`` pairs (see the module's
#: docstring): a thread adds at most 8 of them one after another.
PLAIN_SUM_ELEMENTS = 256


@dataclass
class Indices:
    """Logical index expressions of one tensor, and merged groups of its logical IDs with their index."""

    of: dict[int, str] = field(default_factory=dict)
    groups: list[tuple[tuple[int, ...], str]] = field(default_factory=list)
    #: conditions under which the indices address an element (a pad's or cat's operand read inside
    #: its part of the consumer, an indexed read inside the looked-up axis); a load is masked by them
    valid: tuple[str, ...] = ()


def _with_lost(total: str, lost: str) -> str:
    """A float64 sum joined with what its adds lost, or the sum alone where it is not finite (an inf or
    NaN value made the lost part NaN)."""
    return f"tl.where({total} - {total} == 0, {total} + {lost}, {total})"


@dataclass
class _Accumulation:
    """One reduction being computed: its accumulators (one; a sum and its compensation; Welford's
    shift, mean, m2 and count; or the on-chip var_mean's values and valid lanes) and the key its
    results are remembered by."""

    expr: ReductionOp | VarMeanOp
    out: TensorView
    key: tuple[object, ...]
    dtype: DataType
    on_chip: bool
    #: a floating sum or mean read in a loop: a compensated sum per lane (the sum and what it lost)
    compensated: bool
    names: list[str]

    #: the tile axes the accumulators span: those the reduction's loop domain iterates
    axes: frozenset[int]
    #: an online sum of ``exp(y - max(y))``: the max's accumulation its lanes' sums are relative to
    shift: _Accumulation | None = None
    #: a sum of an online softmax's pass: a plain float32 sum per lane, the lanes' sums joined in float64
    plain: bool = False
    #: a max: the online sums it rescales, and the name of its lanes' maxima kept for their finish
    rescaled: list[_Accumulation] = field(default_factory=list)
    lane_max: str = ""

    @property
    def welford(self) -> bool:
        """A var_mean: Welford's accumulators (or the on-chip var_mean's)."""
        return isinstance(self.expr, VarMeanOp)

    def shape(self, builder: ValueLowering) -> str:
        """The accumulators' tile shape: the tile's size along their axes, 1 along the others (a
        scalar where they span none)."""
        if not self.axes:
            return "[]"
        return f"[{', '.join(t if k in self.axes else '1' for k, t in enumerate(builder.tile_shape))}]"

    def declare(self, builder: ValueLowering) -> None:
        code = builder.code
        identity = _identity(self.expr.kind, self.dtype) if isinstance(self.expr, ReductionOp) else 0
        shape = self.shape(builder)
        for name in self.names:
            code.emit(f"{name} = tl.full({shape}, {literal(identity, self.dtype)}, {triton_dtype(self.dtype)})")
            code.dims[name] = self.axes


class ValueLowering:
    """Mixin: the value of a tensor or scalar at a loop point."""

    if TYPE_CHECKING:  # the kernel's state and loop nest, which ``KernelBuilder`` holds and builds
        code: CodeWriter
        target: str
        l2: L2Hint
        #: positions (in ``inputs``) of the widest inputs: what ``L2Hint.stream`` hints
        streamed: frozenset[int]
        #: whether the kernel asserts on the device (an index's range): compiled in Triton's debug mode
        device_asserts: bool
        #: names of the inputs that hold an earlier launch's partial results per program
        partials: frozenset[int]
        #: the loads being emitted are in the pass that writes the kernel's last output (``L2Hint``)
        last_pass: bool
        #: reductions being accumulated now
        accumulating: int
        inputs: list[TensorView]
        tile_shape: list[str]
        _scalars: dict[str, tuple[str, DataType, Val]]

        def offset(self, tv: TensorView, position: int, indices: Indices) -> tuple[str, frozenset[int]]: ...

        def extent(self, i: IterDomain) -> SymExpr: ...

        def size_symbol(self, logical: IterDomain) -> SymExpr: ...

        def index_of_loop_id(self, i: IterDomain, taken: dict[int, int]) -> str | None: ...

        def walk_back(self, tv: TensorView, partial: bool = False) -> Indices: ...

        def producer_indices(self, expr: Expr, producer: TensorView, consumer: Indices) -> Indices: ...

        def resize_indices(self, expr: SliceOp | PadOp | CatOp, operand: int, consumer: Indices) -> Indices: ...

        def open_loops_for(self, tv: TensorView, reduction: bool | None = None) -> int: ...

        def share_reduction_loops(self, leader: TensorView, others: list[TensorView]) -> None: ...

        def sibling_reductions(self, expr: ReductionOp | VarMeanOp) -> list[ReductionOp | VarMeanOp]: ...

        def online_sums(self, group: list[ReductionOp | VarMeanOp]) -> list[tuple[ReductionOp, ReductionOp]]: ...

        def outputs_of_the_pass(self, leader: TensorView,
                                group: list[ReductionOp | VarMeanOp]) -> list[tuple[int, TensorView]]: ...

        def store_computed_outputs(self) -> None: ...

        def _store(self, tv: TensorView, position: int) -> None: ...

    @property
    def gpu_sums(self) -> bool:
        """Whether tile sums are written as a GPU runs them: ``tl.reduce`` with a combine function, which
        a GPU thread applies to its share of the tile one value after another before the tree across
        threads (Triton's interpreter applies it one value after another to the whole axis), not
        ``tl.standard._sum_combine``, which the interpreter sums with numpy (pairwise)."""
        return self.target == "cuda"

    def value(self, val: Val, indices: Indices | None) -> str:
        """``val`` at the loop point where a consumer reads it with ``indices`` (None for scalars)."""
        if isinstance(val, Scalar):
            return self.scalar(val)
        assert isinstance(val, TensorView) and indices is not None
        key = (val.name, *(indices.of.get(id(i), "0") for i in val.get_logical_domain()
                           if not i.is_broadcast() and not i.is_reduction()), *indices.valid)
        cached = self.code.recall(key)
        if cached is not None:
            return cached
        definition = val.definition
        if val.is_cpu and definition is None:
            result = self.by_value(f"cpu_{val.short_name}", val)
        elif val in self.inputs:
            position = self.inputs.index(val)
            offset, dims = self.offset(val, position, indices)
            result = self.load(val, position, offset, self.code.mask(dims, uses=offset), dims, indices.valid)
        elif isinstance(definition, ReductionOp | VarMeanOp):
            self.reduce(definition)  # first read at this loop point: reduce here
            # read through a pad's or cat's operand part: the reduced value is the one of its loop point
            # (the part's condition selects the read, not the reduction's operands)
            reduced = self.code.recall(key[:len(key) - len(indices.valid)])
            if reduced is None:
                raise KernelError(f"{val.short_name} is read at a loop point where it was not reduced; read the "
                                  "reduction where its consumers' loops map onto its iteration axes")
            return reduced
        else:
            assert definition is not None
            result = self.compute(definition, val, indices)
        self.code.remember(key, result)
        return result

    def load(self, tv: TensorView, position: int, offset: str, mask: str, dims: frozenset[int],
             valid: tuple[str, ...]) -> str:
        """Input ``tv`` (kernel argument ``position``) read at ``offset`` under ``mask`` (the loop point's
        conditions) and the ``valid`` conditions (inside a pad's or cat's operand part, inside the
        looked-up axis), widened to the dtype it is computed in."""
        if valid:
            condition = " & ".join(valid)
            inside = condition if condition.isidentifier() else self.code.assign("inside", condition)
            # constant or scalar offsets beside a varying address: a mask of the address's shape
            if self.code.dims_in(offset) - self.code.dims_of(inside):
                inside = self.code.assign("inside", f"(({offset}) * 0 == 0) & {inside}")
            elif self.code.is_constant(condition):  # a Python bool beside a scalar address: a typed one
                inside = self.code.assign("inside", f"tl.full([], {condition}, tl.int1)")
            # ``!= 0``: the interpreter's ``&`` of a loop index's 0-dim condition with a tile gives
            # a mask of a dtype its load refuses; a compiled kernel folds it away
            mask = self.code.assign("mask", f"({mask} & {inside}) != 0" if mask else f"{inside} != 0")
            if self.code.dims_of(inside) - dims:  # the address varies along fewer tile axes: widen it
                offset = f"{offset} + {inside}.to(tl.int32) * 0"
        # ``L2Hint.keep``: an H200 run of every kernels.py case with and without it on every load:
        # rmsnorm 3966 -> 4126 GB/s, softmax 4011 -> 4158, transpose + add and the cast chain +1%,
        # the others within run-to-run noise (a hand-written rmsnorm kernel: 4005 -> 4142,
        # ``evict_first`` 3828); those cases move 256 MiB and more; smaller rows on chip gain too
        # (``inner_persistent.compute_heuristics``). ``L2Hint.stream`` (plain reductions): an H200
        # row sum written by hand in Inductor's shape, bf16 1024 x 32000, 21.9 us with ``evict_first``,
        # 23.8-25.0 without a hint, 25.6-27.2 with ``evict_last``; float32 512 x 65536 38.4 / 41.6 / -.
        # ``L2Hint.keep_until_last``: H200 A/B over the sweep's looped norms, softmaxes and losses (217
        # points, each in one process with and without): 1.019x on the 132 points of 32 MiB and more
        # (softmax bf16 130 x 131072 1.18x, float32 1024 x 32000 1.09x; worst 0.96x), 1.0x below.
        last_read = self.l2 is L2Hint.keep_until_last and self.last_pass and not self.accumulating
        hint = _EVICT_FIRST if position in self.streamed and (last_read or self.l2 is L2Hint.stream) else \
            _EVICT_LAST if self.l2 in (L2Hint.keep, L2Hint.keep_until_last) else ""
        load = f"tl.load(T{position} + {offset}, mask={mask}, other=0{hint})" if mask else \
            f"tl.load(T{position} + {offset}{hint})"
        return self.code.assign("v", _widened(load, tv.dtype), cse=False)

    def indexed_read(self, expr: IndexedRead, out: TensorView, indices: Indices) -> str:
        """index_select, gather / take_along_axis, index or embedding at ``out``'s ``indices``: each index
        value read (or computed) there, then an indirect load of the lookup tensor (a kernel input) at
        those values along the indexed axes and at ``out``'s positions along the others.

        Each index is checked to be in ``[0, extent)`` (``[-extent, extent)`` where negative values
        count from the end) where the loop point is in range, unless its bounds prove it
        (``integer_bounds``: an index clamped to the axis), as ATen's CUDA kernels assert it: a
        device-side assert on a GPU (``KernelSource.device_asserts``), a ValueError through the
        interpreter (``_check_index``); the load is masked by the range too, so no lane reads out of
        bounds either way. The index term is 64-bit (an int32 index is widened): ``index * stride``
        spans the lookup tensor's whole axis, where 32 bits may overflow."""
        code = self.code
        lookup = expr.lookup
        if lookup not in self.inputs:
            raise KernelError(f"{out.short_name}: {expr.op_name} reads {lookup.short_name} at indexed positions; "
                              "it must be an input of the kernel (global memory), not a value the kernel computes")
        position = self.inputs.index(lookup)
        lookup_ids = lookup.get_logical_domain(no_reductions=True)
        out_ids = out.get_logical_domain(no_reductions=True)
        read = Indices(of={})
        checks = []
        for dim, index in expr.index_reads():
            at = self.value(index, self.producer_indices(expr, index, indices))
            if index.dtype is not DataType.Int:
                at = code.assign("ix", f"({at}).to(tl.int64)")
            extent = "1" if lookup_ids[dim].is_broadcast() else int_expr(self.size_symbol(lookup_ids[dim]))
            if _in_range(index, lookup_ids[dim]):  # (clamped to the axis: no check, no wrap)
                read.of[id(lookup_ids[dim])] = at
                continue
            if expr.allows_negative:
                at = code.assign("ix", f"tl.where({at} < 0, {at} + {extent}, {at})")
            checks.append((code.assign("inside", f"({at} >= 0) & ({at} < {extent})"),
                           f"{expr.op_name}: index {index.short_name} holds a value out of range for "
                           f"{lookup.short_name} axis {dim} (valid: {'-size' if expr.allows_negative else '0'} to "
                           "its size - 1)"))
            read.of[id(lookup_ids[dim])] = at
        pairs = {id(out_ids[o]): id(lookup_ids[a]) for a, o in expr.lookup_axes()}
        for o, a in pairs.items():
            read.of[a] = indices.of.get(o, "0")
        if expr.lookup_exact:  # the paired axes have one extent: a merged index of them addresses both
            read.groups = [(tuple(pairs[k] for k in group), ix) for group, ix in indices.groups
                           if all(k in pairs for k in group)]
        offset, dims = self.offset(lookup, position, read)
        mask = code.mask(dims, uses=offset)
        for inside, message in checks:
            if self.target == "cuda":
                code.emit(f"tl.device_assert({inside}, {message!r}{', mask=' + mask if mask else ''})")
                self.device_asserts = True
            else:
                code.emit(f"_check_index({inside}, {mask or 'None'}, {message!r})")
        return self.load(lookup, position, offset, mask, dims, (*indices.valid, *(inside for inside, _ in checks)))

    def resized(self, expr: PadOp | CatOp, out: TensorView, indices: Indices) -> str:
        """A pad (its operand inside, its value on the border) or a cat (each operand in its part):
        ``tl.where`` over the in-range conditions, each operand read masked to its part."""
        dtype = compute_dtype(out.dtype)
        if isinstance(expr, PadOp):
            fill = expr.inputs[1]
            assert isinstance(fill, Scalar)
            # a typed 0-dim value: the interpreter's tl.where calls .to on its operands
            value = f"tl.full([], {literal(fill.value, dtype)}, {triton_dtype(dtype)})" if fill.is_const else \
                self.convert(self.value(fill, None), fill.dtype, dtype)
            value = _rounded(value, out.dtype)  # the border holds the value as the output's dtype stores it
            parts = [expr.inputs[0]]
        else:
            value = None
            parts = list(expr.inputs)
        branched = branched_parts(expr) if self.tile_shape and not self.code.masked_uniform else frozenset()
        for k in reversed(range(len(parts))):
            part = parts[k]
            assert isinstance(part, TensorView)
            inner = self.resize_indices(expr, k, indices)
            inside = " & ".join(inner.valid[len(indices.valid):])
            if inside and k in branched:
                def read_part(p: TensorView = part, i: Indices = inner) -> str:
                    return self.convert(self.value(p, i), p.dtype, dtype)

                value = self.part_where_inside(inside, read_part, value, dtype)
                continue
            read = self.convert(self.value(part, inner), part.dtype, dtype)
            # The last operand of a cat needs no condition (the others' parts are decided before it),
            # nor does the operand of a pad of zero widths.
            value = read if value is None or not inside else self.code.assign(
                "v", f"tl.where({inside}, {read}, {value})")
        assert value is not None
        return value

    def part_where_inside(self, inside: str, compute: Callable[[], str], otherwise: str | None,
                          dtype: DataType) -> str:
        """``tl.where(inside, compute(), otherwise)`` for a costly part of a pad or cat (``branched_parts``),
        its code under an ``if`` that some lane of the tile is ``inside``: a tile wholly in another part
        (the pointwise scheduler aligns tiles with a costly cat's parts) skips it. The result starts as
        ``otherwise`` (0 for a cat's first-computed part) broadcast to the tile axes the part varies along,
        so both paths give Triton one type."""
        code = self.code
        start, indent = len(code.lines), code.indent
        code.open("if _pending_:")
        read = compute()
        dims = code.dims_in(read) | code.dims_in(inside) | (code.dims_in(otherwise) if otherwise else frozenset())
        result = code.fresh("v")
        code.emit(f"{result} = tl.where({inside}, {read}, {result})")
        code.close()
        shape = ", ".join(self.tile_shape[d] if d in dims else "1" for d in range(len(self.tile_shape)))
        init = (f"tl.broadcast_to({otherwise}, [{shape}])" if otherwise is not None else
                f"tl.full([{shape}], {literal(0, dtype)}, {triton_dtype(dtype)})")
        some = f"tl.reduce(tl.where({inside}, 1, 0), None, _add) > 0" if code.dims_in(inside) else inside
        pad = "    " * indent
        code.lines[start:start + 1] = [f"{pad}{result} = {init}", f"{pad}if {some}:"]
        code.dims[result] = dims
        return result

    def scalar(self, val: Scalar) -> str:
        if val.is_const:
            return literal(val.value, compute_dtype(val.dtype))
        if val.is_fusion_input:
            return self.by_value(val.symbol, val)
        assert val.definition is not None
        key = (val.name,)
        cached = self.code.recall(key)
        if cached is None:
            cached = self.compute(val.definition, val, None)
            self.code.remember(key, cached)
        return cached

    def by_value(self, symbol: str, val: Val) -> str:
        """A fusion input the kernel takes as an argument by value (a scalar, a 0-dim CPU tensor), as a
        typed 0-dim value bound at the kernel's entry: Triton's interpreter passes a float argument as
        a Python float (no ``.to``), a compiled kernel an int argument as int32 when it fits
        (arithmetic on it would wrap)."""
        self._scalars.setdefault(symbol, (f"arg_{symbol}", compute_dtype(val.dtype), val))
        return f"s_{symbol}"

    def compute(self, expr: Expr, out: Val, indices: Indices | None) -> str:
        def operand(v: Val) -> str:
            if isinstance(v, TensorView):
                assert indices is not None
                return self.value(v, self.producer_indices(expr, v, indices))
            return self.value(v, None)

        code = self.code
        if isinstance(expr, (*INDEX_ONLY_OPS, SliceOp, ReshapeOp)):
            return operand(expr.inputs[0])
        if isinstance(expr, PadOp | CatOp):
            assert indices is not None and isinstance(out, TensorView)
            return self.resized(expr, out, indices)
        if isinstance(expr, IndexedRead):
            assert indices is not None and isinstance(out, TensorView)
            return self.indexed_read(expr, out, indices)
        if isinstance(expr, FullOp):
            # A typed scalar: a bare 3 would be int32, a bare True no tensor at all.
            fill, dtype = expr.inputs[0], compute_dtype(out.dtype)
            value = literal(fill.value, dtype) if isinstance(fill, Scalar) and fill.is_const else operand(fill)
            return code.assign("v", _rounded(f"tl.full([], {value}, {triton_dtype(dtype)})", out.dtype))
        if isinstance(expr, IotaOp):
            assert indices is not None and isinstance(out, TensorView)
            index = indices.of[id(out.get_logical_domain()[0])]
            if self.code.is_constant(index):  # one element (or a slice of one): typed (a bare int has no .to)
                index = f"tl.full([], {index}, tl.int64)"
            dtype = compute_dtype(out.dtype)
            # start and step in the output's dtype (a double constant would make the sum float64)
            start, step = (literal(v.value, dtype) if isinstance(v, Scalar) and v.is_const else
                           self.convert(operand(v), v.dtype, dtype) for v in expr.inputs[1:])
            return code.assign("v", _rounded(f"({start} + ({index}){_to(DataType.Int, dtype)} * {step})", out.dtype))
        if isinstance(expr, UnaryOp | BinaryOp | TernaryOp):
            kind = expr.kind
            lowering = TRITON_POINTWISE.get(kind)
            if lowering is None:
                raise KernelError(f"{out}: {kind.name} has no Triton lowering")
            template = lowering.template
            dtype = op_dtype(expr)
            if kind is BinaryOpType.pow:
                template = _pow_by_constant(expr) or template
            args = []
            # A helper function of the prelude (``_div``) or a logical op reads its operands' dtype:
            # a constant operand is a typed 0-dim value there, not a bare Python number.
            typed = "_" in template or kind in _LOGICAL
            # A tensor operand of a wider dtype than a half or bfloat16 op (a 0-dim float tensor: torch
            # does not promote to it) is rounded to the op's dtype first, as torch converts it.
            promoted = promoted_dtype(expr)
            narrow = kind is not UnaryOpType.cast and compute_dtype(promoted) is not promoted
            for k, v in enumerate(expr.inputs):
                raw = kind in _LOGICAL or (kind is TernaryOpType.where and k == 0)
                if isinstance(v, Scalar) and v.is_const:
                    const_dtype = compute_dtype(v.dtype) if raw else dtype
                    text = literal(v.value, const_dtype)  # typed in the op's dtype: no conversion
                    args.append(f"tl.full([], {text}, {triton_dtype(const_dtype)})" if typed and
                                not text.startswith("tl.") else text)
                    continue
                value = operand(v)
                if not raw and narrow and isinstance(v, TensorView) and v.dtype is not promoted:
                    args.append(_rounded(self.convert(value, v.dtype, DataType.Float), promoted))
                else:
                    args.append(value if raw else self.convert(value, v.dtype, dtype))
            produced = DataType.Bool if kind in _COMPARISONS or kind in _LOGICAL else dtype
            text = template.format(*(f"({a})" for a in args))
            return code.assign("v", _rounded(f"({text}){_to(produced, compute_dtype(out.dtype))}", out.dtype))
        raise KernelError(f"{out.short_name if isinstance(out, TensorView) else out}: {expr.op_description} has no "
                          "Triton lowering")

    @staticmethod
    def convert(value: str, src: DataType, dst: DataType) -> str:
        src = compute_dtype(src)
        return f"({value}){_to(src, dst)}" if src is not dst else value

    def store_value(self, value: str, tv: TensorView) -> str:
        if tv.dtype is DataType.BFloat16:
            return f"_to_bf16({value})"  # the prelude's conversion (the interpreter's own truncates)
        return f"({value}){_to(compute_dtype(tv.dtype), tv.dtype)}"

    # --- reductions -------------------------------------------------------------------------------------
    def reduce(self, expr: ReductionOp | VarMeanOp) -> None:
        """Compute ``expr`` at the nest's iteration point: open its serial reduction loops (if any),
        accumulate per lane, then reduce across its reduction tile axes (kept as size-1 axes, so the
        result broadcasts against later tiles).

        One pass over the serial loops serves every reduction that iterates the same ones and reads
        none of them (``sibling_reductions``: layernorm backward's two sums across rows), and stores
        the outputs that would otherwise need a pass of their own over those loops
        (``outputs_of_the_pass``: its ``dx``), so the kernel reads its inputs once.
        """
        self.accumulating += 1
        try:
            self._reduce(expr)
        finally:
            self.accumulating -= 1

    def _reduce(self, expr: ReductionOp | VarMeanOp) -> None:
        code = self.code
        leader = self._accumulation(expr)
        if leader is None:
            return
        group = [leader, *(a for a in map(self._accumulation, self.sibling_reductions(expr)) if a is not None)]
        online = self._online(group)
        if online:
            # The pass computes two exponentials per value: its other sums (cross-entropy's picked
            # logit) add plainly per lane, as the online sums do, where Kahan's terms would cost as
            # much again (a lane adds one value per step: a few dozen on the widest rows).
            for acc in group:
                if acc.compensated:
                    acc.compensated, acc.plain, acc.names = False, True, acc.names[:1]
        group += online
        for acc in group:
            acc.declare(self)
        out = leader.out
        opened = self.open_loops_for(out, reduction=True)
        self.share_reduction_loops(out, [a.out for a in group[1:]])
        self.walk_back(out)
        # Conditions the same for the whole tile (a row past the end): a branch around the reads.
        branched = code.branch(code.uniform())
        for acc in group:
            if acc.rescaled:
                self._accumulate_online(acc)
            elif acc.shift is None:
                self._accumulate(acc)
        if opened:
            for position, tv in self.outputs_of_the_pass(out, [a.expr for a in group]):
                self._store(tv, position)
        self.store_computed_outputs()
        if branched:
            code.close()
        for _ in range(opened):
            code.close()
        for acc in group:
            if acc.rescaled:  # the lanes' maxima, before the max's finish reduces them in place
                acc.lane_max = code.assign("m", acc.names[0], cse=False)
        for acc in group:
            self._finish(acc)

    def _online(self, group: list[_Accumulation]) -> list[_Accumulation]:
        """The accumulations of the online sums of ``group``'s maxima (``online_sums``): one plain
        float32 sum per lane over the same tile axes as its max, linked to it. A lane adds one value
        per loop step (a few dozen for the widest rows), so its sum needs no compensation; the lanes'
        sums join in float64."""
        by_expr = {id(a.expr): a for a in group}
        found = []
        for expr, shift in self.online_sums([a.expr for a in group]):
            acc, m = self._accumulation(expr), by_expr[id(shift)]
            if acc is not None and acc.compensated and acc.axes == m.axes and acc.dtype is m.dtype:
                acc.shift, acc.compensated, acc.plain, acc.names = m, False, True, acc.names[:1]
                m.rescaled.append(acc)
                found.append(acc)
        return found

    def _accumulate_online(self, m: _Accumulation) -> None:
        """A max and the online sums of ``exp(y - max)`` it shifts, at this loop point: each lane's
        running max ``m`` rises to ``m' = max(m, y)`` and its sums become ``s * exp(m - m') +
        exp(y - m')`` (two exponentials per value, no select per sum: the loop is memory bound).

        A lane whose values so far are all -inf (or masked) keeps a max of -inf and sums of 0: its
        shift is 0 there, not ``m' = -inf`` (``exp(-inf + inf)`` is NaN). A +inf or NaN value makes the
        lane's sums NaN, as ``exp(y - max)`` makes some term NaN in the two-pass form. The lanes' sums
        join at the finish, each scaled by ``exp(lane max - row max)``: NaN for a row of only -inf,
        as the two-pass form's ``exp(-inf + inf)`` is there."""
        code = self.code
        expr, out, (running,) = m.expr, m.out, m.names
        y = expr.inputs[0]
        assert isinstance(y, TensorView)
        indices = self.walk_back(out)
        value = self.convert(self.value(y, self.producer_indices(expr, y, indices)), y.dtype, m.dtype)
        own = " ".join(indices.of[id(i)] for i in _domain_ids(out) if i.is_reduction() and id(i) in indices.of)
        mask = code.mask(m.axes, uses=f"{value} {own}")
        # a masked lane's placeholder value is -inf: its max does not rise, its term is 0
        kept = code.assign("y", f"tl.where({mask}, {value}, -_INF)", cse=False) if mask else value
        new = code.assign("m", f"_max({running}, {kept})", cse=False)
        base = code.assign("m", f"tl.where({new} == -_INF, 0.0, {new})", cse=False)
        scale = code.assign("f", f"tl.exp({running} - {base})", cse=False)
        term = code.assign("e", f"tl.exp({kept} - {base})", cse=False)
        for acc in m.rescaled:
            (total,) = acc.names
            code.emit(f"{total} = {total} * {scale} + {term}")
        code.emit(f"{running} = {new}")

    def _accumulation(self, expr: ReductionOp | VarMeanOp) -> _Accumulation | None:
        """How ``expr`` accumulates at this loop point; None when its value is already here."""
        out = expr.outputs[0]
        assert isinstance(out, TensorView)
        outer = self.walk_back(out, partial=True)  # iteration indices, assigned in this scope
        key = (out.name, *(outer.of.get(id(i), "0") for i in out.get_logical_domain()
                           if not i.is_broadcast() and not i.is_reduction()))
        if self.code.recall(key) is not None:
            return None
        # var_mean accumulates in float32, or float64 for double data (the output's precision); the
        # combine of programs' partial results in float64 (few values, counts beyond float32's integers)
        acc_dtype = (DataType.Double if out.dtype is DataType.Double or isinstance(expr, WelfordCombineOp)
                     else DataType.Float) if isinstance(expr, VarMeanOp) else accumulator_dtype(out.dtype)
        welford = isinstance(expr, VarMeanOp)
        looped = any(i.is_reduction() and i.parallel_type is ParallelType.serial for i in out.get_loop_domain())
        # var_mean over tile axes only (the row on chip): passes over registers; Welford's update is
        # for rows read in a loop, and combines partial results (counted) wherever they are read.
        on_chip = welford and not looped and not isinstance(expr, WelfordCombineOp)
        compensated = looped and isinstance(expr, ReductionOp) and expr.compensated and acc_dtype.is_floating and \
            expr.kind in (ReductionOpType.sum, ReductionOpType.mean)
        count = 2 if on_chip or compensated else 4 if welford else 1
        names = [self.code.fresh("acc") for _ in range(count)]
        return _Accumulation(expr, out, key, acc_dtype, on_chip, compensated, names,
                             self._accumulator_axes(out))

    def _accumulator_axes(self, out: TensorView) -> frozenset[int]:
        """The tile axes ``out``'s loop domain iterates: a reduction of values already added up along a
        tile axis (a step's rows, rfactored out of it) keeps an accumulator of size 1 there (every
        axis when a tile loop ID of it maps to no single tile axis). None when it iterates only loops
        and program ids: one value at a time (the programs' partial results of a split row, read in a
        loop by the launch that finishes it), kept in scalars, where a tile of copies would repeat
        every operation per element (a float64 Welford combine 8192 times over)."""
        every = frozenset(range(len(self.tile_shape)))
        axes: set[int] = set()
        taken: dict[int, int] = {}
        for i in out.get_loop_domain():
            if i.parallel_type is ParallelType.serial or i.parallel_type in GRID_PARALLEL_TYPES:  # a loop or the program id
                continue
            index = self.index_of_loop_id(i, taken)
            dims = self.code.dims.get(index) if index is not None else None
            if not dims or len(dims) != 1:
                return every
            axes |= dims
        return frozenset(axes)

    def _accumulate(self, acc: _Accumulation) -> None:
        """Add this loop point's values into the accumulators of ``acc``."""
        code = self.code
        expr, out, names, acc_dtype, on_chip, welford = acc.expr, acc.out, acc.names, acc.dtype, acc.on_chip, acc.welford
        kind = expr.kind if isinstance(expr, ReductionOp) else None
        indices = self.walk_back(out)
        producer = expr.inputs[0]
        assert isinstance(producer, TensorView)
        value = self.convert(self.value(producer, self.producer_indices(expr, producer, indices)), producer.dtype,
                             acc_dtype)
        # The bounds of the value's own indices and of the reduction's indices, from its loops to
        # its logical IDs (a split that overshoots the reduced extent is bounded there, also where
        # the value does not vary along the axis: a sum over an expanded axis); a bound of an
        # enclosing pass over a chunk of the same axis is not this reduction's (it iterates the
        # axis itself).
        own = " ".join(indices.of[id(i)] for i in _domain_ids(out) if i.is_reduction() and id(i) in indices.of)
        mask = code.mask(acc.axes, uses=f"{value} {own}")
        if on_chip:
            values, valid = names
            # ``+ values``: a value the same for every lane (a constant) still fills the tile
            code.emit(f"{values} = tl.where({mask}, {value}, 0.0)" if mask else f"{values} = {values} + {value}")
            code.emit(f"{valid} = tl.where({mask}, 1.0, 0.0)" if mask else f"{valid} = {valid} + 1.0")
        elif isinstance(expr, WelfordCombineOp):
            shift, mean, m2, count = names
            avg_p, m2_p, n_p = (self.convert(self.value(p, self.producer_indices(expr, p, indices)), p.dtype, acc_dtype)
                                for p in expr.tensor_inputs)
            mask = code.mask(acc.axes, uses=f"{avg_p} {m2_p} {n_p} {own}")
            # a partial of no elements (or a lane past the end) takes no part: count 0, its mean not read
            n_b = code.assign("d", f"tl.where({mask}, {n_p}, 0.0)" if mask else n_p, cse=False)
            avg_b = code.assign("d", f"tl.where({n_b} > 0, {avg_p}, 0.0)", cse=False)
            m2_b = code.assign("d", f"tl.where({n_b} > 0, {m2_p}, 0.0)", cse=False)
            code.emit(f"{shift}, {mean}, {m2}, {count} = _welford_combine({shift}, {mean}, {m2}, {count}, {avg_b}, "
                      f"{avg_b} * 0.0, {m2_b}, {n_b})")
        elif welford:
            shift, mean, m2, count = names
            valid = mask or "True"
            # The lane's first finite value is its shift (a lane's masked reads before it are replaced:
            # its count is still 0); an infinite first value leaves the shift 0.
            # (nested, not ``&``: the interpreter's ``&`` of a tile and a 0-dim value fails)
            code.emit(f"{shift} = tl.where({count} == 0, tl.where({value} - {value} == 0, {value}, {shift}), {shift})")
            code.emit(f"{count} = {count} + tl.where({valid}, 1.0, 0.0)")
            shifted = code.assign("d", f"{value} - {shift}", cse=False)
            delta = code.assign("d", f"{shifted} - {mean}", cse=False)
            # ``_approx_div`` (a reciprocal and a multiply, 2 ulp) for float32: the count is a whole number,
            # never near the range's ends; H200, bf16 layer norm 1024 x 32000 80.2 -> 72.2 us, channels-last
            # batch-norm statistics 1.08x, the other var_mean loops equal
            counted = f"tl.where({count} == 0, 1.0, {count})"
            step = f"_approx_div({delta}, {counted})" if acc_dtype is DataType.Float else f"{delta} / {counted}"
            code.emit(f"{mean} = {mean} + tl.where({valid}, {step}, 0.0)")
            code.emit(f"{m2} = {m2} + tl.where({valid}, {delta} * ({shifted} - {mean}), 0.0)")
        elif acc.compensated:
            total, lost = names
            # What the add lost to rounding, exactly where the lane's sum is at least as large as the
            # value (Dekker's fast two-sum: a row far from 0 after its first value), added up apart:
            # three operations a value. The sum never reads it, so an inf or NaN value leaves the sum
            # as torch's; the lost part turns NaN then and is dropped at the end (``_finish``).
            kept = code.assign("d", f"tl.where({mask}, {value}, 0.0)", cse=False) if mask else value
            summed = code.assign("d", f"{total} + {kept}", cse=False)
            code.emit(f"{lost} = {lost} + ({kept} - ({summed} - {total}))")
            code.emit(f"{total} = {summed}")
        else:
            (total,) = names
            assert kind is not None
            # A masked lane combines the identity: the select leaves the accumulator's dependency chain
            # (H200, plain float32 sums of bf16 rows 1024 x 32000: 31.0 -> 26.6 us, 127 x 32000: 16.8 ->
            # 12.4; column sums and maxima unchanged).
            neutral = _NEUTRAL.get(kind) if acc_dtype.is_floating else None
            if mask and neutral is not None:
                code.emit(f"{total} = {_COMBINE[kind]}({total}, tl.where({mask}, {value}, {neutral}))")
            else:
                combined = f"{_COMBINE[kind]}({total}, {value})"
                code.emit(f"{total} = tl.where({mask}, {combined}, {total})" if mask else f"{total} = {combined}")

    def _finish(self, acc: _Accumulation) -> None:
        """Reduce the accumulators of ``acc`` across its tile axes and remember the results."""
        code = self.code
        expr, out, names, acc_dtype, on_chip, key = acc.expr, acc.out, acc.names, acc.dtype, acc.on_chip, acc.key
        compensated = acc.compensated
        shape = acc.shape(self)
        positions = sorted({p for i in out.get_loop_domain() if i.is_reduction()
                            for p in [self._tile_pos_of(i)] if p is not None})
        # every tile axis reduced: one reduction to a scalar (stores take scalars)
        axes: list[int | None] = [None] if positions and len(positions) == len(self.tile_shape) else [*positions]
        if isinstance(expr, VarMeanOp) and on_chip:
            values, valid = names
            total = code.assign("s", values, cse=False)
            self._sum_over(total, axes)
            count = " * ".join(int_expr(self.extent(i)) for i in out.get_logical_domain() if i.is_reduction()) or "1"
            if isinstance(expr, WelfordPartialOp):  # a program's share: its elements counted, not the extents
                count = code.assign("s", valid, cse=False)
                self._sum_over(count, axes)
            first = code.assign("v", f"{total} / ({count})", cse=False)
            # The deviations from the first mean are exact for data near it; their sum corrects the
            # mean (the first one rounds the row's total, large for data far from 0), their squares
            # less the square of that correction are m2.
            deviation = code.assign("d", f"({values} - {first}) * {valid}", cse=False)
            square = code.assign("d", f"{deviation} * {deviation}", cse=False)
            self._sum_over_pair(deviation, square, axes)
            # a row with an inf has a NaN mean, as torch's var_mean (Welford's) gives it, but for a row of
            # one element: its mean is the element (Welford's first step), an inf too
            mean = code.assign("v", f"tl.where(({count}) == 1, {first}, {first} + {deviation} / ({count}))", cse=False)
            m2 = code.assign("d", f"{square} - {deviation} * {deviation} / ({count})", cse=False)
            code.emit(f"{m2} = tl.where({m2} < 0, 0.0, {m2})")  # rounding below 0; NaN stays
            correction = expr.correction
            if isinstance(expr, WelfordPartialOp):
                mean = code.assign("v", f"tl.where(({count}) > 0, {mean}, 0.0)", cse=False)
                results = [self.convert(v, acc_dtype, compute_dtype(tv.dtype))
                           for v, tv in zip((mean, m2, f"({count}) * 1.0"), expr.tensor_outputs, strict=True)]
            else:
                # torch divides by max(0, n - correction): 0 / 0 is NaN, never a negative count
                var = code.assign("v", f"{m2} / tl.maximum(({count}) - {correction}, 0)" if correction else
                                  f"{m2} / ({count})", cse=False)
                results = [self.convert(var, acc_dtype, compute_dtype(expr.outputs[0].dtype)),
                           self.convert(mean, acc_dtype, compute_dtype(expr.outputs[1].dtype))]
        elif isinstance(expr, VarMeanOp):
            # The lanes' partial results (counts, means held as a shift plus a small mean, sums of squared
            # deviations) combine by sums: a centre ``c`` near the mean (the counts and count-weighted shifts
            # summed in the accumulators' precision), then each lane's count times its deviation from ``c``
            # and its squared deviations summed in float64, Chan's parallel formula for all lanes at once.
            # Sums are what GPU reductions are made for; a tree of Welford's combine (a tuple reduction with
            # selects) returned means 1e-4 off on an H200 for rows of 20000 read in a loop, though every
            # lane's state was right and the same tree on those states, loaded from memory, was not
            # (``kernels_notes.md``).
            shift, mean, m2, count = names
            lane_shift, lane_mean, lane_m2, lane_count = (self.convert(n, acc_dtype, DataType.Double) for n in names)
            # the centre, any value near the mean (the deviations from it are summed exactly enough in
            # float64): the lanes' shifts weighted by their counts, in the accumulators' precision
            lane_counts = code.assign("d", count, cse=False)
            weighted = code.assign("d", f"tl.where({count} > 0, {count} * {shift}, 0.0)", cse=False)
            self._sum_over_pair(lane_counts, weighted, axes)
            n64 = code.assign("d", self.convert(lane_counts, acc_dtype, DataType.Double), cse=False)
            centre = code.assign("d", self.convert(f"{weighted} / {lane_counts}", acc_dtype, DataType.Double), cse=False)
            off = code.assign("d", f"tl.where({lane_count} > 0, ({lane_shift} - {centre}) + {lane_mean}, 0.0)",
                              cse=False)
            moved = code.assign("d", f"{lane_count} * {off}", cse=False)
            squares = code.assign("d", f"{lane_m2} + {moved} * {off}", cse=False)
            self._sum_over_pair(moved, squares, axes)
            # an infinite centre is the mean (a column of one -inf: torch's Welford gives the element)
            mean64 = code.assign("d", f"tl.where({centre} - {centre} == 0, {centre} + {moved} / {n64}, {centre})",
                                 cse=False)
            deviations = code.assign("d", f"{squares} - {moved} * {moved} / {n64}", cse=False)
            code.emit(f"{deviations} = tl.where({deviations} < 0, 0.0, {deviations})")  # rounding below 0; NaN stays
            shift = code.assign("v", self.convert(mean64, DataType.Double, acc_dtype), cse=False)
            # what the mean's rounding lost, kept beside it (a program's partial mean combined later)
            residual = f"{mean64} - {self.convert(shift, acc_dtype, DataType.Double)}"
            mean = code.assign("v", self.convert(f"tl.where({mean64} - {mean64} == 0, {residual}, 0.0)",
                                                 DataType.Double, acc_dtype), cse=False)
            m2 = code.assign("v", self.convert(deviations, DataType.Double, acc_dtype), cse=False)
            count = code.assign("v", self.convert(n64, DataType.Double, acc_dtype), cse=False)
            correction = expr.correction
            if isinstance(expr, WelfordPartialOp):  # a program's share, maybe empty: mean 0, count 0
                mean = code.assign("v", f"tl.where({count} > 0, {shift} + {mean}, 0.0)", cse=False)
                results = [self.convert(v, acc_dtype, compute_dtype(tv.dtype))
                           for v, tv in zip((mean, m2, count), expr.tensor_outputs, strict=True)]
            else:
                var = code.assign("v", f"{m2} / tl.maximum({count} - {correction}, 0.0)" if correction else
                                  f"{m2} / {count}", cse=False)
                # the mean of no elements is 0 / 0 (NaN), not the accumulator's initial 0
                mean = code.assign("v", f"tl.where({count} > 0, {shift} + {mean}, {NAN})", cse=False)
                results = [self.convert(var, acc_dtype, compute_dtype(expr.outputs[0].dtype)),
                           self.convert(mean, acc_dtype, compute_dtype(expr.outputs[1].dtype))]
        else:
            kind = expr.kind
            value = names[0]
            if acc.plain:
                # A sum of an online softmax's pass: the lanes' sums added in float64 (once per row),
                # an online sum's each moved from its lane's max to the row's first.
                peak = acc.shift
                if peak is not None:
                    row_max = code.recall((peak.out.name, *peak.key[1:]))
                    assert row_max is not None  # the max finishes first
                    value = f"{value} * tl.exp({peak.lane_max} - {row_max})"
                wide = DataType.Double
                value = code.assign("v", self.convert(value, acc_dtype, wide), cse=False)
                self._sum_over(value, axes)
                acc_dtype = wide
            elif compensated:
                # The lanes' sums and what they lost, added across lanes and joined (and divided by a
                # mean's count) in float64: the result rounds once. Per lane, not per element: a
                # float32 tree over the lanes' large sums would round at their scale at each level.
                wide = DataType.Double
                total, lost = (code.assign("v", self.convert(n, acc_dtype, wide), cse=False) for n in names)
                self._sum_over_pair(total, lost, axes)
                value = code.assign("v", _with_lost(total, lost), cse=False)
                acc_dtype = wide
            elif kind in (ReductionOpType.sum, ReductionOpType.mean) and acc_dtype is DataType.Float and \
                    self._sums_partials(expr):
                # Programs' partial sums (the last step of a reduction across programs): few values,
                # each as large as a share of the total, added in float64. A float32 order of them
                # (the GPU's and numpy's reduce of a tile axis adds one after another) rounds at the
                # scale of the total once per partial.
                wide = DataType.Double
                value = code.assign("v", self.convert(value, acc_dtype, wide), cse=False)
                self._sum_over(value, axes)
                acc_dtype = wide
            elif kind in (ReductionOpType.sum, ReductionOpType.mean) and acc_dtype is DataType.Float and \
                    self.gpu_sums and expr.compensated and self._reads_float32(expr) and \
                    not self._few_reduced_values(axes):
                value = self._compensated_sum_over(value, axes, shape)
                acc_dtype = DataType.Double
            elif kind in (ReductionOpType.sum, ReductionOpType.mean):
                self._sum_over(value, axes)
            else:
                for axis in axes:
                    keep = ", keep_dims=True" if axis is not None else ""
                    code.emit(f"{value} = tl.reduce({value}, {axis}, {_COMBINE[kind]}{keep})")
                code.reduced(value, axes)
            result = value
            if kind is ReductionOpType.mean:
                counted = expr.count_ids or [i for i in out.get_logical_domain() if i.is_reduction()]
                count = " * ".join(int_expr(self.extent(i)) for i in counted)
                if acc_dtype is DataType.Double and compute_dtype(out.dtype) is not DataType.Double:
                    # A float64 sum rounded to float32: times the count's reciprocal, one float64 division
                    # a program where a reduced tile's every thread divides each of its rows' sums (a
                    # float64 division is a subroutine of dozens of instructions: 32 of them a thread in
                    # a mean of 32 float32 rows of 127 a program, sm_90 PTX). The product is within 2**-52
                    # of the quotient, so its float32 rounding is the quotient's.
                    inverse = code.assign("v", f"tl.full([], 1.0, tl.float64) / ({count})", cse=False)
                    result = code.assign("v", f"{value} * {inverse}", cse=False)
                else:
                    result = code.assign("v", f"{value} / ({count})", cse=False)
            results = [self.convert(result, acc_dtype, compute_dtype(out.dtype))]
        for tv, result in zip(expr.outputs, results, strict=True):
            assert isinstance(tv, TensorView)
            out_key = (tv.name, *key[1:])
            result = _rounded(result, tv.dtype)
            code.remember(out_key, result if result.isidentifier() else code.assign("v", result, cse=False))

    def _reads_float32(self, expr: Expr) -> bool:
        """Whether the values ``expr`` reduces come from a tensor input of the kernel that is not a
        16-bit float (float32 data: float16 and bfloat16 results round far above a float32 sum's error,
        so their memory-bound kernels keep the plain sum)."""
        stack, seen = list(expr.inputs), set()
        while stack:
            val = stack.pop()
            if id(val) in seen or not isinstance(val, TensorView):
                continue
            seen.add(id(val))
            if val in self.inputs:
                if val.dtype not in (DataType.Half, DataType.BFloat16):
                    return True
            elif val.definition is not None:
                stack.extend(val.definition.inputs)
        return False

    def _compensated_sum_over(self, name: str, axes: list[int | None], shape: str) -> str:
        """``name`` (float32) summed over tile ``axes`` as pairs of a sum and what its roundings lost
        (``_two_sum``), joined in float64: the result rounds about once, in any order of the adds (a
        GPU thread adds its values one after another). Where the sum is not finite (an inf or NaN
        value) the lost part is NaN and the sum itself is the result."""
        code = self.code
        lost = code.assign("c", f"tl.full({shape}, -0.0, tl.float32)", dims=code.dims.get(name), cse=False)
        extents = self._reduced_tile_extents(axes)
        # A tile sized at launch (a row's whole length) may hold few values: the plain sum then, chosen
        # when the variant compiles (see ``PLAIN_SUM_ELEMENTS``).
        plain = "False" if all(e.isdigit() for e in extents) else f"{' * '.join(extents)} <= {PLAIN_SUM_ELEMENTS}"
        for axis in axes:
            code.emit(f"{name}, {lost} = _sum_keeping_lost({name}, {lost}, {axis}, {plain}, {axis is not None})")
        code.reduced(name, axes)
        code.reduced(lost, axes)
        wide, lost_wide = (code.assign("v", f"{n}.to(tl.float64)", cse=False) for n in (name, lost))
        return code.assign("v", _with_lost(wide, lost_wide), cse=False)

    def _reduced_tile_extents(self, axes: list[int | None]) -> list[str]:
        """The extents (texts: constants, or constexprs sized at launch) of tile ``axes``."""
        positions = range(len(self.tile_shape)) if None in axes else [a for a in axes if a is not None]
        return [self.tile_shape[a] for a in positions]

    def _few_reduced_values(self, axes: list[int | None]) -> bool:
        """Whether a sum over tile ``axes`` adds at most ``PLAIN_SUM_ELEMENTS`` values, known when the
        kernel is written."""
        extents = self._reduced_tile_extents(axes)
        return all(e.isdigit() for e in extents) and math.prod(int(e) for e in extents) <= PLAIN_SUM_ELEMENTS

    def _sums_partials(self, expr: Expr) -> bool:
        """Whether ``expr`` reduces programs' partial results (an input of this launch that an
        earlier launch wrote), read as they are or through copies."""
        source = expr.inputs[0]
        while isinstance(source, TensorView) and isinstance(source.definition, LoadStoreOp):
            source = source.definition.inputs[0]
        return isinstance(source, TensorView) and source.name in self.partials

    def _sum_over(self, name: str, axes: list[int | None]) -> None:
        """``name`` summed over tile ``axes`` in place (see ``gpu_sums``)."""
        combine = "_add" if self.gpu_sums else "_sum_combine"
        for axis in axes:
            keep = ", keep_dims=True" if axis is not None else ""
            self.code.emit(f"{name} = tl.reduce({name}, {axis}, {combine}{keep})")
        self.code.reduced(name, axes)

    def _sum_over_pair(self, a: str, b: str, axes: list[int | None]) -> None:
        """Two values summed over tile ``axes`` in place: one reduction of the pair on the GPU (one
        exchange between warps for both), two numpy sums in the interpreter."""
        if not self.gpu_sums:
            self._sum_over(a, axes)
            self._sum_over(b, axes)
            return
        for axis in axes:
            keep = ", keep_dims=True" if axis is not None else ""
            self.code.emit(f"{a}, {b} = tl.reduce(({a}, {b}), {axis}, _add_pair{keep})")
        self.code.reduced(a, axes)
        self.code.reduced(b, axes)

    def _tile_pos_of(self, i: IterDomain) -> int | None:
        """The tile axis a reduction loop ID of a reduction tensor iterates (None: a serial loop). A serial
        reduction ID is always iterated by a loop of its own (``open_loops_for``), whose values every lane
        added: by the time the reduction finishes that loop is closed, and the tile index an enclosing pass
        has for the same axis is not what accumulated it (a sum over it would count each value once per
        lane)."""
        if i.parallel_type is ParallelType.serial:
            return None
        taken: dict[int, int] = {}
        index = self.index_of_loop_id(i, taken)
        if index is None:
            return None
        dims = self.code.dims.get(index)
        return next(iter(dims)) if dims and len(dims) == 1 else None
