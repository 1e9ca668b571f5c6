"""Register pyfuser as ``nvfuser_direct`` so that nvFuser code imports it unchanged.

Only a rename: ``nvfuser_direct`` is the ``pyfuser`` package object and ``nvfuser_direct.X`` is the
module ``pyfuser.X`` (the same object, so classes compare equal whichever name imported them). A real
nvFuser installation always wins: nothing is registered when ``nvfuser_direct`` can be imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

ALIAS = "nvfuser_direct"


class _AliasLoader(importlib.abc.Loader):
    """Returns the already imported ``pyfuser.X`` for ``nvfuser_direct.X``."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.spec = module.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamps the alias' spec on the module; pyfuser's own name stays its identity.
        module.__spec__ = self.spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(ALIAS + "."):
            return None
        try:
            module = importlib.import_module("pyfuser" + fullname[len(ALIAS):])
        except ModuleNotFoundError:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(module))


def _real_nvfuser_importable() -> bool:
    try:
        return importlib.util.find_spec(ALIAS) is not None
    except (ImportError, ValueError):
        return False


def install_nvfuser_alias() -> bool:
    """Make ``import nvfuser_direct`` import pyfuser unless a real nvFuser is importable.

    Returns whether ``nvfuser_direct`` now names pyfuser.
    """
    pyfuser = sys.modules["pyfuser"]
    current = sys.modules.get(ALIAS)
    if current is not None:
        return current is pyfuser
    if _real_nvfuser_importable():
        return False
    sys.modules[ALIAS] = pyfuser
    if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
    return True
