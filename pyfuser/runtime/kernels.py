"""The kernel stage of the compile driver: each kernel segment is copied into a fusion of its own,
scheduled by its scheduler, turned into Triton source and compiled.

What the code generator may assume of each boundary tensor's layout is decided here, from who
produces it: a fusion input is as the layout key says (its declared or bound contiguity), a tensor
another kernel writes is dense in its allocation order, one an ATen call or a communication writes
promises nothing, and inside a stream loop every tensor is a chunk (a view) that promises nothing.
"""

from __future__ import annotations

import torch

from pyfuser.codegen.compiled_kernel import CompiledKernel
from pyfuser.codegen.kernel_sequence import KernelSequence, compile_fusion
from pyfuser.ir.analysis.allocation_order import allocation_perm
from pyfuser.ir.analysis.stream_axes import expr_stream_axis, fusion_stream_axes
from pyfuser.ir.domain_replay import is_permutation_of_logical, logical_order
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.layout import Layout
from pyfuser.ir.ops import LoadStoreOp
from pyfuser.ir.tensor_view import TensorView
from pyfuser.options import CompileOptions, DisableOption, DumpOption, dump
from pyfuser.runtime.size_dispatch import SizeDispatchedKernel
from pyfuser.scheduler.kernel_scheduling import Bucket, KernelScheduling
from pyfuser.scheduler.registry import SegmentView
from pyfuser.scheduler.schedulers import is_kernel, kernel_scheduler_for
from pyfuser.segmentation.segmented_fusion import SegmentedFusion, SegmentedGroup, boundaries, segment_fusion_copy


def kernel_target(device: torch.device) -> str:
    """What the code generator writes kernels on ``device`` for: compiled for CUDA, else run by Triton's
    interpreter (fd.execute's and manual_execute's kernels alike)."""
    return "cuda" if device.type == "cuda" else "interpreter"


def compile_kernels(segmented: SegmentedFusion, options: CompileOptions,
                    ) -> dict[int, CompiledKernel | KernelSequence | SizeDispatchedKernel]:
    """``id(group) -> kernel`` for every kernel segment."""
    fusion = segmented.fusion
    written_by_kernel = {id(t) for g in segmented.groups if is_kernel(g.scheduler) for t in g.outputs}
    kernels: dict[int, CompiledKernel | KernelSequence | SizeDispatchedKernel] = {}
    inherited = fusion_stream_axes(fusion)  # chunking propagated from stream-parallel inputs
    for k, group in enumerate(segmented.groups):
        if is_kernel(group.scheduler):
            chunked = any(expr_stream_axis(e, inherited) is not None for e in group.exprs)
            kernels[id(group)] = compile_group(fusion, group, k, written_by_kernel, options, chunked)
    return kernels


def compile_group(fusion: Fusion, group: SegmentedGroup, index: int, written_by_kernel: set[int],
                  options: CompileOptions, in_stream_loop: bool = False, known_layouts: dict[int, Layout] | None = None,
                  ) -> CompiledKernel | KernelSequence | SizeDispatchedKernel:
    """``known_layouts``: boundary tensors' layouts already decided (by name), for a part of a split
    segment, whose boundary is the segment's."""
    # In a stream loop a kernel gets chunks, and on many devices shards: either way not the extents
    # the fusion knows statically.
    chunked = in_stream_loop or any(
        i.is_device_dim for tv in (*group.inputs, *group.outputs) if isinstance(tv, TensorView)
        for i in (*tv.get_loop_domain(), *tv.get_allocation_domain()))
    layouts: dict[int, Layout] = {}
    for original in (*group.inputs, *group.outputs):
        if isinstance(original, TensorView):
            if known_layouts is not None and original.name in known_layouts:
                layouts[original.name] = known_layouts[original.name]
                continue
            dense = id(original) in written_by_kernel and not chunked
            layouts[original.name] = _layout(fusion, original, dense, chunked)
    scheduling = KernelScheduling.of(group.scheduler, options.device)
    name = kernel_name(group)
    target = kernel_target(options.device)

    unscheduled: list[Fusion] = []  # a copy analyzed for its extents, scheduled by the first build

    def build(bucket: Bucket | None) -> CompiledKernel | KernelSequence:
        copy = unscheduled.pop() if unscheduled else segment_fusion_copy(fusion, group)[0]
        split = scheduling.split_at(copy, bucket)
        sequence = _split_segment(copy, split, name, index, layouts, options, chunked) if split else None
        if sequence is not None:
            dump(DumpOption.scheduler_params, lambda: f"Segment g{index} ({group.scheduler.name}) for sizes {bucket}: "
                 f"split at {', '.join(t.short_name for t in split)}, its parts launched one after another\n")
            return sequence
        params = scheduling.heuristics(copy, bucket)
        dump(DumpOption.scheduler_params, lambda: f"Segment g{index} ({group.scheduler.name}):\n{params}")
        scheduling.schedule(copy, params)
        kernel = compile_fusion(copy, scheduling.launches(copy, params, bucket), name, target, layouts,
                                params.num_warps, narrow_warps=params.narrow_warps,
                                loop_stages=params.num_stages, chunked=chunked,
                                cooperative=DisableOption.cooperative_launch not in options.disabled,
                                l2=params.l2)
        kernel.scheduled_ir = scheduled_ir(copy)  # after rfactor: the partial results are in it
        kernel.scheduler_params = params
        dump(DumpOption.scheduled_fusion, lambda: f"Scheduled segment g{index} ({group.scheduler.name}):\n"
                                                  f"{kernel.scheduled_ir}")
        dump(DumpOption.kernel, lambda: f"Kernel of segment g{index} ({group.scheduler.name}):\n{kernel.code}\n")
        return kernel

    view, _ = segment_fusion_copy(fusion, group)
    unscheduled.append(view)
    buckets = scheduling.buckets(view)
    if buckets is None:
        return build(None)
    perms = tuple(layouts[o.name].perm for o in group.outputs)
    return SizeDispatchedKernel(name, build, buckets, perms)


def _split_segment(copy: Fusion, split: list[TensorView], name: str, index: int, layouts: dict[int, Layout],
                   options: CompileOptions, chunked: bool) -> KernelSequence | None:
    """A segment run as two launches (``Scheduler.split_at``): the first computes the ``split`` tensors
    (and any segment output among their producers), the second everything else, reading them from
    memory; each part is compiled as a segment of the scheduler that takes it (None where no kernel
    scheduler takes a part)."""
    at = {id(t) for t in split}
    first = Fusion.exprs_between(copy.inputs(), split)
    returned = [o for o in copy.outputs() if isinstance(o, TensorView) and id(o) not in at]
    rest = Fusion.exprs_between([*copy.inputs(), *split], returned)
    # A producer both parts need (a cast of the input) is computed by each, not passed between them.
    by_rest = {id(t) for e in rest for t in e.tensor_outputs}
    first_results = [t for e in first for t in e.tensor_outputs
                     if id(t) in at or (t.is_fusion_output and id(t) not in by_rest)]
    rest_results = [t for e in rest for t in e.tensor_outputs if t.is_fusion_output]
    parts: list[SegmentedGroup] = []
    for exprs, results in ((first, first_results), (rest, rest_results)):
        inputs, _ = boundaries(copy, exprs, set())
        scheduler = kernel_scheduler_for(SegmentView(exprs, inputs, results))
        if scheduler is None:  # the segment's own kernel serves these sizes too, if slower
            return None
        parts.append(SegmentedGroup(exprs, scheduler, inputs=inputs, outputs=results))
    slot_of = {id(v): k for k, v in enumerate(copy.inputs())}
    kernels, reads = [], []
    for part in parts:
        kernels.append(compile_group(copy, part, index, at, options, chunked, layouts))
        reads.append([slot_of[id(v)] for v in part.inputs])
        for t in part.outputs:
            slot_of[id(t)] = len(slot_of)
    outputs = [slot_of[id(o)] for o in copy.outputs()]
    perms = tuple(layouts[o.name].perm for o in copy.outputs() if isinstance(o, TensorView))
    sequence = KernelSequence(name, kernels, reads, outputs, perms)
    sequence.scheduled_ir = "\n".join(k.scheduled_ir for k in kernels)
    return sequence


#: How many characters of op names a kernel's name carries (Triton names the GPU function after it).
_NAME_OPS_LENGTH = 48


def kernel_name(group: SegmentedGroup) -> str:
    """``<scheduler>_<ops>_kernel``: the segment's distinct ops in order (as ``fd.ops`` names them, data
    movement between memories left out) up to ``_NAME_OPS_LENGTH`` characters, so a profile tells
    kernels apart as Inductor's ``triton_poi_fused_<ops>`` names do. Kernels of equal structure (one per
    layer) keep equal names, so their sources stay equal and compile once."""
    ops: list[str] = []
    length = 0
    for expr in group.exprs:
        if isinstance(expr, LoadStoreOp):
            continue
        op = expr.python_call().op
        if op in ops:
            continue
        if length + len(op) > _NAME_OPS_LENGTH:
            break
        ops.append(op)
        length += len(op) + 1
    return "_".join([group.scheduler.name, *ops, "kernel"])


def scheduled_ir(fusion: Fusion) -> str:
    """A scheduled fusion as nvFuser prints it: the math, then every tensor's domains."""
    return str(fusion) + "\n" + "\n".join(tv.transforms_string() for tv in fusion.tensors()) + "\n"


def _layout(fusion: Fusion, tv: TensorView, dense: bool, chunked: bool) -> Layout:
    # A fusion input is read as it was given (its allocation domain); a stride order required of it
    # as a fusion output is the layout of the copy the executor returns, not of the input.
    perm = _given_perm(tv) if tv.is_fusion_input else allocation_perm(fusion, tv)
    if dense:
        return Layout.dense(perm, [i.is_broadcast() for i in tv.get_logical_domain(no_reductions=True)])
    if chunked or not tv.is_fusion_input or not is_permutation_of_logical(tv, tv.get_allocation_domain()):
        return Layout(perm, (False,) * len(perm))
    return Layout.of(perm, tv.contiguity)


def _given_perm(tv: TensorView) -> tuple[int, ...]:
    """The allocation order of a fusion input's logical dims (without reductions), outermost first."""
    logical = tv.get_logical_domain(no_reductions=True)
    if not tv.has_allocation_domain():
        return tuple(range(len(logical)))
    position = {id(i): d for d, i in enumerate(logical)}
    return tuple(position[id(i)] for i in logical_order(tv) if not i.is_reduction())
