"""The ordered list of pre-segmentation passes, in one place."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pyfuser.ir.fusion import Fusion
from pyfuser.preseg.allocation_order_inference import infer_allocation_order
from pyfuser.preseg.decompose_resharding import decompose_resharding
from pyfuser.preseg.input_layouts import bind_input_layouts
from pyfuser.preseg.loop_allocation_decoupling import decouple_loop_and_allocation
from pyfuser.preseg.propagate_shardings import propagate_shardings
from pyfuser.preseg.required_output_layouts import apply_required_output_layouts
from pyfuser.runtime.options import dump_enabled

if TYPE_CHECKING:
    from pyfuser.runtime.executor import CompileOptions

Pass = Callable[[Fusion, "CompileOptions"], None]

#: (name, pass) in the order they run. Layout passes run after the sharding passes, and
#: ``decouple_loop_and_allocation`` runs last: it freezes segment-boundary allocations.
PASSES: list[tuple[str, Pass]] = [
    ("propagate_shardings", propagate_shardings),
    ("decompose_resharding", decompose_resharding),
    ("bind_input_layouts", bind_input_layouts),
    ("apply_required_output_layouts", apply_required_output_layouts),
    ("infer_allocation_order", infer_allocation_order),
    ("decouple_loop_and_allocation", decouple_loop_and_allocation),
]


def run_preseg_passes(fusion: Fusion, options: CompileOptions) -> None:
    dump = dump_enabled("fusion_ir_preseg")
    for name, run in PASSES:
        run(fusion, options)
        if dump:
            print(f"Fusion IR after pre-segmenter pass {name}:")
            print(fusion)
            print(fusion.transforms_string())
