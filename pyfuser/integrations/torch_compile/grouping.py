"""Convex groups of supported nodes over an FX graph, in time linear in its nodes and edges.

A region must be *convex*: no path may leave it and come back (through an eager op, or a node of
another region), else the region would need a value computed from its own output before it runs.
Every supported node gets a *stage*, a number such that along every edge ``a -> b``:

* supported ``a`` and ``b`` on the same device: ``stage(b) >= stage(a)``;
* supported ``a`` and ``b`` on different devices: ``stage(b) > stage(a)``;
* a path from supported ``a`` through eager nodes to supported ``b``: ``stage(b) > stage(a)``.

The supported nodes of one stage and one device form one group. A path from a group back into it
would have to keep the stage constant along every edge, which only edges between supported nodes
of that device (inside the group) do: so every group is convex, and the groups with the eager nodes
form a DAG. Stages are found in two passes over the graph: a forward pass gives each node its
earliest stage (the longest path counted in eager crossings), a backward pass then moves a node as
late as its users allow when that puts it beside more of its users than of its producers (a chain
that only a late op reads joins that op's region rather than an early, unrelated one). Nodes of one
stage that share no edge still form one region (horizontal fusion: one call instead of several).

A node with several outputs (``split``, ``var_mean``) and the ``getitem`` nodes that pick them are one
unit: a region can neither take nor return a tuple, so they share a stage, and a unit with an output
pyfuser does not take (a refused ``getitem``, a user that is not a ``getitem``) is refused whole.

Why not torch.fx's ``CapabilityBasedPartitioner``: after grouping, it moves every ``getitem`` into its
producer's partition whatever the support check said, so a ``getitem`` whose translation failed
comes back into its region on every round of partitioning (its ``remove_bookend_non_compute_ops``
trims a ``split`` at a region's edge but leaves its ``getitem`` nodes, whose translation then fails:
a Phi-3 backward graph never finished planning); and it keeps, per node, the set of every node
downstream of it and tries to merge every pair of partitions at every node: quadratic or worse in
the graph's size.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import Node

#: a stage no user bounds (a node only the graph's output reads)
_UNBOUNDED = 1 << 60


@dataclass
class Grouping:
    #: each group's nodes in graph order; groups in the order of their first node
    groups: list[list[Node]]
    #: supported nodes refused here, with why (units with an output that cannot stay in a region)
    refused: dict[Node, str] = field(default_factory=dict)
    #: each grouped ``getitem`` -> the multi-output node whose output it picks (the root of their unit)
    root: dict[Node, Node] = field(default_factory=dict)


def _is_tuple(node: Node) -> bool:
    return isinstance(node.meta.get("val"), (list, tuple))


def _is_getitem(node: Node) -> bool:
    return node.op == "call_function" and node.target is operator.getitem


def _device(node: Node) -> torch.device | None:
    """The device of a node's first tensor output (None for a node without one)."""
    value: Any = node.meta.get("val")
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    return value.device if isinstance(value, torch.Tensor) else None


def _close_units(nodes: Sequence[Node], supported: set[Node], refused: dict[Node, str]) -> dict[Node, Node]:
    """Refuse the multi-output nodes whose outputs cannot all stay in a region (and the ``getitem``
    nodes of a refused one); the root (multi-output node) of each supported ``getitem``."""
    for node in reversed(nodes):  # a nested tuple's getitems are decided before the getitem that made it
        if node not in supported or not _is_tuple(node):
            continue
        for user in node.users:
            if not _is_getitem(user):
                refused[node] = f"its outputs are read whole by {user.name}, which a region cannot return"
                break
            if user not in supported:
                refused[node] = f"its output {user.name} is left in eager, and a region cannot return a tuple"
                break
        if node in refused:
            supported.discard(node)
    root: dict[Node, Node] = {}
    for node in nodes:
        if not _is_getitem(node) or node not in supported:
            continue
        source = node.args[0]
        if not isinstance(source, Node) or source not in supported or not _is_tuple(source):
            supported.discard(node)
            refused[node] = "picks an output of an op left in eager"
            continue
        root[node] = root.get(source, source)
    return root


def propose_groups(nodes: Sequence[Node], supported_nodes: Collection[Node]) -> Grouping:
    """Convex groups of ``supported_nodes`` over ``nodes`` (a graph's nodes, in topological order)."""
    supported = set(supported_nodes)
    refused: dict[Node, str] = {}
    root = _close_units(nodes, supported, refused)
    members: dict[Node, list[Node]] = {}
    for node, unit_root in root.items():
        members.setdefault(unit_root, []).append(node)
    device = {n: _device(root.get(n, n)) for n in supported}

    # Forward: the earliest stage of each supported node; for another node, the earliest stage a
    # supported node reading it may have.
    earliest: dict[Node, int] = {}
    for node in nodes:
        its_root = root.get(node)
        if its_root is not None:
            earliest[node] = earliest[its_root]
            continue
        is_supported = node in supported
        stage = 0
        for a in node.all_input_nodes:
            if a in supported:
                step = 0 if is_supported and device[a] == device[node] else 1
                stage = max(stage, earliest[a] + step)
            else:
                stage = max(stage, earliest[a])
        earliest[node] = stage

    # Backward: each unit's stage, as late as its users allow when more of its edges to them than
    # to its producers then stay inside a region; for another node, the latest stage it allows.
    stage_of: dict[Node, int] = {}
    for node in reversed(nodes):
        if node not in supported:
            stage_of[node] = min((stage_of[u] for u in node.users), default=_UNBOUNDED)
            continue
        if node in root:
            continue  # decided with its unit's root
        unit = [node, *members.get(node, ())]
        inside = set(unit)
        latest = _UNBOUNDED
        users: list[Node] = []
        for m in unit:
            for u in m.users:
                if u in inside:
                    continue
                if u in supported:
                    latest = min(latest, stage_of[u] - (device[u] != device[node]))
                    users.append(u)
                elif stage_of[u] < _UNBOUNDED:
                    latest = min(latest, stage_of[u] - 1)
        stage = earliest[node]
        if stage < latest < _UNBOUNDED:
            beside_users = sum(1 for u in users if stage_of[u] == latest and device[u] == device[node])
            beside_producers = sum(1 for a in node.all_input_nodes
                                   if a in supported and earliest[a] == stage and device[a] == device[node])
            if beside_users and beside_users >= beside_producers:
                stage = latest
        for m in unit:
            stage_of[m] = stage

    _sink_groups([n for n in nodes if n in supported], supported, device, stage_of)
    groups: dict[tuple[int, torch.device | None], list[Node]] = {}
    for node in nodes:
        if node in supported:
            groups.setdefault((stage_of[node], device[node]), []).append(node)
    return Grouping(list(groups.values()), refused, root)


def _components(group: list[Node], inside: Callable[[Node], bool]) -> list[list[Node]]:
    """The parts of ``group`` that its internal edges connect (``inside``: whether a node is in it)."""
    parent = {n: n for n in group}

    def find(n: Node) -> Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for node in group:
        for u in node.users:
            if inside(u):
                a, b = find(node), find(u)
                if a is not b:
                    parent[b] = a
    parts: dict[Node, list[Node]] = {}
    for node in group:
        parts.setdefault(find(node), []).append(node)
    return list(parts.values())


def _sink_groups(grouped: list[Node], supported: set[Node], device: Mapping[Node, torch.device | None],
                 stage_of: dict[Node, int]) -> None:
    """Move each connected part of a group to the latest group of its device that its users allow
    (latest stage first): its internal edges stay inside, and the move saves a region where the part
    was all its group held (a value computed early that only the graph's output or a late region
    reads joins that region). ``stage_of`` of the eager nodes (the latest stage their users allow) was
    computed before any move; moves only raise stages, so it stays a safe bound."""
    groups: dict[tuple[int, torch.device | None], list[Node]] = {}
    for node in grouped:
        groups.setdefault((stage_of[node], device[node]), []).append(node)
    stages: dict[torch.device | None, list[int]] = {}
    for stage, dev in sorted(groups, key=lambda k: k[0]):
        stages.setdefault(dev, []).append(stage)
    for key in sorted(groups, key=lambda k: k[0], reverse=True):
        stage, dev = key
        ladder = stages[dev]
        if ladder[-1] == stage:
            continue  # no later group to join
        members = set(groups[key])
        moved = 0
        for part in _components(groups[key], members.__contains__):
            latest = _UNBOUNDED
            for node in part:
                for u in node.users:
                    if u in members:
                        continue
                    if u in supported:
                        latest = min(latest, stage_of[u] - (device[u] != dev))
                    elif stage_of[u] < _UNBOUNDED:
                        latest = min(latest, stage_of[u] - 1)
            target = ladder[bisect.bisect_right(ladder, latest) - 1]
            if target > stage:
                for node in part:
                    stage_of[node] = target
                groups[(target, dev)].extend(part)
                moved += len(part)
        if moved == len(members):
            del groups[key]
            ladder.remove(stage)


def trim_edges(group: Sequence[Node], trimmable: Callable[[Node], bool], root: Mapping[Node, Node]) -> list[Node]:
    """``group`` without the nodes ``trimmable`` accepts (views) at its edges: those that read only
    values from outside the group (or other such nodes), and those whose values only nodes outside the
    group (or other such nodes) read. A multi-output node and its ``getitem`` nodes (``root``: getitem ->
    its multi-output node) go or stay together."""
    members = set(group)
    units: dict[Node, list[Node]] = {}
    for node in group:
        units.setdefault(root.get(node, node), []).append(node)
    inputs_outside: set[Node] = set()  # units whose inputs all come from outside (or from such units)
    for unit in units:
        if trimmable(unit) and all(a not in members or root.get(a, a) in inputs_outside
                                   for a in unit.all_input_nodes):
            inputs_outside.add(unit)
    users_outside: set[Node] = set()
    for unit, unit_nodes in reversed(units.items()):
        if trimmable(unit) and all(u not in members or root.get(u, u) is unit or root.get(u, u) in users_outside
                                   for n in unit_nodes for u in n.users):
            users_outside.add(unit)
    dropped = inputs_outside | users_outside
    return [n for n in group if root.get(n, n) not in dropped]


def leading_views(nodes: Sequence[Node], supported: Collection[Node], is_view: Callable[[Node], bool]) -> set[Node]:
    """The supported views (with the ``getitem`` nodes of a multi-output one) that read only values no
    group computes (graph inputs, eager results) or other such views. Whatever the grouping, they would
    sit at their group's input edge and be trimmed: left out of the grouping, they do not order the
    eager ops that read them after the groups of their readers' producers."""
    members = set(supported)
    leading: set[Node] = set()
    for node in nodes:
        if node not in members:
            continue
        if _is_getitem(node):
            if node.args[0] in leading:
                leading.add(node)
        elif is_view(node) and all(a not in members or a in leading for a in node.all_input_nodes):
            leading.add(node)
    return leading
