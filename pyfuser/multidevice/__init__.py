"""Multi-device execution, as nvFuser's ``nvfuser_direct.multidevice`` spells it: meshes, the
communicator, shardings and the per-rank executor.

A public façade over several layers (``ir`` meshes and sharding analysis, the ``comm`` layer, the
``runtime`` executor); nothing below imports it. DTensor interop lives in
``pyfuser.integrations.dtensor`` (``DTensorFusion``).
"""

from pyfuser.comm.comm_plan import CommunicationType
from pyfuser.comm.communicator import Communicator
from pyfuser.comm.shards import shard_tensor
from pyfuser.ir.analysis.sharding import Sharding, sharding_of
from pyfuser.ir.device_mesh import DeviceMesh
from pyfuser.options import CommunicatorBackend
from pyfuser.runtime.multidevice_executor import MultiDeviceExecutor, MultiDeviceExecutorParams

__all__ = ["CommunicationType", "Communicator", "CommunicatorBackend", "DeviceMesh", "MultiDeviceExecutor",
           "MultiDeviceExecutorParams", "Sharding", "shard_tensor", "sharding_of"]
