"""pyfuser: a fusion compiler and multi-GPU runtime for PyTorch."""

from pyfuser import multidevice
from pyfuser.frontend import FusionDefinition
from pyfuser.ir import DataType, IterType, MemoryType, ParallelType, TensorView
from pyfuser.options import CommunicatorBackend

__all__ = ["CommunicatorBackend", "DataType", "FusionDefinition", "IterType", "MemoryType", "ParallelType", "TensorView",
           "multidevice"]
__version__ = "0.1.0"
