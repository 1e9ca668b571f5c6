"""The compile pipeline: fusion -> preseg passes -> Host IR -> host passes -> HostIrEvaluator.

Every fusion executes through Host IR; dumps (``PYFUSER_DUMP``) print each stage.
``PYFUSER_NUM_STREAMS`` (default 4) sets ``numberOfStreams``, the size of the worker-stream pool
that stream loops run on (and the slot count of their ring buffers).
"""

from __future__ import annotations

import copy
import os
from typing import TYPE_CHECKING

from pyfuser.host_ir.evaluator import DEFAULT_NUM_STREAMS, HostIrEvaluator
from pyfuser.host_ir.lowering import lower_fusion
from pyfuser.host_ir.passes import run_host_passes
from pyfuser.host_ir.passes.stream_axes import check_stream_schedules
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.tensor_view import TensorView
from pyfuser.preseg.pipeline import run_preseg_passes
from pyfuser.runtime.options import dump_enabled
from pyfuser.runtime.outputs import OutputLayout

if TYPE_CHECKING:
    from pyfuser.runtime.executor import CompileOptions


def compile_fusion(fusion: Fusion, options: CompileOptions) -> HostIrEvaluator:
    """Passes rewrite a private copy: the user's definition and schedule stay as written."""
    if dump_enabled("fusion_ir"):
        print(fusion)
        print(fusion.transforms_string())
    if dump_enabled("fusion_ir_math"):
        fusion.print_math()
    check_stream_schedules(fusion)
    fusion = copy.deepcopy(fusion)
    run_preseg_passes(fusion, options)
    layouts = [OutputLayout.of(fusion, tv) for tv in fusion.outputs() if isinstance(tv, TensorView)]
    container = lower_fusion(fusion, options)
    run_host_passes(container, fusion, options)
    if dump_enabled("host_ir"):
        print(container, end="")
    return HostIrEvaluator(container, layouts, options.device, num_streams())


def num_streams() -> int:
    raw = os.environ.get("PYFUSER_NUM_STREAMS")
    if not raw:
        return DEFAULT_NUM_STREAMS
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"PYFUSER_NUM_STREAMS must be a positive integer, got {raw!r}") from None
