"""``PYFUSER_DUMP=fx_graph``: an ATen graph with its regions marked and, for each op left in eager, why."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import GraphModule, Node
from torch.fx.node import map_arg

from pyfuser.integrations.torch_compile.partition import RegionPlan
from pyfuser.integrations.torch_compile.support import op_name


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{dtype}[{', '.join(str(s) for s in value.shape)}]"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_describe(v) for v in value) + ")"
    return type(value).__name__ if value is not None else "?"


class _Name(str):
    """An FX node's name, printed bare inside argument lists."""

    def __repr__(self) -> str:
        return str(self)


def _call(node: Node) -> str:
    args = map_arg(node.args, lambda n: _Name(n.name))
    kwargs = map_arg(node.kwargs, lambda n: _Name(n.name))
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{op_name(node)}({', '.join(parts)})"


def format_plan(gm: GraphModule, plan: RegionPlan, title: str) -> str:
    region_of = {n: k for k, (nodes, _) in enumerate(plan.regions) for n in nodes}
    lines = [f"=== pyfuser fx_graph: {title}: {len(plan.regions)} region(s), {len(plan.eager)} op(s) left in eager ==="]
    width = max((len(f"region {k}") for k in range(len(plan.regions))), default=6) + 2
    for node in gm.graph.nodes:
        meta = _describe(node.meta.get("val"))
        if node.op == "placeholder":
            lines.append(f"{'input':<{width}} {node.name}: {meta}")
        elif node.op == "output":
            lines.append(f"{'output':<{width}} {map_arg(node.args[0], lambda n: _Name(n.name))!r}")
        elif node in region_of:
            lines.append(f"{f'region {region_of[node]}':<{width}} {node.name}: {meta} = {_call(node)}")
        else:
            why = plan.eager.get(node, "not a call")
            lines.append(f"{'eager':<{width}} {node.name}: {meta} = {_call(node)}    # {why}")
    for k, (_, translated) in enumerate(plan.regions):
        inputs = ", ".join(translated.inputs[j].name for j in translated.fusion_inputs)
        outputs = ", ".join(n.name for n in translated.outputs)
        lines.append(f"region {k}: fusion inputs ({inputs}) -> outputs ({outputs}) on {translated.device}")
    return "\n".join(lines) + "\n"
