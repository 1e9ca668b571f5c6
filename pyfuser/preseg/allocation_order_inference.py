"""Allocation-order inference: give outputs without a layout requirement their inputs' layout, as a hint.

Every tensor gets an *order* (its logical IDs, outermost first in memory): fusion inputs and
tensors with an allocation domain read it from that domain (``bind_input_layouts`` has already
written the concrete layout of inputs declared without one); every other tensor derives it from
the operands of its definition. Only fusion outputs that carry no requirement receive the result,
through ``set_allocation_domain(..., hint=True)``: a later stage may replace a hint, never a
requirement (seed 001).

How operands decide, per expr (no single "reference" tensor):

* each operand ranks the output IDs its layout-carrying map reaches; output IDs are then ordered
  the way torch's TensorIterator orders dimensions: an insertion sort in which two IDs are
  compared by the *first operand that ranks both*, and IDs nobody ranks keep their logical place.
  So ``cl + plain`` is channels-last, ``plain + cl`` plain, ``bias[C, 1, 1] + cl`` channels-last
  (a broadcast ID has no place in memory and ranks nothing), exactly as in torch;
* matmul and linear carry only batch IDs: M and N stay innermost in logical order, the way the
  GEMM writes them, so ``linear(x[b, m, k], w[n, k])`` with plain inputs stays plain instead of
  the ``[n, b, m]`` a naive highest-rank reference would invent;
* reductions keep their input's order on the IDs they keep (torch's reductions return
  contiguous tensors; keeping the order lets a channels-last sum over H stay C-innermost).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyfuser.ir.base import Expr
from pyfuser.ir.domain_replay import is_permutation_of_logical, logical_order, same_memory_order
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import IterDomain
from pyfuser.ir.ops import LinearOp, MatmulOp
from pyfuser.ir.tensor_view import TensorView

if TYPE_CHECKING:
    from pyfuser.runtime.executor import CompileOptions

#: The ``_disable_options`` name that turns this pass off.
DISABLE_OPTION = "infer_contiguity"

Order = list[IterDomain]


def infer_allocation_order(fusion: Fusion, options: CompileOptions) -> None:
    """The preseg pass: hint the inferred order on every output without a requirement."""
    if DISABLE_OPTION in options.disabled:
        return
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


def infer_allocation_orders(fusion: Fusion) -> dict[int, Order]:
    """``id(tv) -> order`` for every tensor of the fusion (an analysis; changes nothing)."""
    orders: dict[int, Order] = {}
    for tv in fusion.inputs():
        if isinstance(tv, TensorView):
            orders[id(tv)] = logical_order(tv)
    for expr in fusion.exprs():
        outs = expr.tensor_outputs
        if not outs:
            continue
        first = outs[0]
        first_order = logical_order(first) if first.has_allocation_domain() else _propagate(expr, first, orders)
        orders[id(first)] = first_order
        for other in outs[1:]:  # multi-output ops (var_mean): outputs share one shape
            if other.has_allocation_domain():
                orders[id(other)] = logical_order(other)
                continue
            position = {id(i): k for k, i in enumerate(first.get_logical_domain())}
            logical = other.get_logical_domain()
            orders[id(other)] = [logical[position[id(i)]] for i in first_order]
    return orders


def layout_map(expr: Expr, producer: TensorView) -> dict[IterDomain, IterDomain]:
    """The part of ``expr.logical_map(producer)`` along which a memory layout should flow.

    A broadcast producer ID has no place in memory (torch: stride 0), so it has no say in where
    the ID it maps to goes.
    """
    mapping = {p: c for p, c in expr.logical_map(producer).items() if not p.is_broadcast}
    ids = producer.get_logical_domain(no_reductions=True)
    if isinstance(expr, MatmulOp):
        fixed = ids[-2:]  # M / K of a, K / N of b: the GEMM decides their order
    elif isinstance(expr, LinearOp):
        fixed = ids[-1:] if producer is expr.inputs[0] else ids  # K of x; weight and bias carry nothing
    else:
        return mapping
    return {p: c for p, c in mapping.items() if all(p is not f for f in fixed)}


def _propagate(expr: Expr, out: TensorView, orders: dict[int, Order]) -> Order:
    """Order ``out``'s logical IDs the way torch's TensorIterator orders dimensions.

    Each operand ranks the output IDs it maps (0 = outermost in its memory). Insertion sort from
    the innermost logical ID outwards; two IDs are compared by the first operand that ranks both,
    and an ID no operand can compare keeps its place. One operand: its order, mapped. Several:
    the first operand wins wherever it has an opinion.
    """
    logical = out.get_logical_domain()
    rankings: list[dict[int, int]] = []
    for producer in expr.tensor_inputs:
        if id(producer) not in orders:
            continue
        place = {id(p): k for k, p in enumerate(orders[id(producer)])}
        rankings.append({id(c): place[id(p)] for p, c in layout_map(expr, producer).items() if id(p) in place})

    def outer_than(a: IterDomain, b: IterDomain) -> int:
        """1 if ``a`` belongs outside ``b``, -1 if inside, 0 if no operand says."""
        for ranks in rankings:
            if id(a) in ranks and id(b) in ranks:
                return 1 if ranks[id(a)] < ranks[id(b)] else -1
        return 0

    inner_first = list(reversed(logical))
    for i in range(1, len(inner_first)):
        moving = i
        for j in range(i - 1, -1, -1):
            verdict = outer_than(inner_first[j], inner_first[moving])
            if verdict > 0:
                inner_first[j], inner_first[moving] = inner_first[moving], inner_first[j]
                moving = j
            elif verdict < 0:
                break
    return list(reversed(inner_first))
