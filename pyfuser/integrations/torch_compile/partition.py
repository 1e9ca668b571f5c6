"""Partition an ATen graph into pyfuser regions and splice each in as one call.

``grouping.propose_groups`` proposes the largest convex groups of supported nodes; views at a
group's edge are dropped (they are free in eager, and a region would copy them; a ``clone`` is a copy
in eager, so it stays, written by the region) unless only a
matmul of the group reads them, as an operand its translation folds (``mm(x, w.t())`` is
``linear(x, w)``, reading ``w`` as laid out), and a group with nothing to fuse (only views, or only
matmuls, which run as ATen calls in pyfuser too) stays in eager. Each group is translated; a node
that fails to translate is refused and the graph grouped again (groups translated before are kept),
so an unforeseen argument combination costs a region boundary, never an error. The values regions
pass only to other regions then take the layout those want (``boundary_layouts``). Each region then
replaces its nodes: one ``call_function`` of the region and a ``getitem`` per value used outside it.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch.fx import GraphModule, Node
from torch.fx.node import map_arg
from torch.fx.passes.tools_common import legalize_graph

from pyfuser.integrations.torch_compile.boundary_layouts import row_major_boundaries
from pyfuser.integrations.torch_compile.grouping import leading_views, propose_groups, trim_edges
from pyfuser.integrations.torch_compile.lowering import RESHAPES, OpClass
from pyfuser.integrations.torch_compile.region import FusionRegion
from pyfuser.integrations.torch_compile.support import op_class, refusal
from pyfuser.integrations.torch_compile.translator import RegionTranslator, TranslatedRegion, TranslationError

aten = torch.ops.aten

EDGE_VIEW = "a view at a region's edge (free in eager; a region would copy it)"
NOTHING_TO_FUSE = "its group has nothing to fuse (only views or matmuls, which run as ATen calls either way)"


@dataclass
class RegionPlan:
    #: each region's nodes (in graph order) and its translation
    regions: list[tuple[list[Node], TranslatedRegion]]
    #: every call left in eager, with why
    eager: dict[Node, str] = field(default_factory=dict)


def _worth_compiling(nodes: list[Node]) -> bool:
    return any(op_class(n) is OpClass.compute for n in nodes)


def _is_view(node: Node) -> bool:
    return op_class(node) is OpClass.view


#: matmuls whose translation reads an operand's source instead of the view (``tensor_lowerings._mm``):
#: position of the operand -> the view ops it folds (a transposed weight -> ``linear``; rows
#: flattened from an N-D tensor -> the N-D tensor)
_TRANSPOSES = (aten.t.default, aten.transpose.int, aten.permute.default)
FOLDED_OPERANDS = {aten.mm.default: {1: _TRANSPOSES, 0: RESHAPES},
                   aten.addmm.default: {2: _TRANSPOSES, 1: RESHAPES}}


def _keep_folded_operands(members: list[Node], proposed: set[Node], leading: set[Node],
                          order: Mapping[Node, int]) -> list[Node]:
    """``members`` (a group with its edges trimmed; ``proposed``: before) with the views at its edge
    (trimmed, or ``leading``: left out of the grouping) put back that only a matmul of the group reads as
    an operand its translation folds (``mm(x, w.t())`` is ``linear(x, w)``): inside, the view costs
    nothing (the region reads ``w`` as laid out); outside, it is one eager op per call."""
    kept = set(members)
    added: list[Node] = []
    for node in members:
        if node.target not in FOLDED_OPERANDS:
            continue
        for position, views in FOLDED_OPERANDS[node.target].items():
            operand = node.args[position] if position < len(node.args) else None
            if (isinstance(operand, Node) and (operand in proposed or operand in leading) and operand not in kept
                    and operand.target in views and all(user in kept for user in operand.users)):
                kept.add(operand)
                added.append(operand)
    return sorted([*members, *added], key=order.__getitem__) if added else members


def _reject(rejected: dict[Node, str], error: TranslationError, members: Sequence[Node]) -> None:
    """Leave the node that failed to translate in eager (every node of the group, should the error
    name one outside it or one refused before: each round must refuse something new)."""
    if error.node in members and error.node not in rejected:
        rejected[error.node] = f"translation failed: {error.reason}"
        return
    for node in members:
        rejected.setdefault(node, f"its region failed to translate: {error}")


def plan_regions(gm: GraphModule) -> RegionPlan:
    """The regions of ``gm`` and the reasons for what stays eager (``gm`` is not changed)."""
    nodes = list(gm.graph.nodes)
    order = {n: k for k, n in enumerate(nodes)}
    rejected: dict[Node, str] = {}
    translations: dict[tuple[Node, ...], TranslatedRegion] = {}
    while True:
        reasons: dict[Node, str] = {}
        for node in nodes:
            if node.op == "call_function":
                why = refusal(node, rejected)
                if why is not None:
                    reasons[node] = why
        supported = [n for n in nodes if n.op == "call_function" and n not in reasons]
        leading = leading_views(nodes, supported, _is_view)
        grouping = propose_groups(nodes, [n for n in supported if n not in leading])
        reasons.update(grouping.refused)
        regions: list[tuple[list[Node], TranslatedRegion]] = []
        dropped: dict[Node, str] = {}
        refused = False
        for group in grouping.groups:
            members = _keep_folded_operands(trim_edges(group, _is_view, grouping.root), set(group), leading, order)
            if not members:
                continue
            if not _worth_compiling(members):
                dropped.update(dict.fromkeys(members, NOTHING_TO_FUSE))
                continue
            key = tuple(members)
            translated = translations.get(key)
            if translated is None:
                try:
                    translated = translations[key] = RegionTranslator(members).translate()
                except TranslationError as e:
                    _reject(rejected, e, members)
                    refused = True
                    continue
            regions.append((members, translated))
        if not refused:
            return RegionPlan(_with_boundary_layouts(regions), _eager_reasons(gm, regions, reasons, dropped))


def _with_boundary_layouts(regions: list[tuple[list[Node], TranslatedRegion]]
                           ) -> list[tuple[list[Node], TranslatedRegion]]:
    """``regions`` with the values only regions read written in the layout those regions want
    (``boundary_layouts``): the regions returning or reading one are translated again. Should one
    not translate now (its translation read a layout), every value keeps eager's layout."""
    before = {n: dict(n.meta) for _, t in regions for n in t.outputs}
    relaid = set(row_major_boundaries(regions))
    if not relaid:
        return regions
    try:
        return [(nodes, RegionTranslator(nodes).translate()) if relaid.intersection((*t.inputs, *t.outputs))
                else (nodes, t) for nodes, t in regions]
    except TranslationError:
        for node in relaid:
            node.meta.clear()
            node.meta.update(before[node])
        return regions


def _eager_reasons(gm: GraphModule, regions: list[tuple[list[Node], TranslatedRegion]],
                   refused: Mapping[Node, str], dropped: Mapping[Node, str]) -> dict[Node, str]:
    claimed = {n for nodes, _ in regions for n in nodes}
    reasons: dict[Node, str] = {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or n in claimed:
            continue
        reasons[n] = refused.get(n) or dropped.get(n) or EDGE_VIEW
    return reasons


def splice_region(gm: GraphModule, nodes: list[Node], translated: TranslatedRegion, region: FusionRegion,
                  replaced: dict[Node, Node]) -> None:
    """Replace ``nodes`` in ``gm`` by one call of ``region`` and a getitem per output. ``replaced``
    maps the outputs of regions spliced before to their getitems (this region may read them); this
    region's outputs are added to it."""
    graph = gm.graph
    with graph.inserting_after(nodes[-1]):
        call = graph.call_function(region, tuple(replaced.get(n, n) for n in translated.inputs))
    call.meta["val"] = [n.meta.get("val") for n in translated.outputs]
    replacements = []
    with graph.inserting_after(call):
        for k, node in enumerate(translated.outputs):
            item = graph.call_function(operator.getitem, (call, k))
            item.meta.update(node.meta)
            replacements.append((node, item))
    for node, item in replacements:
        node.replace_all_uses_with(item, delete_user_cb=lambda user: user not in nodes)
        replaced[node] = item
    last = replacements[-1][1] if replacements else call
    for view in translated.rederived:  # in eager, from the returned value it views (``finish`` orders them)
        with graph.inserting_after(last):
            source, target = view.args[0], view.target
            assert isinstance(source, Node) and callable(target)  # a rederived view: a view op's call on a node
            rest = map_arg(view.args[1:], lambda a: replaced.get(a, a))
            last = graph.call_function(target, (replaced[source], *rest), dict(view.kwargs))
        last.meta.update(view.meta)
        view.replace_all_uses_with(last, delete_user_cb=lambda user: user not in nodes)
        replaced[view] = last
    for node in reversed(nodes):
        graph.erase_node(node)


def finish(gm: GraphModule) -> GraphModule:
    """Order the rewritten graph topologically (a region's call may come after a user of one of its
    outputs that was placed between its nodes) and regenerate its code, now: a lazily recompiled
    module's ``forward`` (what the backend hands AOTAutograd) would otherwise stay the lazy stub,
    which calls the module through ``nn.Module.__call__`` on every call (14 us of host time per
    call on the CPU machine)."""
    legalize_graph(gm)
    gm.graph.lint()
    gm.recompile()
    real_recompile = getattr(gm, "real_recompile", None)  # torch.fx's _LazyGraphModule
    if callable(real_recompile):
        real_recompile()
    return gm
