"""``import pyfuser.nvfuser_direct_alias``: the one line that lets nvFuser code run unchanged.

After it, ``import nvfuser_direct`` / ``from nvfuser_direct import FusionDefinition`` give pyfuser,
unless a real nvFuser is installed (then that one is imported, untouched).
"""

from pyfuser import install_nvfuser_alias

install_nvfuser_alias()
