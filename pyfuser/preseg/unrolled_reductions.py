"""Reductions of a few elements as pointwise math: a sum, product, max, min or mean over reduced axes of
at most ``UNROLL_LIMIT`` elements in all (constant extents) becomes one slice of its input per reduced
position, combined by pointwise ops.

A reduction kernel computes each result once, where its reduced elements meet; a consumer that reads a
result at another position (a slice, a pad, a rotation) cannot be in that kernel. The backward of
grouped-query attention sums the gradients of each K / V head's repeats (4 of them in a Llama with 16
heads and 4 KV heads), then RoPE's backward reads that sum rotated by half a head: a reduction kernel
that writes the sum, and pointwise kernels that rotate it. As pointwise math each result is recomputed
from its few elements wherever it is read, and the sum, the rotation and the transposed store are one
pointwise kernel. Inductor unrolls reductions of fewer than 8 elements the same way.
"""

from __future__ import annotations

import itertools
import math

from pyfuser.ir.base import Scalar
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import IterDomain, IterType
from pyfuser.ir.ops import BinaryOp, BinaryOpType, ReductionOp, ReductionOpType, SliceOp, SqueezeOp, UnaryOp, UnaryOpType
from pyfuser.ir.symbolic import as_sym
from pyfuser.ir.tensor_domain import TensorDomain
from pyfuser.ir.tensor_view import TensorView, new_like, user_scheduled
from pyfuser.options import CompileOptions

#: The most elements a reduction may combine per result and still become pointwise math: each result then
#: reads them all where it is needed (a consumer reading results at two positions reads twice as many).
#: Inductor's threshold (fewer than ``unroll_reductions_threshold`` = 8).
UNROLL_LIMIT = 7

_COMBINE = {
    ReductionOpType.sum: BinaryOpType.add,
    ReductionOpType.mean: BinaryOpType.add,
    ReductionOpType.prod: BinaryOpType.mul,
    ReductionOpType.max: BinaryOpType.maximum,
    ReductionOpType.min: BinaryOpType.minimum,
}

#: Accumulated in float32, as ATen's reductions of half-precision data do (one rounding, at the end).
_HALF = (DataType.Half, DataType.BFloat16)


def unroll_small_reductions(fusion: Fusion, options: CompileOptions) -> None:
    """Rewrite each reduction that ``unrolled_extents`` accepts into pointwise math."""
    for expr in fusion.exprs():
        if isinstance(expr, ReductionOp):
            extents = unrolled_extents(expr)
            if extents is not None:
                _unroll(fusion, expr, extents)


def unrolled_extents(expr: ReductionOp) -> list[int] | None:
    """The extents of the reduced axes of ``expr`` where it becomes pointwise math; None where it stays a
    reduction: more than ``UNROLL_LIMIT`` elements per result or a symbolic extent, a reduced broadcast
    axis (an expanded input reads one element for all), a sharded or user-scheduled tensor, a finishing
    step of an rfactored mean, or a boolean / complex input."""
    x, out = expr.tensor_inputs[0], expr.output
    if (expr.count_ids or not expr.axes or x.device_mesh is not None or user_scheduled(x) or user_scheduled(out)
            or out.has_allocation_domain() or x.dtype is DataType.Bool or x.dtype.is_complex):
        return None
    logical = x.get_logical_domain(no_reductions=True)
    extents: list[int] = []
    for a in expr.axes:
        value = logical[a].extent.value
        if logical[a].is_broadcast() or value is None:
            return None
        extents.append(int(value))
    return extents if 1 <= math.prod(extents) <= UNROLL_LIMIT else None


def _unroll(fusion: Fusion, expr: ReductionOp, extents: list[int]) -> None:
    """One slice of the input per reduced position (extent 1 on each reduced axis), each cast to the
    accumulation dtype, combined left to right, a mean divided by the count, cast to the result's dtype
    and squeezed to its shape; the result replaces ``expr``'s in its consumers and the outputs."""
    x, out = expr.tensor_inputs[0], expr.output
    logical = x.get_logical_domain(no_reductions=True)
    rounds = expr.kind not in (ReductionOpType.max, ReductionOpType.min)  # max and min are exact
    accumulate = DataType.Float if out.dtype in _HALF and rounds else out.dtype
    pieces = []
    for position in itertools.product(*(range(e) for e in extents)):
        start = dict(zip(expr.axes, position, strict=True))
        ranges = [(as_sym(start[d]), as_sym(start[d] + 1), 1) if d in start else (as_sym(0), i.extent, 1)
                  for d, i in enumerate(logical)]
        piece = TensorView(fusion, TensorDomain([IterDomain(fusion, 1, IterType.Broadcast) if d in start else i.clone()
                                                 for d, i in enumerate(logical)]), x.dtype)
        SliceOp(fusion, piece, x, ranges)
        pieces.append(_cast(fusion, piece, accumulate))
    combined = pieces[0]
    for piece in pieces[1:]:
        total = new_like(combined, accumulate)
        BinaryOp(fusion, _COMBINE[expr.kind], total, combined, piece)
        combined = total
    if expr.kind is ReductionOpType.mean:
        mean = new_like(combined, accumulate)
        BinaryOp(fusion, BinaryOpType.truediv, mean, combined, Scalar(fusion, accumulate, math.prod(extents)))
        combined = mean
    combined = _cast(fusion, combined, out.dtype)
    result = new_like(out)
    SqueezeOp(fusion, result, combined, [d in expr.axes for d in range(len(logical))])
    x.uses[:] = [e for e in x.uses if e is not expr]
    for use in list(out.uses):
        use.replace_input(out, result)
    order = fusion.get_output_stride_order(out) if out.is_fusion_output else None
    fusion.replace_output(out, result)
    if order is not None:
        fusion.set_output_stride_order(result, order)
    fusion.mark_changed()


def _cast(fusion: Fusion, tv: TensorView, dtype: DataType) -> TensorView:
    if tv.dtype is dtype:
        return tv
    cast = new_like(tv, dtype)
    UnaryOp(fusion, UnaryOpType.cast, cast, tv)
    return cast
