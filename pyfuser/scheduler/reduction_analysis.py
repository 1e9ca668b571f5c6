"""What the reduction and normalization schedulers ask of a segment.

A segment with reductions runs as one kernel when it iterates one *full space* (the axes of the
reductions' inputs) and each tensor iterates that space or the part a reduction keeps. Its kind:

* **reduction**: every reduction reduces the same axes and nothing reads a reduced value back
  in the full space (a sum with a pointwise prologue and epilogue);
* **persistent** (normalization): a reduced value is broadcast back and combined with the full
  space (softmax, layernorm): *inner* or *outer* by memory order, like the reduction;
* **inner-outer**: two reductions of the full space, one over its innermost axes (per row) and one
  over the others (across rows), both in one pass (docs/cached_inputs.md's fusion, layernorm backward).

The memory order that decides inner and outer is the allocation order the segment's inputs have
(an intermediate inherits it, ``infer_allocation_orders``), never the logical position (docs/cached_inputs.md).

The space extends through reshapes that regroup kept axes only (``ir/analysis/reshape.py``): a
``[B * S, V]`` and the ``[B, S, V]`` it is reshaped into (or from) iterate one space, ``B * S`` being
``merge(B, S)``. A reshape that regroups a reduced axis ends the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from pyfuser.codegen.support import unsupported_in_reduction_kernel, unsupported_indexed_reads
from pyfuser.ir.analysis.allocation_order import infer_allocation_orders
from pyfuser.ir.analysis.id_graph import IdGraph
from pyfuser.ir.analysis.reshape import (
    Regroupings,
    regrouped_classes,
    regroupings,
    reshape_regroupings,
)
from pyfuser.ir.analysis.resize import RESIZE_OPS, readable_classes, resized_axes, resized_classes
from pyfuser.ir.base import Expr, downstream_exprs
from pyfuser.ir.iter_domain import IterDomain
from pyfuser.ir.ops import ReductionOp, ReshapeOp, VarMeanOp
from pyfuser.ir.ops.indexing import read_by_index_only
from pyfuser.ir.symbolic import SymConst, SymExpr
from pyfuser.ir.tensor_view import TensorView
from pyfuser.scheduler.reduction_kind import ReductionKind, reduction_kind
from pyfuser.scheduler.registry import FusionLike, once_per_view


class NormalizationKind(Enum):
    reduction = "reduction"
    inner_persistent = "inner_persistent"
    outer_persistent = "outer_persistent"
    inner_outer_persistent = "inner_outer_persistent"


@dataclass
class ReductionAnalysis:
    """A segment's reductions: the first reduction's output (the schedule's reference), the full
    space's axes in memory order (of the reference's input), which of them the reference reduces,
    and for inner-outer segments, the reference of the outer reductions."""

    kind: NormalizationKind
    exact: IdGraph
    reference: TensorView
    #: the full space's classes, outermost in memory first
    order: list[int]
    reduced: frozenset[int]
    inner: bool
    outer_reference: TensorView | None = None
    #: the groups of axes the segment's reshapes make one iteration (of ``exact``'s classes)
    regrouped: Regroupings = field(default_factory=lambda: Regroupings(()))

    def extents(self) -> tuple[SymExpr, SymExpr]:
        """(reduced extent, kept extent) of the reference, as products over its logical IDs."""
        reduced: SymExpr = SymConst(1)
        kept: SymExpr = SymConst(1)
        for i in self.reference.get_logical_domain():
            if i.is_broadcast():
                continue
            if i.is_reduction():
                reduced = reduced * i.extent
            else:
                kept = kept * i.extent
        return reduced, kept

    def iterated(self, tv: TensorView) -> frozenset[int]:
        """The classes of the space ``tv`` iterates (its logical axes, broadcast and reduced ones aside):
        ``reduced <=`` it for a tensor as large as the rows (one the loops stream), ``reduced &`` it
        empty for a reduced result."""
        return frozenset(self.exact.class_of(i) for i in tv.get_logical_domain()
                         if not i.is_broadcast() and not i.is_reduction())


def _classes(exact: IdGraph, ids: list[IterDomain]) -> frozenset[int]:
    return frozenset(exact.class_of(i) for i in ids if not i.is_broadcast())


@once_per_view
def analyze(fusion: FusionLike) -> tuple[ReductionAnalysis | None, str]:
    """The segment's reductions if one reduction or normalization kernel computes it (else None
    and why not)."""
    exprs = fusion.exprs()
    reductions = [e for e in exprs if isinstance(e, ReductionOp | VarMeanOp)]
    if not reductions:
        return None, "the segment has no reduction"
    for expr in exprs:
        reason = unsupported_in_reduction_kernel(expr)
        if reason is not None:
            return None, reason
    reason = unsupported_indexed_reads(exprs)
    if reason is not None:
        return None, reason
    if not any(isinstance(o, TensorView) for o in fusion.outputs()):
        return None, "the segment has no tensor output"
    exact = IdGraph(fusion.tensors(), exprs, map_broadcast=False, through_transforms=False)
    groups: dict[frozenset[int], list[Expr]] = {}
    full: frozenset[int] | None = None
    for e in reductions:
        out = e.output
        space = _classes(exact, out.get_logical_domain())
        if full is None:
            full = space
        elif space != full:
            return None, (f"{reductions[0].output.short_name} and {out.short_name} reduce tensors of different axes; "
                          "one reduction kernel iterates one space")
        groups.setdefault(_classes(exact, [i for i in out.get_logical_domain() if i.is_reduction()]), []).append(e)
    assert full is not None
    regrouped = reshape_regroupings(exprs, exact.class_of, exact.forwards)
    reduced_classes = frozenset().union(*groups)
    boundary = {id(v) for v in (*fusion.inputs(), *fusion.outputs())}
    for reshape in exprs:
        if not isinstance(reshape, ReshapeOp):
            continue
        name = reshape.output.short_name
        if any(reduced_classes & {*p, *c} for p, c in regroupings(reshape, exact.class_of, exact.forwards) or []):
            return None, (f"reshape producing {name} splits or merges a reduced axis; one reduction kernel computes "
                          "reshapes of kept axes only")
        if id(reshape.output) in boundary and id(reshape.inputs[0]) in boundary:
            return None, (f"reshape producing {name} returns a tensor in global memory reshaped: an ATen view of it, "
                          "not a kernel's copy")
    # the space's axes on the other side of reshapes of kept axes, and (as a pointwise kernel reads them)
    # the axes of a reshape's operand read at indices computed from its result's
    reachable = readable_classes(exprs, exact.class_of, regrouped_classes(full, regrouped))
    for tv in fusion.tensors():
        own = _classes(exact, [i for i in tv.get_logical_domain() if not i.is_reduction()])
        if not own <= reachable and not read_by_index_only(tv, exprs):  # (a lookup tensor is not iterated)
            return None, (f"{tv.short_name} iterates axes outside the reductions' space; one reduction kernel "
                          "iterates one space")
    computed = _computed_from(reductions, exprs)
    for tv in computed:
        kept_ids = [i for i in tv.get_logical_domain() if not i.is_reduction() and not i.is_broadcast()]
        if len(_classes(exact, kept_ids)) < len(kept_ids):
            # (``x + x.t()`` of a reduced value): the programs tile each axis of the space once, so a
            # reduced value read along the other axis is one they did not compute
            return None, (f"{tv.short_name}, computed from a reduction, iterates two axes of one axis of the "
                          "reductions' space; one reduction kernel reads a reduced value where it computed it")
    reason = _shifts_of_reduced_values(exprs, exact, computed, full, frozenset.intersection(*groups))
    if reason is not None:
        return None, reason
    if any(not r for r in groups):
        return None, "a reduction over no axis"
    # The kernel's programs tile the kept axes; an output that lacks one of them (a broadcast of a
    # smaller tensor) would be written by every program along it, from loops that do not follow the
    # reference's: it belongs to a kernel of its own shape.
    kept = full - frozenset().union(*groups)
    for value in fusion.outputs():
        if isinstance(value, TensorView) and value.definition is not None and not isinstance(
                value.definition, ReductionOp | VarMeanOp):
            missing = kept - regrouped_classes(_classes(exact, value.get_logical_domain()), regrouped)
            if missing:
                return None, (f"output {value.short_name} does not iterate every axis the reduction "
                              f"{reductions[0].output.short_name} keeps; one reduction kernel writes "
                              "outputs over its kept axes")
    orders = infer_allocation_orders(fusion)
    kinds = {id(e): _kind(e, orders[id(e.tensor_inputs[0])]) for e in reductions}
    first = reductions[0]
    order = [exact.class_of(i) for i in orders[id(first.tensor_inputs[0])] if not i.is_broadcast()]
    if len(groups) == 1:
        reduced = next(iter(groups))
        inner = kinds[id(first)] is ReductionKind.inner
        if not _persistent(fusion, exact, reductions):
            return ReductionAnalysis(NormalizationKind.reduction, exact, first.output, order, reduced, inner,
                                     regrouped=regrouped), ""
        kind = NormalizationKind.inner_persistent if inner else NormalizationKind.outer_persistent
        return ReductionAnalysis(kind, exact, first.output, order, reduced, inner, regrouped=regrouped), ""
    if len(groups) > 2:
        return None, "reductions over more than two sets of axes"
    (a, a_exprs), (b, b_exprs) = groups.items()
    if a & b or (a | b) != full:
        return None, "two reductions over overlapping axes, or together not over every axis"
    a_inner = all(kinds[id(e)] is ReductionKind.inner for e in a_exprs)
    b_inner = all(kinds[id(e)] is ReductionKind.inner for e in b_exprs)
    if a_inner == b_inner:
        return None, "two sets of reductions that are both inner or both outer in memory"
    (inner_set, inner_exprs), (outer_exprs) = ((a, a_exprs), b_exprs) if a_inner else ((b, b_exprs), a_exprs)
    if any(isinstance(e, VarMeanOp) for e in outer_exprs):
        return None, "an outer var_mean in an inner-outer segment (its partial results cannot be combined)"
    resize = next((e for e in exprs if isinstance(e, RESIZE_OPS)), None)
    if resize is not None:  # (its schedule keeps the row in a tile beside partial sums across rows)
        return None, (f"{resize.op_description} producing {resize.outputs[0].short_name}: slices, pads and cats "
                      "are not generated by the inner-outer persistent scheduler")
    return ReductionAnalysis(NormalizationKind.inner_outer_persistent, exact, inner_exprs[0].output, order,
                             inner_set, True, outer_exprs[0].output, regrouped), ""


def _shifts_of_reduced_values(exprs: list[Expr], exact: IdGraph, computed: list[TensorView], space: frozenset[int],
                              reduced_by_all: frozenset[int]) -> str | None:
    """Why a slice, pad or cat cannot read its operand where it reads it (None: it can). A resize
    reads its operand at shifted indices on the axes it resizes. A reduced value is the same along
    the axes every reduction reduced (rotary embedding after a per-head norm reads the normalized
    row's other half: its loads again, times the row's statistics); along a kept axis it is another
    program's value. A resize of values no reduction computes is a pointwise kernel's, and so is one of
    a reshape of a reduced value."""
    ids = {id(tv) for tv in computed}
    # the operand axis a resize reads into a reduced one (each part of a cat of the row) is reduced too
    reduced = resized_classes(exprs, exact.class_of, set(reduced_by_all), to_broadcasts=False)
    for expr in (e for e in exprs if isinstance(e, RESIZE_OPS)):
        for k, producer in enumerate(expr.tensor_inputs):
            if id(producer) not in ids:
                # (a rotary backward's pads before a norm backward's sums: the schedule replays the
                # reference's tiling onto the operand's producers, which a resize does not map)
                return (f"{expr.op_description} producing {expr.outputs[0].short_name} reads {producer.short_name}, "
                        "which no reduction of the segment computes; one reduction kernel computes slices, pads "
                        "and cats of its reduced values only")
            p_ids = producer.get_logical_domain(no_reductions=True)
            if any(not i.is_broadcast() and exact.class_of(i) not in space | reduced for i in p_ids):
                # (Swin's pad of a normalized ``[B, H * W, C]`` viewed as ``[B, H, W, C]``): the reduced value is
                # found again at the loop nest's own indices only
                return (f"{expr.op_description} producing {expr.outputs[0].short_name} reads {producer.short_name}, "
                        "a reshape of a value computed from a reduction; one reduction kernel computes slices, "
                        "pads and cats of reduced values over the reductions' own axes")
            for axis in resized_axes(expr, k):
                i = p_ids[axis.dim]
                if not i.is_broadcast() and exact.class_of(i) not in reduced:
                    return (f"{expr.op_description} producing {expr.outputs[0].short_name} reads "
                            f"{producer.short_name}, computed from a reduction, shifted along its axis {axis.dim}, "
                            "which the reductions keep; one reduction kernel reads a reduced value where it "
                            "computed it")
    return None


def _kind(expr: Expr, order: list[IterDomain]) -> ReductionKind:
    try:
        return reduction_kind(expr, order)
    except ValueError:  # a reduction of size-1 (broadcast) axes only: any kind schedules it
        return ReductionKind.inner


def _computed_from(reductions: Sequence[Expr], exprs: list[Expr]) -> list[TensorView]:
    """The reductions' outputs and every tensor the segment's ``exprs`` compute from them (a
    ``SegmentView``'s tensors have uses outside it)."""
    inside = {id(e) for e in exprs}
    found: dict[int, TensorView] = {}
    stack = [out for e in reductions for out in e.tensor_outputs]
    while stack:
        tv = stack.pop()
        if id(tv) not in found:
            found[id(tv)] = tv
            stack.extend(out for use in tv.uses if id(use) in inside for out in use.tensor_outputs)
    return list(found.values())


def _persistent(fusion: FusionLike, exact: IdGraph, reductions: Sequence[Expr]) -> bool:
    """Whether a value computed from a reduction is read back over the axes it reduced."""
    for e in reductions:
        reduced = _classes(exact, [i for i in e.output.get_logical_domain() if i.is_reduction()])
        if any(_classes(exact, [i for i in out.get_logical_domain() if not i.is_reduction()]) & reduced
               for use in downstream_exprs(e) for out in use.tensor_outputs):
            return True
    return False
