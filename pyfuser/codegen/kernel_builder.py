"""A scheduled segment -> the source of one Triton kernel.

The reference tensor's loop domain is the loop nest: ``grid_*`` IDs become ``tl.program_id``,
``block_*`` / ``vectorize`` / ``unroll`` IDs become the axes of one n-D tile (``tl.arange`` of a
power-of-two size, masked when padded; as wide as a runtime extent when the extent is symbolic, a
persistent row), ``serial`` IDs become loops. Every output's loop IDs must map onto that nest (the
exact ``IdGraph``); walking each output's split / merge transforms back from the loop indices gives
its logical indices, and every other tensor's indices follow from its consumer's through the exprs'
logical maps (a producer is computed, or loaded, at the loop point of the consumer that reads it:
everything is inlined, as a Triton tile program needs). Global tensors are addressed with runtime
strides; where a merge covers logical axes that are adjacent and contiguous in a tensor's
allocation, the merged index times the inner stride replaces the div / mod pair, so the access
stays contiguous and Triton can vectorize it.

Reductions (``values.py``) iterate their reduction loop IDs: a tile axis is reduced with
``tl.reduce`` over it, a serial one accumulates in a loop; a later output of the same kernel whose
axis maps to a reduction's tile axis reads the tile still on chip (persistent), one whose axis maps
to a serial reduction loop runs its own loop after the reduction (another pass).

Sizes are kernel arguments: every exact class of logical IDs is one ``ks*`` integer the launcher
reads off a tensor, so a new size reuses the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyfuser.codegen.code_writer import CodeWriter
from pyfuser.codegen.kernel_source import (
    ALIGNMENTS,
    KernelError,
    KernelSource,
    SizeSource,
    alignment_param,
    stride_param,
    tensor_param,
)
from pyfuser.codegen.triton_support import MAX_TILE_NUMEL, int_expr, loop_range, prelude, triton_dtype
from pyfuser.codegen.values import Indices, L2Hint, ValueLowering
from pyfuser.ir.analysis.id_graph import IdGraph
from pyfuser.ir.analysis.reshape import reshape_groups
from pyfuser.ir.analysis.resize import RESIZE_OPS, resized_axes
from pyfuser.ir.base import Expr, Val
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import IterDomain, Merge, ParallelType, Split
from pyfuser.ir.layout import Layout
from pyfuser.ir.ops import CatOp, PadOp, ReductionOp, ReshapeOp, SliceOp, VarMeanOp
from pyfuser.ir.ops.indexing import IndexedRead
from pyfuser.ir.ops.shape import describe_axis
from pyfuser.ir.symbolic import SymBinary, SymConst, SymExpr, SymVar, ceil_div, sym_min
from pyfuser.ir.tensor_domain import transforms_between
from pyfuser.ir.tensor_view import TensorView
from pyfuser.utils import next_power_of_2

GRID_AXES = {ParallelType.grid_x: 0, ParallelType.grid_y: 1, ParallelType.grid_z: 2}
TILE_TYPES = frozenset({ParallelType.block_x, ParallelType.block_y, ParallelType.block_z,
                        ParallelType.vectorize, ParallelType.unroll})
#: Largest tile a runtime extent may ask for (a persistent row of 32768 elements)
MAX_DYNAMIC_TILE = 1 << 15
#: What a pipelined loop's ``num_stages`` reads until the kernel's strides are known (``_pipeline_stages``)
_STAGES = "_pipeline_stages_"

#: per tensor name
Layouts = dict[int, Layout]


@dataclass
class Loop:
    id: IterDomain
    kind: str  # "grid" | "tile" | "serial"
    extent: SymExpr
    index: str = ""
    tile_size: int = 0  # 0: sized at launch (``tile_param``)
    tile_param: str = ""
    tile_pos: int = 0


@dataclass(frozen=True)
class _IndexForm:
    """An ID's index as ``(base // divisor) % extent`` of the index of the outermost merge above it
    (Inductor's indexing of a flat index): each axis of a nest of merges costs at most one division and
    one remainder, where taking the outer and inner part merge by merge chains them (``(i % (a * b)) % b``).
    ``wrapped``: the remainder is needed (the outermost axes of the nest span the base without it).
    ``factors``: the extents of the axes inside, as texts; the divisor is written canonically (constants
    folded, the others sorted), so the text of an axis does not depend on how the merges nest
    (``merge(merge(a, b), c)`` or ``merge(a, merge(b, c))``: a reshape's groups nest either way)."""

    base: str
    factors: tuple[str, ...] = ()
    wrapped: bool = False

    def divided(self, inner_extents: tuple[str, ...]) -> _IndexForm:
        """The form of a merge's outer ID, given this form of the merge's output and the extents of the
        axes its inner ID covers."""
        return _IndexForm(self.base, self.factors + inner_extents, self.wrapped)

    def within(self) -> _IndexForm:
        """The form of a merge's inner ID (its extent bounds it: the remainder is needed)."""
        return _IndexForm(self.base, self.factors, True)

    def divisor(self) -> str | None:
        constant, symbols = 1, []
        for f in self.factors:
            if f.isdigit():
                constant *= int(f)
            else:
                symbols.append(f)
        terms = ([str(constant)] if constant != 1 or not symbols else []) + sorted(symbols)
        if terms == ["1"]:
            return None
        return terms[0] if len(terms) == 1 else f"({' * '.join(terms)})"


class KernelBuilder(ValueLowering):
    def __init__(self, fusion: Fusion, name: str, target: str, layouts: Layouts,
                 reference: TensorView | None = None, loop_stages: int = 0, chunked: bool = False,
                 l2: L2Hint = L2Hint.keep, partials: frozenset[int] = frozenset()) -> None:
        """``chunked``: the kernel runs in a stream loop on chunks of its tensors, so an extent the
        fusion knows statically (an ``expand`` target) is not the extent of what it gets: extents
        come from the tensors, and static ones are checked against the whole tensors' sizes.
        ``l2``: what the loads ask of L2 (``L2Hint``).
        ``partials``: names of inputs that hold an earlier launch's partial results per program."""
        """``layouts``: per tensor name, the layout that holds for every tensor the kernel will be
        given (default: ``Layout.strided``)."""
        self.fusion = fusion
        self.name = name
        self.target = target
        self.chunked = chunked
        # Serial loops software-pipelined by Triton (loads of the next steps issued early) when > 1.
        self.range = loop_range(target)
        self.loop_stages = loop_stages if target == "cuda" else 0
        self.l2 = l2
        #: reductions being accumulated now (nested ones count twice) and whether the loads being emitted
        #: are in the pass that writes the kernel's last output (``L2Hint.keep_until_last``)
        self.accumulating = 0
        self.last_pass = False
        self.device_asserts = False
        self.partials = partials
        self.layouts = layouts
        self.exprs = fusion.exprs()
        self.tensors = fusion.tensors()
        #: tensors the kernel reads through pointers; a 0-dim CPU tensor input (``is_cpu``) is a value
        #: the launch reads on the host and passes by value, as torch treats it beside CUDA tensors
        self.inputs = [v for v in fusion.inputs() if isinstance(v, TensorView) and not v.is_cpu]
        self.outputs = [v for v in fusion.outputs() if isinstance(v, TensorView)]
        #: the widest inputs (most axes that are not broadcasts), which ``L2Hint.stream`` hints: read once
        iterated = [sum(not i.is_broadcast() for i in tv.get_logical_domain(no_reductions=True)) for tv in self.inputs]
        widest = max(iterated, default=0)
        self.streamed = frozenset(k for k, n in enumerate(iterated) if n == widest)
        self.loop_graph = IdGraph(self.tensors, self.exprs, map_broadcast=True)
        self.exact = IdGraph(self.tensors, self.exprs, map_broadcast=False)
        self.reference = reference or self.outputs[0]
        # Compiled Triton only: the interpreter's ``block & scalar`` is no boolean mask.
        self.code = CodeWriter(masked_uniform=self.loop_stages > 1)
        #: index name -> how it was taken from a flat index (``_IndexForm``): an axis taken from it is
        #: written from that flat index, in the text the loop nest gives the axis (``_axes_of``)
        self._index_forms: dict[str, _IndexForm] = {}
        #: kernel texts of extents and what they are over the size symbols; divisors' multiplier arguments
        self._extent_of_text: dict[str, SymExpr] = {}
        self._multipliers: dict[tuple[int, tuple[str, ...]], str] = {}  # a ``_size_product`` -> its argument
        self._class_symbol: dict[int, str] = {}
        self._sizes: list[SizeSource] = []
        self._size_arguments: dict[str, str] = {}
        self._strides: list[tuple[int, int]] = []
        self._stride_names: dict[tuple[int, int], str] = {}
        #: (tensor position, dim) -> the dims allocated just outside it, nearest first, of a merged group
        #: whose index is multiplied by that dim's stride (see ``stride_fallbacks``)
        self._group_strides: dict[tuple[int, int], tuple[int, ...]] = {}
        #: values the kernel takes by value (scalar fusion inputs, 0-dim CPU tensor inputs): symbol ->
        #: (argument name, dtype it is computed in, the fusion input)
        self._scalars: dict[str, tuple[str, DataType, Val]] = {}
        self._divisibility: list[tuple[SymExpr, int, str]] = []
        self._dynamic_tiles: list[tuple[str, SymExpr, int, str]] = []
        self._stored: set[int] = set()
        self._tile_index: dict[int, str] = {}
        self.tile_shape: list[str] = []
        #: the bounds of splits that may not divide: (condition, outer index, stride, inner index, extent)
        self._split_bounds: list[tuple[str, str, str, str, str]] = []

    # --- sizes ------------------------------------------------------------------------------------
    def size_symbol(self, logical: IterDomain) -> SymExpr:
        """The runtime extent of a non-broadcast logical ID: a constant (of any member of its class:
        the launch checks the others), or its class's size argument."""
        constant = logical.extent if logical.extent.value is not None else \
            next((m.extent for m in self.exact.members(logical) if not m.is_broadcast() and m.extent.value is not None),
                 None)
        if constant is not None and not (self.chunked and self._held_by_a_tensor(logical)):
            return constant
        root = self.exact.class_of(logical)
        symbol = self._class_symbol.get(root)
        if symbol is None:
            symbol = self._class_symbol[root] = f"ks{len(self._class_symbol)}"
            self._sizes.append(self._size_source(logical, symbol))
        return SymVar(symbol)

    def _held_by_a_tensor(self, logical: IterDomain) -> bool:
        members = {id(m) for m in self.exact.members(logical)}
        return any(id(i) in members for tv in (*self.inputs, *self.outputs)
                   for i in tv.get_logical_domain(no_reductions=True) if not i.is_broadcast())

    def _size_source(self, logical: IterDomain, symbol: str) -> SizeSource:
        members = {id(m) for m in self.exact.members(logical)}
        for output, tvs in ((False, self.inputs), (True, self.outputs)):
            for k, tv in enumerate(tvs):
                for d, i in enumerate(tv.get_logical_domain(no_reductions=True)):
                    if id(i) in members and not i.is_broadcast():
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
        return SymConst(1) if i.is_broadcast() else self.size_symbol(i)

    # --- the loop nest ------------------------------------------------------------------------------
    def _loop_nest(self) -> list[Loop]:
        ref = self.reference
        loops: list[Loop] = []
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
            extent = self.extent(i)
            if ptype in GRID_AXES:
                if i.is_reduction():
                    raise KernelError(f"{where} is a reduction ID parallelized on {ptype.name}: a reduction across "
                                      "programs needs a final step; rfactor it (tv.rfactor) and reduce the partial "
                                      "results on a tile axis or in a loop")
                loops.append(Loop(i, "grid", extent, f"pid{GRID_AXES[ptype]}"))
            elif ptype in TILE_TYPES:
                loops.append(self._tile(i, extent, where))
            elif not i.is_broadcast():  # a serial broadcast iterates once and indexes nothing: no loop
                loops.append(Loop(i, "serial", extent))
        tiles = [loop for loop in loops if loop.kind == "tile"]
        for k, loop in enumerate(tiles):
            loop.tile_pos = k
        static = 1
        for loop in tiles:
            static *= loop.tile_size or 1
        if static > MAX_TILE_NUMEL:
            sizes = " x ".join(str(loop.tile_size or loop.tile_param) for loop in tiles)
            raise KernelError(f"{ref.short_name}: the tile of its block / vectorize / unroll axes ({sizes} = {static} "
                              f"elements) is over Triton's limit of {MAX_TILE_NUMEL}")
        return loops

    def _tile(self, i: IterDomain, extent: SymExpr, where: str) -> Loop:
        ptype = i.parallel_type
        size = extent.value
        if size is None:
            if ptype is not ParallelType.block_x and ptype is not ParallelType.block_y:
                raise KernelError(f"{where} is parallelized on {ptype.name} but its extent {i.extent} is not a "
                                  "constant; split it by a constant factor")
            param = f"TILE{len(self._dynamic_tiles)}"
            self._dynamic_tiles.append((param, extent, MAX_DYNAMIC_TILE,
                                        f"{where} is a tile as wide as its extent"))
            return Loop(i, "tile", extent, tile_param=param)
        if size > MAX_TILE_NUMEL:
            raise KernelError(f"{where} is parallelized on {ptype.name} with extent {size}, over Triton's "
                              f"tile limit of {MAX_TILE_NUMEL} elements")
        if ptype is ParallelType.vectorize:
            self._check_vectorize(i, where)
        return Loop(i, "tile", extent, tile_size=next_power_of_2(size))

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
            mapped = [d for d, j in enumerate(dims) if not j.is_broadcast() and self.exact.mapped(j, node)]
            if not mapped:
                continue
            layout = self.layouts.get(tv.name) or Layout.strided(len(dims))
            order, contiguity = layout.perm, list(layout.contiguity)
            live = [(d, c) for d, c in zip(order, contiguity, strict=False) if not dims[d].is_broadcast()]
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
    def walk_back(self, tv: TensorView, partial: bool = False) -> Indices:
        """``tv``'s logical indices from the loop nest's indices (its loop IDs must map onto it).

        Also adds the conditions that keep the loop point in range to the current scope: a split
        that may not divide can overshoot its input's extent, so that index is compared with it once,
        as high in the transforms as possible (``merged < M * N``, which keeps the mask contiguous for
        Triton); a merge's remainder never overshoots. ``partial``: loop IDs without an index yet
        (a reduction's, before its loop opens) are skipped, and so is what depends on them.
        """
        code = self.code
        known: dict[int, str] = {}
        bounded: dict[int, bool] = {}
        taken: dict[int, int] = {}
        # A copy of a reduction's result may keep its reduction IDs (partial sums before an
        # allreduce): they are not stored, so nothing indexes them.
        kept_reduction = not isinstance(tv.definition, ReductionOp | VarMeanOp)
        for pos, i in enumerate(tv.get_loop_domain()):
            index = self.index_of_loop_id(i, taken)
            if index is None:
                if i.is_broadcast() or (i.is_reduction() and kept_reduction):
                    known[id(i)], bounded[id(i)] = "0", True
                    continue
                if partial:
                    continue
                raise KernelError(f"{tv.short_name} axis {pos} ({i}) is not mapped to the loop nest of "
                                  f"{self.reference.short_name}, the kernel's reference: schedule "
                                  f"{tv.short_name} like it (schedule.transform_like / parallelize_like) or "
                                  "leave its loop domain unscheduled")
            known[id(i)], bounded[id(i)] = index, True
        result = Indices()
        merged: dict[int, tuple[int, ...]] = {}
        start = tv.domain().root or tv.get_logical_domain()  # an rfactor partial maps its producer by root
        for t in reversed(transforms_between(start, tv.get_loop_domain())):
            if isinstance(t, Split):
                outer, inner = known.get(id(t.outer)), known.get(id(t.inner))
                if outer is None or inner is None:
                    continue
                stride = int_expr(self.extent(t.inner))
                index = known[id(t.in_id)] = code.assign(
                    "ix", f"{outer} * {stride} + {inner}" if stride != "1" else f"{outer} + {inner}")
                if not (self._divides(t) and bounded[id(t.outer)] and bounded[id(t.inner)]):
                    extent = int_expr(self.extent(t.in_id))
                    code.add_condition(f"({index} < {extent})", code.dims_of(index))
                    self._split_bounds.append((f"({index} < {extent})", outer, stride, inner, extent))
                bounded[id(t.in_id)] = True
            elif isinstance(t, Merge):
                out = known.get(id(t.out))
                if out is None:
                    continue
                inner_extent = self._extent_text(self.extent(t.inner))
                outer_extent = self._extent_text(self.extent(t.outer))
                if inner_extent == "1":
                    known[id(t.outer)], known[id(t.inner)] = out, "0"
                elif outer_extent == "1":
                    # the merged index itself (not ``out % inner``): the same text a tensor without the
                    # outer broadcast (a squeeze's output, replayed by forwarding) computes, so a
                    # value computed for one is found again by the other
                    known[id(t.outer)], known[id(t.inner)] = "0", out
                else:
                    form = self._form_of(out)
                    known[id(t.outer)] = self._assign_form(form.divided(self._leaf_extents(t.inner)), outer_extent)
                    known[id(t.inner)] = self._assign_form(form.within(), inner_extent)
                bounded[id(t.outer)], bounded[id(t.inner)] = bounded[id(t.out)], True
                merged[id(t.out)] = (id(t.outer), id(t.inner))
                result.groups.append(((id(t.out),), out))
        for pos, i in enumerate(start):
            if id(i) not in known:
                if i.is_broadcast() or (i.is_reduction() and kept_reduction):
                    known[id(i)] = "0"
                elif not partial:
                    raise KernelError(f"{tv.short_name} logical axis {pos} ({i}) is not reached from its loop domain "
                                      "in the kernel's loop nest")
        result.of = known
        logical_ids = {id(i) for i in start}
        # The walk meets a nest of merges outermost first: each group is expanded into the logical IDs
        # under it once all are known, so ((d0, d1), d2) is one group, which a dense tensor indexes
        # linearly (one stride, contiguous along the tile: vectorized loads).
        def logical_of(k: int) -> tuple[int, ...]:
            return tuple(j for c in merged[k] for j in logical_of(c)) if k in merged else (k,)

        groups = [(logical_of(g[0]), e) for g, e in result.groups]
        result.groups = [(g, e) for g, e in groups if all(k in logical_ids for k in g)]
        return result

    def _form_of(self, index: str) -> _IndexForm:
        """How ``index`` was taken from a flat index (``index`` itself where it was not)."""
        return self._index_forms.get(index, _IndexForm(index))

    def _assign_form(self, form: _IndexForm, extent: str) -> str:
        """The name of ``form``'s index of an axis of ``extent``, its form remembered."""
        divisor = form.divisor()
        text = form.base if divisor is None else self._quotient(form.base, divisor, form.factors)
        if form.wrapped:
            text = self._remainder(text, extent, form.factors)
        name = self.code.assign("ix", text)
        self._index_forms.setdefault(name, form)
        return name

    def _extent_text(self, e: SymExpr) -> str:
        """``e`` as kernel text (``int_expr``), remembered so that a division by it can be set up at
        launch (``_multiplier``)."""
        text = int_expr(e)
        if e.value is None:
            self._extent_of_text.setdefault(text, e)
        return text

    def _size_product(self, factors: tuple[str, ...]) -> tuple[int, tuple[str, ...]] | None:
        """The product of ``factors`` (extent texts) as a constant and the size arguments it multiplies
        (sorted, so a product is one however its text nests: ``(ks1 * ks2)``, ``(ks2 * ks1)``), None where a
        factor is anything else (a sum, a tile sized at launch)."""
        constant, symbols, terms = 1, [], []
        for f in factors:
            if f.isdigit():
                constant *= int(f)
            elif f in self._extent_of_text:
                terms.append(self._extent_of_text[f])
            else:
                return None
        sizes = {src.symbol for src in self._sizes}
        while terms:
            term = terms.pop()
            if isinstance(term, SymConst):
                constant *= int(term.val)
            elif isinstance(term, SymVar) and term.name in sizes:
                symbols.append(term.name)
            elif isinstance(term, SymBinary) and term.op == "*":
                terms += [term.lhs, term.rhs]
            else:
                return None
        return constant, tuple(sorted(symbols))

    @staticmethod
    def _alignment(product: tuple[int, tuple[str, ...]]) -> str:
        """The compile-time alignment of a ``_size_product`` (a constexpr expression over the size
        arguments' alignment parameters): 1 exactly where the product is odd."""
        constant, symbols = product
        terms = [str(ALIGNMENTS[constant & 15])] if ALIGNMENTS[constant & 15] != 1 else []
        return " * ".join([*terms, *(alignment_param(s) for s in symbols)]) or "1"

    def _quotient(self, index: str, divisor: str, factors: tuple[str, ...]) -> str:
        """``index // divisor`` (the product of ``factors``). A tile of indices divided by an odd size
        known at launch takes the launch's multiplier (``_fdiv``: a multiply-high and a shift, where an
        integer division is a subroutine of about 20 instructions); by a size Triton knows a multiple
        of 2 or more, the plain division, whose quotient Triton knows constant over runs (loads it
        vectorizes) where it knows nothing of the multiply's; by a constant, the plain division, which
        the compiler turns into a multiply."""
        product = self._size_product(factors)
        if product is None or not product[1] or not self.code.dims_in(index):
            return f"{index} // {divisor}"
        return f"_fdiv({index}, {self._multiplier(product)}, {divisor}, {self._alignment(product)})"

    def _remainder(self, value: str, extent: str, factors: tuple[str, ...]) -> str:
        """``value % extent``, where ``value`` is a flat index divided by the product of ``factors``: by the
        launch's multiplier of an odd ``extent`` where the division left runs of one index (``_fmod``),
        plainly otherwise (see ``_quotient``)."""
        product, divided = self._size_product((extent,)), self._size_product(factors)
        if product is None or not product[1] or divided is None or not self.code.dims_in(value):
            return f"{value} % {extent}" if value.isidentifier() else f"({value}) % {extent}"
        return (f"_fmod({value}, {self._multiplier(product)}, {extent}, {self._alignment(product)}, "
                f"{self._alignment(divided)})")

    def _multiplier(self, product: tuple[int, tuple[str, ...]]) -> str:
        """The argument holding ``division_multiplier`` of a ``_size_product``, one per product."""
        return self._multipliers.setdefault(product, f"dm{len(self._multipliers)}")

    def _divisors(self) -> tuple[tuple[str, SymExpr], ...]:
        """(multiplier argument, the divisor over the size symbols) of each ``_size_product`` divided by."""
        divisors = []
        for (constant, symbols), name in self._multipliers.items():
            extent: SymExpr = SymConst(constant)
            for symbol in symbols:
                extent = extent * SymVar(symbol)
            divisors.append((name, extent))
        return tuple(divisors)

    def _leaf_extents(self, i: IterDomain) -> tuple[str, ...]:
        """The extents (texts) of the IDs a nest of merges combines into ``i`` (``i``'s own if no merge
        made it)."""
        definition = i.definition
        if isinstance(definition, Merge) and i is definition.out:
            return self._leaf_extents(definition.outer) + self._leaf_extents(definition.inner)
        return (self._extent_text(self.extent(i)),)

    def _divides(self, split: Split) -> bool:
        """Whether ``split`` divides the extent the kernel iterates, not the one the fusion states: in
        a stream loop a tensor's extents are its chunk's (``size_symbol``), so a split that divides
        the whole tensor's static extent (``Split.is_divisible``) may overshoot a chunk."""
        extent, factor = self.extent(split.in_id).value, split.factor.value
        return extent is not None and factor is not None and extent % factor == 0

    def index_of_loop_id(self, i: IterDomain, taken: dict[int, int]) -> str | None:
        """The nest index ``i`` takes: its own if it is a loop ID of the nest, else that of the nest's
        loop ID it maps to. Two axes of one tensor can map to one class (``x + x.t()``: both axes
        have ``x``'s extent), so the k-th of a tensor's IDs in a class takes the k-th loop of it."""
        own = self.code.loop_index(id(i))
        if own is not None:
            return own
        root = self.exact.class_of(i)
        candidates = self.code.class_indices(root)
        k = taken.get(root, 0)
        taken[root] = k + 1
        return candidates[k] if k < len(candidates) else None

    def size_argument(self, e: SymExpr) -> str:
        """``e`` (over the fusion's sizes) as a kernel expression: a constant, or an argument the launch
        evaluates (a slice's start, a pad's width)."""
        if e.value is not None:
            return str(e.value)
        key = str(e)
        symbol = self._size_arguments.get(key)
        if symbol is None:
            symbol = self._size_arguments[key] = f"kr{len(self._size_arguments)}"
            self._sizes.append(SizeSource(symbol, extent=e))
        return symbol

    def resize_indices(self, expr: SliceOp | PadOp | CatOp, operand: int, consumer: Indices) -> Indices:
        """The ``operand``-th tensor input of a resize op read at its consumer's indices: shifted (and
        strided) on the resized axes, with the in-range condition of each bounded one."""
        producer = expr.inputs[operand]
        assert isinstance(producer, TensorView)
        result = self._mapped_indices(expr, producer, consumer)
        p_ids = producer.get_logical_domain(no_reductions=True)
        c_ids = expr.output.get_logical_domain(no_reductions=True)
        conditions = list(result.valid)
        for axis in resized_axes(expr, operand):
            c_index = consumer.of.get(id(c_ids[axis.dim]), "0")
            index = f"{c_index}" if axis.step == 1 else f"({c_index}) * {axis.step}"
            offset = self.size_argument(axis.offset)
            index = f"({index} + {offset})" if offset != "0" else index
            if index in self._index_forms:
                # the consumer's index as taken from a flat one, ``(flat // d) % extent``, wraps at the
                # consumer's extent, not the operand's (a cat's part, a slice, a pad): the operand's axes
                # of a reshape are taken from it by a name of its own, never rewritten through the
                # consumer's flat index
                index = self.code.assign("ix", index, cse=False)
            result.of[id(p_ids[axis.dim])] = index
            if axis.bounded:
                extent = int_expr(self.size_symbol(p_ids[axis.dim]))
                conditions.append(f"({index} >= 0) & ({index} < {extent})")
        result.valid = tuple(conditions)
        return result

    def producer_indices(self, expr: Expr, producer: TensorView, consumer: Indices) -> Indices:
        """A producer read at its consumer's loop point: its indices through the expr's logical map,
        shifted on the axes a resize op moves, recomputed through a reshape's groups."""
        if isinstance(expr, RESIZE_OPS):
            return self.resize_indices(expr, expr.inputs.index(producer), consumer)
        if isinstance(expr, ReshapeOp):
            return self.reshape_indices(expr, consumer)
        return self._mapped_indices(expr, producer, consumer)

    def reshape_indices(self, expr: ReshapeOp, consumer: Indices) -> Indices:
        """A reshape's operand read at its consumer's indices (``ir/analysis/reshape.py``): per group,
        the consumer's flat index over the group's axes (a merged index the consumer already has, else
        their row-major sum), then each producer axis as that index divided by the extents inside it
        and wrapped by its own. A consumer's merged group that covers whole groups is the operand's
        merged group too, so a dense operand is still addressed by one index times one stride, and its
        axes are taken from that one index as the kernel's loop nest takes them (``_axes_of``): a value a
        reduction kernel computed at the nest's indices is found again through reshapes."""
        groups = reshape_groups(expr)
        if groups is None:
            raise KernelError(f"{expr.output.short_name}: a reshape whose groups of axes are not known from its "
                              "extents is an ATen call, not a kernel's")
        producer = expr.inputs[0]
        assert isinstance(producer, TensorView)
        p_ids = producer.get_logical_domain(no_reductions=True)
        c_ids = expr.output.get_logical_domain(no_reductions=True)
        code = self.code
        result = Indices(valid=consumer.valid)
        for p in producer.get_logical_domain():
            result.of[id(p)] = "0"
        done: set[int] = set()  # groups (by position) whose producer axes are known
        # merged groups of the consumer that cover whole reshape groups, widest first: the same flat index
        position = {id(i): d for d, i in enumerate(c_ids)}
        for group_ids, index in sorted(consumer.groups, key=lambda g: -len(g[0])):
            if any(k not in position for k in group_ids):
                continue
            dims = [position[k] for k in group_ids if not c_ids[position[k]].is_broadcast()]
            chosen = [k for k, g in enumerate(groups) if set(dims) & set(g.outputs)]
            between = [d for d in range(min(dims, default=0), max(dims, default=-1) + 1) if not c_ids[d].is_broadcast()]
            if dims != between or dims != sorted(d for k in chosen for d in groups[k].outputs
                                                 if not c_ids[d].is_broadcast()):
                continue
            ins = [p_ids[d] for k in chosen for d in groups[k].inputs if not p_ids[d].is_broadcast()]
            if len(ins) > 1:
                result.groups.append((tuple(id(i) for i in ins), index))
            if not done & set(chosen):
                self._axes_of(index, ins, result)
                done.update(chosen)
        merged = {tuple(group): index for group, index in consumer.groups}
        for k, group in enumerate(groups):
            live_in = [p_ids[d] for d in group.inputs if not p_ids[d].is_broadcast()]
            if not live_in or k in done:
                continue
            outs = [c_ids[d] for d in group.outputs if not c_ids[d].is_broadcast()]
            flat = merged.get(tuple(id(i) for i in outs)) if len(outs) > 1 else None
            if flat is None:
                flat = "0"
                for i in outs:
                    index = consumer.of.get(id(i), "0")
                    extent = int_expr(self.size_symbol(i))
                    flat = index if flat == "0" else code.assign("ix", f"({flat}) * {extent} + {index}")
            self._axes_of(flat, live_in, result)
            if len(live_in) > 1:  # the operand's axes of the group, merged: the same flat index
                result.groups.append((tuple(id(i) for i in live_in), flat))
        return result

    def _axes_of(self, flat: str, axes: list[IterDomain], result: Indices) -> None:
        """Each of ``axes`` (outer first) from their row-major ``flat`` index, in the text ``walk_back`` gives
        the axes of a nest of merges outer first (``merge(merge(a, b), c)``): the same text, so a value
        computed at the loop nest's indices is recalled, not computed again; axes of one element are 0.
        Where ``flat`` was itself taken from a wider flat index (a reshape's group merged in the loop nest
        with axes outside it, ``merge(merge(B, D), C)`` read through ``[C, B * D]``), the axes are taken
        from that wider index, as ``walk_back`` takes them (``i // 4``, not ``(i // 2) // 2``)."""
        form = self._form_of(flat)
        sized = [(i, self._extent_text(self.size_symbol(i))) for i in axes]
        for i, extent in sized:
            if extent == "1":
                result.of[id(i)] = "0"
        live = [(i, extent) for i, extent in sized if extent != "1"]
        for k, (i, extent) in reversed(list(enumerate(live))):
            axis = form if k == 0 else form.within()
            result.of[id(i)] = flat if len(live) == 1 else self._assign_form(axis, extent)
            form = form.divided((extent,))

    def _mapped_indices(self, expr: Expr, producer: TensorView, consumer: Indices) -> Indices:
        mapping = expr.logical_map(producer)
        result = Indices(valid=consumer.valid)
        inverse: dict[int, int] = {}
        for p in producer.get_logical_domain():
            c = mapping.get(p)
            if p.is_broadcast() or c is None or id(c) not in consumer.of:
                result.of[id(p)] = "0"
            else:
                result.of[id(p)] = consumer.of[id(c)]
                inverse[id(c)] = id(p)
        for group, index in consumer.groups:
            if all(k in inverse for k in group):
                result.groups.append((tuple(inverse[k] for k in group), index))
        return result

    def offset(self, tv: TensorView, position: int, indices: Indices) -> tuple[str, frozenset[int]]:
        """``sum(index * stride)`` over ``tv``'s memory-occupying dims, contiguous merged groups fused;
        and the tile axes the address varies along."""
        dims = tv.get_logical_domain(no_reductions=True)
        dim_of = {id(i): d for d, i in enumerate(dims)}
        layout = self.layouts.get(tv.name) or Layout.strided(len(dims))
        order, contiguity = layout.perm, layout.contiguity
        # An expanded axis (stride 0) or one of size 1 (contiguity None) takes part in no merged
        # group: a group's index times its innermost stride is only its address when every axis
        # of it is laid out densely.
        expanded = {d for d, c in zip(order, contiguity, strict=False) if c is None} | \
            {d for d, i in enumerate(dims) if i.expanded}
        live = [d for d, i in enumerate(dims) if not i.is_broadcast()]
        alloc = [d for d in order if d in live]
        contig = {d: bool(c) for d, c in zip(order, contiguity, strict=False)}
        covered: set[int] = set()
        terms: list[str] = []
        used: list[str] = []
        for group, index in sorted(indices.groups, key=lambda g: -len(g[0])):
            ds = [dim_of[k] for k in group if k in dim_of]
            if len(ds) < len(group) or any(d not in live or d in covered or d in expanded for d in ds):
                continue
            start = alloc.index(ds[0])
            if alloc[start:start + len(ds)] != ds or not all(contig.get(d) for d in ds[:-1]):
                continue
            terms.append(self._stride_term(index, position, ds[-1]))
            outer = tuple(reversed(ds[:-1]))
            if len(outer) > len(self._group_strides.get((position, ds[-1]), ())):
                self._group_strides[(position, ds[-1])] = outer
            used.append(index)
            covered.update(ds)
        for d in live:
            if d not in covered:
                index = indices.of[id(dims[d])]
                terms.append(self._stride_term(index, position, d))
                used.append(index)
        return (" + ".join(terms) if terms else "0"), self.code.dims_in(" ".join(used))  # indices may be expressions

    def _stride_term(self, index: str, position: int, dim: int) -> str:
        key = (position, dim)
        name = self._stride_names.get(key)
        if name is None:
            name = self._stride_names[key] = stride_param(position, dim)
            self._strides.append(key)
        return f"({index}) * {name}"

    # --- the kernel -------------------------------------------------------------------------------------
    def _check_inlined_producers(self) -> None:
        """A scheduled tensor the kernel computes must be parallelized like the loop it is inlined in,
        and reduce nothing across programs (grid reductions are split into launches before)."""
        ref_loop = self.reference.get_loop_domain()
        for tv in self.tensors:
            for pos, i in enumerate(tv.get_loop_domain()):
                if i.is_reduction() and i.parallel_type in GRID_AXES and tv not in self.inputs:
                    raise KernelError(f"{tv.short_name} axis {pos} ({i}) is a reduction across programs "
                                      f"({i.parallel_type.name}) inside one launch; a grid reduction needs a final "
                                      "step after every program finished (rfactor it, or let the code generator "
                                      "split it into launches)")
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
        self._open_parallel(loops)
        # Reductions whose iteration axes the nest indexes here are computed up front, before the
        # serial loops of the nest (their values do not vary along them: a split normalization's final
        # step reduces the programs' partial results once, then loops over its share of the row); one
        # nested in another's loop (a row's reduction inside a reduction across rows) where its value
        # is read.
        self._reduce_indexed()
        self._open_serial(loops)
        self._reduce_indexed()
        pending = [(position, tv) for position, tv in enumerate(self.outputs, start=len(self.inputs))
                   if id(tv) not in self._stored]
        # the last pass over the rows: the last output computed elementwise (a reduction's result reads none)
        last = max((k for k, (_, tv) in enumerate(pending) if not isinstance(tv.definition, ReductionOp | VarMeanOp)),
                   default=None)
        for k, (position, tv) in enumerate(pending):
            if id(tv) not in self._stored:  # (an earlier pass's reduction may have stored it with its own pass)
                self.last_pass = k == last
                self._store(tv, position)
        self.last_pass = False
        return self._source(loops)

    def _reduce_indexed(self) -> None:
        """Compute each reduction whose iteration axes have indices here (one computed already is
        recalled, not computed again)."""
        for expr in self.exprs:
            if isinstance(expr, ReductionOp | VarMeanOp) and self._indexed_here(expr.output):
                self.reduce(expr)

    def _open_parallel(self, loops: list[Loop]) -> None:
        """The program ids and tile indices of the nest."""
        code = self.code
        tiles = [loop for loop in loops if loop.kind == "tile"]
        self.tile_shape = [str(loop.tile_size) if loop.tile_size else loop.tile_param for loop in tiles]
        for loop in loops:
            if loop.kind == "grid":
                code.emit(f"{loop.index} = tl.program_id({loop.index[-1]})")
            elif loop.kind == "tile":
                shape = ", ".join(":" if k == loop.tile_pos else "None" for k in range(len(tiles)))
                size = loop.tile_size or loop.tile_param
                loop.index = code.assign("r", f"tl.arange(0, {size})" + (f"[{shape}]" if len(tiles) > 1 else ""),
                                         frozenset({loop.tile_pos}))
                self._tile_index[loop.tile_pos] = loop.index
                if loop.tile_size != loop.extent.value:
                    code.add_condition(f"({loop.index} < {int_expr(loop.extent)})", frozenset({loop.tile_pos}))
            if loop.kind != "serial":
                code.bind_loop(id(loop.id), self.exact.class_of(loop.id), loop.index)

    def _open_serial(self, loops: list[Loop]) -> None:
        """The serial loops of the nest but those over an axis some reduction of the kernel reduces."""
        code = self.code
        # A serial loop over an axis some reduction of the kernel reduces must not enclose that
        # reduction (it would reduce one chunk of the row): consumers open it after the reduction
        # (a multi-pass kernel), in ``_store``.
        reduced = {self.exact.class_of(i) for e in self.exprs if isinstance(e, ReductionOp | VarMeanOp)
                   for tv in e.tensor_outputs for i in tv.get_loop_domain() if i.is_reduction()}
        for loop in loops:
            if loop.kind == "serial" and not loop.id.is_reduction() and self.exact.class_of(loop.id) not in reduced:
                loop.index = code.fresh("i")
                code.open(f"for {loop.index} in {self._loop(int_expr(loop.extent))}:")
                code.bind_loop(id(loop.id), self.exact.class_of(loop.id), loop.index)

    def _loop(self, extent: str) -> str:
        if self.loop_stages > 1:  # the stage count is written once the kernel's strides are known
            return f"tl.range({extent}, num_stages={_STAGES})"
        return f"{self.range}({extent})"

    def _pipeline_stages(self) -> str:
        """The stage count of the kernel's software-pipelined loops: ``loop_stages``, but 1 (not pipelined)
        in the variant for tensor inputs whose rows load in 4-byte pieces (a row stride whose alignment,
        the launch-time constexpr ``*_align``, times the element size is 4 bytes: float32 rows of odd
        length, bf16 rows of 2 mod 4). Triton pipelines such a load as one 4-byte ``cp.async`` per element:
        layer-norm backward of float32 131072 x 127 took 422 us pipelined, 173 not (H200; aligned rows
        gain from the pipeline; 2-byte pieces are not copied asynchronously at all). A constexpr
        expression of the alignments: one compiled variant per alignment class, as for the loads."""
        pieces = []
        for position, dim in self._strides:
            if position >= len(self.inputs):
                continue
            tv = self.inputs[position]
            dims = tv.get_logical_domain(no_reductions=True)
            layout = self.layouts.get(tv.name) or Layout.strided(len(dims))
            live = [d for d in layout.perm if not dims[d].is_broadcast()]
            if not live or dim == live[-1]:
                continue  # the innermost stride: contiguous elements (1 at launch), not a row
            align = alignment_param(self._stride_names[(position, dim)])
            size = tv.dtype.torch_dtype.itemsize
            if size < 4:  # 1 when the row stride is 4 / size elements aligned
                pieces.append(f"({align} // {4 // size}) * ({4 // size} // {align})")
            elif size == 4:
                pieces.append(f"(1 // {align})")
        if not pieces:
            return str(self.loop_stages)
        any_four = "(1 - " + " * ".join(f"(1 - {p})" for p in dict.fromkeys(pieces)) + ")"
        return f"({self.loop_stages} - {self.loop_stages - 1} * {any_four})"

    def _indexed_here(self, tv: TensorView) -> bool:
        """Whether every iterating loop ID of ``tv`` has a loop index in the current scope."""
        taken: dict[int, int] = {}
        return all(i.is_reduction() or i.is_broadcast() or self.index_of_loop_id(i, taken) is not None
                   for i in tv.get_loop_domain())

    def store_computed_outputs(self) -> None:
        """Store the outputs already computed at this loop point (an output read by a reduction, in
        that reduction's loop: a value written once, where it is computed, not recomputed later)."""
        for position, tv in enumerate(self.outputs, start=len(self.inputs)):
            if id(tv) in self._stored or isinstance(tv.definition, ReductionOp | VarMeanOp) or tv in self.inputs:
                continue
            taken: dict[int, int] = {}
            if not all(i.is_broadcast() or self.index_of_loop_id(i, taken) is not None for i in tv.get_loop_domain()):
                continue
            indices = self.walk_back(tv)
            key = (tv.name, *(indices.of.get(id(i), "0") for i in tv.get_logical_domain()
                              if not i.is_broadcast() and not i.is_reduction()))
            value = self.code.recall(key)
            if value is not None:
                self._emit_store(tv, position, indices, value)

    def open_loops_for(self, tv: TensorView, reduction: bool | None = None) -> int:
        """Open a loop for each serial loop ID of ``tv`` the nest has no index for in this scope (a
        later pass over a reduced axis, a chunk loop); returns how many were opened.

        ``reduction`` None: every such ID; False: iteration IDs only; True: reduction IDs only, and
        each serial one gets a loop of its own even where a loop over its class encloses it (a
        reduction iterates its whole axis, never the chunk an enclosing pass is at).
        """
        opened = 0
        taken: dict[int, int] = {}
        reduces = isinstance(tv.definition, ReductionOp | VarMeanOp)
        for pos, i in enumerate(tv.get_loop_domain()):
            if i.is_broadcast() or (reduction is not None and i.is_reduction() != reduction):
                continue
            if i.is_reduction() and not reduces:  # a reduction ID kept by a copy: nothing to iterate
                continue
            own_loop = reduction and i.parallel_type is ParallelType.serial
            if not own_loop and self.index_of_loop_id(i, taken) is not None:
                continue
            if i.parallel_type is not ParallelType.serial:
                raise KernelError(f"{tv.short_name} axis {pos} ({i}) is parallelized on {i.parallel_type.name} but "
                                  f"the kernel's reference {self.reference.short_name} has no such loop")
            index = self.code.fresh("i")
            self.code.open(f"for {index} in {self._loop(int_expr(self.extent(i)))}:")
            self.code.bind_loop(id(i), self.exact.class_of(i), index)
            opened += 1
        return opened

    # --- one pass over a reduction's loops for everything that can share it ---------------------------
    def _serial_reduction_classes(self, tv: TensorView) -> list[int]:
        return [self.exact.class_of(i) for i in tv.get_loop_domain()
                if i.is_reduction() and i.parallel_type is ParallelType.serial]

    def _reductions_feeding(self, val: Val) -> list[ReductionOp | VarMeanOp]:
        """The kernel's reductions whose results ``val`` is computed from (its own definition too)."""
        found: dict[int, ReductionOp | VarMeanOp] = {}
        seen: set[int] = set()
        stack = [val]
        while stack:
            v = stack.pop()
            if id(v) in seen or v in self.inputs or v.definition is None:
                continue
            seen.add(id(v))
            if isinstance(v.definition, ReductionOp | VarMeanOp):
                found[id(v.definition)] = v.definition
            stack.extend(v.definition.inputs)
        return list(found.values())

    def _outside_the_pass(self, val: Val, group: list[ReductionOp | VarMeanOp], classes: set[int]) -> bool:
        """Whether ``val`` can be computed inside a pass of ``group``'s loops (of ID classes ``classes``):
        it reads no reduction of the group and none that iterates those loops itself."""
        members = {id(e) for e in group}
        return all(id(r) not in members and not classes & set(self._serial_reduction_classes(r.output))
                   for r in self._reductions_feeding(val))

    def sibling_reductions(self, expr: ReductionOp | VarMeanOp) -> list[ReductionOp | VarMeanOp]:
        """Reductions that can accumulate in ``expr``'s serial loops: the same serial reduction loops,
        their iteration indices already here, and a producer that reads none of the group."""
        leader = expr.outputs[0]
        assert isinstance(leader, TensorView)
        classes = sorted(self._serial_reduction_classes(leader))
        if not classes:
            return []
        group: list[ReductionOp | VarMeanOp] = [expr]
        for e in self.exprs:
            if e is expr or not isinstance(e, ReductionOp | VarMeanOp):
                continue
            out = e.outputs[0]
            assert isinstance(out, TensorView)
            if sorted(self._serial_reduction_classes(out)) != classes or not self._indexed_here(out):
                continue
            if self._outside_the_pass(e.inputs[0], group, set(classes)):
                group.append(e)
        return group[1:]

    def online_sums(self, group: list[ReductionOp | VarMeanOp]) -> list[tuple[ReductionOp, ReductionOp]]:
        """Sums the schedule accumulates in the pass of their max (``ReductionOp.online_max``), that max
        in ``group`` and iterating its serial reduction loops, each with that max: each lane's sum is
        kept relative to the lane's running max (an online softmax), so the row is read once for
        both."""
        leader = group[0].outputs[0]
        assert isinstance(leader, TensorView)
        classes = sorted(self._serial_reduction_classes(leader))
        members = {id(e) for e in group}
        found: list[tuple[ReductionOp, ReductionOp]] = []
        if not classes:
            return found
        for e in self.exprs:
            if not isinstance(e, ReductionOp) or id(e) in members:
                continue
            shift = e.online_max
            if shift is None or id(shift) not in members:
                continue
            if sorted(self._serial_reduction_classes(e.output)) == classes and self._indexed_here(e.output):
                found.append((e, shift))
        return found

    def share_reduction_loops(self, leader: TensorView, others: list[TensorView]) -> None:
        """Bind the serial reduction loop IDs of ``others`` to the loops just opened for ``leader``'s."""
        opened: dict[int, list[str]] = {}
        for i in leader.get_loop_domain():
            if i.is_reduction() and i.parallel_type is ParallelType.serial:
                index = self.code.loop_index(id(i))
                assert index is not None  # opened by open_loops_for
                opened.setdefault(self.exact.class_of(i), []).append(index)
        for tv in others:
            taken: dict[int, int] = {}
            for i in tv.get_loop_domain():
                if i.is_reduction() and i.parallel_type is ParallelType.serial:
                    root = self.exact.class_of(i)
                    k = taken[root] = taken.get(root, -1) + 1
                    self.code.alias_loop(id(i), opened[root][k])

    def outputs_of_the_pass(self, leader: TensorView,
                            group: list[ReductionOp | VarMeanOp]) -> list[tuple[int, TensorView]]:
        """Outputs that would need a pass of their own over ``leader``'s serial reduction loops and
        can be computed in the reduction's pass instead (they read none of its results)."""
        classes = set(self._serial_reduction_classes(leader))
        found = []
        for position, tv in enumerate(self.outputs, start=len(self.inputs)):
            if id(tv) in self._stored or tv in self.inputs or isinstance(tv.definition, ReductionOp | VarMeanOp):
                continue
            iterated = {self.exact.class_of(i) for i in tv.get_loop_domain() if not i.is_reduction() and not i.is_broadcast()}
            if iterated & classes and self._indexed_here(tv) and self._outside_the_pass(tv, group, classes):
                found.append((position, tv))
        return found

    def _store(self, tv: TensorView, position: int) -> None:
        code = self.code
        reduced = isinstance(tv.definition, ReductionOp | VarMeanOp)
        opened = self.open_loops_for(tv, reduction=False if reduced else None)
        indices = self.walk_back(tv, partial=isinstance(tv.definition, ReductionOp | VarMeanOp))
        branched = code.branch(code.uniform())  # reads of a row past the end are skipped too
        self._emit_store(tv, position, indices, self.value(tv, indices))
        if branched:
            code.close()
        for _ in range(opened):
            code.close()

    def _emit_store(self, tv: TensorView, position: int, indices: Indices, value: str) -> None:
        code = self.code
        branched = code.branch(code.uniform())  # the same for the whole tile: a branch, not a mask
        offset, dims = self.offset(tv, position, indices)
        # A value that varies along tile axes the address does not (an output broadcast along them)
        # is stored from every lane of those axes to the one address: the pointer spans them too,
        # and the mask keeps lanes past the extent from writing, except the first lane of each, so
        # the value is stored even when those axes are empty (a var_mean of no elements, NaN). The
        # extent's conditions are those the value is computed under (the address has no index of
        # those axes): a lane past it holds a masked load's zero.
        mask = code.mask(dims, uses=offset)
        extra = sorted(code.dims_of(value) - dims)
        if extra:
            offset += "".join(f" + 0 * {self._tile_index[a]}" for a in extra)
            spanned = code.mask(dims | frozenset(extra), uses=f"{offset} {value}")
            if spanned and spanned != mask:
                first = " & ".join(f"({self._tile_index[a]} == 0)" for a in extra)
                mask = code.assign("mask", f"{spanned} | ({mask + ' & ' if mask else ''}{first})", dims | frozenset(extra))
        code.emit(f"tl.store(T{position} + {offset}, {self.store_value(value, tv)}{', mask=' + mask if mask else ''})")
        if branched:
            code.close()
        self._stored.add(id(tv))

    def _nonempty_checks(self) -> tuple[tuple[SymExpr, str], ...]:
        """The reduced axes of each max / min, which must not be empty at launch: ATen raises for
        those (no identity is the result), so a kernel must not return its accumulator's -inf.
        A reduced ID at position k of the output's root (or logical) domain is axis k of its input."""
        checks = []
        for expr in self.exprs:
            if not isinstance(expr, ReductionOp) or not expr.kind.spec.needs_elements:
                continue
            out, producer = expr.output, expr.inputs[0]
            assert isinstance(out, TensorView) and isinstance(producer, TensorView)
            dims = producer.get_logical_domain(no_reductions=True)
            for k, i in enumerate(out.domain().root or out.get_logical_domain()):
                if i.is_reduction() and k < len(dims) and not dims[k].is_broadcast():
                    name = expr.kind.name
                    checks.append((self.extent(dims[k]), f"{name}: {describe_axis(producer, k)} has size 0; the "
                                                         f"{name} of an empty axis is undefined"))
        return tuple(checks)

    def _pad_checks(self) -> tuple[tuple[SymExpr, str], ...]:
        """Each padded axis of a pad, which its negative widths must not crop by more than it has (ATen
        raises, even where the padding after the crop would leave a size of 0 or more)."""
        checks = []
        for expr in self.exprs:
            if not isinstance(expr, PadOp):
                continue
            out, producer = expr.outputs[0], expr.inputs[0]
            assert isinstance(out, TensorView) and isinstance(producer, TensorView)
            in_ids = producer.get_logical_domain(no_reductions=True)
            for axis in resized_axes(expr, 0):
                left, right = expr.axis_widths(axis.dim)
                what = f"pad {out.short_name} (of {producer.short_name}): {describe_axis(producer, axis.dim)}"
                if left.value is not None and right.value is not None:
                    crop = -min(left.value, 0) - min(right.value, 0)
                    if crop:
                        checks.append((self.extent(in_ids[axis.dim]) - SymConst(crop),
                                       f"{what} is cropped by {crop} (widths {left.value}, {right.value}), more "
                                       "than its size ({} left)"))
                else:  # symbolic widths (evaluated by the launch): what is left after the negative ones crop
                    lw, rw = (w if w.value is not None else SymVar(self.size_argument(w)) for w in (left, right))
                    checks.append((self.extent(in_ids[axis.dim]) + sym_min(lw, 0) + sym_min(rw, 0),
                                   f"{what} is cropped by widths {left}, {right}, more than its size ({{}} left)"))
        return tuple(checks)

    def _gather_checks(self) -> tuple[tuple[SymExpr, str], ...]:
        """Each axis of a gather's index other than ``dim``, which must not be longer than the lookup
        tensor's (ATen's shape rule; the kernel reads the lookup tensor at the index's positions there):
        the lookup's extent less the index's, which must not be negative."""
        checks = []
        for expr in self.exprs:
            if not isinstance(expr, IndexedRead) or expr.lookup_exact:
                continue
            lookup_ids = expr.lookup.get_logical_domain(no_reductions=True)
            out_ids = expr.output.get_logical_domain(no_reductions=True)
            for a, o in expr.lookup_axes():
                have = SymConst(1) if lookup_ids[a].is_broadcast() else self.size_symbol(lookup_ids[a])
                checks.append((have - self.extent(out_ids[o]),
                               f"{expr.op_name}: index {expr.lookup_index.short_name} axis {o} is longer than "
                               f"{expr.lookup.short_name} axis {a} (its size less the index's is {{}}); off dim "
                               f"{expr.dim} the index must be at most as long"))
        return tuple(checks)

    def _source(self, loops: list[Loop]) -> KernelSource:
        nonempty = self._nonempty_checks()  # first: they may add size arguments
        mapped = () if self.chunked else self._mapped_extent_checks()
        nonnegative = self._pad_checks() + self._gather_checks()
        output_shapes = tuple(tuple(SymConst(1) if i.is_broadcast() else self.extent(i)
                                    for i in tv.get_logical_domain(no_reductions=True)) for tv in self.outputs)
        tensors = [tensor_param(k) for k in range(len(self.inputs) + len(self.outputs))]
        strides = [self._stride_names[key] for key in self._strides]
        sizes = [s.symbol for s in self._sizes]
        all_inputs = self.fusion.inputs()
        scalar_symbols = list(self._scalars)
        scalar_positions = tuple(all_inputs.index(self._scalars[sym][2]) for sym in scalar_symbols)
        tile_params = [f"{param}: tl.constexpr" for param, *_ in self._dynamic_tiles]
        integers = [*strides, *sizes]
        divisors = self._divisors()
        multipliers = [name for name, _ in divisors]
        params = ", ".join([*tensors, *integers, *multipliers, *(self._scalars[sym][0] for sym in scalar_symbols),
                            *tile_params, *(f"{alignment_param(n)}: tl.constexpr" for n in integers)])
        aligned = [f"    {n} = _aligned({n}, {alignment_param(n)})" for n in integers]
        # A bool arrives as an int (``KernelSource.bool_scalars``): a comparison.
        typed = [f"    s_{sym} = {arg} != 0" if dtype is DataType.Bool else
                 f"    s_{sym} = tl.full([], {arg}, {triton_dtype(dtype)})" for sym, (arg, dtype, _) in self._scalars.items()]
        body = "\n".join([*aligned, *typed, *self._full_tiles_apart(loops)]) or "    pass"
        if self.loop_stages > 1:
            body = body.replace(f"num_stages={_STAGES}", f"num_stages={self._pipeline_stages()}")
        source = f"{prelude(self.target)}\n\n@_jit\ndef {self.name}({params}):\n{body}\n"
        grid = tuple(next((loop.extent for loop in loops if loop.kind == "grid" and loop.index == f"pid{a}"),
                          SymConst(1)) for a in range(3))
        used = max((a + 1 for a in range(3) if any(loop.index == f"pid{a}" for loop in loops)), default=1)
        tensor_positions = tuple(all_inputs.index(tv) for tv in self.inputs)
        perms = tuple(self.layouts[tv.name].perm if tv.name in self.layouts else tuple(range(tv.ndim))
                      for tv in self.outputs)
        return KernelSource(
            self.name, source, tensor_positions, scalar_positions, tuple(self._strides), tuple(self._sizes),
            grid[:used], self._size_checks(), () if self.chunked else self._constant_checks(), output_shapes, perms,
            tuple(tv.dtype for tv in self.outputs), tuple(tv.short_name for tv in (*self.inputs, *self.outputs)),
            tuple(self._divisibility), tuple(self._dynamic_tiles), self._extent_checks() if self.chunked else (),
            nonempty, nonnegative_checks=nonnegative, mapped_extent_checks=mapped,
            stride_fallbacks=tuple((k, d, outer) for (k, d), outer in self._group_strides.items()),
            bool_scalars=tuple(k for k, sym in enumerate(scalar_symbols) if self._scalars[sym][1] is DataType.Bool),
            cpu_scalars=tuple(k for k, sym in enumerate(scalar_symbols) if isinstance(self._scalars[sym][2], TensorView)),
            device_asserts=self.device_asserts, divisors=divisors)

    def _full_tiles_apart(self, loops: list[Loop]) -> list[str]:
        """The body's lines; for a kernel over a flat index split into one tile per program (the
        pointwise schedule's, ``pid * B + arange(B)``), the body twice: programs whose tile lies wholly
        inside the extent run it with the bound known true, the last one with its mask. Triton widens
        a masked access to 16 bytes only where it can prove the mask constant over each group, which
        it cannot when the extent is not a multiple of 16 in its specializations (an odd element
        count, or sizes none of which is a multiple of 16): every access is then an element wide,
        2-3.5x slower for a bf16 activation on an H200 (``benchmarks/results/kernels_notes.md``)."""
        lines = self.code.lines
        grids = [loop for loop in loops if loop.kind == "grid"]
        tiles = [loop for loop in loops if loop.kind == "tile" and loop.tile_size]
        if len(loops) != 2 or len(grids) != 1 or len(tiles) != 1 or not self._split_bounds:
            return lines
        pid, tile, size = grids[0].index, tiles[0].index, tiles[0].tile_size
        conditions = {c for c, _ in self.code.conditions()}
        bounds = {b[0]: b for b in self._split_bounds if b[0] in conditions}
        if not bounds or set(bounds) != conditions or any((outer, stride, inner) != (pid, str(size), tile)
                                            for _, outer, stride, inner, _ in bounds.values()):
            return lines
        full = " & ".join(f"({pid} * {size} + {size} <= {extent})" for *_, extent in bounds.values())
        unmasked = []
        for line in lines:
            for condition in bounds:
                line = line.replace(condition, f"tl.full([{size}], 1, tl.int1)")
            unmasked.append(line)
        first = next((k for k, line in enumerate(lines) if line.strip().startswith(f"{pid} = ")), None)
        if first is None:
            return lines
        return [*lines[:first + 1], f"    if {full}:", *("    " + line for line in unmasked[first + 1:]),
                "    else:", *("    " + line for line in lines[first + 1:])]

    def _constant_checks(self) -> tuple[tuple[int, int, int], ...]:
        """Input dims of symbolic extent in a class of constant extent (``expand(x, [6, 4])`` of an
        ``x`` declared ``[-1, 1]``), compared with the constant at launch."""
        checks = []
        for k, tv in enumerate(self.inputs):
            for d, i in enumerate(tv.get_logical_domain(no_reductions=True)):
                if i.is_broadcast() or i.extent.value is not None:
                    continue
                constant = next((m.extent.value for m in self.exact.members(i)
                                 if not m.is_broadcast() and m.extent.value is not None), None)
                if constant is not None:
                    checks.append((k, d, constant))
        return tuple(checks)

    def _extent_checks(self) -> tuple[tuple[SymExpr, int, str], ...]:
        """The constant checks of a chunked kernel, on the whole tensors' bound extents."""
        checks = []
        for tv in self.inputs:
            for d, i in enumerate(tv.get_logical_domain(no_reductions=True)):
                if i.is_broadcast() or i.extent.value is not None:
                    continue
                constant = next((m.extent.value for m in self.exact.members(i)
                                 if not m.is_broadcast() and m.extent.value is not None), None)
                if constant is not None:
                    checks.append((i.extent, constant, f"{tv.short_name} axis {d} has size {{}}, but the fusion takes "
                                                       f"it as {constant} (an expand or an operand of static size "
                                                       f"{constant})"))
        return tuple(checks)

    def _mapped_extent_checks(self) -> tuple[tuple[SymExpr, SymExpr, str], ...]:
        """Computed extents (a slice's, a pad's, a cat's: expressions, not an input's size) that the
        kernel iterates as one loop with other axes, to compare with the loop's extent at launch:
        where they differ (a slice of one element beside an axis of three), the loop would index
        past the smaller one and give the output the wrong shape. Input sizes are compared by
        ``_size_checks`` and ``_constant_checks``; an input scalar's symbol (``full([n, 4])``) is
        compared here like an expression."""
        checks = []
        seen: set[tuple[int, str]] = set()
        input_sizes = {str(i.extent) for tv in self.inputs for i in tv.get_logical_domain(no_reductions=True)
                       if isinstance(i.extent, SymVar)}
        for tv in self.tensors:
            for d, i in enumerate(tv.get_logical_domain(no_reductions=True)):
                if i.is_broadcast() or i.extent.value is not None or str(i.extent) in input_sizes:
                    continue
                key = (self.exact.class_of(i), str(i.extent))
                if key in seen:
                    continue
                seen.add(key)
                loop = self.size_symbol(i)
                source = next((src.extent for src in self._sizes if src.symbol == str(loop)), None)
                if loop.value is None and source is not None and str(source) == str(i.extent):
                    continue  # the loop's size is this very extent
                checks.append((i.extent, loop, f"{describe_axis(tv, d)} has size {{}}, but the kernel iterates it "
                                               "with the axes it maps to, of size {}; they must be equal (declare an "
                                               "axis with size 1 to broadcast it)"))
        return tuple(checks)

    def _size_checks(self) -> tuple[tuple[int, int, int, int], ...]:
        """Input dims the kernel assumes equal (one size class), to compare at launch."""
        first: dict[int, tuple[int, int]] = {}
        checks = []
        for k, tv in enumerate(self.inputs):
            for d, i in enumerate(tv.get_logical_domain(no_reductions=True)):
                if i.is_broadcast() or i.extent.value is not None:
                    continue
                root = self.exact.class_of(i)
                if root in first:
                    checks.append((*first[root], k, d))
                else:
                    first[root] = (k, d)
        return tuple(checks)

