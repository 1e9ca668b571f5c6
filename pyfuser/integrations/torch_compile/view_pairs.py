"""Views that change nothing, dropped from an ATen graph before it is partitioned: transposes
(``t``, ``transpose``, a ``permute`` of two dims) that undo each other, and ``detach``.

AOTAutograd's backward reads a weight the forward transposed as ``t(t(w))`` and hands gradients
back as ``t(t(g))``: in a Llama layer's backward graph 28 of the 33 transposes left in eager were
such pairs. A pair is the tensor it started from (same sizes, strides and offset), so its uses read
that tensor (a region then reads the weight itself); the transposes nothing reads any more are erased.

``detach`` is the tensor itself in graphs that record no gradients (AOTAutograd runs its forward and
backward so), yet each is an eager dispatch between regions: the Llama layer's graphs held six, in
chains (``detach(detach(rsqrt))``) that only fed regions.

A reshape (``view``) and a dtype conversion commute, and which comes first decides a kernel: a
reshape between two kernels is a segment boundary, so the conversion goes beside the computation it
joins and the reshape to the side of a value no kernel computes (a graph input, a GEMM's result), where
it is a free view. A bfloat16 loss reads ``logits.float().view(-1, vocab)``: converted first, one kernel
wrote the float32 copy of the logits and the loss kernel read it; reshaped first, the loss kernel
reads the bfloat16 logits.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from pyfuser.integrations.torch_compile.lowering import RESHAPES, device_arg, swapped_dims

aten = torch.ops.aten

#: values no kernel computes: a reshape of one is a free view
_OUTSIDE_KERNELS = (aten.mm.default, aten.addmm.default, aten.bmm.default)


def drop_transpose_pairs(gm: GraphModule, *, outputs: bool = True) -> int:
    """Make every use of two transposes of the same two dims in a row (``t(t(x))``) read ``x``, in
    place (the caller regenerates the code); ``outputs=False`` keeps the pair where the graph returns it (a
    forward's outputs carry AOTAutograd's aliasing metadata). Returns how many pairs were dropped."""
    dropped = 0
    for node in list(gm.graph.nodes):
        swap = swapped_dims(node)
        if swap is None:
            continue
        inner = node.args[0]
        if not isinstance(inner, Node) or swapped_dims(inner) != swap or not isinstance(inner.args[0], Node):
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


def _conversion(node: Node) -> bool:
    """Whether ``node`` only converts its tensor's dtype (``_to_copy`` to a dtype, strided, on the same
    device)."""
    if node.op != "call_function" or node.target is not aten._to_copy.default or len(node.args) != 1:
        return False
    kwargs, source = node.kwargs, node.args[0]
    value = source.meta.get("val") if isinstance(source, Node) else None
    return ("dtype" in kwargs and set(kwargs) <= {"dtype", "layout", "device"}
            and kwargs.get("layout", torch.strided) == torch.strided and isinstance(value, torch.Tensor)
            and device_arg(kwargs.get("device", value.device)) == value.device)


def _reshape(node: Node) -> bool:
    return node.op == "call_function" and node.target in RESHAPES and isinstance(node.args[0], Node)


def _computed_in_kernels(node: Node) -> bool:
    return node.op == "call_function" and node.target not in _OUTSIDE_KERNELS and not _reshape(node)


def conversions_beside_their_computation(gm: GraphModule, *, outputs: bool = True) -> int:
    """Swap a reshape and a dtype conversion next to each other (the first's only reader the second) so
    the conversion reads a value a kernel computes, or the reshape one no kernel computes, in place (the
    caller regenerates the code); ``outputs=False`` leaves a pair the graph returns as it is (a forward's
    outputs carry AOTAutograd's aliasing metadata). Returns how many pairs were swapped."""
    swapped = 0
    for node in list(gm.graph.nodes):
        if _reshape(node) and _conversion(node.args[0]) and len(node.args[0].users) == 1:
            first, second = node.args[0], node  # reshape(convert(x)): reshape x itself unless a kernel computes it
        elif _conversion(node) and _reshape(node.args[0]) and len(node.args[0].users) == 1:
            first, second = node.args[0], node  # convert(reshape(y)): convert y where a kernel computes it
        else:
            continue
        source = first.args[0]
        if not isinstance(source, Node) or (_conversion(first) == _computed_in_kernels(source)):
            continue
        if not outputs and any(u.op == "output" for u in second.users):
            continue
        graph = gm.graph
        with graph.inserting_before(second):
            moved = graph.call_function(second.target, (source, *second.args[1:]), dict(second.kwargs))
            moved.meta["val"] = second.target(source.meta["val"], *second.args[1:], **second.kwargs)
            last = graph.call_function(first.target, (moved, *first.args[1:]), dict(first.kwargs))
        last.meta.update(second.meta)
        second.replace_all_uses_with(last)
        graph.erase_node(second)
        graph.erase_node(first)
        swapped += 1
    return swapped
