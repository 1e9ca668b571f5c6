"""The kernel stage of the compile driver: each kernel segment is copied into a fusion of its own,
scheduled by its scheduler, turned into Triton source and compiled.

What the code generator may assume of each boundary tensor's layout is decided here, from who
produces it: a fusion input is as the layout key says (its declared or bound contiguity), a tensor
another kernel writes is dense in its allocation order, one an ATen call or a communication writes
promises nothing, and inside a stream loop every tensor is a chunk (a view) that promises nothing.
"""

from __future__ import annotations

from pyfuser.codegen.compiled_kernel import CompiledKernel
from pyfuser.codegen.kernel_sequence import KernelSequence, compile_fusion
from pyfuser.ir.analysis.allocation_order import allocation_perm
from pyfuser.ir.analysis.stream_axes import expr_stream_axis
from pyfuser.ir.domain_replay import is_permutation_of_logical
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.tensor_view import TensorView
from pyfuser.options import CompileOptions, DumpOption, dump
from pyfuser.scheduler.schedulers import SCHEDULERS
from pyfuser.segmentation.segmented_fusion import SegmentedFusion, SegmentedGroup, segment_fusion_copy

Layout = tuple[tuple[int, ...], list[bool | None]]


def kernel_target(options: CompileOptions) -> str:
    return "cuda" if options.device.type == "cuda" else "interpreter"


def compile_kernels(segmented: SegmentedFusion, options: CompileOptions,
                    ) -> dict[int, CompiledKernel | KernelSequence]:
    """``id(group) -> kernel`` for every kernel segment."""
    fusion = segmented.fusion
    written_by_kernel = {id(t) for g in segmented.groups if g.scheduler.is_kernel for t in g.outputs}
    kernels: dict[int, CompiledKernel | KernelSequence] = {}
    for k, group in enumerate(segmented.groups):
        if group.scheduler.is_kernel:
            kernels[id(group)] = compile_group(fusion, group, k, written_by_kernel, options)
    return kernels


def compile_group(fusion: Fusion, group: SegmentedGroup, index: int, written_by_kernel: set[int],
                  options: CompileOptions) -> CompiledKernel | KernelSequence:
    copy, _ = segment_fusion_copy(fusion, group)
    scheduler = SCHEDULERS[group.scheduler]
    params = scheduler.compute_heuristics(copy, ())
    dump(DumpOption.scheduler_params, lambda: f"Segment g{index} ({group.scheduler.name}):\n{params}")
    scheduler.schedule(copy, params)
    chunked = any(expr_stream_axis(e) is not None for e in group.exprs)
    layouts: dict[int, Layout] = {}
    for original in (*group.inputs, *group.outputs):
        if isinstance(original, TensorView):
            dense = id(original) in written_by_kernel and not chunked
            layouts[original.name] = _layout(fusion, original, dense, chunked)
    reference = next(tv for tv in copy.outputs() if isinstance(tv, TensorView) and tv.name == params.reference)
    kernel = compile_fusion(copy, f"{group.scheduler.name}_kernel", kernel_target(options), layouts, reference,
                            params.num_warps)
    dump(DumpOption.kernel, lambda: f"Kernel of segment g{index} ({group.scheduler.name}):\n{kernel.code}\n")
    return kernel


def _layout(fusion: Fusion, tv: TensorView, dense: bool, chunked: bool) -> Layout:
    perm = allocation_perm(fusion, tv)
    if dense:
        return perm, [None if tv.get_logical_domain(no_reductions=True)[d].is_broadcast else True for d in perm]
    if chunked or not tv.is_fusion_input or not is_permutation_of_logical(tv, tv.get_allocation_domain()):
        return perm, [False] * len(perm)
    return perm, list(tv.contiguity)
