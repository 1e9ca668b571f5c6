"""The fusion IR: values, expressions, iteration domains and their transforms."""

from pyfuser.ir.base import Expr, Scalar, Val
from pyfuser.ir.device_mesh import DeviceMesh
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import IterDomain, IterType, Merge, ParallelType, Split
from pyfuser.ir.tensor_domain import TensorDomain
from pyfuser.ir.tensor_view import MemoryType, TensorView

__all__ = ["DataType", "DeviceMesh", "EvalContext", "Expr", "Fusion", "IterDomain", "IterType", "MemoryType", "Merge",
           "ParallelType", "Scalar", "Split", "TensorDomain", "TensorView", "Val"]
