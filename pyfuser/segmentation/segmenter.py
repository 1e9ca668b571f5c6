"""The segmenter: which exprs share an executor.

Today every expr is its own segment: a resharding ``set`` is a communication, anything else an
ATen call (``SchedulerType.expr_eval``). Everything an ATen call or a communication produces is
materialized, in global memory.
"""

from __future__ import annotations

from pyfuser.ir.analysis.sharding import is_resharding
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.tensor_view import MemoryType
from pyfuser.options import CompileOptions
from pyfuser.scheduler.registry import SchedulerType
from pyfuser.segmentation.segmented_fusion import SegmentedFusion, SegmentedGroup, boundaries


def segment_fusion(fusion: Fusion, options: CompileOptions) -> SegmentedFusion:
    exprs = fusion.exprs()
    live = {id(e) for e in exprs}
    groups = []
    for expr in exprs:
        kind = SchedulerType.communication if is_resharding(expr) else SchedulerType.expr_eval
        inputs, outputs = boundaries(fusion, [expr], live)
        groups.append(SegmentedGroup([expr], kind, inputs=inputs, outputs=outputs))
    for group in groups:
        for tv in (t for e in group.exprs for t in e.tensor_outputs):
            tv.memory_type = MemoryType.Global
    return SegmentedFusion(fusion, groups)
