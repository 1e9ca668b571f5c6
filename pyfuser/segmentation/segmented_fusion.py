"""A segmented fusion: the fusion's exprs partitioned into groups, each run by one scheduler.

A group's boundary tensors (inputs read from outside it, outputs read outside it or returned)
live in global memory; their allocation was finalized by preseg (docs/loop_and_allocation.md). Tensors produced and
consumed inside one kernel group never touch global memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pyfuser.ir.base import Expr, Val
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import ParallelType
from pyfuser.ir.tensor_view import MemoryType, TensorView
from pyfuser.scheduler.registry import SchedulerType


@dataclass(eq=False)
class SegmentedGroup:
    """Exprs (in topological order) that one executor runs together."""

    exprs: list[Expr]
    scheduler: SchedulerType
    #: why no kernel scheduler took the group (printed in the dump), for ATen groups
    reason: str = ""
    inputs: list[Val] = field(default_factory=list)
    outputs: list[TensorView] = field(default_factory=list)

    def to_string(self, index: int) -> str:
        ins = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.outputs))
        why = f" ({self.reason})" if self.reason else ""
        body = "".join(e.to_string(2) for e in self.exprs)
        return f"  g{index} {self.scheduler.name}{why}\n    inputs: {ins}\n    outputs: {outs}\n{body}"


@dataclass(eq=False)
class SegmentedFusion:
    fusion: Fusion
    groups: list[SegmentedGroup]

    def __str__(self) -> str:
        body = "".join(g.to_string(k) for k, g in enumerate(self.groups))
        return f"Segmented fusion ({len(self.groups)} segments) {{\n{body}}} // Segmented fusion\n"


def _is_constant(v: Val) -> bool:
    return not v.is_tensor and v.definition is None and not v.is_fusion_input


def boundaries(fusion: Fusion, exprs: Sequence[Expr], live: set[int]) -> tuple[list[Val], list[TensorView]]:
    """The inputs a group of ``exprs`` reads from outside it (constants aside) and the tensors it
    produces that a live expr (``live``: ids of the exprs the outputs need) outside it reads, or
    that are fusion outputs."""
    members = {id(e) for e in exprs}
    produced = {id(v) for e in exprs for v in e.outputs}
    inputs = {id(v): v for e in exprs for v in e.inputs if id(v) not in produced and not _is_constant(v)}
    fusion_outputs = {id(v) for v in fusion.outputs()}
    outputs = [t for e in exprs for t in e.tensor_outputs
               if id(t) in fusion_outputs or any(id(u) in live and id(u) not in members for u in t.uses)]
    return list(inputs.values()), list(dict.fromkeys(outputs))


def segment_fusion_copy(fusion: Fusion, group: SegmentedGroup) -> tuple[Fusion, dict[int, object]]:
    """The segment as a fusion of its own, for a scheduler to transform: a copy computing the
    group's outputs from its inputs, with every loop domain back to the logical domain (host loops
    and devices are the program's business, not the kernel's; the kernel sees chunks and shards as
    they are). Returns the copy and ``id(original node) -> copy``."""
    memo: dict[int, object] = {}
    copy = fusion.clone_segment(group.inputs, group.outputs, memo)
    for tv in copy.tensors():
        if tv.is_fusion_input or tv.is_fusion_output:
            tv.memory_type = MemoryType.Global
        tv.device_mesh = None
        tv.compute_at_pos = 0
        d = tv.domain()
        d.loop = list(d.logical)
        for i in d.logical:
            i.parallel_type = ParallelType.serial
    copy.mark_changed()
    return copy, memo
