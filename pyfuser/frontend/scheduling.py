"""Scheduling and kernel inspection from a FusionDefinition: ``fd.sched`` (nvFuser's name for the
schedule tools bound to the definition's fusion), ``fd.fusion.print_kernel()``."""

from __future__ import annotations

from collections.abc import Sequence

from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import ParallelType
from pyfuser.ir.tensor_view import TensorView
from pyfuser.runtime.manual import kernel_source
from pyfuser.scheduler import tools


class DefinedFusion(Fusion):
    """The fusion a FusionDefinition builds: a ``Fusion`` that can also print its kernel."""

    def kernel_code(self, target: str = "cuda") -> str:
        """The Triton source of this fusion as one kernel, as scheduled (nvFuser's ``print_kernel``)."""
        return kernel_source(self, target)

    def print_kernel(self, target: str = "cuda") -> str:
        text = self.kernel_code(target)
        print(text)
        return text


class ScheduleOps:
    """``fd.sched``: the schedule tools on this definition's fusion."""

    def __init__(self, fusion: Fusion) -> None:
        self._fusion = fusion

    def transform_like(self, ref: TensorView, selected_tvs: Sequence[TensorView] | None = None) -> None:
        tools.transform_like(ref, selected_tvs or None)

    def parallelize_like(self, ref: TensorView, selected_tvs: Sequence[TensorView] | None = None,
                         parallel_types: Sequence[ParallelType] | None = None) -> None:
        tools.parallelize_like(ref, selected_tvs or None, parallel_types)

    def inline_most(self, selected_tvs: Sequence[TensorView] | None = None) -> None:
        tools.inline_most(selected_tvs or None, fusion=self._fusion)

    def inline_at(self, reference_tv: TensorView, pos: int = -1, selected_tvs: Sequence[TensorView] | None = None) -> None:
        tools.inline_at(reference_tv, pos, selected_tvs or None)
