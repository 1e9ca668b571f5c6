"""Layouts that keep views free: an intermediate that a permute reads only to reshape it is allocated
in the permuted order, so the permute is contiguous and the reshape a view instead of a copy.

The pattern is a backward pass's head merge: the kernel computing a query's gradient writes
``[b, h, s, d]``, the graph permutes it to ``[b, s, h, d]`` and reshapes it to ``[b * s, h * d]``
for the weight-gradient matmul; with the logical order as its layout the reshape copied the whole
tensor (ATen's ``reshape`` of a non-viewable layout: 2 x 107 us per Llama layer step at seq 2048).
Written in the permuted order by the kernel that computes it, the tensor costs nothing more when
the permute keeps the innermost axis (as there: the kernel's reads stay contiguous), and one tiled
transpose kernel instead of a kernel and a copy when it does not. nvFuser's allocation-domain pass
makes the same choice for the tensors it can.

Only computed intermediates (no fusion input or output, no layout given, not sharded) whose one
reader is the permute, and whose permuted value only reshapes read, receive the layout, as a hint.
"""

from __future__ import annotations

from pyfuser.ir.fusion import Fusion
from pyfuser.ir.ops import BinaryOp, PermuteOp, ReshapeOp, TernaryOp, UnaryOp
from pyfuser.ir.tensor_view import TensorView
from pyfuser.options import CompileOptions

#: What a generated kernel computes and writes in any layout: pointwise ops.
_COMPUTED = (UnaryOp, BinaryOp, TernaryOp)


def permuted_layouts_for_reshapes(fusion: Fusion, options: CompileOptions) -> None:
    """Hint the permuted order on every intermediate a permute only reads to reshape."""
    for expr in fusion.exprs():
        if not isinstance(expr, PermuteOp):
            continue
        tv, permuted = expr.inputs[0], expr.outputs[0]
        if not (isinstance(tv, TensorView) and isinstance(permuted, TensorView)) or not _free_layout(tv):
            continue
        if len(tv.uses) != 1 or not permuted.uses or not all(isinstance(u, ReshapeOp) for u in permuted.uses):
            continue
        logical = tv.get_logical_domain()
        if any(i.is_reduction() for i in logical) or list(expr.dims) == list(range(len(logical))):
            continue
        tv.set_allocation_domain([logical[d] for d in expr.dims], True, hint=True)


def _free_layout(tv: TensorView) -> bool:
    """Whether ``tv`` is a computed intermediate whose layout nothing else decides."""
    return (isinstance(tv.definition, _COMPUTED) and not tv.is_fusion_input and not tv.is_fusion_output
            and not tv.has_allocation_domain() and tv.device_mesh is None)
