"""The memory order every tensor of a fusion has or inherits (an analysis: it changes nothing).

Every tensor gets an *order* (its logical IDs, outermost first in memory): fusion inputs and
tensors with an allocation domain read it from that domain; every other tensor derives it from
the operands of its definition, the way torch's TensorIterator does (see ``_propagate``):

* each operand ranks the output IDs its layout-carrying map reaches; output IDs are then ordered
  by an insertion sort in which two IDs are compared by the *first operand that ranks both*, and
  IDs nobody ranks keep their logical place. So ``cl + plain`` is channels-last, ``plain + cl``
  plain, ``bias[C, 1, 1] + cl`` channels-last (a broadcast ID has no place in memory), exactly as
  in torch;
* matmul and linear carry only batch IDs: M and N stay innermost in logical order, the way the
  GEMM writes them, so ``linear(x[b, m, k], w[n, k])`` with plain inputs stays plain instead of
  the ``[n, b, m]`` a naive highest-rank reference would invent (docs/layout_requirements.md);
* reductions keep their input's order on the IDs they keep.

The preseg pass ``infer_allocation_order`` hints these orders on outputs; the reduction
classifier reads them for intermediates.
"""

from __future__ import annotations

from typing import Protocol

from pyfuser.ir.base import Expr, Val
from pyfuser.ir.domain_replay import logical_order
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import IterDomain
from pyfuser.ir.layout import allocation_permutation
from pyfuser.ir.ops import LinearOp, MatmulOp
from pyfuser.ir.tensor_view import TensorView

Order = list[IterDomain]


class ExprGraph(Protocol):
    """What the inference reads of a fusion: a whole ``Fusion``, or a scheduler's view of a segment of
    one (``scheduler.registry.SegmentView``), which classifies reductions before anything is copied."""

    def inputs(self) -> list[Val]: ...

    def exprs(self) -> list[Expr]: ...


def infer_allocation_orders(fusion: ExprGraph) -> dict[int, Order]:
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
        for other in outs[1:]:  # multi-output ops: outputs of the first's rank (var_mean) share its order
            logical = other.get_logical_domain()
            if other.has_allocation_domain() or len(logical) != len(first.get_logical_domain()):
                orders[id(other)] = logical_order(other)  # another shape (sdpa's logsumexp): its own order
                continue
            position = {id(i): k for k, i in enumerate(first.get_logical_domain())}
            orders[id(other)] = [logical[position[id(i)]] for i in first_order]
    return orders


def layout_map(expr: Expr, producer: TensorView) -> dict[IterDomain, IterDomain]:
    """The part of ``expr.logical_map(producer)`` along which a memory layout should flow.

    A broadcast producer ID has no place in memory (torch: stride 0), so it has no say in where
    the ID it maps to goes.
    """
    mapping = {p: c for p, c in expr.logical_map(producer).items() if not p.is_broadcast()}
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


def allocation_perm(fusion: Fusion, tv: TensorView) -> tuple[int, ...]:
    """Allocation order (logical dims without reductions, outermost first) of a buffer allocated for
    ``tv``: a required output stride order, else its allocation domain, else row-major. A sharded
    allocation (``[mesh, i0/d, i1]``) reads as its logical order."""
    required = fusion.get_output_stride_order(tv) if tv.is_fusion_output else None
    if required is not None:
        return tuple(allocation_permutation(required))
    logical = tv.get_logical_domain(no_reductions=True)
    if not tv.has_allocation_domain():
        return tuple(range(len(logical)))
    position = {id(i): d for d, i in enumerate(logical)}
    return tuple(position[id(i)] for i in logical_order(tv) if not i.is_reduction())
