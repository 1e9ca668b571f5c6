"""Manual execution: a whole fusion, scheduled by the user (or by ``schedule.schedule``), compiled
as one kernel exactly as written (nvFuser's ``KernelExecutor``, behind ``fd.manual_execute``).

No preseg pass, no segmentation: the user's loop domains are the kernel. An output the user left
unscheduled follows the reference output (the first one the user scheduled), since every output
of one kernel is written from one loop nest. Kernels are compiled per input layout (memory order,
density, dtypes), like programs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from pyfuser.codegen.compiled_kernel import CompiledKernel
from pyfuser.codegen.kernel_sequence import KernelSequence, build_sources, compile_fusion
from pyfuser.codegen.values import L2Hint
from pyfuser.ir.analysis.allocation_order import allocation_perm
from pyfuser.ir.eval_context import EvalContext, NoPrograms
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import ParallelType
from pyfuser.ir.layout import Layout, contiguity_of_strides, memory_order
from pyfuser.ir.tensor_view import TensorView
from pyfuser.runtime import profiling
from pyfuser.runtime.inputs import InputBinder
from pyfuser.runtime.kernels import kernel_target
from pyfuser.scheduler.kernel_scheduling import manual_launches
from pyfuser.scheduler.registry import Machine
from pyfuser.scheduler.tools import parallelize_like, transform_like


def _scheduled(tv: TensorView) -> bool:
    loop, logical = tv.get_loop_domain(), tv.get_logical_domain()
    return len(loop) != len(logical) or any(a is not b for a, b in zip(loop, logical, strict=True)) or \
        any(i.parallel_type is not ParallelType.serial for i in loop)


def _reference(fusion: Fusion, name: int | None) -> TensorView:
    outputs = [o for o in fusion.outputs() if isinstance(o, TensorView)]
    if not outputs:
        raise ValueError("the fusion has no tensor outputs; call fd.add_output(tv) first")
    if name is not None:
        return next(tv for tv in fusion.tensors() if tv.name == name)  # a reduction may lead the nest
    return next((o for o in outputs if _scheduled(o)), outputs[0])


class ManualKernels:
    """The kernels of one fusion compiled as scheduled, by input layout."""

    def __init__(self, fusion: Fusion) -> None:
        self.fusion = fusion
        self._version = -1
        self._kernels: dict[tuple[Any, ...], CompiledKernel | KernelSequence] = {}
        self._binder: InputBinder | None = None
        self.last: CompiledKernel | KernelSequence | None = None
        #: milliseconds the latest ``compile`` spent compiling (0 when its kernel was cached), for the profiler
        self.last_compile_ms = 0.0

    def compile(self, args: Sequence[Any], reference: int | None = None, num_warps: int = 4,
                loop_stages: int = 0, l2: L2Hint = L2Hint.keep) -> CompiledKernel | KernelSequence:
        """The kernel for ``args``' layout (compiled now unless it already is), without running it."""
        if self._version != self.fusion.version:
            self._kernels.clear()
            self._binder = InputBinder(self.fusion.inputs())
            self._version = self.fusion.version
        binder = self._binder
        assert binder is not None
        binder.check(args)
        device = _device_of(args)
        key = (tuple((a.dtype, tuple(memory_order(a.shape, a.stride())), tuple(s == 1 for s in a.shape),
                      tuple(contiguity_of_strides(a.shape, a.stride(), memory_order(a.shape, a.stride()),
                                                  [s == 1 for s in a.shape])))
                     if isinstance(a, torch.Tensor) else type(a) for a in args), device.type, reference, num_warps, loop_stages,
               l2)
        kernel = self._kernels.get(key)
        self.last_compile_ms = 0.0
        if kernel is None:
            begun = time.perf_counter()
            kernel = self._kernels[key] = self._compile(args, device, reference, num_warps, loop_stages, l2)
            self.last_compile_ms = (time.perf_counter() - begun) * 1e3
        return kernel

    def is_compiled(self) -> bool:
        """Whether a kernel of the fusion as it now stands is compiled (for some input layout)."""
        return self._version == self.fusion.version and bool(self._kernels)

    def run(self, args: Sequence[Any], reference: int | None = None, num_warps: int = 4,
            loop_stages: int = 0, l2: L2Hint = L2Hint.keep) -> list[torch.Tensor]:
        started = time.perf_counter() if profiling.active() else 0.0
        args = list(args)
        kernel = self.compile(args, reference, num_warps, loop_stages, l2)
        binder = self._binder
        assert binder is not None
        device = _device_of(args)
        self.last = kernel
        if binder.has_scalars:
            args = binder.coerce(args)
        try:
            outputs = kernel.run(EvalContext(binder.bind(args), device), *args)
            if started:  # one kernel, scheduled by the user (nvFuser's scheduler name "user")
                profiling.record(self.fusion, [profiling.SegmentInfo(kernel.name, "user")], device, started, args,
                                 outputs, self.last_compile_ms)
            return outputs
        except NoPrograms:
            names = ", ".join(o.short_name for o in self.fusion.outputs() if isinstance(o, TensorView))
            raise ValueError(f"manual_execute: the schedule's grid has no program for these sizes (an extent it spans "
                             f"is 0), but not every output ({names}) is empty, so no program would write them; "
                             "fd.execute computes them for such sizes") from None

    def _compile(self, args: Sequence[Any], device: torch.device, reference: int | None,
                 num_warps: int, loop_stages: int, l2: L2Hint) -> CompiledKernel | KernelSequence:
        layouts: dict[int, Layout] = {}
        for tv, a in zip(self.fusion.inputs(), args, strict=True):
            if isinstance(tv, TensorView):
                order = tuple(memory_order(a.shape, a.stride()))
                layouts[tv.name] = Layout.of(order, contiguity_of_strides(a.shape, a.stride(), order,
                                                                          [s == 1 for s in a.shape]))
        target = kernel_target(device)
        copy, ref, layouts = _prepared(self.fusion, reference, layouts)
        # A schedule from a scheduler (its params name the reference) gets the scheduler's final step
        # for a grid reduction; a hand-written one keeps its own.
        parts = manual_launches(copy, ref, Machine.of(device) if reference is not None else None)
        return compile_fusion(copy, parts, "manual_kernel", target, layouts, num_warps, loop_stages,
                              l2=l2)


def _device_of(args: Sequence[Any]) -> torch.device:
    """Where a manual kernel runs: its first tensor input's device (the CPU's interpreter without one)."""
    return next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))


def _prepared(fusion: Fusion, reference: int | None, input_layouts: dict[int, Layout] | None,
              ) -> tuple[Fusion, TensorView, dict[int, Layout]]:
    """A copy of ``fusion`` whose unscheduled outputs follow the reference, and every layout."""
    copy = fusion.clone()
    ref = _reference(copy, reference)
    pending = [o for o in copy.outputs() if isinstance(o, TensorView) and o is not ref and not _scheduled(o)]
    if pending and _scheduled(ref):
        transform_like(ref, pending)
        parallelize_like(ref, pending)
    layouts: dict[int, Layout] = dict(input_layouts or {})
    for tv in copy.inputs():
        if isinstance(tv, TensorView) and tv.name not in layouts:
            layouts[tv.name] = Layout.of(allocation_perm(copy, tv), tv.contiguity)
    for out in copy.outputs():
        if isinstance(out, TensorView):
            broadcast = [i.is_broadcast() for i in out.get_logical_domain(no_reductions=True)]
            layouts[out.name] = Layout.dense(allocation_perm(copy, out), broadcast)
    return copy, ref, layouts


def kernel_source(fusion: Fusion, target: str = "cuda", reference: int | None = None,
                  input_layouts: dict[int, Layout] | None = None) -> str:
    """The Triton source of the kernel(s) of ``fusion`` as scheduled, in launch order.
    ``input_layouts``: what is known of the inputs' layouts (default: their declared allocation
    and contiguity)."""
    copy, ref, layouts = _prepared(fusion, reference, input_layouts)
    parts = manual_launches(copy, ref, None)
    return "\n".join(source.source for _, source in build_sources(parts, "manual_kernel", target, layouts))
