"""Staged ``var_mean``: a mean and variance over reduced axes that a kept axis separates in memory are
computed in two stages, first over all the reduced axes but the outermost in memory, then over that one.

Batch-norm statistics of NCHW activations (``var_mean`` over N, H, W of [N, C, H, W]) in one stage are a
reduction whose elements are not contiguous (an index divided and wrapped per element, C apart).
Reducing H, W first keeps N*C programs on contiguous rows; the second stage reduces N partial results.
A var_mean whose results each reduce few enough elements for one program's tile (``ONE_STAGE_ELEMENTS``)
keeps one stage: every channel's elements are loaded at once, where a first stage of short rows (7 x 7
pixels) is slow. Where the extents are symbolic, the executor decides it for the inputs of each call
(``one_stage_var_means``) and keys its programs on the answer (``CompileOptions.one_stage_var_means``).
Reduced axes that are together in memory need no stages: innermost, whole rows; outermost (channels-last
statistics: N*H*W rows of C contiguous channels), an outer reduction split across programs (Welford's
partial results per program, combined by a second launch: ``scheduler/grid_reduction.py``), unless a
normalization reads the results back (batch-norm's forward), which is not split: then H, W first gives
the first stage N*C columns.

Every partial of the first stage covers the same number of elements (the product of the other
reduced extents), so the second stage is exact algebra, not a heuristic: the mean is the mean of the
partial means and the (biased) variance is the mean of the partial variances plus the variance of the
partial means (the law of total variance with equal weights), both stable in floating point.

The second stage is one normalization kernel over the partials: the mean of the partial means, read
back to take each partial mean's deviation from it, and the mean of the partial variances plus those
squared deviations. A ``var_mean`` of the partial means beside a mean of the partial variances would be
two kernels: they reduce tensors whose axes only a fusion input relates.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from pyfuser.ir.analysis.allocation_order import infer_allocation_orders
from pyfuser.ir.base import downstream_exprs
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import IterDomain, IterType
from pyfuser.ir.ops import BinaryOp, BinaryOpType, BroadcastOp, ReductionOp, ReductionOpType, VarMeanOp
from pyfuser.ir.tensor_domain import TensorDomain
from pyfuser.ir.tensor_view import TensorView
from pyfuser.options import CompileOptions

#: Whether an outer var_mean (channels-last statistics) is staged even where nothing reads its results
#: back: H, W first (N*C columns), then N. Off: one var_mean split across programs (N*H*W rows, C
#: columns: Welford's partials, one combine), which reads the same contiguous rows in one launch fewer.
#: ``benchmarks/kernels.py --sweep`` times both (``stage_outer_var_means``).
_STAGE_OUTER = [False]


@contextmanager
def stage_outer_var_means(staged: bool) -> Iterator[bool]:
    """Stage outer var_means (``staged``) or split them across programs inside the block (fusions compiled
    there keep it)."""
    _STAGE_OUTER.append(staged)
    try:
        yield staged
    finally:
        _STAGE_OUTER.pop()


#: The most reduced elements per result that a var_mean over axes a kept one separates takes in one stage
#: (``_fits_one_tile``).
ONE_STAGE_ELEMENTS = 8192

#: Exact in these dtypes' own arithmetic (the kernels accumulate them at their own precision); a
#: half-precision var_mean rounds each stage's results, so it keeps one stage.
_DTYPES = (DataType.Float, DataType.Double)


def stage_var_means(fusion: Fusion, options: CompileOptions) -> None:
    """Rewrite each ``var_mean`` that ``staged_axes`` picks into its two stages."""
    orders = infer_allocation_orders(fusion)
    for expr in fusion.exprs():
        if not isinstance(expr, VarMeanOp):
            continue
        x = expr.tensor_inputs[0]
        split = staged_axes(expr, orders[id(x)], options.one_stage_var_means)
        if split is not None:
            _stage(fusion, expr, *split)
            # the stages' outputs replace the var_mean's in its consumers, a later var_mean among them
            orders = infer_allocation_orders(fusion)


def staged_axes(expr: VarMeanOp, order: list[IterDomain], one_stage: frozenset[int] = frozenset(),
                ) -> tuple[int, list[int]] | None:
    """``(outer, inner)``: the reduced axis the second stage reduces and those the first does, or None
    to keep one stage: one reduced axis, a reduction of every axis, a correction (unbiased variance:
    the stages combine biased ones), half-precision data, or reduced axes together in memory (whole
    rows innermost, or an outer reduction, which splits across programs, unless its results are
    broadcast back to a normalization or ``stage_outer_var_means`` asks for stages). ``one_stage``: the
    var_means (by variance output) that fit one tile at the sizes compiled for (``one_stage_var_means``)."""
    x = expr.tensor_inputs[0]
    fusion = x.fusion
    logical = x.get_logical_domain(no_reductions=True)
    reduced = [a for a in expr.axes if not logical[a].is_broadcast()]  # size-1 axes cost nothing
    if (expr.correction != 0 or x.dtype not in _DTYPES or len(reduced) < 2
            or all(logical[k].is_broadcast() for k in range(len(logical)) if k not in expr.axes)
            or any(fusion.get_output_stride_order(o) is not None
                   for o in expr.tensor_outputs if o.is_fusion_output)):
        return None
    position = {id(i): k for k, i in enumerate(logical)}
    memory = [position[id(i)] for i in order if id(i) in position and not i.is_broadcast()]
    if len(memory) != sum(not i.is_broadcast() for i in logical):
        return None
    places = [k for k, a in enumerate(memory) if a in reduced]
    gap = places[-1] - places[0] + 1 != len(places)  # a kept axis lies between reduced ones
    if gap and (expr.tensor_outputs[0].name in one_stage or _fits_one_tile([logical[a] for a in reduced])):
        return None
    outer = memory[-1] not in reduced  # the innermost axis is kept: an outer reduction
    if not (gap or (outer and (_STAGE_OUTER[-1] or _broadcast_back(expr)))):
        return None
    first = memory[places[0]]
    return first, [a for a in expr.axes if a != first]


def _fits_one_tile(reduced: list[IterDomain], sizes: Mapping[str, int] | None = None) -> bool:
    """Whether the reduced elements of each result, known at compile time (or at ``sizes``, a call's bound
    size symbols), are at most ``ONE_STAGE_ELEMENTS``: one program then takes them all at once (a persistent tile), which no
    stage of contiguous rows beats when the rows are short. H200, batch-norm statistics and forward of
    NCHW activations whose every channel fits a tile (128 x 2048 x 7 x 7: 6272 elements, 3 x 127 x 33 x
    33: 3267; bf16 and float32): 0.33-0.74x of Inductor staged (the first stage's rows of 49 or 1089
    pixels), 0.54-0.93x in one stage; past a tile (64 x 512 x 28 x 28 and larger) staging won, 0.78-1.30x
    against 0.26-0.86x."""
    if sizes is None and any(i.extent.value is None for i in reduced):
        return False
    return math.prod(i.extent.evaluate(sizes or {}) for i in reduced) <= ONE_STAGE_ELEMENTS


def one_stage_var_means(fusion: Fusion, sizes: Mapping[str, int]) -> frozenset[int]:
    """The var_means of ``fusion`` (by variance output) reducing symbolic extents whose elements per result
    fit one tile (``ONE_STAGE_ELEMENTS``) at ``sizes`` (the bound size symbols of a call's inputs): one
    stage for them, as for static extents that fit. H200, batch-norm statistics of NCHW bf16 / float32 with
    symbolic sizes, one stage against staged: 128 x 2048 x 7 x 7 43.6 / 71.0 us (Inductor 24.7), 3 x 127 x
    33 x 33 7.2 / 9.8 (6.0); the forward 63.2 / 94.1 (37.0) and 7.3 / 13.1 (7.1); past a tile staged won
    (32 x 64 x 112 x 112 27.6 / 87.4, Inductor 35.9)."""
    found = set()
    for expr in fusion.exprs():
        if not isinstance(expr, VarMeanOp):
            continue
        logical = expr.tensor_inputs[0].get_logical_domain(no_reductions=True)
        reduced = [logical[a] for a in expr.axes if not logical[a].is_broadcast()]
        if len(reduced) < 2 or all(i.extent.value is not None for i in reduced):
            continue  # one axis: never staged; static extents: decided at compile time
        if _fits_one_tile(reduced, sizes):
            found.add(expr.tensor_outputs[0].name)
    return frozenset(found)


def _broadcast_back(expr: VarMeanOp) -> bool:
    """Whether a result of ``expr`` is broadcast back (a normalization reads it over the axes it
    reduces: batch-norm's forward). A normalization is not split across programs: one outer
    normalization over channels-last activations would have C / column-block programs."""
    return any(isinstance(use, BroadcastOp) for use in downstream_exprs(expr))


def _tensor(fusion: Fusion, source: TensorView, reduced: list[int], dtype: DataType,
            broadcast: Sequence[int] = ()) -> TensorView:
    """A new tensor over ``source``'s axes, those at ``reduced`` reduction axes and those at
    ``broadcast`` size-1 broadcast axes."""
    ids = [IterDomain(fusion, 1, IterType.Broadcast) if k in broadcast else
           IterDomain(fusion, i.extent, IterType.Reduction if k in reduced else
                      IterType.Broadcast if i.is_broadcast() else IterType.Iteration)
           for k, i in enumerate(source.get_logical_domain(no_reductions=True))]
    return TensorView(fusion, TensorDomain(ids), dtype)


def _stage(fusion: Fusion, expr: VarMeanOp, outer: int, inner: list[int]) -> None:
    """The first stage's partials, then the second stage as one normalization over them: the mean of
    the partial means, broadcast back, and the mean of each partial's variance plus its mean's squared
    deviation from it (two passes over the partials, so a mean far from 0 costs no precision). Both
    reductions read tensors of one space, so the second stage is one kernel."""
    x = expr.tensor_inputs[0]
    var, mean = expr.tensor_outputs
    part_var, part_mean = _tensor(fusion, x, inner, var.dtype), _tensor(fusion, x, inner, mean.dtype)
    VarMeanOp(fusion, part_var, part_mean, x, inner, 0)
    axis = outer - sum(a < outer for a in inner)  # the outer axis among the partials' axes
    new_mean = _tensor(fusion, part_mean, [axis], mean.dtype)
    ReductionOp(fusion, ReductionOpType.mean, new_mean, part_mean, [axis])
    rank = len(part_mean.get_logical_domain(no_reductions=True))
    flags = [k == axis for k in range(rank)]
    center = _tensor(fusion, part_mean, [], mean.dtype, broadcast=[axis])
    BroadcastOp(fusion, center, new_mean, flags)
    deviation = _tensor(fusion, part_mean, [], var.dtype)
    BinaryOp(fusion, BinaryOpType.sub, deviation, part_mean, center)
    square = _tensor(fusion, part_mean, [], var.dtype)
    BinaryOp(fusion, BinaryOpType.mul, square, deviation, deviation)
    spread = _tensor(fusion, part_var, [], var.dtype)
    BinaryOp(fusion, BinaryOpType.add, spread, part_var, square)
    new_var = _tensor(fusion, spread, [axis], var.dtype)
    ReductionOp(fusion, ReductionOpType.mean, new_var, spread, [axis])
    x.uses[:] = [e for e in x.uses if e is not expr]
    for old, new in ((var, new_var), (mean, new_mean)):
        for use in list(old.uses):
            use.replace_input(old, new)
        fusion.replace_output(old, new)
    fusion.mark_changed()
