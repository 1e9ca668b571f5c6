"""Views that change nothing, dropped from an ATen graph before it is partitioned: transposes
(``t``, ``transpose``, a ``permute`` of two dims) that undo each other, and ``detach``.

AOTAutograd's backward reads a weight the forward transposed as ``t(t(w))`` and hands gradients
back as ``t(t(g))``: in a Llama layer's backward graph 28 of the 33 transposes left in eager were
such pairs. A pair is the tensor it started from (same sizes, strides and offset), so its uses read
that tensor (a region then reads the weight itself); the transposes nothing reads any more are erased.

``detach`` is the tensor itself in graphs that record no gradients (AOTAutograd runs its forward and
backward so), yet each is an eager dispatch between regions: the Llama layer's graphs held six, in
chains (``detach(detach(rsqrt))``) that only fed regions.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from pyfuser.integrations.torch_compile.lowering import swapped_dims


def drop_transpose_pairs(gm: GraphModule, *, outputs: bool = True) -> int:
    """Make every use of two transposes of the same two dims in a row (``t(t(x))``) read ``x``, in
    place (the caller regenerates the code); ``outputs=False`` keeps the pair where the graph returns it (a
    forward's outputs carry AOTAutograd's aliasing metadata). Returns how many pairs were dropped."""
    dropped = 0
    for node in list(gm.graph.nodes):
        swap = swapped_dims(node)
        inner = node.args[0] if swap is not None else None
        if swap is None or swapped_dims(inner) != swap or not isinstance(inner.args[0], Node):
            continue
        base = inner.args[0]
        if node.replace_all_uses_with(base, delete_user_cb=lambda user: outputs or user.op != "output"):
            dropped += 1
        for dead in (node, inner):
            if not dead.users:
                gm.graph.erase_node(dead)
    return dropped


def drop_detaches(gm: GraphModule, *, outputs: bool = True) -> int:
    """Make every use of ``detach(x)`` read ``x``, in place (the caller regenerates the code);
    ``outputs=False`` keeps one ``detach`` where the graph returns it (a forward's outputs carry
    AOTAutograd's aliasing metadata), of ``x`` itself rather than of another ``detach``. Returns how
    many were erased."""
    dropped = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.detach.default:
            continue
        base = node.args[0]
        if not isinstance(base, Node):
            continue
        node.replace_all_uses_with(base, delete_user_cb=lambda user: outputs or user.op != "output")
        if not node.users:
            gm.graph.erase_node(node)
            dropped += 1
    return dropped
