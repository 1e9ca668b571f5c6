"""Multi-device execution: meshes, shardings, communications and the per-rank executor.

Importing this package registers the multi-device Host IR lowering (``lowering.py``). DTensor interop
lives in ``pyfuser.multidevice.dtensor`` (``DTensorFusion``).
"""

from pyfuser.multidevice import lowering as _lowering  # noqa: F401  (registers the lowerings)
from pyfuser.multidevice.comm_plan import CommunicationType
from pyfuser.multidevice.communicator import Communicator
from pyfuser.multidevice.device_mesh import DeviceMesh
from pyfuser.multidevice.executor import MultiDeviceExecutor, MultiDeviceExecutorParams
from pyfuser.multidevice.sharding import Sharding, shard_tensor, sharding_of

__all__ = ["CommunicationType", "Communicator", "DeviceMesh", "MultiDeviceExecutor", "MultiDeviceExecutorParams",
           "Sharding", "shard_tensor", "sharding_of"]
