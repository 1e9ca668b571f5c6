"""Version comparisons under the names of nvFuser's ``nvfuser_direct.nvfuser_direct_version``:
``version() > Version("0.0.0")`` compares release numbers, as ``version() > "0.0.0"`` does."""

from torch.torch_version import TorchVersion as NvfuserVersion
from torch.torch_version import Version

__all__ = ["NvfuserVersion", "Version"]
