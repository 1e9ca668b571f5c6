"""nvFuser's ``KernelExecutor``: one fusion, scheduled by hand, compiled and run as one kernel.

``KernelExecutor().compile(fd.fusion, inputs)`` then ``.run(inputs)`` is ``fd.manual_execute``
split in two steps, as nvFuser's tests and tutorials call it; ``fd.ke`` is the executor behind
``fd.manual_execute``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pyfuser.ir.base import UnsupportedFeatureError
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.fusion import Fusion
from pyfuser.runtime.manual import ManualKernels


@dataclass(frozen=True)
class CompileParams:
    """nvFuser's nvrtc options. Triton's compiler picks a kernel's index width and registers itself,
    so these are checked and kept (``KernelExecutor.compile_params``) but change nothing in a
    pyfuser kernel (docs/architecture.md §11)."""

    index_type: DataType | None = None
    maxrregcount: int = 255
    enable_magic_zero: bool = True
    enable_ptxas_verbose: bool = False

    def __post_init__(self) -> None:
        if self.index_type not in (None, DataType.Int32, DataType.Int):
            raise ValueError(f"CompileParams: index_type must be DataType.Int32, DataType.Int or None, got "
                             f"{self.index_type!r}")
        if isinstance(self.maxrregcount, bool) or not isinstance(self.maxrregcount, int) or self.maxrregcount <= 0:
            raise ValueError(f"CompileParams: maxrregcount must be a positive int, got {self.maxrregcount!r}")


class KernelExecutor:
    """Compile a scheduled fusion for the inputs' layout, then run it (nvFuser's ``KernelExecutor``)."""

    def __init__(self, kernels: ManualKernels | None = None) -> None:
        self._kernels = kernels
        self.compile_params = CompileParams()

    def compile(self, fusion: Fusion, args: Sequence[Any] = (), compile_params: CompileParams | None = None) -> None:
        """Compile ``fusion`` as scheduled for ``args``' layout (dtypes, memory order, contiguity)."""
        if not isinstance(fusion, Fusion):
            raise TypeError(f"KernelExecutor.compile takes a Fusion (fd.fusion), got {type(fusion).__name__}")
        if compile_params is not None and not isinstance(compile_params, CompileParams):
            raise TypeError(f"KernelExecutor.compile: compile_params must be a CompileParams, got "
                            f"{type(compile_params).__name__}")
        if self._kernels is None or self._kernels.fusion is not fusion:
            self._kernels = ManualKernels(fusion)
        self.compile_params = compile_params or CompileParams()
        self._kernels.compile(list(args))

    def run(self, args: Sequence[Any]) -> list[torch.Tensor]:
        if self._kernels is None:
            raise ValueError("KernelExecutor.run: nothing is compiled; call compile(fusion, inputs) first")
        return self._kernels.run(list(args))

    def is_compiled(self) -> bool:
        return self._kernels is not None and self._kernels.is_compiled()

    def is_programmatic_dependent_launch_enabled(self) -> bool:
        """pyfuser launches Triton kernels without CUDA's programmatic dependent launch (a launch
        attribute nvFuser's executor sets): asking is refused rather than answered False, so code that
        relies on it learns why."""
        raise UnsupportedFeatureError("programmatic dependent launch (a CUDA launch attribute of nvFuser's kernels)",
                                      "pyfuser's kernels launch in stream order")
