"""Forward broadcasts of fusion inputs into each of their readers (nvFuser's segmenter forwards the
unary ops of fusion inputs the same way).

A broadcast of an input (``cos[None, None]`` read by the rotary embedding of both q and k) that
several exprs read would otherwise be one tensor for two segments: either a kernel of its own
that writes the broadcast out to global memory, or a boundary that stops the segments around it
from merging (one pointwise kernel writes outputs of one shape). A broadcast or an expand costs
nothing to recompute, so each reader gets its own chain of them from the input, and the segmenter
then puts every copy inside the kernel of its reader.

Only tensors as defined (loop domain = logical domain, no parallel type, no layout of its own,
not inlined) that are not fusion outputs are forwarded: a scheduled one is the user's.
"""

from __future__ import annotations

from pyfuser.ir.base import Expr
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.ops import BroadcastOp, ExpandOp
from pyfuser.ir.tensor_view import TensorView, new_like, user_scheduled
from pyfuser.options import CompileOptions


def _as_defined(tv: TensorView) -> bool:
    return (not tv.is_fusion_output and not tv.has_allocation_domain() and tv.compute_at_pos == 0
            and not user_scheduled(tv))


def _copy_chain(tv: TensorView, fusion: Fusion) -> TensorView:
    """A private copy of the broadcasts / expands that compute ``tv`` from a fusion input."""
    expr = tv.definition
    assert isinstance(expr, BroadcastOp | ExpandOp)
    source = expr.inputs[0]
    assert isinstance(source, TensorView)
    inp = source if source.is_fusion_input else _copy_chain(source, fusion)
    copy = new_like(tv)
    copy.device_mesh = tv.device_mesh
    if isinstance(expr, BroadcastOp):
        BroadcastOp(fusion, copy, inp, expr.flags, expr.implicit)
    else:
        ExpandOp(fusion, copy, inp, expr.size_checks, expr.shape)
    return copy


def forward_input_broadcasts(fusion: Fusion, options: CompileOptions) -> None:
    exprs = fusion.exprs()
    live = {id(e) for e in exprs}
    forwarded: list[TensorView] = []  # computed from a fusion input by broadcasts and expands only
    seen: set[int] = set()
    for expr in exprs:
        if not isinstance(expr, BroadcastOp | ExpandOp):
            continue
        source, out = expr.inputs[0], expr.output
        if isinstance(source, TensorView) and (source.is_fusion_input or id(source) in seen) and _as_defined(out):
            forwarded.append(out)
            seen.add(id(out))
    for tv in forwarded:
        readers: list[Expr] = list(dict.fromkeys(u for u in tv.uses if id(u) in live))
        for reader in readers[1:]:
            reader.replace_input(tv, _copy_chain(tv, fusion))
