"""pyfuser: a fusion compiler and multi-GPU runtime for PyTorch.

``import pyfuser as nvfuser_direct`` gives the names of nvFuser's Python API that pyfuser
implements (``tests/frontend/test_nvfuser_direct_api.py`` lists them); after ``import pyfuser.nvfuser_direct_alias``
nvFuser code imports ``nvfuser_direct`` unchanged (unless a real nvFuser is installed).
"""

from pyfuser import idm, multidevice, nvfuser_direct_version, pytorch_utils, schedule
from pyfuser._nvfuser_alias import install_nvfuser_alias
from pyfuser.frontend import FusionDefinition
from pyfuser.frontend.caching import LruFusionCache
from pyfuser.frontend.descriptors import compute_tensor_descriptor
from pyfuser.frontend.kernel_executor import CompileParams, KernelExecutor
from pyfuser.frontend.profiler import PythonProfiler
from pyfuser.frontend.validate import get_val_tolerances, validate_with_auto_inferred_outputs
from pyfuser.idm import IdMappingMode
from pyfuser.integrations.dtensor import execute_with_dtensors
from pyfuser.ir import DataType, Fusion, IterType, MemoryType, Merge, ParallelType, Split, TensorView
from pyfuser.ir.ops import BroadcastOp, LoadStoreOpType, ReshapeOp, SqueezeOp
from pyfuser.ir.python_definition import translate_fusion
from pyfuser.nvfuser_direct_version import NvfuserVersion
from pyfuser.options import CommunicatorBackend
from pyfuser.runtime.executor import FusionExecutorCache
from pyfuser.runtime.fusion_cache import LRUCache
from pyfuser.schedule import SchedulerType

__version__ = "0.1.0"


def version() -> NvfuserVersion:
    """The version, comparable with version strings and ``Version`` objects (``version() > "0.0.0"``), as nvFuser's."""
    return NvfuserVersion(__version__)


__all__ = [
    "BroadcastOp", "CommunicatorBackend", "CompileParams", "DataType", "Fusion", "FusionDefinition",
    "FusionExecutorCache", "IdMappingMode", "IterType", "KernelExecutor", "LRUCache", "LoadStoreOpType",
    "LruFusionCache", "MemoryType", "Merge", "ParallelType", "PythonProfiler", "ReshapeOp", "SchedulerType", "Split",
    "SqueezeOp", "TensorView", "compute_tensor_descriptor", "execute_with_dtensors", "get_val_tolerances", "idm",
    "install_nvfuser_alias", "multidevice", "nvfuser_direct_version", "pytorch_utils", "schedule", "translate_fusion",
    "validate_with_auto_inferred_outputs", "version",
]
