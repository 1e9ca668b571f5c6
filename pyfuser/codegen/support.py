"""What a generated kernel can compute, asked by schedulers before they accept a segment."""

from __future__ import annotations

from pyfuser.codegen.kernel_builder import INDEX_ONLY_OPS
from pyfuser.codegen.triton_support import compute_dtype, triton_dtype
from pyfuser.ir.base import Expr, Scalar
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.ops import BinaryOp, FullOp, IotaOp, LoadStoreOp, LoadStoreOpType, SqueezeOp, TernaryOp, UnaryOp


def unsupported_in_pointwise_kernel(expr: Expr) -> str | None:
    """Why a pointwise kernel cannot compute ``expr`` (None: it can)."""
    name = f"{expr.op_description} producing {expr.outputs[0]}"
    for v in (*expr.inputs, *expr.outputs):
        if triton_dtype(v.dtype) is None:
            return f"{name}: dtype {v.dtype} has no Triton type"
    if isinstance(expr, LoadStoreOp):
        if expr.kind is LoadStoreOpType.segment_set:
            return f"{name}: segment_set forces a segment boundary"
        return None
    if isinstance(expr, SqueezeOp) and expr.runtime_checked:
        return f"{name}: squeezing an axis of unknown size needs a size check at execution"
    if isinstance(expr, (*INDEX_ONLY_OPS, FullOp, IotaOp)):
        return None
    if isinstance(expr, UnaryOp | BinaryOp | TernaryOp):
        spec = expr.kind.spec
        if spec.triton is None:
            return f"{name}: {expr.kind.name} has no Triton lowering"
        if spec.floating_only and not compute_dtype(expr.outputs[0].dtype).is_floating:
            return f"{name}: {expr.kind.name} on {expr.outputs[0].dtype} is only exact as an ATen call"
        for v in expr.inputs:
            if isinstance(v, Scalar) and v.is_fusion_input and v.dtype is DataType.Double and \
                    compute_dtype(expr.outputs[0].dtype) is DataType.Double:
                return f"{name}: a double-precision scalar argument would be passed to Triton as float32"
        return None
    return f"{name}: {expr.op_description} is not computed by a pointwise kernel"
