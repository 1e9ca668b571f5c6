"""The inner persistent scheduler (softmax, layernorm, rmsnorm and their backward): reductions
over the innermost axes whose results are read back along the row. Rows that fit a tile stay on
chip between the reduction and its consumers (one read, one write); longer rows are read once per
pass (multi-pass), and fewer such rows than the machine fills are split across programs (each
reduction a grid reduction, the programs' shares of the row read again by the launch that follows)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pyfuser.ir.fusion import Fusion
from pyfuser.ir.ops import VarMeanOp
from pyfuser.ir.tensor_view import TensorView
from pyfuser.scheduler.reduction_analysis import NormalizationKind, ReductionAnalysis, analyze
from pyfuser.scheduler.reduction_schedule import (
    ReductionParams,
    checked_analysis,
    element_bytes,
    inner_params,
    schedule_segment,
    size_hints,
)
from pyfuser.scheduler.registry import FusionLike, Machine, Scheduler, SchedulerType, SizeHints

KINDS = (NormalizationKind.inner_persistent,)

#: Below this many bytes moved (a read and a write of the rows), loads carry no L2 eviction hint.
#: H200, bf16 softmax / layernorm, GB/s with the hint and without: 32 MiB moved, rows of 1024, 2608 /
#: 2738 and 2399 / 2675 (rows of 256, 2048, 8192: 4-12 % faster without it too); 128 MiB 3697 / 3755
#: and 3488 / 3610; 256 MiB (rows of 256) 3991 / 3987 and 3816 / 3834; 512 MiB 4182 / 4102 and 3905 /
#: 3909 (softmax of 8192: 4156 / 3973). Inductor hints only loads that every program reads again.
EVICT_LAST_MIN_BYTES = 256 << 20

#: Warps of a program that loops over a row (rows wider than a persistent tile): Inductor's looped
#: softmax runs steps of 2048 on 16 warps on an H100 (``triton_heuristics._reduction_configs``).
LOOP_WARPS = 16
#: Bytes each thread loads per step of such a loop: one 16-byte vector (a step of 4096 bf16 or 2048
#: float32 elements on 16 warps). Few values per thread keep the online softmax's per-lane max and
#: sum and their temporaries in registers: ptxas for sm_90a gives softmax bf16 40 registers a thread
#: at 4096 on 16 warps (3 programs of 16 warps an SM), 28-32 at 2048 (4), 64 at 8192 on 16 warps
#: (cross-entropy backward spills there), 96 at 8192 on 8 warps (127 for the two-pass loops).
LOOP_BYTES_PER_THREAD = 16


def looped_row(machine: Machine, row_bytes: int) -> tuple[int, int]:
    """(loop step, num_warps) of a normalization that loops over its rows: one 16-byte load per thread
    per step on ``LOOP_WARPS`` warps (on the interpreter's machine, steps as many times smaller as its
    loop tile: small tests still take several steps)."""
    warps = LOOP_WARPS if machine.loop_tile >= 2048 else 4
    step = 32 * LOOP_WARPS * LOOP_BYTES_PER_THREAD // max(row_bytes, 1) * machine.loop_tile // 2048
    return step, warps


def row_bytes(fusion: FusionLike, analysis: ReductionAnalysis) -> int:
    """The widest element of the inputs and outputs that span the reduced axes (the rows a loop reads
    and writes; a cross-entropy's int64 targets, one per row, do not count)."""
    exact = analysis.exact
    return max((v.dtype.torch_dtype.itemsize for v in (*fusion.inputs(), *fusion.outputs())
                if isinstance(v, TensorView) and analysis.reduced <= {
                    exact.class_of(i) for i in v.get_logical_domain() if not i.is_broadcast and not i.is_reduction}),
               default=4)


def can_schedule(fusion: FusionLike) -> tuple[bool, str]:
    analysis, reason = analyze(fusion)
    if analysis is None:
        return False, reason
    if analysis.kind not in KINDS:
        return False, f"not a normalization over the innermost axes: a {analysis.kind.value} segment"
    return True, ""


def compute_heuristics(fusion: FusionLike, inputs: Sequence[Any] | SizeHints = ()) -> ReductionParams:
    analysis = checked_analysis(fusion, KINDS)
    hints = size_hints(fusion, analysis, inputs)
    # Few long rows are split across programs (a row's share each), as reductions are: each reduction a
    # grid reduction whose final step reads the share again (softmax: the shares' maxima, then their
    # sums of exponentials, then the output: three launches, the row read three times as by one
    # program per row, on enough programs to fill the machine). Welford's partial results are not
    # finished across programs: var_mean is never split.
    splittable = not any(isinstance(e, VarMeanOp) for e in fusion.exprs())
    params = inner_params(SchedulerType.inner_persistent, analysis.reference, hints, splittable)
    if params.shape == "loop":
        step, warps = looped_row(hints.machine, row_bytes(fusion, analysis))
        params = replace(params, tile=step, num_warps=warps)
    if hints.kept is not None and hints.reduced is not None:
        params = replace(params, evict_last=2 * hints.kept * hints.reduced * element_bytes(fusion) >= EVICT_LAST_MIN_BYTES)
    return params


def schedule(fusion: Fusion, params: ReductionParams) -> None:
    schedule_segment(fusion, params, KINDS)


INNER_PERSISTENT = Scheduler(SchedulerType.inner_persistent, can_schedule, compute_heuristics, schedule, size_dependent=True)
