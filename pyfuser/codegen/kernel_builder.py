"""A scheduled segment -> the source of one Triton kernel.

The reference tensor's loop domain is the loop nest: ``grid_*`` IDs become ``tl.program_id``,
``block_*`` / ``vectorize`` / ``unroll`` IDs become the axes of one n-D tile (``tl.arange`` of a
power-of-two size, masked when padded), ``serial`` IDs become loops. Every output's loop IDs must
map onto that nest (the exact ``IdGraph``); walking each output's split / merge transforms back from
the loop indices gives its logical indices, and every other tensor's indices follow from its
consumer's through the exprs' logical maps (a producer is computed, or loaded, at the loop point
of the consumer that reads it: everything is inlined, as a Triton tile program needs). Global
tensors are addressed with runtime strides; where a merge covers logical axes that are adjacent
and contiguous in a tensor's allocation, the merged index times the inner stride replaces the
div / mod pair, so the access stays contiguous and Triton can vectorize it.

Sizes are kernel arguments: every exact class of logical IDs (``IdGraph``) is one ``ks*`` integer
the launcher reads off a tensor, so a new size reuses the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from pyfuser.codegen.id_graph import IdGraph
from pyfuser.codegen.triton_support import (
    MAX_TILE_NUMEL,
    compute_dtype,
    int_expr,
    literal,
    next_power_of_2,
    prelude,
    triton_dtype,
)
from pyfuser.ir.base import Expr, Scalar, Val
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import IterDomain, Merge, ParallelType, Split
from pyfuser.ir.ops import (
    BinaryOp,
    BinaryOpType,
    BroadcastOp,
    ExpandOp,
    FullOp,
    IotaOp,
    LoadStoreOp,
    PermuteOp,
    SqueezeOp,
    TernaryOp,
    TernaryOpType,
    UnaryOp,
    UnaryOpType,
)
from pyfuser.ir.ops.promotion import result_dtype
from pyfuser.ir.symbolic import SymConst, SymExpr, SymVar, ceil_div
from pyfuser.ir.tensor_domain import transforms_between
from pyfuser.ir.tensor_view import TensorView

GRID_AXES = {ParallelType.grid_x: 0, ParallelType.grid_y: 1, ParallelType.grid_z: 2}
TILE_TYPES = frozenset({ParallelType.block_x, ParallelType.block_y, ParallelType.block_z,
                        ParallelType.vectorize, ParallelType.unroll})
#: Exprs a pointwise kernel computes; shape ops only change how their producer is indexed.
INDEX_ONLY_OPS = (LoadStoreOp, BroadcastOp, ExpandOp, SqueezeOp, PermuteOp)
_COMPARISONS = frozenset({BinaryOpType.eq, BinaryOpType.ne, BinaryOpType.lt, BinaryOpType.le, BinaryOpType.gt,
                          BinaryOpType.ge})
_LOGICAL = frozenset({BinaryOpType.logical_and, BinaryOpType.logical_or, UnaryOpType.logical_not})


class KernelError(ValueError):
    """A segment the code generator cannot turn into a kernel; the message names tensor and axis."""


@dataclass(frozen=True)
class SizeSource:
    """Where the launcher reads a size class: dim ``dim`` of input (``output=False``) or output
    ``index``; or, for a class no input holds, ``extent`` in the bound sizes (also for an output
    the launcher allocates itself, whose shape it must know first)."""

    symbol: str
    index: int = -1
    dim: int = -1
    output: bool = False
    extent: SymExpr | None = None


@dataclass(frozen=True)
class KernelSource:
    """A generated kernel and everything its launcher needs. Arguments, in order: tensors (the
    segment's tensor inputs, then its outputs), strides, sizes, scalars."""

    name: str
    source: str
    #: position in the segment's inputs of each tensor input and of each scalar argument
    tensor_inputs: tuple[int, ...]
    scalar_inputs: tuple[int, ...]
    #: (tensor position among inputs+outputs, dim) per stride argument
    stride_args: tuple[tuple[int, int], ...]
    sizes: tuple[SizeSource, ...]
    #: per grid axis used (x, y, z): extent over the size symbols
    grid: tuple[SymExpr, ...]
    #: (tensor input, dim, tensor input, dim): dims the kernel takes as one size, compared at launch
    size_checks: tuple[tuple[int, int, int, int], ...]
    #: (tensor input, dim, size): dims the kernel takes as a constant (an ``expand`` target)
    constant_checks: tuple[tuple[int, int, int], ...]
    #: per output: shape over the size symbols, allocation order, dtype
    output_shapes: tuple[tuple[SymExpr, ...], ...]
    output_perms: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[DataType, ...]
    #: the tensor names, for messages (inputs then outputs)
    tensor_names: tuple[str, ...]
    #: (extent over the size symbols, factor, message): a vectorized split that must divide at launch
    divisibility_checks: tuple[tuple[SymExpr, int, str], ...] = ()


@dataclass
class _Loop:
    id: IterDomain
    kind: str  # "grid" | "tile" | "serial"
    extent: SymExpr
    index: str
    tile_size: int = 0
    tile_pos: int = 0


@dataclass
class _Indices:
    """Logical index expressions of one tensor, and merged groups of its logical IDs with their index."""

    of: dict[int, str] = field(default_factory=dict)
    groups: list[tuple[tuple[int, ...], str]] = field(default_factory=list)
    #: conditions under which the loop point is in range for this tensor, with their tile axes
    masks: list[tuple[str, frozenset[int]]] = field(default_factory=list)


class KernelBuilder:
    def __init__(self, fusion: Fusion, name: str, target: str, contiguity: dict[int, tuple[tuple[int, ...],
                                                                                            list[bool | None]]],
                 reference: TensorView | None = None) -> None:
        """``contiguity``: per tensor name, (allocation order of its non-reduction logical dims, nvFuser
        contiguity flags in that order) that hold for every tensor the kernel will be given."""
        self.fusion = fusion
        self.name = name
        self.target = target
        self.layouts = contiguity
        self.exprs = fusion.exprs()
        self.tensors = fusion.tensors()
        self.inputs = [v for v in fusion.inputs() if isinstance(v, TensorView)]
        self.outputs = [v for v in fusion.outputs() if isinstance(v, TensorView)]
        self.loop_graph = IdGraph(self.tensors, self.exprs, map_broadcast=True)
        self.exact = IdGraph(self.tensors, self.exprs, map_broadcast=False)
        self.reference = reference or self.outputs[0]
        self.lines: list[str] = []
        self._counter = 0
        self._class_symbol: dict[int, str] = {}
        self._sizes: list[SizeSource] = []
        self._values: dict[tuple[object, ...], str] = {}
        self._loop_index: dict[int, str] = {}
        self._loop_index_by_class: dict[int, list[str]] = {}
        self._strides: list[tuple[int, int]] = []
        self._stride_names: dict[tuple[int, int], str] = {}
        self._scalars: dict[str, str] = {}
        self._divisibility: list[tuple[SymExpr, int, str]] = []
        #: tile axes each index variable varies along (others are scalars: program ids, loop counters)
        self._dims: dict[str, frozenset[int]] = {}
        #: conditions keeping a loop point in range, with the tile axes each varies along
        self._conditions: list[tuple[str, frozenset[int]]] = []
        self._masks: dict[frozenset[int], str] = {}

    # --- names ----------------------------------------------------------------------------------
    def _fresh(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def _emit(self, line: str, indent: int) -> None:
        self.lines.append("    " * indent + line)

    def _assign(self, prefix: str, expr: str, indent: int, dims: frozenset[int] = frozenset()) -> str:
        name = self._fresh(prefix)
        self._emit(f"{name} = {expr}", indent)
        self._dims[name] = dims
        return name

    def _dims_of(self, *names: str) -> frozenset[int]:
        return frozenset().union(*(self._dims.get(n, frozenset()) for n in names))

    def _mask(self, dims: frozenset[int], indent: int) -> str:
        """The conditions an access varying along tile axes ``dims`` needs: those on its own axes (an
        access may not have a mask wider than its pointer; the store masks the rest)."""
        if dims not in self._masks:
            conds = [c for c, d in self._conditions if d <= dims]
            self._masks[dims] = self._assign("mask", " & ".join(conds), indent, dims) if conds else ""
        return self._masks[dims]

    # --- sizes ------------------------------------------------------------------------------------
    def size_symbol(self, logical: IterDomain) -> SymExpr:
        """The runtime extent of a non-broadcast logical ID: a constant (of any member of its class:
        the launch checks the others), or its class's size argument."""
        if logical.extent.value is not None:
            return logical.extent
        constant = next((m.extent for m in self.exact.members(logical)
                         if not m.is_broadcast and m.extent.value is not None), None)
        if constant is not None:
            return constant
        root = self.exact.class_of(logical)
        symbol = self._class_symbol.get(root)
        if symbol is None:
            symbol = self._class_symbol[root] = f"ks{len(self._class_symbol)}"
            self._sizes.append(self._size_source(logical, symbol))
        return SymVar(symbol)

    def _size_source(self, logical: IterDomain, symbol: str) -> SizeSource:
        members = {id(m) for m in self.exact.members(logical)}
        for output, tvs in ((False, self.inputs), (True, self.outputs)):
            for k, tv in enumerate(tvs):
                for d, i in enumerate(tv.get_logical_domain(no_reductions=True)):
                    if id(i) in members and not i.is_broadcast:
                        return SizeSource(symbol, k, d, output, logical.extent if output else None)
        return SizeSource(symbol, extent=logical.extent)

    def extent(self, i: IterDomain) -> SymExpr:
        """How many values the loop over ``i`` takes."""
        definition = i.definition
        if isinstance(definition, Split):
            parent = self.extent(definition.in_id)
            factor = definition.factor
            if i is definition.inner:
                return factor if definition.inner_split else ceil_div(parent, factor)
            return ceil_div(parent, factor) if definition.inner_split else factor
        if isinstance(definition, Merge):
            return self.extent(definition.outer) * self.extent(definition.inner)
        # A broadcast axis of an output is one element wide; a producer's broadcast axis is never
        # looped over (it reads index 0), so its extent never enters the index math.
        return SymConst(1) if i.is_broadcast else self.size_symbol(i)

    # --- the loop nest ------------------------------------------------------------------------------
    def _loop_nest(self) -> list[_Loop]:
        ref = self.reference
        loops: list[_Loop] = []
        tiles = [i for i in ref.get_loop_domain() if i.parallel_type in TILE_TYPES]
        seen_types: dict[ParallelType, IterDomain] = {}
        for pos, i in enumerate(ref.get_loop_domain()):
            where = f"{ref.short_name} axis {pos} ({i})"
            ptype = i.parallel_type
            if ptype in (ParallelType.stream, *(p for p in ParallelType if p.is_device)):
                raise KernelError(f"{where} is parallelized on {ptype.name}: host loops and devices never reach "
                                  "a kernel")
            if ptype is not ParallelType.serial and ptype in seen_types:
                raise KernelError(f"{where} and {seen_types[ptype]} are both parallelized on {ptype.name}; each "
                                  "parallel type binds at most one loop ID of a kernel")
            seen_types[ptype] = i
            if i.is_reduction:
                raise KernelError(f"{where} is a reduction ID; reductions in generated kernels are not supported by "
                                  "this scheduler")
            extent = self.extent(i)
            if ptype in GRID_AXES:
                axis = GRID_AXES[ptype]
                loops.append(_Loop(i, "grid", extent, f"pid{axis}"))
            elif ptype in TILE_TYPES:
                size = extent.value
                if size is None:
                    raise KernelError(f"{where} is parallelized on {ptype.name} but its extent {i.extent} is not a "
                                      "constant; a tile axis needs a constant extent (split by a constant factor)")
                if size > MAX_TILE_NUMEL:
                    raise KernelError(f"{where} is parallelized on {ptype.name} with extent {size}, over Triton's "
                                      f"tile limit of {MAX_TILE_NUMEL} elements")
                if ptype is ParallelType.vectorize:
                    self._check_vectorize(i, where)
                loops.append(_Loop(i, "tile", extent, "", next_power_of_2(size), tiles.index(i)))
            else:
                loops.append(_Loop(i, "serial", extent, ""))
        numel = 1
        for loop in loops:
            numel *= loop.tile_size or 1
        if numel > MAX_TILE_NUMEL:
            sizes = " x ".join(str(loop.tile_size) for loop in loops if loop.kind == "tile")
            raise KernelError(f"{ref.short_name}: the tile of its block / vectorize / unroll axes ({sizes} = {numel} "
                              f"elements) is over Triton's limit of {MAX_TILE_NUMEL}")
        return loops

    def _check_vectorize(self, i: IterDomain, where: str) -> None:
        """A vectorized ID is the inner output of a split by the vector width, on the axis every global
        tensor has innermost and contiguous, and the split divides (checked at launch when symbolic)."""
        split = i.definition
        if not (isinstance(split, Split) and split.inner is i and split.inner_split):
            raise KernelError(f"{where} is vectorized but is not the inner output of a split by the vector width")
        node = split.in_id
        while node.definition is not None:
            parent = node.definition
            if isinstance(parent, Merge) and node is parent.out:
                node = parent.inner
            elif isinstance(parent, Split) and node is parent.inner:
                node = parent.in_id
            else:
                raise KernelError(f"{where} is vectorized but comes from the outer part of {parent}; only the "
                                  "innermost axis can be vectorized")
        for tv in (*self.inputs, *self.outputs):
            dims = tv.get_logical_domain(no_reductions=True)
            mapped = [d for d, j in enumerate(dims) if not j.is_broadcast and self.exact.mapped(j, node)]
            if not mapped:
                continue
            order, contiguity = self.layouts.get(tv.name, (tuple(range(len(dims))), [False] * len(dims)))
            live = [(d, c) for d, c in zip(order, contiguity, strict=False) if not dims[d].is_broadcast]
            if not live or live[-1][0] != mapped[0] or not live[-1][1]:
                raise KernelError(f"{where} is vectorized along {node}, but {tv.short_name} axis {mapped[0]} is not "
                                  f"innermost and contiguous in memory (allocation order {list(order)}, contiguity "
                                  f"{contiguity}); vectorize only the innermost contiguous axis")
        factor = split.factor.value
        if factor is None:
            raise KernelError(f"{where} is vectorized by a symbolic factor {split.factor}; use a constant")
        extent = self.extent(split.in_id)
        if extent.value is not None and extent.value % factor:
            raise KernelError(f"{where} is vectorized by {factor}, which does not divide the extent {extent.value}")
        if extent.value is None:
            self._divisibility.append((extent, factor, f"{where} is vectorized by {factor}, which must divide the "
                                                       f"extent of {split.in_id}"))

    # --- indexing ---------------------------------------------------------------------------------
    def _walk_back(self, tv: TensorView, indent: int) -> _Indices:
        """``tv``'s logical indices from the loop nest's indices (its loop IDs must map onto it).

        Also records the conditions that keep a loop point in range (``_Indices.masks``): a split that
        may not divide can overshoot its input's extent, so that index is compared with it once, as
        high in the transforms as possible (``merged < M * N``, which keeps the mask contiguous for
        Triton); a merge's remainder never overshoots.
        """
        known: dict[int, str] = {}
        bounded: dict[int, bool] = {}
        taken: dict[int, int] = {}
        for pos, i in enumerate(tv.get_loop_domain()):
            index = self._index_of_loop_id(i, taken)
            if index is None:
                if i.is_broadcast:
                    known[id(i)], bounded[id(i)] = "0", True
                    continue
                raise KernelError(f"{tv.short_name} axis {pos} ({i}) is not mapped to the loop nest of "
                                  f"{self.reference.short_name}, the kernel's reference: schedule "
                                  f"{tv.short_name} like it (schedule.transform_like / parallelize_like) or "
                                  "leave its loop domain unscheduled")
            known[id(i)], bounded[id(i)] = index, True
        result = _Indices()
        merged: dict[int, tuple[int, ...]] = {}
        for t in reversed(transforms_between(tv.get_logical_domain(), tv.get_loop_domain())):
            if isinstance(t, Split):
                outer, inner = known.get(id(t.outer)), known.get(id(t.inner))
                if outer is None or inner is None:
                    continue
                stride = int_expr(self.extent(t.inner))
                known[id(t.in_id)] = self._assign("ix", f"{outer} * {stride} + {inner}" if stride != "1" else
                                                  f"{outer} + {inner}", indent, self._dims_of(outer, inner))
                if not (t.is_divisible() and bounded[id(t.outer)] and bounded[id(t.inner)]):
                    index = known[id(t.in_id)]
                    result.masks.append((f"({index} < {int_expr(self.extent(t.in_id))})", self._dims_of(index)))
                bounded[id(t.in_id)] = True
            elif isinstance(t, Merge):
                out = known.get(id(t.out))
                if out is None:
                    continue
                inner_extent = int_expr(self.extent(t.inner))
                if inner_extent == "1":
                    known[id(t.outer)], known[id(t.inner)] = out, "0"
                else:
                    dims = self._dims_of(out)
                    known[id(t.outer)] = self._assign("ix", f"{out} // {inner_extent}", indent, dims)
                    known[id(t.inner)] = self._assign("ix", f"{out} % {inner_extent}", indent, dims)
                bounded[id(t.outer)], bounded[id(t.inner)] = bounded[id(t.out)], True
                merged[id(t.out)] = (*merged.get(id(t.outer), (id(t.outer),)), *merged.get(id(t.inner), (id(t.inner),)))
                result.groups.append((merged[id(t.out)], out))
        for pos, i in enumerate(tv.get_logical_domain()):
            if id(i) not in known:
                if i.is_broadcast:
                    known[id(i)], bounded[id(i)] = "0", True
                    continue
                raise KernelError(f"{tv.short_name} logical axis {pos} ({i}) is not reached from its loop domain "
                                  "in the kernel's loop nest")
        result.of = known
        logical_ids = {id(i) for i in tv.get_logical_domain()}
        result.groups = [(g, e) for g, e in result.groups if all(k in logical_ids for k in g)]
        return result

    def _index_of_loop_id(self, i: IterDomain, taken: dict[int, int]) -> str | None:
        """The nest index ``i`` takes: its own if it is a loop ID of the reference, else that of the
        reference's loop ID it maps to. Two axes of one tensor can map to one class (``x + x.t()``:
        both axes have ``x``'s extent), so the k-th of a tensor's IDs in a class takes the reference's
        k-th loop ID in it."""
        own = self._loop_index.get(id(i))
        if own is not None:
            return own
        root = self.exact.class_of(i)
        candidates = self._loop_index_by_class.get(root, [])
        k = taken.get(root, 0)
        taken[root] = k + 1
        return candidates[k] if k < len(candidates) else None

    def _producer_indices(self, expr: Expr, producer: TensorView, consumer: _Indices) -> _Indices:
        """A producer read at its consumer's loop point: its indices through the expr's logical map."""
        mapping = expr.logical_map(producer)
        result = _Indices()
        inverse: dict[int, int] = {}
        for p in producer.get_logical_domain():
            c = mapping.get(p)
            if p.is_broadcast or c is None:
                result.of[id(p)] = "0"
            else:
                result.of[id(p)] = consumer.of[id(c)]
                inverse[id(c)] = id(p)
        for group, index in consumer.groups:
            if all(k in inverse for k in group):
                result.groups.append((tuple(inverse[k] for k in group), index))
        return result

    def _offset(self, tv: TensorView, position: int, indices: _Indices) -> tuple[str, frozenset[int]]:
        """``sum(index * stride)`` over ``tv``'s memory-occupying dims, contiguous merged groups fused."""
        dims = tv.get_logical_domain(no_reductions=True)
        dim_of = {id(i): d for d, i in enumerate(dims)}
        live = [d for d, i in enumerate(dims) if not i.is_broadcast]
        order, contiguity = self.layouts.get(tv.name, (tuple(range(len(dims))), [False] * len(dims)))
        alloc = [d for d in order if d in live]
        contig = {d: bool(c) for d, c in zip(order, contiguity, strict=False)}
        covered: set[int] = set()
        terms: list[str] = []
        used: list[str] = []
        for group, index in sorted(indices.groups, key=lambda g: -len(g[0])):
            ds = [dim_of.get(k) for k in group]
            if any(d is None or d not in live or d in covered for d in ds):
                continue
            start = alloc.index(ds[0])  # type: ignore[arg-type]
            if alloc[start:start + len(ds)] != ds or not all(contig.get(d) for d in ds[:-1]):  # type: ignore[misc]
                continue
            terms.append(self._stride_term(index, position, ds[-1]))  # type: ignore[arg-type]
            used.append(index)
            covered.update(ds)  # type: ignore[arg-type]
        for d in live:
            if d not in covered:
                index = indices.of[id(dims[d])]
                terms.append(self._stride_term(index, position, d))
                used.append(index)
        return (" + ".join(terms) if terms else "0"), self._dims_of(*used)

    def _stride_term(self, index: str, position: int, dim: int) -> str:
        key = (position, dim)
        name = self._stride_names.get(key)
        if name is None:
            name = self._stride_names[key] = f"st{position}_{dim}"
            self._strides.append(key)
        return f"({index}) * {name}"

    # --- values -----------------------------------------------------------------------------------
    def _value(self, val: Val, indices: _Indices | None, indent: int) -> str:
        """``val`` at the loop point where a consumer reads it with ``indices`` (None for scalars)."""
        if isinstance(val, Scalar):
            return self._scalar(val, indent)
        assert isinstance(val, TensorView) and indices is not None
        key = (val.name, *(indices.of[id(i)] for i in val.get_logical_domain() if not i.is_broadcast))
        cached = self._values.get(key)
        if cached is not None:
            return cached
        if val.is_fusion_input or val.definition is None:
            position = self.inputs.index(val)
            offset, dims = self._offset(val, position, indices)
            mask = self._mask(dims, indent)
            load = f"tl.load(T{position} + {offset}, mask={mask}, other=0)" if mask else \
                f"tl.load(T{position} + {offset})"
            result = self._assign("v", f"{load}{_to(val.dtype, compute_dtype(val.dtype))}", indent)
        else:
            result = self._compute(val.definition, val, indices, indent)
        self._values[key] = result
        return result

    def _scalar(self, val: Scalar, indent: int) -> str:
        if val.is_const:
            return literal(val.value, compute_dtype(val.dtype))
        if val.is_fusion_input:
            name = self._scalars.setdefault(val.symbol, f"arg_{val.symbol}")
            return name
        assert val.definition is not None
        key = (val.name,)
        if key not in self._values:
            self._values[key] = self._compute(val.definition, val, None, indent)
        return self._values[key]

    def _compute(self, expr: Expr, out: Val, indices: _Indices | None, indent: int) -> str:
        def operand(v: Val) -> str:
            if isinstance(v, TensorView):
                assert indices is not None
                return self._value(v, self._producer_indices(expr, v, indices), indent)
            return self._value(v, None, indent)

        if isinstance(expr, INDEX_ONLY_OPS):
            return operand(expr.inputs[0])
        if isinstance(expr, FullOp):
            return self._convert(operand(expr.inputs[0]), expr.inputs[0].dtype, compute_dtype(out.dtype))
        if isinstance(expr, IotaOp):
            assert indices is not None and isinstance(out, TensorView)
            index = indices.of[id(out.get_logical_domain()[0])]
            start, step = (operand(v) for v in expr.inputs[1:])
            dtype = compute_dtype(out.dtype)
            return self._assign("v", f"({start} + ({index}){_to(DataType.Int, dtype)} * {step}){_to(dtype, dtype)}",
                                indent)
        if isinstance(expr, UnaryOp | BinaryOp | TernaryOp):
            kind = expr.kind
            template = kind.spec.triton
            if template is None:
                raise KernelError(f"{out}: {kind.name} has no Triton lowering")
            op_dtype = _op_dtype(expr)
            args = []
            for k, v in enumerate(expr.inputs):
                raw = kind in _LOGICAL or (kind is TernaryOpType.where and k == 0)
                if isinstance(v, Scalar) and v.is_const and not raw:
                    args.append(literal(v.value, op_dtype))  # typed in the op's dtype: no conversion
                    continue
                value = operand(v)
                args.append(value if raw else self._convert(value, v.dtype, op_dtype))
            result_dtype_ = DataType.Bool if kind in _COMPARISONS or kind in _LOGICAL else op_dtype
            text = template.format(*(f"({a})" for a in args))
            return self._assign("v", f"({text}){_to(result_dtype_, compute_dtype(out.dtype))}", indent)
        raise KernelError(f"{out.short_name if isinstance(out, TensorView) else out}: {type(expr).__name__} has no "  # type: ignore[attr-defined]
                          "Triton lowering in a pointwise kernel")

    @staticmethod
    def _convert(value: str, src: DataType, dst: DataType) -> str:
        src = compute_dtype(src)
        return f"({value}){_to(src, dst)}" if src is not dst else value

    # --- the kernel -------------------------------------------------------------------------------------
    def _check_inlined_producers(self) -> None:
        """A scheduled tensor the kernel computes must be parallelized like the loop it is inlined in."""
        ref_loop = self.reference.get_loop_domain()
        for tv in self.tensors:
            if tv in self.inputs or tv is self.reference:
                continue
            for pos, i in enumerate(tv.get_loop_domain()):
                if i.parallel_type is ParallelType.serial:
                    continue
                match = next((r for r in ref_loop if self.loop_graph.mapped(r, i)), None)
                if match is None or match.parallel_type is not i.parallel_type:
                    expected = f"{match} on {match.parallel_type.name}" if match is not None else "no loop of it"
                    raise KernelError(f"{tv.short_name} axis {pos} ({i}) is parallelized on {i.parallel_type.name}, but "
                                      f"it is computed inside {self.reference.short_name}'s loop nest, which maps it to "
                                      f"{expected}: parallelize producers like their consumer (parallelize_like)")

    def build(self) -> KernelSource:
        self._check_inlined_producers()
        loops = self._loop_nest()
        tiles = [loop for loop in loops if loop.kind == "tile"]
        for loop in loops:
            if loop.kind == "grid":
                self._emit(f"{loop.index} = tl.program_id({loop.index[-1]})", 1)
            elif loop.kind == "tile":
                shape = ", ".join(":" if k == loop.tile_pos else "None" for k in range(len(tiles)))
                reshape = f"[{shape}]" if len(tiles) > 1 else ""
                loop.index = self._assign("r", f"tl.arange(0, {loop.tile_size}){reshape}", 1,
                                          frozenset({loop.tile_pos}))
                if loop.tile_size != loop.extent.value:
                    self._conditions.append((f"({loop.index} < {loop.extent.value})", frozenset({loop.tile_pos})))
        indent = 1
        for loop in loops:
            if loop.kind == "serial":
                loop.index = self._fresh("i")
                self._emit(f"for {loop.index} in range({int_expr(loop.extent)}):", indent)
                indent += 1
        for loop in loops:
            self._loop_index[id(loop.id)] = loop.index
            self._loop_index_by_class.setdefault(self.exact.class_of(loop.id), []).append(loop.index)
        outputs = [(tv, self._walk_back(tv, indent)) for tv in self.outputs]
        ref_indices = dict(outputs)[self.reference] if self.reference in dict(outputs) else outputs[0][1]
        self._conditions.extend(ref_indices.masks)
        uniform = [c for c, dims in self._conditions if not dims]
        if uniform:  # the same for the whole tile: a branch, not a mask
            self._emit(f"if {' & '.join(uniform)}:", indent)
            indent += 1
            self._conditions = [(c, dims) for c, dims in self._conditions if dims]
        for position, (tv, indices) in enumerate(outputs, start=len(self.inputs)):
            value = self._value(tv, indices, indent)
            offset, dims = self._offset(tv, position, indices)
            stored = f"({value}){_to(compute_dtype(tv.dtype), tv.dtype)}"
            mask = self._mask(dims, indent)
            self._emit(f"tl.store(T{position} + {offset}, {stored}{', mask=' + mask if mask else ''})", indent)
        return self._source(loops)

    def _source(self, loops: Sequence[_Loop]) -> KernelSource:
        output_shapes = tuple(tuple(SymConst(1) if i.is_broadcast else self.size_symbol(i)
                                    for i in tv.get_logical_domain(no_reductions=True)) for tv in self.outputs)
        tensors = [f"T{k}" for k in range(len(self.inputs) + len(self.outputs))]
        strides = [self._stride_names[key] for key in self._strides]
        sizes = [s.symbol for s in self._sizes]
        all_inputs = self.fusion.inputs()
        scalar_symbols = list(self._scalars)
        scalar_positions = tuple(next(k for k, v in enumerate(all_inputs) if isinstance(v, Scalar) and v.symbol == sym)
                                 for sym in scalar_symbols)
        params = ", ".join([*tensors, *strides, *sizes, *(self._scalars[sym] for sym in scalar_symbols)])
        body = "\n".join(self.lines) or "    pass"
        source = f"{prelude(self.target)}\n\n@_jit\ndef {self.name}({params}):\n{body}\n"
        grid = tuple(next((loop.extent for loop in loops if loop.kind == "grid" and loop.index == f"pid{a}"),
                          SymConst(1)) for a in range(3))
        used = max((a + 1 for a in range(3) if any(loop.index == f"pid{a}" for loop in loops)), default=1)
        tensor_positions = tuple(all_inputs.index(tv) for tv in self.inputs)
        perms = tuple(self.layouts.get(tv.name, (tuple(range(tv.ndim)), []))[0] for tv in self.outputs)
        return KernelSource(
            self.name, source, tensor_positions, scalar_positions, tuple(self._strides), tuple(self._sizes),
            grid[:used], self._size_checks(), self._constant_checks(), output_shapes, perms,
            tuple(tv.dtype for tv in self.outputs), tuple(tv.short_name for tv in (*self.inputs, *self.outputs)),
            tuple(self._divisibility))

    def _constant_checks(self) -> tuple[tuple[int, int, int], ...]:
        """Input dims of symbolic extent in a class of constant extent (``expand(x, [6, 4])`` of an
        ``x`` declared ``[-1, 1]``), compared with the constant at launch."""
        checks = []
        for k, tv in enumerate(self.inputs):
            for d, i in enumerate(tv.get_logical_domain(no_reductions=True)):
                if i.is_broadcast or i.extent.value is not None:
                    continue
                constant = next((m.extent.value for m in self.exact.members(i)
                                 if not m.is_broadcast and m.extent.value is not None), None)
                if constant is not None:
                    checks.append((k, d, constant))
        return tuple(checks)

    def _size_checks(self) -> tuple[tuple[int, int, int, int], ...]:
        """Input dims the kernel assumes equal (one size class), to compare at launch."""
        first: dict[int, tuple[int, int]] = {}
        checks = []
        for k, tv in enumerate(self.inputs):
            for d, i in enumerate(tv.get_logical_domain(no_reductions=True)):
                if i.is_broadcast or i.extent.value is not None:
                    continue
                root = self.exact.class_of(i)
                if root in first:
                    checks.append((*first[root], k, d))
                else:
                    first[root] = (k, d)
        return tuple(checks)


def _to(src: DataType, dst: DataType) -> str:
    if src is dst:
        return ""
    if dst is DataType.Bool:
        return " != 0"
    return f".to({triton_dtype(dst)})"


def _op_dtype(expr: UnaryOp | BinaryOp | TernaryOp) -> DataType:
    """The dtype an op computes in: its output's, except comparisons (the operands' common type,
    by torch's promotion)."""
    if expr.kind in _COMPARISONS:
        return compute_dtype(result_dtype(torch.add, expr.inputs))
    out = compute_dtype(expr.outputs[0].dtype)
    if out is DataType.Bool and expr.kind not in _LOGICAL and expr.kind is not UnaryOpType.cast:
        return DataType.Int32  # torch's bool arithmetic saturates (True + True is True): compute wide, then != 0
    return out
