"""pyfuser: a fusion compiler and multi-GPU runtime for PyTorch.

``import pyfuser as nvfuser_direct`` gives the names of nvFuser's Python API that pyfuser
implements (``tests/test_nvfuser_direct_api.py`` lists them).
"""

from torch.torch_version import TorchVersion

from pyfuser import multidevice
from pyfuser.frontend import FusionDefinition
from pyfuser.frontend.caching import LruFusionCache
from pyfuser.frontend.validate import get_val_tolerances, validate_with_auto_inferred_outputs
from pyfuser.integrations.dtensor import execute_with_dtensors
from pyfuser.ir import DataType, Fusion, IterType, MemoryType, ParallelType, TensorView
from pyfuser.ir.layout import tensor_descriptor as compute_tensor_descriptor
from pyfuser.ir.python_definition import translate_fusion
from pyfuser.options import CommunicatorBackend
from pyfuser.runtime.executor import FusionExecutorCache
from pyfuser.runtime.fusion_cache import LRUCache

__version__ = "0.1.0"


def version() -> TorchVersion:
    """The version, comparable with version strings (``version() > "0.0.0"``), as nvFuser's."""
    return TorchVersion(__version__)


__all__ = ["CommunicatorBackend", "DataType", "Fusion", "FusionDefinition", "FusionExecutorCache", "IterType",
           "LRUCache", "LruFusionCache", "MemoryType", "ParallelType", "TensorView", "compute_tensor_descriptor",
           "execute_with_dtensors", "get_val_tolerances", "multidevice", "translate_fusion",
           "validate_with_auto_inferred_outputs", "version"]
