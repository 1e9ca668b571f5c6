"""The views left in eager between regions, called as tensor methods.

A partitioned training graph keeps ~60 views in eager per Llama layer step (weight transposes feeding
the regions' matmuls, the head reshapes around attention). Called as ``torch.ops.aten.t.default(w)``
each goes through ``OpOverload.__call__`` in Python before the dispatcher (2.4-2.7 us on the CPU
machine); ``w.t()`` enters the same ATen op through the tensor's C++ method binding (1.0 us). The
rewrite keeps each node's name and metadata and only ops whose method has the overload's exact
schema, so what runs is the same op on the same arguments; and ``_unsafe_view`` (AOTAutograd's reshape
of a GEMM's result) as ``view``: the same tensor, which autograd sees as a view, so only where the
graph does not return it to autograd (its outputs whose aliasing AOTAutograd tracks).
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch.fx import GraphModule, Node

aten = torch.ops.aten

#: ATen overload -> the tensor method that calls it with the same positional arguments
METHODS = {
    aten.view.default: "view",
    aten.t.default: "t",
    aten.transpose.int: "transpose",
    aten.permute.default: "permute",
    aten.unsqueeze.default: "unsqueeze",
    aten.squeeze.dim: "squeeze",
    aten.squeeze.dims: "squeeze",
    aten.select.int: "select",
    aten.expand.default: "expand",
    aten.detach.default: "detach",
    aten.reshape.default: "reshape",
}


def call_views_as_methods(gm: GraphModule, protected: Collection[Node] = ()) -> int:
    """Turn ``gm``'s eager calls of the ops in ``METHODS`` into method calls, and those of ``_unsafe_view``
    outside ``protected`` into ``view`` calls, in place (the caller regenerates the code); returns how
    many were turned."""
    turned = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        method = METHODS.get(node.target)
        if node.target is aten._unsafe_view.default and node not in protected:
            method = "view"
        if method is None or node.kwargs or not node.args:  # ``expand(..., implicit=True)`` keeps its op
            continue
        node.op, node.target = "call_method", method
        turned += 1
    return turned
