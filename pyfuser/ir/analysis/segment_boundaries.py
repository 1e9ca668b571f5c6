"""Which tensors can be segment boundaries, decided before segmentation (docs/loop_and_allocation.md).

Preseg must finalize the allocation of every tensor that segmentation may place on a boundary,
so this is a conservative superset of what any segmentation produces: fusion inputs and outputs,
global-memory tensors, results of the ops that end a kernel or run outside one (reductions,
matmul, linear, ``segment_set``, a resharding ``set`` = a communication), inputs of ops that run
outside a kernel, and tensors that a host loop produces or consumes (a Stream ID in their loop
domain or in a consumer's: host loops slice operands that live in global memory, docs/stream_lowering.md).
Every other intermediate is produced by a pointwise or shape op and consumed only by ops a kernel
fuses with it, so any segmentation inlines it; its (hinted) allocation stays open to schedulers.
"""

from __future__ import annotations

from pyfuser.ir.analysis.sharding import is_resharding
from pyfuser.ir.base import Expr
from pyfuser.ir.ops import LinearOp, LoadStoreOp, LoadStoreOpType, MatmulOp, ReductionOp, VarMeanOp
from pyfuser.ir.tensor_view import MemoryType, TensorView


def runs_outside_kernel(expr: Expr) -> bool:
    """Ops that read their inputs from global memory: ATen calls (matmul, linear), communications
    and forced boundaries (``segment_set``)."""
    if isinstance(expr, LoadStoreOp):
        return expr.kind is LoadStoreOpType.segment_set or is_resharding(expr)
    return isinstance(expr, MatmulOp | LinearOp)


def _has_stream_loop(tv: TensorView) -> bool:
    return any(i.is_stream for i in tv.get_loop_domain())


def can_be_segment_boundary(tv: TensorView) -> bool:
    if tv.is_fusion_input or tv.is_fusion_output or tv.memory_type is MemoryType.Global:
        return True
    definition = tv.definition
    if definition is not None and (runs_outside_kernel(definition) or isinstance(definition, ReductionOp | VarMeanOp)):
        return True
    if _has_stream_loop(tv) or any(_has_stream_loop(c) for use in tv.uses for c in use.tensor_outputs):
        return True
    return any(runs_outside_kernel(use) for use in tv.uses)
