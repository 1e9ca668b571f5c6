"""One region of an ATen graph (a convex set of FX nodes the partitioner grouped) -> a FusionDefinition.

Inputs come from the traced example values: a tensor is declared with its dtype, its static sizes,
``-1`` for each size dynamo made symbolic (so a new size binds, it does not recompile) and, when it
is dense, its contiguity and stride order (``from_pytorch``'s descriptor). A symbolic size passed as
a number (a SymInt placeholder) becomes ``fd.ops.size`` of a tensor input that has that symbol as
an axis, else an integer scalar input; SymFloat / SymBool inputs are scalar inputs. Each output is
required in the layout its example value has, so a later region or eager op sees the strides it
was traced with (torch's meta functions', or, for a value only regions read, the layout the
partitioner chose for them: ``boundary_layouts``).

A one-element constant of the graph (a ``get_attr``: ``constant_folding``) is a literal of the
kernels. Every translated value is checked against the node's traced value (dtype, rank, static sizes); a
node that fails to translate raises ``TranslationError`` naming it, and the partitioner leaves it
in eager.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx import Node
from torch.fx.node import map_aggregate

from pyfuser.frontend.fusion_definition import FusionDefinition
from pyfuser.integrations.torch_compile.constant_folding import constant_value
from pyfuser.integrations.torch_compile.eager_methods import METHODS
from pyfuser.integrations.torch_compile.lowering import LoweringContext, OpClass, is_tensor_meta, meta_of
from pyfuser.integrations.torch_compile.support import LOWERINGS, op_class, op_name
from pyfuser.ir.base import Scalar
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.layout import is_dense, tensor_descriptor
from pyfuser.ir.tensor_view import TensorView

#: ``node.meta`` key of a value the partitioner chose to have written row-major (``boundary_layouts``):
#: its region requires that order of the output even where the inferred one would differ
ROW_MAJOR_OUTPUT = "pyfuser_row_major_output"


class TranslationError(ValueError):
    """A node pyfuser could not translate; it is left in eager and the graph partitioned again."""

    def __init__(self, node: Node, reason: str) -> None:
        self.node = node
        self.reason = reason
        super().__init__(f"FX node {node.name} ({op_name(node) if node.op == 'call_function' else node.op}): {reason}")


@dataclass
class TranslatedRegion:
    fd: FusionDefinition
    #: the values the region is called with (FX nodes outside it), in call order
    inputs: list[Node]
    #: for each fusion input, in definition order, its position among ``inputs``
    fusion_inputs: list[int]
    #: the region's nodes used outside it, in order; the region returns their values
    outputs: list[Node]
    #: for each of ``outputs``, its position among the fusion's outputs
    output_slots: list[int]
    device: torch.device
    #: ``T3`` -> ``mul_1 (aten.mul.Tensor)``: what each tensor of the fusion is in the FX graph
    names: dict[str, str] = field(default_factory=dict)
    #: the region's views of values it returns, used outside it: taken there, in eager, from the
    #: returned values (see ``rederived_views``), in graph order
    rederived: list[Node] = field(default_factory=list)


def _hint(size: Any) -> int | None:
    """A size's value in the traced example (None for a data-dependent size without one)."""
    if isinstance(size, int):
        return size
    hint = size.node.hint
    return int(hint) if hint is not None else None


def size_hints(sizes: Sequence[Any]) -> list[int] | None:
    """Sizes (or strides) as ints, from their traced hints (None where one has none)."""
    values = [_hint(s) for s in sizes]
    known = [v for v in values if v is not None]
    return known if len(known) == len(values) else None


def region_device(inputs: Sequence[Node], nodes: Sequence[Node]) -> torch.device:
    """The device a region computes on: that of its first tensor that is not a 0-dim CPU scalar."""
    cpu_scalar = None
    for n in (*inputs, *nodes):
        for t in _flat_tensors(meta_of(n)):
            if t.device.type == "cpu" and t.dim() == 0:
                cpu_scalar = t.device
                continue
            return t.device
    return cpu_scalar or torch.device("cpu")


def _flat_tensors(value: Any) -> list[torch.Tensor]:
    if is_tensor_meta(value):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flat_tensors(v)]
    return []


class RegionTranslator:
    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = list(nodes)
        members = set(self.nodes)
        inputs: dict[Node, None] = {}
        for n in self.nodes:
            for a in n.all_input_nodes:
                if a not in members:
                    inputs.setdefault(a, None)
        self.inputs = list(inputs)
        used_outside = [n for n in self.nodes if any(u not in members for u in n.users)]
        self.rederived = rederived_views(used_outside, members)
        taken_outside = set(self.rederived)
        self.outputs = [n for n in used_outside if n not in taken_outside]
        self.device = region_device(self.inputs, self.nodes)
        self.fd = FusionDefinition()
        self.env: dict[Node, Any] = {}
        self.names: dict[str, str] = {}

    def translate(self) -> TranslatedRegion:
        try:
            fusion_inputs = self._define_inputs()
        except TranslationError:
            raise
        except Exception as e:  # an input pyfuser cannot declare: the first node reading it stays eager
            raise TranslationError(self.nodes[0], f"declaring the region's inputs: {type(e).__name__}: {e}") from e
        for node in self.nodes:
            self.env[node] = self._translate_node(node)
        slots = self._add_outputs()
        return TranslatedRegion(self.fd, self.inputs, fusion_inputs, self.outputs, slots, self.device, self.names,
                                self.rederived)

    # --- inputs ----------------------------------------------------------------------------------------
    def _define_inputs(self) -> list[int]:
        order: list[int] = []
        symbols: dict[sympy.Symbol, tuple[TensorView, int]] = {}
        for k, node in enumerate(self.inputs):  # tensors first: symbolic scalars may be their sizes
            meta = meta_of(node)
            literal = self._literal(node)
            if literal is not None:
                self.env[node] = literal
                self.names[literal.short_name] = f"{node.name} (constant)"
                continue
            if is_tensor_meta(meta):
                tv = self._define_tensor(node, meta)
                self.env[node] = tv
                self.names[tv.short_name] = f"{node.name} (input)"
                order.append(k)
                for d, size in enumerate(meta.shape):
                    if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                        symbols.setdefault(size.node.expr, (tv, d))
        for k, node in enumerate(self.inputs):
            meta = meta_of(node)
            if is_tensor_meta(meta):
                continue
            if isinstance(meta, torch.SymInt) and meta.node.expr in symbols:
                tv, d = symbols[meta.node.expr]
                self.env[node] = self.fd.ops.size(tv, d)
                continue
            dtype = _scalar_dtype(meta)
            if dtype is None:
                user = next(u for u in node.users if u in set(self.nodes))
                raise TranslationError(user, f"input {node.name} is a {type(meta).__name__}, not a tensor or number")
            self.env[node] = self.fd.define_scalar(None, dtype)
            order.append(k)
        return order

    def _literal(self, node: Node) -> TensorView | None:
        """A one-element constant of the graph (``constant_folding``) as a value of the kernels, not an
        input read on every call (None for any other input)."""
        value = constant_value(node)
        if value is None or value.numel() != 1 or value.is_complex():
            return None
        with unset_fake_temporarily():  # (the partitioner translates under AOTAutograd's fake mode)
            number = value.item()
        return self.fd.ops.full(list(value.shape), number, DataType.from_torch(value.dtype))

    def _define_tensor(self, node: Node, meta: torch.Tensor) -> TensorView:
        if meta.device != self.device and not (meta.device.type == "cpu" and meta.dim() == 0):
            user = next(u for u in node.users if u in set(self.nodes))
            raise TranslationError(user, f"input {node.name} is on {meta.device} but the region computes on "
                                         f"{self.device}")
        sizes, strides = size_hints(meta.shape), size_hints(meta.stride())
        shape = [s if isinstance(s, int) else -1 for s in meta.shape]
        dtype = DataType.from_torch(meta.dtype)
        is_cpu = meta.device.type == "cpu" and meta.dim() == 0 and self.device.type != "cpu"
        if is_cpu:
            return self.fd.define_tensor([], dtype=dtype, is_cpu=True)
        if sizes is not None and strides is not None and is_dense(sizes, strides):
            contiguity, order = tensor_descriptor(sizes, strides)
            row_major = order == sorted(order, reverse=True)
            return self.fd.define_tensor(shape, contiguity, dtype, stride_order=None if row_major else order)
        # A view (expanded, sliced, overlapping): promise nothing about its strides.
        return self.fd.define_tensor(shape, [None if s == 1 else False for s in shape], dtype)

    # --- nodes -----------------------------------------------------------------------------------------
    def _translate_node(self, node: Node) -> Any:
        meta = node.meta.get("val")
        for t in _flat_tensors(meta):
            if t.device != self.device:
                raise TranslationError(node, f"produces a tensor on {t.device} in a region on {self.device}")
        if node.target is operator.getitem:
            source, index = node.args
            if not isinstance(source, Node):  # FX's getitem reads a node's result: nothing else to translate
                raise TranslationError(node, f"takes an item of {type(source).__name__}, not of a node's result")
            return self.env[source][index]
        lowering = LOWERINGS[node.target]
        args = map_aggregate(node.args, self._value)
        kwargs = map_aggregate(dict(node.kwargs), self._value)
        try:
            result = lowering.translate(LoweringContext(self.fd, node, self.env), *args, **kwargs)
        except TranslationError:
            raise
        except Exception as e:  # whatever a lowering did not foresee leaves the node in eager
            raise TranslationError(node, f"{type(e).__name__}: {e}") from e
        _check_result(node, result, meta)
        for tv in _flat_views(result):
            self.names.setdefault(tv.short_name, f"{node.name} ({op_name(node)})")
        return result

    def _value(self, a: Any) -> Any:
        return self.env[a] if isinstance(a, Node) else a

    # --- outputs ---------------------------------------------------------------------------------------
    def _add_outputs(self) -> list[int]:
        """Each output node's position among the fusion's outputs. Nodes of one value share a position
        where the graph has them share memory (one is a view, ``alias`` or ``detach`` of the other); a
        copy that the region computes as the value it copies (a ``clone``) gets a ``set`` of its own, so
        a write through one result is not seen through the other."""
        slots: list[int] = []
        added: dict[int, tuple[int, Node]] = {}
        count = 0
        inputs = {id(v) for v in self.fd.fusion.inputs()}
        for node in self.outputs:
            value = self.env[node]
            if not isinstance(value, TensorView):
                raise TranslationError(node, f"its value leaves the region as a {type(value).__name__}, not a tensor")
            shared = added.get(id(value))
            if shared is not None and OpClass.view in (op_class(node), op_class(shared[1])):
                slots.append(shared[0])
                continue
            tv = self.fd.ops.set(value) if id(value) in inputs or shared is not None else value
            meta = node.meta["val"]
            order = _required_order(meta)
            if order is None and node.meta.get(ROW_MAJOR_OUTPUT):
                order = list(range(meta.dim() - 1, -1, -1))
            self.fd.add_output(tv, stride_order=order)
            added.setdefault(id(value), (count, node))
            slots.append(count)
            count += 1
        return slots


#: Views whose eager call returns a view of its input (never a copy), taken again outside a region.
_VIEWS = frozenset((*METHODS, torch.ops.aten._unsafe_view.default))


def rederived_views(used_outside: Sequence[Node], members: set[Node]) -> list[Node]:
    """Of the region's nodes used outside it, the views of another such node (one it returns, or
    another of these): the graph has them share memory with what they view, and a program's outputs
    each own their memory, so returned from the region one would be copied on every call (with a check
    of every input's storage); taken outside, in eager, from the returned value, each is one view, as
    in the graph."""
    exported: set[Node] = set()
    views: list[Node] = []
    for node in used_outside:  # graph order: what a view reads is decided before it
        base = node.args[0] if node.args else None
        others = [a for a in node.all_input_nodes if a is not base]
        if (node.op == "call_function" and node.target in _VIEWS and isinstance(base, Node) and base in exported
                and not any(a in members for a in others)):
            views.append(node)
        exported.add(node)
    return views


def _required_order(meta: torch.Tensor) -> list[int] | None:
    """The stride order torch's meta function gives a dense output (None: row-major or not dense)."""
    sizes, strides = size_hints(meta.shape), size_hints(meta.stride())
    if meta.dim() < 2 or sizes is None or strides is None or not is_dense(sizes, strides):
        return None
    return tensor_descriptor(sizes, strides)[1]


def _scalar_dtype(meta: Any) -> DataType | None:
    if isinstance(meta, (torch.SymBool, bool)):
        return DataType.Bool
    if isinstance(meta, (torch.SymInt, int)):
        return DataType.Int
    if isinstance(meta, (torch.SymFloat, float)):
        return DataType.Double
    return None


def _flat_views(value: Any) -> list[TensorView]:
    if isinstance(value, TensorView):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for x in value for v in _flat_views(x)]
    return []


def _check_result(node: Node, value: Any, meta: Any) -> None:
    """A translation must produce what torch traced: same dtype, rank and static sizes."""
    if is_tensor_meta(meta):
        if not isinstance(value, TensorView):
            kind = "a scalar" if isinstance(value, Scalar) else type(value).__name__
            raise TranslationError(node, f"translated to {kind}, but torch returns a tensor")
        if value.dtype.torch_dtype != meta.dtype:
            raise TranslationError(node, f"translated to dtype {value.dtype.torch_dtype}, but torch computes "
                                         f"{meta.dtype}")
        extents = value.get_logical_domain(no_reductions=True)
        if len(extents) != meta.dim():
            raise TranslationError(node, f"translated to rank {len(extents)}, but torch returns rank {meta.dim()}")
        for d, (i, size) in enumerate(zip(extents, meta.shape, strict=True)):
            if isinstance(size, int) and i.extent.is_const and i.extent.value != size:
                raise TranslationError(node, f"axis {d} translated to extent {i.extent.value}, but torch's is {size}")
    elif isinstance(meta, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(meta):
            raise TranslationError(node, f"translated to {value!r}, but torch returns {len(meta)} values")
        for v, m in zip(value, meta, strict=True):
            _check_result(node, v, m)
