"""What a generated kernel can compute, asked by schedulers before they accept a segment."""

from __future__ import annotations

from collections.abc import Sequence

from pyfuser.codegen.triton_ops import TRITON_POINTWISE
from pyfuser.codegen.triton_support import compute_dtype, triton_dtype
from pyfuser.codegen.values import INDEX_ONLY_OPS
from pyfuser.ir.analysis.reshape import reshape_groups
from pyfuser.ir.analysis.resize import RESIZE_OPS
from pyfuser.ir.base import Expr, Scalar
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.ops import (
    BinaryOp,
    BinaryOpType,
    FullOp,
    IotaOp,
    LoadStoreOp,
    LoadStoreOpType,
    ReductionOp,
    ReshapeOp,
    SqueezeOp,
    TernaryOp,
    UnaryOp,
    VarMeanOp,
    WelfordOp,
)
from pyfuser.ir.ops.indexing import EmbeddingFwdOp, IndexedRead
from pyfuser.ir.ops.rfactor import RFactorOp


def unsupported_in_pointwise_kernel(expr: Expr) -> str | None:
    """Why a pointwise kernel cannot compute ``expr`` (None: it can), naming the op and the tensor it
    produces (written only for a refusal: the segmenter asks of every expr of every candidate segment)."""
    cause = _pointwise_refusal(expr)
    return None if cause is None else f"{expr.op_description} producing {expr.outputs[0]}: {cause}"


def _pointwise_refusal(expr: Expr) -> str | None:
    """``unsupported_in_pointwise_kernel``'s cause, without the op's name."""
    for v in (*expr.inputs, *expr.outputs):
        if triton_dtype(v.dtype) is None:
            return f"dtype {v.dtype} has no Triton type"
    if isinstance(expr, LoadStoreOp):
        if expr.kind is LoadStoreOpType.segment_set:
            return "segment_set forces a segment boundary"
        return None
    if isinstance(expr, SqueezeOp) and expr.runtime_checked:
        return "squeezing an axis of unknown size needs a size check at execution"
    if isinstance(expr, (*INDEX_ONLY_OPS, *RESIZE_OPS, FullOp, IotaOp)):
        return None
    if isinstance(expr, ReshapeOp):
        if reshape_groups(expr) is None:
            return "its groups of axes are not known from its extents (symbolic, or empty)"
        return None
    if isinstance(expr, IndexedRead):
        return _indexed_read_refusal(expr)
    if isinstance(expr, UnaryOp | BinaryOp | TernaryOp):
        lowering = TRITON_POINTWISE.get(expr.kind)
        if lowering is None:
            return f"{expr.kind.name} has no Triton lowering"
        if lowering.floating_only and not compute_dtype(expr.outputs[0].dtype).is_floating:
            return f"{expr.kind.name} on {expr.outputs[0].dtype} is only exact as an ATen call"
        if isinstance(expr, BinaryOp) and expr.kind in _INTEGER_DIVISIONS and _divides_integers_by_maybe_zero(expr):
            return "integer division by a value that may be 0, for which ATen raises and a kernel cannot"
        for v in expr.inputs:
            if isinstance(v, Scalar) and v.is_fusion_input and v.dtype is DataType.Double and \
                    compute_dtype(expr.outputs[0].dtype) is DataType.Double:
                return "a double-precision scalar argument would be passed to Triton as float32"
        return None
    return f"{expr.op_description} is not computed by a pointwise kernel"


def _indexed_read_refusal(expr: IndexedRead) -> str | None:
    """An indirect load computes index_select, gather and embedding's rows (``values.py``), from a lookup
    tensor of at least one axis; embedding only without ``max_norm`` (which renormalizes the rows it
    reads) and ``padding_idx`` (no forward value depends on it, but its range is ATen's check)."""
    lookup = expr.lookup
    if lookup.ndim == 0:
        return f"a 0-dim lookup tensor {lookup.short_name}"
    if isinstance(expr, EmbeddingFwdOp):
        for option in ("max_norm", "padding_idx"):
            if expr.option(option) is not None:
                return f"embedding with {option} is an ATen call"
    return None


def unsupported_indexed_reads(exprs: Sequence[Expr]) -> str | None:
    """Why one kernel cannot compute the ``IndexedRead``s of a segment of ``exprs`` (None: it can): each
    reads its lookup tensor at positions only known when its index is, so the tensor must be in global
    memory when the kernel starts (a segment input), never a value the kernel computes at its consumer's
    loop point (nvFuser's rule for the lookup tv of index_select and gather)."""
    produced = {id(o) for e in exprs for o in e.outputs}
    for e in exprs:
        if isinstance(e, IndexedRead) and id(e.lookup) in produced:
            return (f"{e.op_description} producing {e.outputs[0]}: its lookup tensor {e.lookup.short_name} is "
                    "computed in the segment; a kernel reads it at indexed positions from a segment input")
    return None


#: ops that divide integers (a quotient or a remainder): ATen raises for a 0 divisor
_INTEGER_DIVISIONS = (BinaryOpType.div, BinaryOpType.fmod, BinaryOpType.mod)


def _divides_integers_by_maybe_zero(expr: BinaryOp) -> bool:
    """An integer quotient or remainder whose divisor is not a non-zero constant: ATen raises for a 0
    divisor (the default path's ValueError), a kernel would return garbage, so it runs as ATen."""
    lhs, rhs = expr.inputs
    if any(v.dtype.is_floating or v.dtype.is_complex for v in (lhs, rhs)):
        return False
    return not (isinstance(rhs, Scalar) and rhs.is_const and rhs.value != 0)


def unsupported_in_reduction_kernel(expr: Expr) -> str | None:
    """Why a reduction or normalization kernel cannot compute ``expr`` (None: it can): what a
    pointwise kernel computes, plus sum / prod / max / min / mean and var_mean reductions (a reshape:
    where it regroups kept axes only; a slice, pad or cat: where it reads no reduced value at another
    program's point; the reduction analysis asks both)."""
    if isinstance(expr, (WelfordOp, RFactorOp)):
        return f"{expr.op_description} producing {expr.outputs[0]}: not generated by the reduction schedulers"
    if isinstance(expr, ReductionOp | VarMeanOp):
        for v in (*expr.inputs, *expr.outputs):
            if triton_dtype(v.dtype) is None:
                return f"{expr.op_description} producing {expr.outputs[0]}: dtype {v.dtype} has no Triton type"
        return None
    return unsupported_in_pointwise_kernel(expr)
