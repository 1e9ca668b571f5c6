"""Copying a whole fusion graph without recursion.

``copy.deepcopy`` recurses along definition / use chains, so a fusion of a few hundred exprs
overflows Python's stack. The compiler copies every fusion it compiles (passes rewrite the copy,
the user's definition stays as written), so the copy is done in two flat phases instead:
discover every IR node and make an empty instance of each, then fill in their attributes with
references remapped to the new instances. Anything that is not an IR node (ints, strings,
enums, symbolic extents, dtypes, functions, device meshes) is immutable and shared.

Copies are a large part of compiling a model (every segment's fusion is one), so what a value is
(an IR node, a container, anything else) is decided once per type, and each node's attributes are
read once.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import Any

_LEAF, _NODE, _LIST, _TUPLE, _DICT, _SET, _GATED = range(7)


class _Kinds(dict[type, int]):
    """What each type's values are to the copy (``kinds[type(value)]``), by ``issubclass`` once per type:
    the node types are abstract classes, and an ``isinstance`` against them is slow."""

    def __init__(self, node_types: tuple[type, ...], gated: type | None = None) -> None:
        super().__init__({int: _LEAF, float: _LEAF, str: _LEAF, bool: _LEAF, type(None): _LEAF})
        self.node_types = node_types
        self.gated = gated

    def __missing__(self, t: type) -> int:
        if self.gated is not None and issubclass(t, self.gated):
            kind = _GATED
        elif issubclass(t, self.node_types):
            kind = _NODE
        elif issubclass(t, dict):
            kind = _DICT
        elif issubclass(t, list):
            kind = _LIST
        elif issubclass(t, tuple):
            kind = _TUPLE
        elif issubclass(t, (set, frozenset)):
            kind = _SET
        else:
            kind = _LEAF
        self[t] = kind
        return kind


_SLOTS: dict[type, tuple[tuple[str, ...], bool]] = {}


def _layout(t: type) -> tuple[tuple[str, ...], bool]:
    """A type's slot names (every class of its MRO) and whether its instances have a ``__dict__``."""
    layout = _SLOTS.get(t)
    if layout is None:
        names: list[str] = []
        for cls in t.__mro__:
            slots = cls.__dict__.get("__slots__", ())
            names.extend([slots] if isinstance(slots, str) else slots)
        slots_only = tuple(n for n in names if n not in ("__dict__", "__weakref__"))
        layout = _SLOTS[t] = (slots_only, any("__dict__" in c.__dict__ for c in t.__mro__))
    return layout


def _attributes(obj: object) -> list[tuple[str, Any]]:
    slots, has_dict = _layout(type(obj))
    items: list[tuple[str, Any]] = []
    for name in slots:
        try:
            items.append((name, getattr(obj, name)))
        except AttributeError:  # a slot never assigned
            pass
    if has_dict:
        items.extend(vars(obj).items())
    return items


def _children(value: Any, kinds: _Kinds, out: list[Any], kept: AbstractSet[int]) -> bool:
    """Append the IR nodes found in ``value`` (looking inside plain containers), except gated ones
    not ``kept``; whether it holds any node (dropped ones included: they are removed from it)."""
    found = False
    stack = [value]
    while stack:
        v = stack.pop()
        kind = kinds[type(v)]
        if kind == _LEAF:
            continue
        if kind == _NODE:
            out.append(v)
            found = True
        elif kind == _GATED:
            if id(v) in kept:
                out.append(v)
            found = True
        elif kind == _DICT:
            stack.extend(v.keys())
            stack.extend(v.values())
        else:
            stack.extend(v)
    return found


_DROPPED = object()


def _remap(value: Any, kinds: _Kinds, memo: dict[int, Any]) -> Any:
    """``value`` with its nodes replaced by their copies; a node not copied (dropped) is left out of
    containers, and is ``_DROPPED`` itself."""
    kind = kinds[type(value)]
    if kind == _LEAF:
        return value
    if kind == _NODE or kind == _GATED:
        return memo.get(id(value), _DROPPED)
    if kind == _DICT:
        items = ((_remap(k, kinds, memo), _remap(v, kinds, memo)) for k, v in value.items())
        return {k: v for k, v in items if k is not _DROPPED and v is not _DROPPED}
    values = [v for v in (_remap(v, kinds, memo) for v in value) if v is not _DROPPED]
    if kind == _LIST:
        return values
    if kind == _TUPLE:
        return tuple(values)
    return type(value)(values)


def _scan(node: Any, kinds: _Kinds, memo: dict[int, Any], kept: AbstractSet[int],
          pending: list[Any]) -> list[tuple[str, Any, bool]]:
    """``node``'s attributes, each with whether it holds IR nodes (to remap); the nodes found that
    are neither copied yet nor dropped go on ``pending``. A plain value or a single node (most
    attributes) is decided without walking a container."""
    attributes: list[tuple[str, Any, bool]] = []
    for name, value in _attributes(node):
        kind = kinds[type(value)]
        if kind == _LEAF:
            attributes.append((name, value, False))
        elif kind == _NODE or kind == _GATED:
            key = id(value)
            if key not in memo and (kind == _NODE or key in kept):
                pending.append(value)
            attributes.append((name, value, True))
        else:
            found: list[Any] = []
            holds = _children(value, kinds, found, kept)
            pending.extend([f for f in found if id(f) not in memo])
            attributes.append((name, value, holds))
    return attributes


def clone_graph(root: Any, node_types: tuple[type, ...], memo: dict[int, Any] | None = None,
                gate: tuple[type, AbstractSet[int]] | None = None, also: Sequence[Any] = ()) -> Any:
    """A deep copy of every IR node (an instance of ``node_types``) reachable from ``root``; other
    values are shared. ``memo`` (``id(original) -> copy``) is filled for callers that need the map;
    a node already in it is taken as copied (its copy neither filled in nor followed: a caller that
    builds one node's copy itself keeps the copy from walking what that node holds).
    ``gate`` (a node type, ids) copies only the nodes of that type whose ids are given: the others
    are neither copied nor followed; a reference to one is left out of the container holding it,
    an attribute that is one becomes None (a segment's copy keeps its own exprs only: its inputs
    lose their definitions, its values the uses outside it, whatever value leads there); ``also``
    are nodes to copy beside ``root`` (a segment's values that only dropped nodes lead to)."""
    memo = {} if memo is None else memo
    kinds = _Kinds(node_types, gate[0] if gate is not None else None)
    kept: AbstractSet[int] = gate[1] if gate is not None else frozenset()
    #: each original node's copy with its attributes, and whether each holds IR nodes (to remap)
    filled: list[tuple[Any, list[tuple[str, Any, bool]]]] = []
    pending = [root, *also]
    new = object.__new__
    while pending:
        node = pending.pop()
        if id(node) in memo:
            continue
        copy = memo[id(node)] = new(type(node))
        filled.append((copy, _scan(node, kinds, memo, kept, pending)))
    setattr_ = object.__setattr__
    get = memo.get
    for copy, attributes in filled:
        for name, value, holds_nodes in attributes:
            if holds_nodes:
                value = get(id(value)) if kinds[type(value)] in (_NODE, _GATED) else _remap(value, kinds, memo)
                if value is None or value is _DROPPED:
                    value = None
            setattr_(copy, name, value)
    return memo[id(root)]
