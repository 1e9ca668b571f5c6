"""A reshape as groups of axes: which producer axes hold the elements of which consumer axes.

Both shapes are cut into the shortest runs of axes with equal products (``[B, S, H*D] -> [B, S, H, D]``
is ``[B]->[B]``, ``[S]->[S]``, ``[H*D]->[H, D]``), as nvFuser's reshape analysis splits and merges
IDs. Inside a group the consumer's indices give one flat index (row-major over the group's consumer
axes) and each producer axis is that flat index divided and wrapped by its group's inner extents. So
a generated kernel reads a reshape's operand at computed positions, whatever the operand's strides
(a reshape of a permuted or expanded value, which as an ATen call would copy).

The groups are known only where the products can be compared: constant extents, or equal symbolic
extents paired one to one. Any other reshape stays an ATen call.

The same groups say which iterations are one across a reshape (``regroupings``): a group's producer axes
merged row-major iterate what its consumer axes merged row-major iterate (``[B * S] -> [B, S]``: ``B * S``
is ``merge(B, S)``). The ID graph maps them so (``id_graph.py``), so a reduction kernel iterates tensors on
both sides of a reshape in one loop nest: a scheduler merges a group's axes where a tensor has them apart,
and the code generator divides and wraps the merged index back into the axes, as it reads an operand.

The groups also say which shards a reshape carries (``shard_pairs``): a contiguous block of a group's
outermost axis is a contiguous block of the group's elements, on either side.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyfuser.ir.base import Expr
from pyfuser.ir.iter_domain import IterDomain
from pyfuser.ir.ops import ReshapeOp
from pyfuser.ir.symbolic import SymExpr
from pyfuser.ir.tensor_view import TensorView


@dataclass(frozen=True)
class ReshapeGroup:
    """Producer axes ``inputs`` hold the elements of consumer axes ``outputs`` (logical positions,
    reductions left out), both row-major; either side may be empty where it is only axes of size 1."""

    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


def _const(e: SymExpr) -> int | None:
    return e.value


def reshape_groups(expr: ReshapeOp) -> list[ReshapeGroup] | None:
    """The groups of ``expr`` in axis order, or None where extents that are not constant keep them
    from being known (or an extent is 0: every grouping holds, and no kernel reads anything)."""
    producer = expr.inputs[0]
    assert isinstance(producer, TensorView)
    src = [i.extent for i in producer.get_logical_domain(no_reductions=True)]
    dst = [i.extent for i in expr.output.get_logical_domain(no_reductions=True)]
    return _groups(src, dst)


def _groups(src: Sequence[SymExpr], dst: Sequence[SymExpr]) -> list[ReshapeGroup] | None:
    if any(_const(e) == 0 for e in (*src, *dst)):
        return None
    groups: list[ReshapeGroup] = []
    s = t = 0
    while s < len(src) or t < len(dst):
        if s < len(src) and _const(src[s]) == 1 and not (t < len(dst) and _const(dst[t]) == 1):
            groups.append(ReshapeGroup((s,), ()))
            s += 1
            continue
        if t < len(dst) and _const(dst[t]) == 1 and not (s < len(src) and _const(src[s]) == 1):
            groups.append(ReshapeGroup((), (t,)))
            t += 1
            continue
        if s == len(src) or t == len(dst):
            return None  # elements left on one side only: not a reshape of these extents
        if src[s] == dst[t]:
            groups.append(ReshapeGroup((s,), (t,)))
            s, t = s + 1, t + 1
            continue
        a, b = _const(src[s]), _const(dst[t])
        if a is None or b is None:
            return None
        ins, outs = [s], [t]
        s, t = s + 1, t + 1
        while a != b:
            if a < b:
                if s == len(src) or _const(src[s]) is None:
                    return None
                a *= _const(src[s]) or 0
                ins.append(s)
                s += 1
            else:
                if t == len(dst) or _const(dst[t]) is None:
                    return None
                b *= _const(dst[t]) or 0
                outs.append(t)
                t += 1
        groups.append(ReshapeGroup(tuple(ins), tuple(outs)))
    return groups


def shard_pairs(expr: ReshapeOp, ranks: int) -> dict[IterDomain, IterDomain]:
    """Producer logical ID -> consumer logical ID of ``expr`` whose shards over ``ranks`` ranks (outer splits:
    rank ``r`` holds the ``r``-th contiguous block) are the same elements, so that the reshape of a shard is
    the shard of the reshape: an axis the reshape leaves as it is, and the outermost axis of each group it
    regroups where that axis and the group's outermost consumer axis both have extents that are multiples of
    ``ranks`` (block ``r`` of the group's row-major elements on both sides). A split ``[A] -> [A1, A2]`` of a
    sharded ``A`` shards ``A1`` (the heads of a fused QKV projection); a merge ``[A1, A2] -> [A]`` of a
    sharded ``A1`` shards ``A``. An inner axis of a group pairs with nothing: its shard is strided."""
    groups = reshape_groups(expr)
    if groups is None:
        return {}
    producer = expr.inputs[0]
    assert isinstance(producer, TensorView)
    p_ids = producer.get_logical_domain(no_reductions=True)
    c_ids = expr.output.get_logical_domain(no_reductions=True)
    pairs: dict[IterDomain, IterDomain] = {}
    for g in groups:
        if not g.inputs or not g.outputs:
            continue
        p, c = p_ids[g.inputs[0]], c_ids[g.outputs[0]]
        if (len(g.inputs) == len(g.outputs) == 1) or (_multiple(p.extent, ranks) and _multiple(c.extent, ranks)):
            pairs[p] = c
    return pairs


def _multiple(extent: SymExpr, ranks: int) -> bool:
    value = _const(extent)
    return value is not None and value % ranks == 0


#: A group's axes as iteration classes, outer first, size-1 axes left out (they add nothing to a flat index).
Key = tuple[int, ...]


def group_ids(expr: ReshapeOp, size_one: Callable[[IterDomain], bool],
              ) -> list[tuple[list[IterDomain], list[IterDomain]]] | None:
    """Each group of ``expr`` as (producer IDs, consumer IDs), outer first, those ``size_one`` drops left
    out (they add nothing to a flat index), groups empty on a side dropped; None where the groups are not
    known. A group of one ID a side maps the two IDs; a longer one maps the row-major merges of its IDs."""
    groups = reshape_groups(expr)
    if groups is None:
        return None
    producer = expr.inputs[0]
    assert isinstance(producer, TensorView)
    p_ids = producer.get_logical_domain(no_reductions=True)
    c_ids = expr.output.get_logical_domain(no_reductions=True)
    found = []
    for g in groups:
        a = [p_ids[d] for d in g.inputs if not size_one(p_ids[d])]
        b = [c_ids[d] for d in g.outputs if not size_one(c_ids[d])]
        if a and b:
            found.append((a, b))
    return found


def regroupings(expr: ReshapeOp, class_of: Callable[[IterDomain], int],
                size_one: Callable[[IterDomain], bool]) -> list[tuple[Key, Key]] | None:
    """The groups of ``expr`` of several IDs on a side (``group_ids``), each as (producer key, consumer
    key): their classes (``class_of``), outer first. (A group of one ID a side maps two IDs directly.)"""
    groups = group_ids(expr, size_one)
    if groups is None:
        return None
    return [(tuple(map(class_of, a)), tuple(map(class_of, b))) for a, b in groups if len(a) > 1 or len(b) > 1]


class Regroupings:
    """Keys (``Key``) that reshapes make one iteration, transitively (``[B * S] -> [B, S] -> [B * S]``)."""

    def __init__(self, pairs: Sequence[tuple[Key, Key]]) -> None:
        self._parent: dict[Key, Key] = {}
        for a, b in pairs:
            self._parent[self.find(a)] = self.find(b)

    def find(self, key: Key) -> Key:
        parent = self._parent.setdefault(key, key)
        while parent != key:
            key, parent = parent, self._parent.setdefault(parent, parent)
        return key

    def __contains__(self, key: Key) -> bool:
        return key in self._parent

    def keys(self) -> list[Key]:
        return list(self._parent)

    def same(self, a: Key, b: Key) -> bool:
        return a in self and b in self and self.find(a) == self.find(b)


def reshape_regroupings(exprs: Sequence[Expr], class_of: Callable[[IterDomain], int],
                        size_one: Callable[[IterDomain], bool]) -> Regroupings:
    """The ``Regroupings`` of every reshape of ``exprs`` whose groups are known."""
    pairs: list[tuple[Key, Key]] = []
    for expr in exprs:
        if isinstance(expr, ReshapeOp):
            pairs += regroupings(expr, class_of, size_one) or []
    return Regroupings(pairs)


def regrouped_classes(classes: set[int] | frozenset[int], regrouped: Regroupings) -> set[int]:
    """``classes`` grown by the classes of every key equivalent to a key all of whose classes are in it: the
    axes a kernel reaches through reshapes from a tensor iterating ``classes`` (``[B, S, V]`` reaches
    ``B * S``; ``[B * S, V]`` reaches ``B`` and ``S``)."""
    grown = set(classes)
    changed = True
    while changed:
        changed = False
        for key in regrouped.keys():
            if all(c in grown for c in key):
                for other in regrouped.keys():
                    if regrouped.same(key, other) and not all(c in grown for c in other):
                        grown.update(other)
                        changed = True
    return grown


def reshaped_classes(exprs: Sequence[Expr], class_of: Callable[[IterDomain], int], allowed: set[int]) -> set[int]:
    """``allowed`` (ID classes of a kernel's reference) grown by the axes of reshapes' operands whose
    consumer axes are all in it, consumers before producers (``exprs`` in definition order, walked
    backwards): a kernel iterating the reshape's result reaches every element of its operand."""
    grown = set(allowed)
    for expr in reversed(exprs):
        if not isinstance(expr, ReshapeOp):
            continue
        out_ids = expr.output.get_logical_domain(no_reductions=True)
        if all(i.is_broadcast() or class_of(i) in grown for i in out_ids):
            producer = expr.inputs[0]
            assert isinstance(producer, TensorView)
            grown.update(class_of(i) for i in producer.get_logical_domain(no_reductions=True))
    return grown


def is_view_of(expr: ReshapeOp, order: Sequence[IterDomain]) -> bool:
    """Whether ATen reshapes ``expr``'s operand as a view when it is laid out densely in ``order`` (its
    logical IDs, outermost first): each group of several producer axes of more than one element is
    adjacent in memory, outer before inner, and none of them is expanded (stride 0 beside a stride)."""
    groups = reshape_groups(expr)
    if groups is None:
        return False
    producer = expr.inputs[0]
    assert isinstance(producer, TensorView)
    ids = producer.get_logical_domain(no_reductions=True)
    memory = [i for i in order if i.extent.value != 1 and not i.is_reduction()]
    for group in groups:
        merged = [ids[d] for d in group.inputs if ids[d].extent.value != 1]
        if len(merged) < 2:
            continue
        if any(i.expanded for i in merged):
            return False
        try:
            start = memory.index(merged[0])
        except ValueError:
            return False
        if memory[start:start + len(merged)] != merged:
            return False
    return True
