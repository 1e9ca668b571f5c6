"""Op nodes of the fusion IR. Each node knows its torch semantics, printing and ID map; op kinds
(``UnaryOpType``, ``BinaryOpType``, ...) are enums whose members carry their row of the op table."""

from pyfuser.ir.ops.creation import FullOp, IotaOp
from pyfuser.ir.ops.matmul import LinearOp, MatmulOp
from pyfuser.ir.ops.pointwise import BinaryOp, BinaryOpType, TernaryOp, TernaryOpType, UnaryOp, UnaryOpType
from pyfuser.ir.ops.reduction import ReductionOp, ReductionOpType, VarMeanOp, WelfordOp
from pyfuser.ir.ops.shape import (
    BroadcastOp,
    CatOp,
    ExpandOp,
    LoadStoreOp,
    LoadStoreOpType,
    PadOp,
    PermuteOp,
    ReshapeOp,
    SliceOp,
    SqueezeOp,
)

__all__ = [
    "BinaryOp", "BinaryOpType", "BroadcastOp", "CatOp", "ExpandOp", "FullOp", "IotaOp", "LinearOp", "LoadStoreOp",
    "LoadStoreOpType", "MatmulOp", "PadOp", "PermuteOp", "ReductionOp", "ReductionOpType", "ReshapeOp", "SliceOp",
    "SqueezeOp", "TernaryOp", "TernaryOpType", "UnaryOp", "UnaryOpType", "VarMeanOp", "WelfordOp",
]
