"""Copying a whole fusion graph without recursion.

``copy.deepcopy`` recurses along definition / use chains, so a fusion of a few hundred exprs
overflows Python's stack. The compiler copies every fusion it compiles (passes rewrite the copy,
the user's definition stays as written), so the copy is done in two flat phases instead:
discover every IR node and make an empty instance of each, then fill in their attributes with
references remapped to the new instances. Anything that is not an IR node (ints, strings,
enums, symbolic extents, dtypes, functions, device meshes) is immutable and shared.
"""

from __future__ import annotations

from typing import Any

_CONTAINERS = (list, tuple, dict, set, frozenset)


def _attribute_names(obj: object) -> list[str]:
    names: list[str] = []
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        names.extend([slots] if isinstance(slots, str) else slots)
    names = [n for n in names if n not in ("__dict__", "__weakref__") and hasattr(obj, n)]
    if hasattr(obj, "__dict__"):
        names.extend(vars(obj))
    return names


def _children(value: Any, node_types: tuple[type, ...], out: list[Any]) -> None:
    """Append the IR nodes found in ``value`` (looking inside plain containers)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, node_types):
            out.append(v)
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, _CONTAINERS):
            stack.extend(v)


def _remap(value: Any, node_types: tuple[type, ...], memo: dict[int, Any]) -> Any:
    if isinstance(value, node_types):
        return memo[id(value)]
    if isinstance(value, list):
        return [_remap(v, node_types, memo) for v in value]
    if isinstance(value, tuple):
        return tuple(_remap(v, node_types, memo) for v in value)
    if isinstance(value, dict):
        return {_remap(k, node_types, memo): _remap(v, node_types, memo) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return type(value)(_remap(v, node_types, memo) for v in value)
    return value


def clone_graph(root: Any, node_types: tuple[type, ...], memo: dict[int, Any] | None = None) -> Any:
    """A deep copy of every IR node (an instance of ``node_types``) reachable from ``root``; other
    values are shared. ``memo`` (``id(original) -> copy``) is filled for callers that need the map."""
    memo = {} if memo is None else memo
    originals: list[Any] = []
    pending = [root]
    while pending:
        node = pending.pop()
        if id(node) in memo:
            continue
        memo[id(node)] = object.__new__(type(node))
        originals.append(node)
        found: list[Any] = []
        for name in _attribute_names(node):
            _children(getattr(node, name), node_types, found)
        pending.extend(f for f in found if id(f) not in memo)
    for node in originals:
        copy = memo[id(node)]
        for name in _attribute_names(node):
            object.__setattr__(copy, name, _remap(getattr(node, name), node_types, memo))
    return memo[id(root)]
