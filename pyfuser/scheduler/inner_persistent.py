"""The inner persistent scheduler (softmax, layernorm, rmsnorm and their backward): reductions
over the innermost axes whose results are read back along the row. Rows that fit a tile stay on
chip between the reduction and its consumers (one read, one write); longer rows are read once per
pass (multi-pass), and fewer such rows than the machine fills are split across programs (each
reduction a grid reduction, the programs' shares of the row read again by the launch that follows)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pyfuser.codegen.values import L2Hint
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.ops import ReductionOp, VarMeanOp
from pyfuser.ir.tensor_view import TensorView
from pyfuser.scheduler.reduction_analysis import NormalizationKind, ReductionAnalysis, analyze
from pyfuser.scheduler.reduction_schedule import (
    ReductionParams,
    checked_analysis,
    inner_params,
    l2_by_size,
    schedule_segment,
    size_hints,
)
from pyfuser.scheduler.registry import FusionLike, Machine, Scheduler, SchedulerType, SizeHints

KINDS = (NormalizationKind.inner_persistent,)

#: Warps of a program that loops over a row (rows wider than a persistent tile): Inductor's looped
#: softmax runs steps of 2048 on 16 warps on an H100 (``triton_heuristics._reduction_configs``).
LOOP_WARPS = 16
#: Bytes each thread loads per step of such a loop where the row's pass carries at most two running
#: results (softmax's max and sum) over enough rows for two programs an SM: two 16-byte vectors (a step
#: of 8192 bf16 or 4096 float32 elements on 16 warps), the best of a sweep on one H100 (step 1024-8192 x
#: 4, 8, 16 warps x online or not): softmax bf16 512 x 128256 1786 GB/s against 1548 at one vector and
#: 1645 at Inductor's 2048; log-softmax bf16 1024 x 32000 2138 against 1906. Otherwise one vector: at
#: two, cross-entropy's forward (max, sum and the picked logit) ran 0.27 against 0.19 ms (4097 x 32000)
#: and log-softmax over 130 rows (one program an SM) 0.074 against 0.058 ms
#: (``benchmarks/results/kernels_notes.md``). ptxas for sm_90a at two: 64 registers a thread.
LOOP_BYTES_PER_THREAD = 32
LOOP_BYTES_PER_THREAD_NARROW = 16
#: Running results a row's pass may carry for the wide step (a var_mean counts four: Welford's).
LOOP_WIDE_MAX_RESULTS = 2
#: Elements each thread takes per step where the pass carries a var_mean (Welford's four running values
#: and a division an element) over rows enough for every SM, on ``LOOP_WARPS``: H200 sweep of layer norms
#: (steps 1024-8192 x 4, 8, 16 warps), steps of 2048 best or within 1 % at bf16 1024 x 32000 (93.5 us
#: against 109.1 at the 4096 of ``LOOP_BYTES_PER_THREAD_NARROW``; Inductor 67.8), 512 x 65536 (100.8 /
#: 105.6), 256 x 128256 (98.1 / 105.9) and float32 1024 x 32000 (127.8 / 129.0); on fewer rows than SMs (one
#: program an SM at most) the wider step keeps more loads in flight: bf16 128 x 262144 145.7 us at 2048
#: against 103.1 at 4096, 127 x 32000 20.7 against 16.1.
LOOP_WELFORD_ELEMENTS = 4
#: Elements each thread takes per step, on ``LOOP_SINGLE_WARPS``, where the pass carries one running sum (an
#: RMS norm's): H200, float32 1024 x 32000 92.3 us against 104.4 at 32 bytes a thread on 16 warps (Inductor
#: 75.4), bf16 256 x 128256 56.5 (one program a row; Inductor 58.4).
LOOP_SINGLE_ELEMENTS = 32
LOOP_SINGLE_WARPS = 8


#: Rows per SM below which a looped row's step widens: a single sum's pass on ``LOOP_WARPS`` (32 elements a
#: thread), any other's ``LOOP_BYTES_PER_THREAD`` a thread whatever it carries. H200 sweep of the looped
#: norms, softmaxes and losses with Welford's approximate division and the last pass's L2 hint in force
#: (each knob alone, in one process beside the rules before): on 66-256 rows two vectors a thread 1.05-1.44x
#: (softmax bf16 130 x 131072 1.32x, cross-entropy forward float32 128 x 262144 1.41x, layer norm float32 128
#: x 262144 1.29x) but for cross-entropy's forward of bf16 logits (three running results: 0.80-1.03x), RMS
#: norms on 16 warps 1.04-1.23x; on 512 rows and more both lost (cross-entropy forward bf16 512 x 65536 0.70x,
#: RMS norm bf16 1024 x 32000 0.81x): they keep the rules above there.
FEW_ROWS_PER_SM = 2


#: A normalization splits its rows across programs only for fewer rows than half the SMs. Split, an
#: online softmax's row is read three times (the shares' maxima, their sums, the output: three launches)
#: and any other's twice with a launch more; one program per row reads it twice but leaves SMs idle. One
#: H100, ratio to the best of eager and Inductor, split / one program per row: softmax bf16 8 x 262144
#: 0.90 / 0.28, log-softmax f32 63 x 262144 0.88 / 0.67, bf16 130 x 131072 0.60 / 0.77; H200, RMS norm
#: bf16 256 x 128256 73.3 us split in two against 56.5-61.8 one program a row
#: (``benchmarks/results/kernels_notes.md``).
ONLINE_SPLIT_SMS_PER_ROW = 2


#: Warps of a program that loops over its share of a row split across programs (few long rows): a looped
#: row's ``LOOP_WARPS`` (``warps_for`` gave its steps of 8192 elements 8). H200 A/B of the norm, softmax, loss
#: and batch-norm families' points with fewer rows than half the SMs (each point's arms in one process): the
#: 47 it changes 1.126x (1.02-1.32x on 45: cross-entropy forward float32 63 x 262144 1.32x, softmax float32 17
#: x 128256 1.26x; log-softmax bf16 32 x 262144 0.99x; batch-norm backward float32 256 x 64 x 32 x 32, NCHW
#: rows of 262144 in runs of 1024, 0.77x: its first launch, two float32 inputs and two compensated sums, hits 16
#: warps' cap of 128 registers a thread and spills 16 bytes, where 8 warps held it in 254).
SPLIT_WARPS = 16


def looped_row(machine: Machine, row_bytes: int, rows: int | None = None, results: int = 1,
               welford: bool = False) -> tuple[int, int]:
    """(loop step, num_warps) of a normalization that loops over its ``rows`` (None: unknown), its pass
    carrying ``results`` running reductions: ``LOOP_WELFORD_ELEMENTS`` a thread on ``LOOP_WARPS`` warps
    where it carries a var_mean (``welford``) over a row for every SM, ``LOOP_SINGLE_ELEMENTS`` on
    ``LOOP_SINGLE_WARPS`` where it carries one sum (on ``LOOP_WARPS`` for fewer rows than
    ``FEW_ROWS_PER_SM`` an SM), else ``LOOP_BYTES_PER_THREAD`` a thread per step on ``LOOP_WARPS`` warps
    where the pass carries few results or the rows are that few, else ``LOOP_BYTES_PER_THREAD_NARROW``
    (on the interpreter's machine, steps as many times smaller as its loop tile, on 4 warps: small tests
    still take several steps)."""
    gpu = machine.loop_tile >= 2048
    # Fewer rows than two programs an SM: each program keeps more loads in flight (``FEW_ROWS_PER_SM``).
    few = rows is not None and rows < FEW_ROWS_PER_SM * machine.sm_count
    if welford and rows is not None and rows >= machine.sm_count:
        step, warps = 32 * LOOP_WARPS * LOOP_WELFORD_ELEMENTS, LOOP_WARPS
    elif results == 1:
        warps = LOOP_WARPS if few else LOOP_SINGLE_WARPS
        step = 32 * warps * LOOP_SINGLE_ELEMENTS
    else:
        # more than two plain running results over 16-bit rows (cross-entropy's forward of bf16 logits) keep
        # one vector a thread on few rows too: two gave 0.80-1.03x there
        wide = rows is not None and (results <= LOOP_WIDE_MAX_RESULTS or (few and (welford or row_bytes >= 4)))
        per_thread = LOOP_BYTES_PER_THREAD if wide else LOOP_BYTES_PER_THREAD_NARROW
        step, warps = 32 * LOOP_WARPS * per_thread // max(row_bytes, 1), LOOP_WARPS
    return step * machine.loop_tile // 2048, warps if gpu else 4


def row_bytes(fusion: FusionLike, analysis: ReductionAnalysis) -> int:
    """The widest element of the inputs and outputs that span the reduced axes (the rows a loop reads
    and writes; a cross-entropy's int64 targets, one per row, do not count)."""
    return max((v.dtype.torch_dtype.itemsize for v in (*fusion.inputs(), *fusion.outputs())
                if isinstance(v, TensorView) and analysis.reduced <= analysis.iterated(v)), default=4)


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
    # sums of exponentials, then the output: three launches, the row read three times where one
    # program per row reads it twice, on enough programs to fill the machine): only for fewer rows than
    # half the SMs (``ONLINE_SPLIT_SMS_PER_ROW``). So does a layer norm's var_mean:
    # Welford's partial results per program, combined by the launch that normalizes its share (the row
    # is read twice either way). H200, bf16 layer norm against Inductor, one program a row / split: 33 x
    # 128256 0.40x / 0.73x, 63 x 65536 0.65x / 0.73x, 1 x 262144 0.13x / 0.47x; but 128 x 262144
    # 1.06x / 0.83x and 256 x 128256 0.72x / 0.55x.
    welford = any(isinstance(e, VarMeanOp) for e in fusion.exprs())
    splittable = not (hints.kept is not None and hints.kept * ONLINE_SPLIT_SMS_PER_ROW >= hints.machine.sm_count)
    params = inner_params(SchedulerType.inner_persistent, analysis.reference, hints, splittable)
    if params.shape == "split":
        params = replace(params, num_warps=SPLIT_WARPS)
    if params.shape == "loop":
        # running values per element: Welford's shift, mean, m2 and count for a var_mean
        results = sum(4 if isinstance(e, VarMeanOp) else 1 for e in fusion.exprs() if isinstance(e, ReductionOp | VarMeanOp))
        step, warps = looped_row(hints.machine, row_bytes(fusion, analysis), hints.kept, results, welford)
        params = replace(params, tile=step, num_warps=warps)
    # Loads keep their lines in L2 (``L2Hint.keep``): a looped row is read again by the pass that writes the
    # outputs (Inductor hints its looped normalizations' first reads so). Rows on chip too: H200 A/B of the
    # sweep's twelve norm, softmax and loss families (395 points), each point's kernels forced to one hint
    # in one process: the 82 points whose rows on chip took no hint (then the rule below 256 MiB moved) ran
    # 1.054x faster kept (1.06-1.15x at 16 MiB and less, 0.99-1.02x at 32-128 MiB; 11 points slower, by 3 %
    # at most); streaming them past L2 (``evict_first``) 0.93x. From ``STREAM_MIN_BYTES`` on, the last
    # pass over a looped row lets its lines go first (``L2Hint.keep_until_last``, as Inductor's second
    # loop does): H200 A/B of the looped norms, softmaxes and losses (217 points, each in one process with
    # and without), 1.019x on the 132 of 32 MiB and more (softmax bf16 130 x 131072 1.18x, log-softmax
    # float32 1024 x 32000 1.09x; worst 0.96x), 1.00x on those below.
    return l2_by_size(replace(params, l2=L2Hint.keep_until_last), hints, fusion)


def schedule(fusion: Fusion, params: ReductionParams) -> None:
    schedule_segment(fusion, params, KINDS)


INNER_PERSISTENT = Scheduler(SchedulerType.inner_persistent, can_schedule, compute_heuristics, schedule, size_dependent=True)
