"""The compile driver: each stage one named call, each dump named after its stage.

fusion -> preseg passes -> segmentation -> kernels (schedule + codegen per kernel segment) -> Host IR
lowering -> host passes -> HostIrEvaluator.
Passes rewrite a private copy: the user's definition and schedule stay as written.
"""

from __future__ import annotations

from pyfuser.host_ir.evaluator import HostIrEvaluator
from pyfuser.host_ir.lowering import lower_segmented_fusion
from pyfuser.host_ir.outputs import OutputLayout
from pyfuser.host_ir.passes.pipeline import run_host_passes
from pyfuser.ir.analysis.stream_axes import check_stream_schedules
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.ops import LinearOp, MatmulOp
from pyfuser.ir.ops.matmul import GroupedMmOp
from pyfuser.ir.tensor_view import TensorView
from pyfuser.options import CompileOptions, DisableOption, DumpOption, dump, num_streams
from pyfuser.preseg.pipeline import run_preseg_passes
from pyfuser.runtime.backends import COMMUNICATION_LOWERING, EXPR_LOWERINGS, HOST_PASSES, STEP_BUILDERS
from pyfuser.runtime.kernels import compile_kernels
from pyfuser.runtime.profiling import SegmentInfo
from pyfuser.scheduler.schedulers import is_kernel
from pyfuser.segmentation.segmented_fusion import SegmentedFusion, SegmentedGroup
from pyfuser.segmentation.segmenter import segment_fusion


def compile_fusion(fusion: Fusion, options: CompileOptions) -> HostIrEvaluator:
    dump(DumpOption.fusion_ir, lambda: f"{fusion}\n{fusion.transforms_string()}\n")
    dump(DumpOption.fusion_ir_math, fusion.math_string)
    check_stream_schedules(fusion)
    fusion = fusion.clone()
    run_preseg_passes(fusion, options)
    layouts = [OutputLayout.of(fusion, tv) for tv in fusion.outputs() if isinstance(tv, TensorView)]
    segmented = segment_fusion(fusion, options)
    dump(DumpOption.segmented_fusion, lambda: str(segmented))
    if options.is_disabled(DisableOption.matmul_expr_eval):
        _check_matmuls_schedulable(segmented)
    kernels = compile_kernels(segmented, options)
    container = lower_segmented_fusion(segmented, options, EXPR_LOWERINGS, COMMUNICATION_LOWERING, kernels)
    run_host_passes(container, options, HOST_PASSES)
    dump(DumpOption.host_ir, container.to_string)
    program = HostIrEvaluator(container, layouts, options.device, num_streams(), STEP_BUILDERS)
    program.segments = [SegmentInfo(kernels[id(g)].name if id(g) in kernels else _aten_segment_name(g), g.scheduler.name)
                        for g in segmented.groups]
    return program


def _aten_segment_name(group: SegmentedGroup) -> str:
    """An ATen-evaluated segment by its ops (``expr_eval: matmul, add``)."""
    ops = dict.fromkeys(type(e).__name__.removesuffix("Op").lower() for e in group.exprs)
    return f"{group.scheduler.name}: {', '.join(ops)}"


def _check_matmuls_schedulable(segmented: SegmentedFusion) -> None:
    """With ``matmul_expr_eval`` disabled a matmul has no executor: fail as nvFuser fails when no
    scheduler takes a segment."""
    for group in segmented.groups:
        matmul = next((e for e in group.exprs if isinstance(e, (MatmulOp, LinearOp, GroupedMmOp))), None)
        if matmul is not None and not is_kernel(group.scheduler):
            raise RuntimeError(f"Can not find a scheduler to schedule fusion segment {matmul.to_string().strip()}: "
                               "pyfuser runs matmul and linear as ATen calls only, and matmul_expr_eval is disabled")
