"""Allocation-order inference: give outputs without a layout requirement the memory order their
operands imply (``ir.analysis.allocation_order``), as a hint.

Only fusion outputs that carry no requirement receive it, through
``set_allocation_domain(..., hint=True)``: a later stage may replace a hint, never a requirement
(docs/layout_requirements.md). Off with ``_disable_options=["infer_contiguity"]``.
"""

from __future__ import annotations

from pyfuser.ir.analysis.allocation_order import infer_allocation_orders
from pyfuser.ir.domain_replay import is_permutation_of_logical, same_memory_order
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.tensor_view import TensorView
from pyfuser.options import CompileOptions


def infer_allocation_order(fusion: Fusion, options: CompileOptions) -> None:
    """Hint the inferred order on every output without a requirement."""
    orders = infer_allocation_orders(fusion)
    for out in fusion.outputs():
        if not isinstance(out, TensorView) or out.is_fusion_input:
            continue
        if out.allocation_is_required or out.domain().allocation_frozen or fusion.get_output_stride_order(out) is not None:
            continue
        if out.has_allocation_domain() and not is_permutation_of_logical(out, out.get_allocation_domain()):
            continue  # a sharded hint from an earlier pass: the finalizing pass owns it
        order = orders[id(out)]
        if same_memory_order(order, out.get_logical_domain()):
            continue
        out.set_allocation_domain(order, True, hint=True)
