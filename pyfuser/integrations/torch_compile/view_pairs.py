"""Transposes that undo each other, dropped from an ATen graph before it is partitioned.

AOTAutograd's backward reads a weight the forward transposed as ``t(t(w))`` and hands gradients
back as ``t(t(g))``: in a Llama layer's backward graph 28 of the 33 transposes left in eager were
such pairs. A pair is the tensor it started from (same sizes, strides and offset), so its uses read
that tensor (a region then reads the weight itself); the transposes nothing reads any more are erased.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

aten = torch.ops.aten


def _swap(node: Node) -> tuple[int, int] | None:
    """The two dims a transpose node swaps (normalized), or None for anything else."""
    if node.op != "call_function" or node.kwargs:
        return None
    if node.target is aten.t.default and len(node.args) == 1:
        return (0, 1)
    if node.target is aten.transpose.int and len(node.args) == 3:
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or not all(isinstance(d, int) for d in node.args[1:]):
            return None
        a, b = (d % value.dim() for d in node.args[1:])  # type: ignore[operator]
        return (min(a, b), max(a, b))
    return None


def drop_transpose_pairs(gm: GraphModule, *, outputs: bool = True) -> int:
    """Make every use of ``transpose(transpose(x))`` (the same two dims) read ``x``, in place (the
    caller regenerates the code); ``outputs=False`` keeps the pair where the graph returns it (a
    forward's outputs carry AOTAutograd's aliasing metadata). Returns how many pairs were dropped."""
    dropped = 0
    for node in list(gm.graph.nodes):
        swap = _swap(node)
        inner = node.args[0] if swap is not None else None
        if not isinstance(inner, Node) or _swap(inner) != swap or not isinstance(inner.args[0], Node):
            continue
        base = inner.args[0]
        if node.replace_all_uses_with(base, delete_user_cb=lambda user: outputs or user.op != "output"):
            dropped += 1
        for dead in (node, inner):
            if not dead.users:
                gm.graph.erase_node(dead)
    return dropped
