"""The pointwise scheduler: one kernel over the reference output's iteration space.

The reference's logical axes are put in its allocation (memory) order and flattened; the flat axis
is split into a block-sized tile (``block_x``) and a grid of programs (``grid_x``). An input
broadcast along the outer axes (a bias ``[N]`` added to ``[M, N]``) is read at the flat index
modulo its extent: Triton still sees its reads contiguous and aligned when ``N`` is a multiple of
16. ``break_point`` > 0 asks for a 2-D schedule instead (outer axes x inner axes, tiled
``[block_y, block_x]``); the heuristics do not pick it: on an H200 the 1-D tile beat every 2-D
tile swept for a row broadcast (bias + gelu bf16 3958 GB/s vs 3913 at best, the 4-input chain
4343 vs 4215; ``benchmarks/results/kernels_notes.md``). Tile sizes come from the
widest element type: a thread's share is one 16-byte access or two. Triton vectorizes the
contiguous, aligned accesses itself (the code generator keeps contiguous merged axes as one index
so it can see them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyfuser.codegen.values import L2Hint
from pyfuser.ir.analysis.id_graph import IdGraph
from pyfuser.ir.analysis.resize import MIN_BRANCHED_PART, branched_parts, resized_part_starts
from pyfuser.ir.domain_replay import logical_order
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import ParallelType
from pyfuser.ir.ops import CatOp, PadOp
from pyfuser.ir.tensor_view import TensorView
from pyfuser.scheduler.pointwise_analysis import (
    check_pointwise,
    innermost_classes,
    reference_output,
    short_transposed_axis,
)
from pyfuser.scheduler.registry import FusionLike, Scheduler, SchedulerType, SizeHints
from pyfuser.scheduler.tools import inline_most, parallelize_like, transform_like


@dataclass(frozen=True)
class PointwiseParams:
    """``break_point``: number of outer axes (in memory order) in the 2-D schedule's outer group,
    0 for the 1-D schedule; ``block``: the 1-D tile, or ``(outer, inner)`` tile of the 2-D one."""

    reference: int
    break_point: int = 0
    block: tuple[int, ...] = (1024,)
    num_warps: int = 4
    scheduler_type: SchedulerType = SchedulerType.pointwise
    #: no serial loops to pipeline; loads keep their lines in L2 (not fields: no schedule changes them)
    narrow_warps = 0
    num_stages = 0
    l2 = L2Hint.keep

    def __str__(self) -> str:
        shape = " x ".join(map(str, self.block))
        kind = f"2-D, {self.break_point} outer axes" if self.break_point else "1-D"
        return (f"===== Pointwise Parameters ========\nreference: T{self.reference}\nschedule: {kind}\n"
                f"tile: {shape}\nnum_warps: {self.num_warps}\n====================================\n")


def can_schedule(fusion: FusionLike) -> tuple[bool, str]:
    reason, _ = _schedulable(fusion)
    return not reason, reason


def _schedulable(fusion: FusionLike) -> tuple[str, IdGraph | None]:
    """Why the pointwise scheduler cannot take ``fusion`` ("" where it can), and the segment's exact ID
    graph where it can."""
    ok, reason, exact = check_pointwise(fusion)
    if not ok or exact is None:
        return reason, None
    if len(innermost_classes(fusion, exact)) > 1 and short_transposed_axis(fusion, exact) is None:
        return "inputs and outputs disagree on the innermost axis in memory: the transpose scheduler tiles it", None
    return "", exact


def element_bytes(fusion: FusionLike) -> int:
    return max((v.dtype.torch_dtype.itemsize for v in (*fusion.inputs(), *fusion.outputs())
                if isinstance(v, TensorView)), default=4)


def compute_heuristics(fusion: FusionLike, inputs: Sequence[Any] | SizeHints = ()) -> PointwiseParams:
    reason, exact = _schedulable(fusion)
    if exact is None:
        raise ValueError(f"the pointwise scheduler cannot schedule this fusion: {reason}")
    ref = reference_output(fusion)
    vec = max(1, 16 // element_bytes(fusion))
    block = 256 * vec
    aligned = costly_parts_period(fusion, ref, exact)
    if aligned is not None:
        tile = min(block, aligned & -aligned)  # the largest power of two dividing it
        if tile >= MIN_BRANCHED_PART:
            return PointwiseParams(ref.name, 0, (tile,), num_warps=max(1, min(4, tile // (64 * vec))))
    return PointwiseParams(ref.name, 0, (block,))


def costly_parts_period(fusion: FusionLike, ref: TensorView, exact: IdGraph) -> int | None:
    """The greatest common divisor of the flat (memory-order) positions where the parts of the segment's pads
    and cats the kernel branches on (``branched_parts``) begin and end along the reference's iteration, or
    None (none of them resizes an axis the reference iterates as one, of static extents inside it). A 1-D
    tile dividing it lies wholly in one part of each, so the branch (``part_where_inside``) skips every
    other part's ops: Phi-3's fused q / k / v projection's backward computed each part's rotary cosines and
    sines on every element of its 1536 columns (141 us a layer on an H200 against Inductor's 50, in four
    kernels)."""
    order = [i for i in logical_order(ref) if not i.is_broadcast() and not i.is_reduction()]
    classes = [exact.class_of(i) for i in order]
    extents = [i.extent.value for i in order]
    period = 0
    for expr in fusion.exprs():
        if not isinstance(expr, PadOp | CatOp) or not branched_parts(expr):
            continue
        out_ids = expr.output.get_logical_domain(no_reductions=True)
        for dim, starts in resized_part_starts(expr).items():
            cls = exact.class_of(out_ids[dim])
            inner = extents[classes.index(cls) + 1:] if cls in classes else [None]
            if any(e is None for e in inner):
                continue
            stride = math.prod(e for e in inner if e is not None)
            period = math.gcd(period, *(int(start or 0) * stride for start in starts))
    return period or None


def schedule(fusion: Fusion, params: PointwiseParams) -> None:
    ref = next(tv for tv in fusion.outputs() if isinstance(tv, TensorView) and tv.name == params.reference)
    n = flatten_in_memory_order(ref)
    if n == 0:  # a 0-dim output: one program computes its one element
        propagate(ref)
        return
    if params.break_point:
        outer, inner = params.block
        merge_inner_first(ref, params.break_point, n)
        merge_inner_first(ref, 0, params.break_point)
        ref.split(1, inner)
        ref.split(0, outer)
        ref.reorder({1: 2, 2: 1})  # [O/outer, I/inner, outer, inner]
        ref.axis(0).parallelize(ParallelType.grid_x)
        ref.axis(1).parallelize(ParallelType.grid_y)
        ref.axis(2).parallelize(ParallelType.block_y)
        ref.axis(3).parallelize(ParallelType.block_x)
    else:
        merge_inner_first(ref, 0, n)
        ref.split(0, params.block[0])
        ref.axis(0).parallelize(ParallelType.grid_x)
        ref.axis(1).parallelize(ParallelType.block_x)
    propagate(ref)


def broadcasts_of_their_own(ref: TensorView) -> bool:
    """Whether another output of ``ref``'s segment has a broadcast ID that maps to none of ``ref``'s IDs
    (each layer's ``unsqueeze`` of the same positions in DeBERTa). A merge of ``ref``'s broadcast
    replays only on tensors whose broadcast maps to it: such an output would keep its logical domain
    and be written by serial loops over all of it in every program."""
    fusion = ref.fusion
    graph = IdGraph(fusion.tensors(), fusion.exprs(), map_broadcast=True, through_transforms=False)
    ours = ref.get_logical_domain()
    return any(i.is_broadcast() and not any(graph.mapped(i, r) for r in ours)
               for out in fusion.outputs() if isinstance(out, TensorView) and out is not ref
               for i in out.get_logical_domain())


def flatten_in_memory_order(ref: TensorView) -> int:
    """Reorder ``ref``'s loop domain (still its logical domain) into its allocation order and return
    how many iterating IDs lead. Behind them, unmerged and never iterated: its reduction IDs (a tensor
    a pointwise kernel copies may keep the reduction IDs of the reduction it comes from, e.g. partial
    sums before an allreduce), and its broadcast IDs where other outputs have broadcasts of their own
    (``broadcasts_of_their_own``; unless it has only broadcasts)."""
    order = [i for i in logical_order(ref) if not i.is_reduction()]
    if any(not i.is_broadcast() for i in order) and broadcasts_of_their_own(ref):
        order = [i for i in order if not i.is_broadcast()] + [i for i in order if i.is_broadcast()]
        iterating = sum(not i.is_broadcast() for i in order)
    else:
        iterating = len(order)
    order += [i for i in ref.get_loop_domain() if i.is_reduction()]
    loop = ref.get_loop_domain()
    ref.reorder({loop.index(i): k for k, i in enumerate(order) if i in loop})
    return iterating


def merge_range(tv: TensorView, start: int, stop: int) -> None:
    """Merge loop axes ``[start, stop)`` into one at ``start`` (a 0-dim tensor gets one axis of 1)."""
    for _ in range(stop - start - 1):
        tv.merge(start, start + 1)


def merge_inner_first(tv: TensorView, start: int, stop: int) -> None:
    """Merge loop axes ``[start, stop)`` into one at ``start``, the innermost ones first: each inner
    group (d1, d2) of (d0, (d1, d2)) is a merged index of its own, so an input broadcast along the
    outer axes (a mask ``[1, S, S]`` shared by the batch) is read at one contiguous index, the flat
    index modulo its extent, instead of a stride per axis (not contiguous to Triton)."""
    for k in range(stop - 2, start - 1, -1):
        tv.merge(k, k + 1)


def propagate(ref: TensorView) -> None:
    """Every other tensor of the segment follows ``ref``: same transforms, parallel types, inlined."""
    transform_like(ref)
    parallelize_like(ref)
    inline_most(fusion=ref.fusion)


POINTWISE = Scheduler(SchedulerType.pointwise, can_schedule, compute_heuristics, schedule, size_dependent=False)
