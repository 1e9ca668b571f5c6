"""The ordered list of pre-segmentation passes, in one place."""

from __future__ import annotations

from pyfuser.ir.fusion import Fusion
from pyfuser.ir.pass_manager import Pass, run_passes
from pyfuser.options import CompileOptions, DisableOption, DumpOption
from pyfuser.preseg.allocation_order_inference import infer_allocation_order
from pyfuser.preseg.decompose_resharding import decompose_resharding
from pyfuser.preseg.forward_input_broadcasts import forward_input_broadcasts
from pyfuser.preseg.identity_casts import drop_identity_casts
from pyfuser.preseg.input_layouts import bind_input_layouts
from pyfuser.preseg.loop_allocation_decoupling import decouple_loop_and_allocation
from pyfuser.preseg.propagate_shardings import propagate_shardings
from pyfuser.preseg.required_output_layouts import apply_required_output_layouts
from pyfuser.preseg.staged_var_mean import stage_var_means
from pyfuser.preseg.unrolled_reductions import unroll_small_reductions
from pyfuser.preseg.view_friendly_layouts import permuted_layouts_for_reshapes

#: In the order they run. Layout passes run after the sharding passes, and
#: ``decouple_loop_and_allocation`` runs last: it freezes segment-boundary allocations.
PRESEG_PASSES: list[Pass[Fusion]] = [
    Pass("drop_identity_casts", drop_identity_casts),
    Pass("forward_input_broadcasts", forward_input_broadcasts),
    Pass("propagate_shardings", propagate_shardings),
    Pass("decompose_resharding", decompose_resharding),
    Pass("unroll_small_reductions", unroll_small_reductions),
    Pass("bind_input_layouts", bind_input_layouts),
    Pass("apply_required_output_layouts", apply_required_output_layouts),
    Pass("stage_var_means", stage_var_means),
    Pass("infer_allocation_order", infer_allocation_order, disabled_by=DisableOption.infer_contiguity),
    Pass("permuted_layouts_for_reshapes", permuted_layouts_for_reshapes, disabled_by=DisableOption.infer_contiguity),
    Pass("decouple_loop_and_allocation", decouple_loop_and_allocation),
]


def _describe(fusion: Fusion, name: str) -> str:
    return f"Fusion IR after pre-segmenter pass {name}:\n{fusion}\n{fusion.transforms_string()}\n"


def run_preseg_passes(fusion: Fusion, options: CompileOptions) -> None:
    run_passes(PRESEG_PASSES, fusion, options, DumpOption.fusion_ir_preseg, _describe)
