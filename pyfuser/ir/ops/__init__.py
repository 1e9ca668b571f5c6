"""Op nodes of the fusion IR. Each node knows its torch semantics, printing and ID map."""

from pyfuser.ir.ops.creation import FullOp, IotaOp
from pyfuser.ir.ops.matmul import LinearOp, MatmulOp
from pyfuser.ir.ops.pointwise import BinaryOp, TernaryOp, UnaryOp
from pyfuser.ir.ops.reduction import ReductionOp, VarMeanOp
from pyfuser.ir.ops.shape import (
    BroadcastOp,
    CatOp,
    ExpandOp,
    LoadStoreOp,
    PadOp,
    PermuteOp,
    ReshapeOp,
    SliceOp,
    SqueezeOp,
    new_like,
    set_op,
)

__all__ = [
    "BinaryOp", "BroadcastOp", "CatOp", "ExpandOp", "FullOp", "IotaOp", "LinearOp", "LoadStoreOp",
    "MatmulOp", "PadOp", "PermuteOp", "ReductionOp", "ReshapeOp", "SliceOp", "SqueezeOp", "TernaryOp",
    "UnaryOp", "VarMeanOp", "new_like", "set_op",
]
