"""Turning a scheduled fusion into what runs it: one generated kernel, or the launches of a
grid reduction in order (``KernelSequence``), each compiled."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pyfuser.codegen.compiled_kernel import CompiledKernel
from pyfuser.codegen.grid_reduction import FinishStep, split_at_grid_reductions
from pyfuser.codegen.kernel_builder import KernelBuilder, Layouts
from pyfuser.codegen.kernel_source import KernelSource
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.tensor_view import TensorView


class KernelSequence:
    """Kernels launched one after another on a segment's inputs; a later one reads what an earlier
    one wrote (a grid reduction's partial results). Runs like one ``CompiledKernel``."""

    def __init__(self, name: str, kernels: list[CompiledKernel], reads: list[list[int]], outputs: list[int],
                 output_perms: tuple[tuple[int, ...], ...]) -> None:
        """``reads[k]``: the slots kernel ``k`` takes (the segment's inputs, then every kernel's
        outputs in launch order); ``outputs``: the slots of the segment's outputs."""
        self.name = name
        self.kernels = kernels
        self._reads = reads
        self._outputs = outputs
        self.output_perms = output_perms
        self.scheduled_ir = ""
        #: the heuristics it was scheduled with (set by the runtime; None for a manual schedule)
        self.scheduler_params: object = None

    @property
    def code(self) -> str:
        return "\n".join(k.code for k in self.kernels)

    def run(self, ctx: EvalContext, *args: Any, out: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        slots: list[Any] = list(args)
        for kernel, reads in zip(self.kernels, self._reads, strict=True):
            slots.extend(kernel.run(ctx, *[slots[s] for s in reads]))
        results = [slots[s] for s in self._outputs]
        if out is None:
            return results
        for buffer, result in zip(out, results, strict=True):
            buffer.copy_(result)
        return list(out)


def build_sources(fusion: Fusion, name: str, target: str, layouts: Layouts, reference: TensorView,
                  finish: FinishStep | None = None, loop_stages: int = 0, chunked: bool = False,
                  ) -> list[tuple[Fusion, KernelSource]]:
    """The kernels of scheduled ``fusion``, in launch order, with the fusion each one computes."""
    parts = split_at_grid_reductions(fusion, reference, finish)
    if len(parts) == 1:
        return [(fusion, KernelBuilder(fusion, name, target, layouts, reference, loop_stages, chunked).build())]
    result = []
    for k, part in enumerate(parts):
        part_layouts = dict(layouts)
        for tv in (*part.fusion.inputs(), *part.fusion.outputs()):
            if isinstance(tv, TensorView) and tv.name not in part_layouts:  # a partial: dense, row-major
                dims = tv.get_logical_domain(no_reductions=True)
                part_layouts[tv.name] = (tuple(range(len(dims))), [None if i.is_broadcast else True for i in dims])
        kind = "final" if k == len(parts) - 1 else f"partial{k}"
        stages = loop_stages if k == 0 else 0  # the final step is small
        result.append((part.fusion, KernelBuilder(part.fusion, f"{name}_{kind}", target, part_layouts,
                                                  part.reference, stages, chunked).build()))
    return result


def compile_fusion(fusion: Fusion, name: str, target: str, layouts: Layouts, reference: TensorView,
                   num_warps: int = 4, finish: FinishStep | None = None, loop_stages: int = 0,
                   chunked: bool = False) -> CompiledKernel | KernelSequence:
    """Build and compile the kernel(s) of scheduled ``fusion`` (``chunked``: it runs in a stream loop)."""
    built = build_sources(fusion, name, target, layouts, reference, finish, loop_stages, chunked)
    if len(built) == 1:
        return CompiledKernel(built[0][1], num_warps)
    slot_of = {_key(v): k for k, v in enumerate(fusion.inputs())}
    kernels, reads = [], []
    perm_of: dict[int, tuple[int, ...]] = {}
    next_slot = len(fusion.inputs())
    for part, source in built:
        reads.append([slot_of[_key(v)] for v in part.inputs()])
        kernels.append(CompiledKernel(source, num_warps))
        for v, perm in zip(part.outputs(), source.output_perms, strict=True):
            slot_of[_key(v)] = next_slot
            perm_of[next_slot] = tuple(perm)
            next_slot += 1
    outputs = [slot_of[_key(v)] for v in fusion.outputs()]
    return KernelSequence(name, kernels, reads, outputs, tuple(perm_of[s] for s in outputs))


def _key(v: Any) -> Any:
    return v.name if isinstance(v, TensorView) else ("s", v.symbol)
