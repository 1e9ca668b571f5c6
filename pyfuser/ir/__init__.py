"""The fusion IR: values, expressions, iteration domains and their transforms."""

from pyfuser.ir.base import Expr, Scalar, Val
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import IterDomain, IterType, Merge, ParallelType, Split
from pyfuser.ir.tensor_domain import TensorDomain
from pyfuser.ir.tensor_view import MemoryType, TensorView

__all__ = ["DataType", "Expr", "Fusion", "IterDomain", "IterType", "MemoryType", "Merge", "ParallelType",
           "Scalar", "Split", "TensorDomain", "TensorView", "Val"]
