"""The schedules the reduction and normalization schedulers share.

The reference is the first reduction's output: its logical axes are put in memory order and merged
into one kept axis ``I`` and one reduced axis ``R``; the kernel then takes one of these shapes
(every other tensor follows the reference, and is inlined):

* **tile** (``R`` fits a tile): ``[I/rows (grid_x), rows (block_y), R (block_x)]``; a program
  reduces ``rows`` whole rows at once, the row stays on chip for its consumers (persistent);
* **loop** (``R`` too large): ``[I (grid_x), R/T (loop), T (block_x)]``; consumers of a reduced
  value loop over the row again (multi-pass);
* **split** (few rows, long ones): the loop shape with ``R/T`` also split across ``G`` programs
  (grid_y), each reducing its share: a grid reduction, finished by a second launch;
* **outer** (``R`` outermost in memory): ``[I/BI (grid_x), R/BR (loop), BR (block_y), BI (block_x)]``
  (or ``R`` whole as the block_y tile when it fits), accesses contiguous along ``I``.

On-chip caches of the inputs get an allocation derived from their loop domain (docs/cached_inputs.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch

from pyfuser.codegen.values import L2Hint
from pyfuser.ir.analysis.online_softmax import softmax_shift
from pyfuser.ir.domain_replay import logical_ancestors
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import IterDomain, ParallelType
from pyfuser.ir.ops import (
    BinaryOp,
    BinaryOpType,
    LoadStoreOp,
    ReductionOp,
    ReductionOpType,
    SqueezeOp,
    UnaryOp,
    UnaryOpType,
)
from pyfuser.ir.symbolic import SymExpr, SymVar
from pyfuser.ir.tensor_view import TensorView
from pyfuser.scheduler.cache import cache_inputs, derive_allocation_from_loop
from pyfuser.scheduler.reduction_analysis import NormalizationKind, ReductionAnalysis, analyze
from pyfuser.scheduler.registry import FusionLike, Machine, SchedulerType, SizeHints
from pyfuser.scheduler.tools import inline_most, one_per_class, parallelize_like, transform_like
from pyfuser.utils import next_power_of_2

#: Elements of a tile a program holds at once when several rows share it (registers per thread).
ROWS_TILE = 4096
#: The same for a plain reduction of rows (``InnerHeuristic.rows_tile``): half as many rows a program.
PLAIN_ROWS_TILE = 2048
#: Elements of a persistent tile of whole rows: rows shorter than this share a program. Small
#: programs (2 warps) let an SM overlap many rows' loads with others' reductions. H200 sweep,
#: layernorm / softmax bf16, GB/s against tiles of 4096 (4 warps): rows of 256 2456 / 2570 vs 2231 /
#: 2422, of 512 2422 / 2533 vs 2089 / 2461, of 1024 2405 / 2618 vs 2114 / 2503 (32768 rows: 3513 /
#: 3715 vs 3039 / 3699), of 2048 3009 / 3216 vs 2987 / 3163; tiles of 2048 lost at 256 and 512.
#: Plain reductions of rows (read only) keep ``ROWS_TILE``: a bf16 row sum of 256 ran at 1914 GB/s
#: with it and 1589 with this, of 1024 1843 and 1580.
PERSISTENT_ROWS_TILE = 1024
#: A kept extent at least this many programs' worth keeps every SM busy without a split.
WAVES = 2


@dataclass(frozen=True)
class ReductionParams:
    """``shape``: "tile", "loop", "split" or "outer" (see the module); ``rows``: rows per program
    (tile); ``tile``: elements of ``R`` per loop step (loop, split) or ``BI`` (outer);
    ``tile_reduced``: ``BR`` (outer, 0: ``R`` whole); ``split``: programs per row (split);
    ``reference``: the tensor whose loop nest the kernel runs."""

    scheduler_type: SchedulerType
    reference: int
    shape: str
    rows: int = 1
    tile: int = 0
    tile_reduced: int = 0
    split: int = 1
    num_warps: int = 4
    #: warps of the compiled variants whose rows load narrower than 16 bytes (0: ``num_warps``;
    #: ``launcher.DirectLaunches.warps_of``)
    narrow_warps: int = 0
    #: software pipelining of the serial loops (Triton's ``num_stages``; 0: none)
    num_stages: int = 0
    #: what the loads ask of L2 (``L2Hint``)
    l2: L2Hint = L2Hint.keep
    #: a looped normalization's sums of ``exp(y - max(y))`` accumulate in their max's pass (an online
    #: softmax, ``mark_online_sums``): the row is read once for both
    online: bool = True
    #: inner-outer persistent with several rows a step: each reduction across rows keeps a partial per
    #: row of the step over the row loop and adds them up once after it, instead of adding up each
    #: step's rows (a reduction across warps, a barrier, each step)
    keep_step_rows: bool = False

    def __str__(self) -> str:
        fields = {"tile": f"rows per program: {self.rows}, row as one tile",
                  "loop": f"loop step: {self.tile}",
                  "split": f"loop step: {self.tile}, programs per row: {self.split} (grid reduction)",
                  "outer": f"kept tile: {self.tile}, reduced tile: {self.tile_reduced or 'whole extent'}"}
        if self.scheduler_type is SchedulerType.inner_outer_persistent:
            fields = {"tile": "row as one tile", "loop": f"row in steps of {self.tile}"}
            held = ", a partial per row of the step" if self.keep_step_rows else ""
            fields = {k: f"{v}; {self.split} programs, each a block of rows, {self.rows} at a time{held} (partials "
                         "finished by a second launch)" for k, v in fields.items()}
        if self.scheduler_type in (SchedulerType.inner_persistent, SchedulerType.outer_persistent):
            fields["loop"] += f", online softmax: {self.online}"
            fields["outer"] += f", online softmax: {self.online}" if self.tile_reduced else ""
        if self.split > 1 and self.shape == "outer":
            fields["outer"] += f", programs per column block: {self.split} (grid reduction)"
        return (f"===== Reduction Parameters ========\nscheduler: {self.scheduler_type.name}\nreference: "
                f"T{self.reference}\nshape: {self.shape}\n{fields[self.shape]}\nnum_warps: {self.num_warps}\n"
                f"num_stages: {self.num_stages}\nl2: {self.l2.value}\n"
                "====================================\n")


def size_hints(fusion: FusionLike, analysis: ReductionAnalysis, inputs: Sequence[Any] | SizeHints) -> SizeHints:
    """The sizes to schedule for: given by the runtime, or read off the fusion's input values."""
    if isinstance(inputs, SizeHints):
        return inputs
    tensors = [a for a in inputs if isinstance(a, torch.Tensor)]
    machine = Machine.of(tensors[0].device if tensors else torch.device("cpu"))
    if not inputs:
        return SizeHints(None, None, machine)
    env: dict[str, int] = {}
    for tv, value in zip(fusion.inputs(), inputs, strict=False):
        if isinstance(tv, TensorView) and isinstance(value, torch.Tensor):
            for i, size in zip(tv.get_logical_domain(no_reductions=True), value.shape, strict=False):
                if isinstance(i.extent, SymVar):
                    env[i.extent.name] = int(size)
    reduced, kept = analysis.extents()
    return SizeHints(_evaluate(reduced, env), _evaluate(kept, env), machine)


def _evaluate(e: SymExpr, env: dict[str, int]) -> int | None:
    try:
        return int(e.evaluate(env))
    except ValueError:
        return None


def checked_analysis(fusion: FusionLike, kinds: Sequence[NormalizationKind]) -> ReductionAnalysis:
    analysis, reason = analyze(fusion)
    if analysis is None or analysis.kind not in kinds:
        raise ValueError(f"the {kinds[0].value} scheduler cannot schedule this fusion: "
                         f"{reason or f'it is a {analysis.kind.value} segment' if analysis else reason}")
    return analysis


def element_bytes(fusion: FusionLike) -> int:
    return max((v.dtype.torch_dtype.itemsize for v in (*fusion.inputs(), *fusion.outputs())
                if isinstance(v, TensorView)), default=4)


#: Bytes a size bucket's input takes from which a kernel's last read of it lets its lines go first from L2
#: (``L2Hint.stream``, ``L2Hint.keep_until_last``, as Inductor's looped reductions hint them); below it L2
#: holds what the kernel reads anyway and the loads keep their lines (``L2Hint.keep``). H200 A/B of the
#: sweep's six plain-reduction families (sum, mean and amax of rows inner and outer in memory, bf16 and
#: float32, 240 points, L2 flushed before each call): streamed, tensors of 32 MiB and more ran up to 1.27x
#: faster (bf16 row maxima 1024 x 32000: 32.2 -> 25.5 us), those of 8 MiB and less up to 0.66x slower (bf16
#: row sums 127 x 32000: 9.6 -> 14.4 us); with the bucket's bytes (the next power of two of each extent) at
#: this threshold, 1.025x geomean over keeping, worst 0.95x. Looped normalizations' last pass: below.
STREAM_MIN_BYTES = 32 << 20


def l2_by_size(params: ReductionParams, hints: SizeHints, fusion: FusionLike) -> ReductionParams:
    """``params`` whose hint lets lines go first (``stream``, ``keep_until_last``) turned to ``L2Hint.keep``
    where the input takes less than ``STREAM_MIN_BYTES`` or its size is unknown; other params as given."""
    if params.l2 not in (L2Hint.stream, L2Hint.keep_until_last):
        return params
    size = None if hints.kept is None or hints.reduced is None else hints.kept * hints.reduced * element_bytes(fusion)
    return params if size is not None and size >= STREAM_MIN_BYTES else replace(params, l2=L2Hint.keep)


def loop_stages(params: ReductionParams, bytes_per_element: int, welford: bool) -> int:
    """The pipeline depth a plain outer reduction's loop asks for once its L2 hint is decided
    (``l2_by_size``): ``OuterHeuristic.streamed_16bit_stages`` where it streams data of at most 2 bytes an
    element, ``streamed_welford_stages`` where it streams a var_mean's data of any width, else its params'."""
    h = _OUTER[-1]
    if params.l2 is not L2Hint.stream or not params.num_stages:
        return params.num_stages
    if bytes_per_element <= 2:
        return h.streamed_16bit_stages
    return h.streamed_welford_stages if welford else params.num_stages


def streamed_bytes(fusion: FusionLike) -> int:
    """The widest element of the tensors a reduction streams: its inputs and its outputs of the
    input's size, not its reduced results (a float32 column max of bfloat16 data reads 2-byte
    elements: a column block of 32 x 16 bytes is 256 of them, not the 128 its float32 result has)."""
    full = [v for v in fusion.outputs() if isinstance(v, TensorView)
            and not any(i.is_reduction() or i.is_broadcast() for i in v.get_logical_domain())]
    return max((v.dtype.torch_dtype.itemsize for v in (*fusion.inputs(), *full) if isinstance(v, TensorView)),
               default=4)


def warps_for(tile: int) -> int:
    """Warps for a tile of ``tile`` elements: 2 to 8 warps, about 32 elements per thread from 2048
    elements up (an H200 sweep of layernorm / rmsnorm / softmax rows of 8192: 8 warps best or within
    1%; 16 lost 22% on layernorm; tiles of 1024 on 2 warps beat 1 and 4)."""
    return max(2, min(8, tile // 1024))


#: Loops over a column block (outer reductions), software-pipelined three deep: H200, column sum f32
#: 65536x4096 2813 -> 4163 GB/s (torch.compile 4046; two and four stages slower).
LOOP_STAGES = 3

#: Steps of a loop along a row, in elements (with the Machine's ``loop_tile`` of 2048 on a GPU: 8192),
#: 8 warps, not pipelined. H200 sweep: softmax bf16 8192x32000 2797 GB/s (steps of 4096 on 4 warps,
#: pipelined 3 deep: 2192; torch.compile 1820), row sum f32 4096x65536 4288 (steps of 2048 on 2 warps:
#: 4004; torch.compile 4063, eager 4202); pipelining steps this long gained at most 0.4% and cost
#: softmax 12% (three loops over the row).
LOOP_STEP_TILES = 4


def pipeline_stages(fusion: FusionLike, analysis: ReductionAnalysis, step: int, machine: Machine,
                    wanted: int = LOOP_STAGES) -> int:
    """How deep a loop over rows is software-pipelined: ``wanted`` stages where that many steps of the
    inputs that iterate the whole space (``step`` elements of each a step) fit in a program's shared
    memory, else fewer; 0 (not pipelined) where two do not. Triton holds each stage's loads in shared
    memory: float32 rows of 11008 in steps of 16384 asked 3 x 128 KiB of an H200's 227 (a launch
    failure on CUDA only; the interpreter has no shared memory)."""
    streamed = 0
    for tv in fusion.inputs():
        if isinstance(tv, TensorView):
            classes = analysis.iterated(tv)
            if analysis.reduced <= classes and classes - analysis.reduced:
                streamed += tv.dtype.torch_dtype.itemsize * step
    fitting = machine.shared_bytes // max(streamed, 1)
    return wanted if fitting >= wanted else fitting if fitting >= 2 else 0


def inner_params(scheduler_type: SchedulerType, ref: TensorView, hints: SizeHints, splittable: bool) -> ReductionParams:
    m = hints.machine
    reduced, kept = hints.reduced, hints.kept
    if reduced is not None and next_power_of_2(reduced) <= m.max_persistent:
        width = next_power_of_2(max(reduced, 1))
        tile = PERSISTENT_ROWS_TILE if scheduler_type is SchedulerType.inner_persistent else ROWS_TILE
        rows = max(1, min(tile // width, 64))
        if kept is not None:
            # Keep enough programs to fill the machine before packing rows.
            while rows > 1 and -(-kept // rows) < WAVES * m.sm_count:
                rows //= 2
        return ReductionParams(scheduler_type, ref.name, "tile", rows=rows, num_warps=warps_for(rows * width))
    step = m.loop_tile * LOOP_STEP_TILES
    if splittable and reduced is not None and kept is not None and kept < WAVES * m.sm_count:
        split = min(-(-WAVES * m.sm_count // max(kept, 1)), max(1, reduced // (4 * step)))
        if split >= 2:
            return ReductionParams(scheduler_type, ref.name, "split", tile=step, split=split,
                                   num_warps=warps_for(step))
    return ReductionParams(scheduler_type, ref.name, "loop", tile=step, num_warps=warps_for(step))


@dataclass(frozen=True)
class InnerHeuristic:
    """The knobs ``reduction_inner_params`` sizes plain reductions of rows innermost in memory by (a sum,
    max or mean of each row: nothing reads the row again, so keeping it on chip buys nothing), in one
    object that ``benchmarks/kernels.py --sweep`` varies (``inner_heuristic``).

    The kernel is compiled per size bucket (the next power of two of the row): a row whole as one tile
    has up to half its lanes masked off in its bucket (11008 in a tile of 16384: a third). Rows of at most
    ``max_tile`` elements are one tile (``rows_tile`` elements per program, at most ``max_rows`` rows,
    fewer where the rows give fewer than ``waves`` programs per SM); longer ones loop in steps of at most
    ``loop_step`` elements (0: the machine's ``loop_tile`` times ``LOOP_STEP_TILES``), short enough that
    the steps past a row's end waste at most ``max_waste`` of any row in the bucket (Inductor loops every
    row longer than 1024 of a plain reduction). A few long rows split across programs (each at least
    ``min_steps`` steps) where the rows give fewer than ``waves`` programs per SM. ``loop_warps``: the
    loop's warps (0: about 32 elements per thread). ``max_tile`` 16384: the best of a sweep on one H100,
    amax bf16 4097 x 11008 one tile 2115 GB/s against 1854 looped in steps of 2048 (``max_tile`` 4096)
    and 2061 in steps of 8192 (``benchmarks/results/kernels_notes.md``). ``l2``: the loads of the rows,
    read once, go first from L2 (``L2Hint.stream``, Inductor's ``evict_first`` in its looped reductions;
    what the knobs of steps and warps were not: ``codegen/values.py`` ``load``).

    Swept since with the hint in force (H200, the 240 points of the six plain-reduction families, each
    knob alone, every variant in one process beside the defaults of then; a var_mean keeps ``ROWS_TILE``
    and ``warps_for``, not swept so): ``rows_tile`` 4096 -> 2048
    (``PLAIN_ROWS_TILE``: half the rows a program, on half the warps) 1.06x on the 33 streamed row tiles
    (bf16 sums of 131072 x 127 1.41x, float32 of 65536 x 512 1.21x), 0.98-1.01x on the kept ones; loops of
    steps of at most ``short_step`` elements (rows of 16385 to 32768) on ``short_step_warps`` (8 elements a
    lane, where ``warps_for`` gave 32 on 4 warps) 1.35-1.71x on bf16 127 x 32000 (127 programs of 4 warps
    left the SMs idle), 1.01-1.10x on the others; steps of 8192 on 16 warps 0.90-1.07x (kept at 8).

    A var_mean's float32 row of ``WIDE_WELFORD_TILE`` elements or more on chip (two passes over registers)
    takes ``welford_tile_elements`` a thread (``warps_for``: 32), on at most ``MAX_TILE_WARPS``: H200 A/B of
    the batch-norm families' NCHW statistics and forwards (each point's arms in one process), 1.00-1.14x on
    the six float32 points it changes (statistics of 128 x 2048 x 7 x 7 1.14x: 6272-element rows gathered in
    runs of 49, whose per-element addresses filled 122 registers a thread at 8 warps); on bf16 rows it lost
    where the rows are long contiguous runs (32 x 64 x 112 x 112 0.86x, 32 x 256 x 56 x 56 0.92x) and won on
    gathered ones (7 x 7 1.21x, 33 x 33 1.07x): bf16 rows keep ``warps_for``."""

    max_tile: int = 16384
    rows_tile: int = PLAIN_ROWS_TILE
    max_rows: int = 64
    waves: int = WAVES
    loop_step: int = 0
    max_waste: float = 0.25
    min_steps: int = 4
    loop_warps: int = 0
    short_step: int = 4096
    short_step_warps: int = 16
    welford_tile_elements: int = 16
    l2: L2Hint = L2Hint.stream


#: A var_mean's float32 row of at least this many elements on chip takes ``InnerHeuristic.welford_tile_elements``
#: a thread, on at most ``MAX_TILE_WARPS``.
WIDE_WELFORD_TILE = 4096
MAX_TILE_WARPS = 16

_Heuristic = TypeVar("_Heuristic")

#: The heuristic ``reduction_inner_params`` reads (replaced only by ``inner_heuristic``).
_INNER = [InnerHeuristic()]


@contextmanager
def in_force(stack: list[_Heuristic], heuristic: _Heuristic) -> Iterator[_Heuristic]:
    """``heuristic`` on top of ``stack`` (the one read) inside the block."""
    stack.append(heuristic)
    try:
        yield heuristic
    finally:
        stack.pop()


def inner_heuristic(heuristic: InnerHeuristic) -> AbstractContextManager[InnerHeuristic]:
    """Size plain inner reductions by ``heuristic`` inside the block (kernels compiled there keep it)."""
    return in_force(_INNER, heuristic)


def reduction_inner_params(ref: TensorView, hints: SizeHints, splittable: bool, welford: bool,
                           bytes_per_element: int) -> ReductionParams:
    """A plain reduction of rows (``InnerHeuristic``): whole rows as one tile, a loop, or a split loop. A
    var_mean's rows are one tile up to the machine's persistent size: on chip, two passes over registers
    (no division per element, as Welford's update in a loop has)."""
    m, h = hints.machine, _INNER[-1]
    reduced, kept = hints.reduced, hints.kept
    kind = SchedulerType.reduction
    max_tile = m.max_persistent if welford else min(h.max_tile, m.max_persistent)
    if reduced is not None and next_power_of_2(reduced) <= max_tile:
        width = next_power_of_2(max(reduced, 1))
        rows = max(1, min((ROWS_TILE if welford else h.rows_tile) // width, h.max_rows))
        if kept is not None:
            while rows > 1 and -(-kept // rows) < h.waves * m.sm_count:
                rows //= 2
        warps = warps_for(rows * width)
        if welford and width >= WIDE_WELFORD_TILE and bytes_per_element >= 4 and h.welford_tile_elements:
            warps = min(MAX_TILE_WARPS, width // (32 * h.welford_tile_elements))
        return ReductionParams(kind, ref.name, "tile", rows=rows, num_warps=warps, l2=h.l2)
    longest = step = h.loop_step or m.loop_tile * LOOP_STEP_TILES
    if reduced is not None:
        # a row of the bucket (next_power_of_2(reduced) / 2, next_power_of_2(reduced)] wastes less than
        # 2 * step / bucket of its reads past its end
        step = min(step, max(256, next_power_of_2(int(next_power_of_2(reduced) * h.max_waste / 2) or 1)))
    warps = h.loop_warps or (h.short_step_warps if step <= h.short_step and not welford else warps_for(step))
    if splittable and reduced is not None and kept is not None and kept < h.waves * m.sm_count:
        # programs of at least ``min_steps`` of the longest steps each (shorter steps, for less waste,
        # do not make rows split sooner)
        split = min(-(-h.waves * m.sm_count // max(kept, 1)), max(1, reduced // (h.min_steps * longest)))
        if split >= 2:
            return ReductionParams(kind, ref.name, "split", tile=step, split=split, num_warps=warps,
                                   l2=h.l2)
    return ReductionParams(kind, ref.name, "loop", tile=step, num_warps=warps, l2=h.l2)


#: The narrowest column block of an outer reduction (elements of the kept axis per program).
MIN_OUTER_TILE = 32


#: Bytes a plain outer reduction's program reads per loop step (``outer_params``), and programs per SM its
#: split aims for
#: (normalizations keep ``step_bytes`` and ``waves``: not swept): H200 x4 sweep of the generated kernels
#: (column sums bf16 and f32 of 17 shapes from 1023 x 1000 to 262144 x 64, a mean, two maxima) over 512 / 256 /
#: 128-byte columns x 16 / 8 KiB steps x 1 / 2 / 4 waves: 8 KiB and 4 waves within 0.69x of each shape's best
#: (geomean 0.86x), 16 KiB and 2 waves (before) down to 0.27x (geomean 0.74x): a sum's Kahan terms double its
#: registers, and its 8-warp steps ran one or two programs an SM (f32 32768 x 1000: 191 us against 52; bf16
#: 8192 x 4096: 43.8 against 34.5 at best).
OUTER_REDUCTION_STEP_BYTES = 8192
OUTER_SPLIT_WAVES = 4
#: Programs per SM from which a plain outer reduction of 16-bit data counts its step in float32
#: accumulators (8 rows of 256 columns, not 16). H200, bf16 column sums (compensated: two accumulators an
#: element) and maxima: 1.04-1.29x on 8192 x 4096, 32768 x 1000, 65536 x 512, 256 x 128256, 512 x 65536,
#: 4097 x 512, 1023 x 1000 (4 or more programs an SM), 0.80x on 2048 x 11008 (172 programs of 64 columns).
STEP_IN_ACCUMULATORS_WAVES = 2


@dataclass(frozen=True)
class OuterHeuristic:
    """The knobs ``outer_params`` sizes outer reductions and normalizations by (and ``final_params`` the
    last launch of a reduction split across programs), in one object so that ``benchmarks/kernels.py
    --sweep`` can time whole fusions (every outer segment, channels-last batch-norm statistics among
    them) under variants of it (``outer_heuristic``).

    A program reads a block of ``column_bytes`` of the kept (innermost) axis per row, ``step_bytes``
    per loop step (``reduction_step_bytes`` in a plain reduction; rows of the block, pipelined ``stages``
    deep). Where the kept axis gives fewer than ``waves`` programs per SM:

    * a plain reduction first narrows its block, down to ``narrow_bytes`` (whole 128-byte lines), if
      that alone gives every SM a program (no second launch: the permuted mean of 16384 columns, 256
      programs of 64 bf16 columns, as Inductor runs it); else it keeps the wide block and splits the
      reduced axis across programs (a grid reduction of at most ``split_waves`` programs per SM, each
      at least ``min_steps`` loop steps, the steps divided evenly among them);
    * a var_mean reads blocks of ``welford_column_bytes`` and splits the same way, into
      ``welford_waves`` programs per SM of ``welford_step_elements`` steps, ``welford_elements`` per
      thread (Welford's four accumulators per element and a division make a thread's share costly);
      one over fewer than ``small_welford_elements`` in all steps ``small_welford_step_elements`` with no
      minimum of steps per program (more, shorter programs: its time is latency). Steps count elements,
      not bytes: Welford's update per element, not the loads, bounds the step. H200 sweep of 24 channels-
      last batch-norm statistics (14 shapes from 8 x 48 x 17 x 17 to 32 x 64 x 112 x 112, bf16 and
      float32) and 14 forwards beside Inductor, the lanes' Welford results all combined in float32 (the
      sums of squares are float64 in the tree since, for accuracy; not re-measured): steps of 4096
      elements (8 KiB of bf16, 16 KiB of float32) and 2048 a step with one step a program allowed below
      2M elements: geomean 0.80 -> 0.87x of Inductor (statistics), 0.82 -> 0.83x (forwards), worst
      0.47 -> 0.58x; 8 KiB steps for float32 too: 0.80x, 16 KiB for bf16 too: up to 0.5x slower on small
      tensors.
      H200 sweep of channels-last batch-norm statistics (bf16 32 x 256 x 56 x 56, 64 x 512 x 28 x 28,
      32 x 64 x 112 x 112, 128 x 2048 x 7 x 7, float32 32 x 256 x 56 x 56; column blocks of 128-512
      bytes x steps of 4-16 KiB x 1-4 programs an SM x 8 or 16 elements a thread): blocks of 128 bytes
      (64 bf16 channels, 32 float32) with 8 KiB steps (64 rows) on one program an SM were within 0.87x
      of each shape's best (geomean 0.98x), against 0.66x (0.76x) for 512-byte blocks of 4 KiB steps
      on two programs an SM: 69.9 -> 49.6 us at 32 x 256 x 56 x 56 (Inductor 42.9). Swept again with the
      approximate division (22 channels-last points, each in one process): Inductor's shape (8 programs an
      SM of 8 x 64 steps, 2 elements a thread) 0.77x, 4 an SM of 1024-element steps 0.85x, 16 warps a step
      (``welford_max_warps``, 4 elements a thread) 0.955x: the rule stands;
    * a plain reduction's loop step gives each lane ``warps_for``'s 32 elements, 16-byte loads of them;
      the variants whose rows load in narrower pieces (a row of 127 bf16 elements) launch on as many
      warps as give each lane ``narrow_elements`` (``ReductionParams.narrow_warps``); where narrowing
      alone gave the SMs their programs but fewer than ``STEP_IN_ACCUMULATORS_WAVES`` an SM, each step
      reads ``narrowed_step_bytes`` on 8 warps (more loads in flight per program). H200, bf16: column
      sums and maxima of 131072 x 127 53.9 -> 26.0 and 40.2 -> 25.6 us, 1023 x 127 12.4 -> 9.5 (Inductor
      20.5, 22.1, 7.6); maxima of 2048 x 11008 and sums of 4097 x 11008 (172 programs of 64 columns)
      28.1 -> 23.4 and 43.9 -> 37.1 (Inductor 21.3, 42.7); aligned rows keep 2 warps (8 warps there:
      up to 1.3x slower);
    * a normalization splits the same way, its final launch reading each program's share of the rows
      again; one with a var_mean cannot split and narrows its block down to ``min_columns`` elements.

    The final step of a split reads the programs' partial results (few rows, all in one tile where
    they fit) in column blocks narrowed down to ``final_min_columns`` until there are ``final_waves``
    programs per SM: its data is small and mostly in L2, and a var_mean's combine (float64) is
    latency-bound, so programs matter more than whole lines there. ``l2``: what a normalization's loads
    ask of L2 (kept: its rows are read again); ``reduction_l2``: a plain reduction's (its input streamed
    through once: ``L2Hint.stream``, as ``InnerHeuristic.l2``).

    A plain reduction (no var_mean) reads blocks of ``reduction_columns`` elements, whatever their width
    (``column_bytes`` is a normalization's), splits into programs of at least ``reduction_min_steps`` steps,
    and pipelines a loop that streams 16-bit data (``L2Hint.stream``) ``streamed_16bit_stages`` deep (its
    steps, counted in float32 accumulators, carry half a float32 step's bytes). H200, the 240 points of the
    six plain-reduction families with the hint in force, each knob alone against the rules before: blocks of
    128 bf16 columns (256 before) 1.03-1.10x on all 33 bf16 points it changed (worst 1.007x; float32's 64
    columns 0.96-1.16x: kept at 128); 2 steps a program (4 before) 1.03-1.18x on the 9 small splits it
    changed (bf16 column sums of 1023 x 1000 1.09x); 4 stages (3) 1.05-1.09x on the 51 streamed bf16
    points (worst 0.98x; float32 0.97-1.03x, kept 16-bit 0.93-1.14x: 3 stay there). A var_mean's streamed loop
    takes ``streamed_welford_stages`` whatever its width (Welford's update per element leaves more time between a
    step's loads): H200 A/B, the nine float32 channels-last batch-norm statistics and forwards it changes,
    1.00-1.12x (geomean 1.07x; the bf16 ones already stream at ``streamed_16bit_stages``)."""

    column_bytes: int = 512
    reduction_columns: int = 128
    step_bytes: int = ROWS_TILE * 4
    reduction_step_bytes: int = OUTER_REDUCTION_STEP_BYTES
    waves: int = WAVES
    split_waves: int = OUTER_SPLIT_WAVES
    min_steps: int = 4
    reduction_min_steps: int = 2
    min_columns: int = MIN_OUTER_TILE
    stages: int = LOOP_STAGES
    streamed_16bit_stages: int = 4
    streamed_welford_stages: int = 4
    narrow_bytes: int = 128
    welford_column_bytes: int = 128
    welford_step_elements: int = 4096
    small_welford_elements: int = 1 << 21
    small_welford_step_elements: int = 2048
    welford_waves: int = 1
    welford_elements: int = 8
    welford_max_warps: int = 8
    narrow_elements: int = 8
    narrowed_step_bytes: int = 16384
    final_waves: int = 1
    final_min_columns: int = 4
    l2: L2Hint = L2Hint.keep
    reduction_l2: L2Hint = L2Hint.stream


#: The heuristic ``outer_params`` reads (replaced only by ``outer_heuristic``).
_OUTER = [OuterHeuristic()]


def outer_heuristic(heuristic: OuterHeuristic) -> AbstractContextManager[OuterHeuristic]:
    """Size outer reductions by ``heuristic`` inside the block (kernels compiled there keep it)."""
    return in_force(_OUTER, heuristic)


def outer_params(scheduler_type: SchedulerType, ref: TensorView, hints: SizeHints, persistent: bool,
                 splittable: bool, bytes_per_element: int, welford: bool = False) -> ReductionParams:
    m = hints.machine
    h = _OUTER[-1]
    reduced, kept = hints.reduced, hints.kept
    # Whole 16-byte vectors per lane: 32 lanes of them by default.
    element = max(bytes_per_element, 1)
    # A plain reduction's split (its partial results combined once) takes more programs than a
    # normalization's, whose final launch reads each program's share of the rows again.
    plain = scheduler_type is SchedulerType.reduction and not welford
    widest = next_power_of_2(max(1, h.reduction_columns if plain else
                                 (h.welford_column_bytes if welford else h.column_bytes) // element))
    inner = min(widest, next_power_of_2(kept)) if kept is not None else widest
    target = (h.welford_waves if welford else h.waves) * m.sm_count
    l2 = h.reduction_l2 if scheduler_type is SchedulerType.reduction else h.l2
    split_target = h.split_waves * m.sm_count if plain else target
    narrowed_few = False  # narrowed to give every SM a program, fewer than two an SM
    if kept is not None and not splittable:
        # Without a split (a var_mean normalization, a grid reduction's final step), programs come from the
        # kept axis only: narrower column blocks (down to a warp's width, whole 32-byte sectors of
        # 16-bit data) before too few programs. Whisper's layer norms over channels stored outermost
        # (1024 x 12000 bf16) ran on 47 programs of 256 columns.
        while inner > h.min_columns and -(-kept // inner) < target:
            inner //= 2
    elif kept is not None and not welford and h.narrow_bytes:
        narrowed = inner
        floor = next_power_of_2(max(1, h.narrow_bytes // element))
        while narrowed > floor and -(-kept // narrowed) < target:
            narrowed //= 2
        if -(-kept // narrowed) >= m.sm_count:  # a program for every SM without a second launch
            inner, splittable = narrowed, False
            narrowed_few = -(-kept // inner) < STEP_IN_ACCUMULATORS_WAVES * m.sm_count
    # A normalization must hold its columns whole; a reduction asking for it (a var_mean of few rows) takes
    # it only where the column blocks alone give every SM a program, else it splits its rows.
    whole = persistent and reduced is not None and next_power_of_2(reduced) * inner <= m.max_persistent
    if whole and scheduler_type is SchedulerType.reduction:
        whole = kept is not None and -(-kept // inner) >= m.sm_count
    if whole and reduced is not None:
        tile = next_power_of_2(max(reduced, 1)) * inner
        return ReductionParams(scheduler_type, ref.name, "outer", tile=inner, num_warps=warps_for(tile), l2=l2)
    step = h.reduction_step_bytes if plain else h.step_bytes
    min_steps = h.reduction_min_steps if plain else h.min_steps
    if welford:
        small = reduced is not None and kept is not None and reduced * kept < h.small_welford_elements
        step = (h.small_welford_step_elements if small else h.welford_step_elements) * element
        min_steps = 1 if small else min_steps

    def steps_of(width: int) -> tuple[int, int]:
        """(rows per loop step, programs along the reduced axis) for steps of ``step`` bytes of ``width``."""
        rows = max(1, min(step // width // inner, next_power_of_2(reduced) if reduced is not None else 64))
        split = 1
        if splittable and reduced is not None and kept is not None:
            programs = -(-kept // inner)
            if programs < split_target:
                # At most ``split_target`` programs in all (one more column block's worth was a second wave
                # of programs on an H100: 272 for 264 slots), each with loop steps to take (16 steps in 17
                # programs left one program masked off), so the split divides the steps evenly.
                split = max(1, min(split_target // programs, reduced // (min_steps * rows)))
                steps = -(-reduced // rows)
                split = -(-steps // -(-steps // split))
        return rows, split

    # Bytes per loop step: of the data (a step of 16-bit data has twice the rows of float32's: the loads
    # in flight, not the elements, keep the memory system busy); but a plain reduction on enough programs
    # (``STEP_IN_ACCUMULATORS_WAVES`` an SM, which keep the loads in flight together) counts its step in
    # its float32 accumulators, whatever the data's width.
    rows, split = steps_of(element)
    if plain and element < 4:
        narrow_rows, narrow_split = steps_of(4)
        if kept is not None and -(-kept // inner) * narrow_split >= STEP_IN_ACCUMULATORS_WAVES * m.sm_count:
            rows, split = narrow_rows, narrow_split
    if welford:
        return ReductionParams(scheduler_type, ref.name, "outer", tile=inner, tile_reduced=rows, split=split,
                               num_warps=max(1, min(h.welford_max_warps, rows * inner // (32 * h.welford_elements))),
                               num_stages=h.stages, l2=l2)
    warps = warps_for(rows * inner)
    if plain and narrowed_few and h.narrowed_step_bytes:
        cap = next_power_of_2(reduced) if reduced is not None else rows
        rows, warps = max(rows, min(h.narrowed_step_bytes // element // inner, cap)), 8
    narrow = max(1, min(8, rows * inner // (32 * h.narrow_elements))) if plain and h.narrow_elements else 0
    return ReductionParams(scheduler_type, ref.name, "outer", tile=inner, tile_reduced=rows, split=split,
                           num_warps=warps, narrow_warps=max(narrow, warps) if narrow else 0,
                           num_stages=h.stages, l2=l2)


def final_params(ref: TensorView, reduced: int | None, kept: int | None, machine: Machine,
                 bytes_per_element: int, final_tile: int, welford: bool = False) -> ReductionParams:
    """The last launch of an outer reduction split across programs: the programs' partial results
    (``reduced`` rows of them) per column. Columns from 128 bytes, narrowed while the kept extent gives
    fewer than ``final_waves`` programs per SM (channels-last batch-norm statistics: 256 channels, the
    float64 combine of a var_mean's partials ran on 4 programs); every row in one tile of at most
    ``final_tile`` elements where they fit, so each program issues all its loads at once (the seed003
    case's final step had 32 programs loop over [32, 128] tiles), else a loop over steps of rows. A
    var_mean's combine holds four float64 accumulators and three partials per element: an eighth of
    the elements per tile (a [2048, 4] tile of them spilled)."""
    h = _OUTER[-1]
    budget = final_tile // 8 if welford else final_tile
    columns = max(h.final_min_columns, 32 * max(1, 16 // max(bytes_per_element, 1)))
    if kept is not None:
        columns = min(columns, max(h.final_min_columns, next_power_of_2(kept)))
        while columns > h.final_min_columns and -(-kept // columns) < h.final_waves * machine.sm_count:
            columns //= 2
    def warps(elements: int) -> int:
        return max(1, min(8, elements // (32 * h.welford_elements))) if welford else warps_for(elements)

    rows = next_power_of_2(reduced) if reduced is not None else None
    if rows is not None and rows * columns <= budget:
        return ReductionParams(SchedulerType.reduction, ref.name, "outer", tile=columns, num_warps=warps(rows * columns))
    columns = min(columns, budget)
    step = max(1, budget // columns)
    if rows is not None:
        step = min(step, rows)
    return ReductionParams(SchedulerType.reduction, ref.name, "outer", tile=columns, tile_reduced=step,
                           num_warps=warps(step * columns))


# --- schedules ------------------------------------------------------------------------------------------
def flatten(ref: TensorView, analysis: ReductionAnalysis, reduced_first: bool) -> None:
    """``ref``'s loop as ``[I, R]`` (or ``[R, I]``): kept and reduced axes, each merged in memory order
    (broadcast axes join the kept ones)."""
    exact = analysis.exact
    rank = {c: k for k, c in enumerate(analysis.order)}
    merge_regrouped(ref, analysis)
    loop = ref.get_loop_domain()
    logical = ref.get_logical_domain()

    def key(i: IterDomain) -> int:
        if i.is_broadcast():
            return -1
        return min(rank.get(exact.class_of(a), len(rank)) for a in logical_ancestors(i, logical))

    kept = sorted((i for i in loop if not i.is_reduction()), key=key)
    reduced = sorted((i for i in loop if i.is_reduction()), key=key)
    order = [*reduced, *kept] if reduced_first else [*kept, *reduced]
    ref.reorder({loop.index(i): k for k, i in enumerate(order)})
    first, second = (reduced, kept) if reduced_first else (kept, reduced)
    # The innermost axes merged first, (d0, (d1, d2)): each inner group is a merged index of its own, so
    # a dense tensor whose group is not contiguous as a whole (an NCHW batch norm's rows: N, then H and W
    # beyond the channel) is still read at one index for its contiguous part (H * W), one division and
    # one remainder by runtime sizes an element instead of three.
    for k in range(len(first) + len(second) - 2, len(first) - 1, -1):
        ref.merge(k, k + 1)
    for k in range(len(first) - 2, -1, -1):
        ref.merge(k, k + 1)
    if not first:  # a full reduction: a kept axis of one element to hang the grid on
        raise ValueError(f"{ref.short_name}: a reduction to a single value has no kept axis")


def merge_regrouped(ref: TensorView, analysis: ReductionAnalysis) -> None:
    """Merge each group of ``ref``'s kept axes that a reshape of the segment regroups, outer first (``[B,
    S, rV]`` read from a ``[B * S, V]``: ``merge(B, S)``), so that the tensors on the reshape's other side
    find that iteration in ``ref``'s transforms (``transform_like``), whatever order ``flatten`` puts the
    kept axes in."""
    exact, regrouped = analysis.exact, analysis.regrouped
    for key in regrouped.keys():
        if len(key) < 2:
            continue
        loop = [i for i in ref.get_loop_domain() if i.definition is None and not i.is_reduction() and not i.is_broadcast()]
        chosen = one_per_class(loop, key, exact.class_of)
        if chosen is not None:
            merged = chosen[0]
            for inner in chosen[1:]:
                outer_pos, inner_pos = _position(ref, merged), _position(ref, inner)
                ref.merge(outer_pos, inner_pos)
                merged = ref.get_loop_domain()[min(outer_pos, inner_pos)]


def _position(tv: TensorView, i: IterDomain) -> int:
    return next(k for k, j in enumerate(tv.get_loop_domain()) if j is i)


def schedule_reference(ref: TensorView, analysis: ReductionAnalysis, params: ReductionParams) -> None:
    """Transform the reference's loop domain into the params' shape and parallelize it."""
    full = all(i.is_reduction() or i.is_broadcast() for i in ref.get_logical_domain())
    if params.shape == "outer":
        if full:
            _schedule_outer_full(ref, params)
            return
        flatten(ref, analysis, reduced_first=True)  # [R, I]
        ref.split(1, params.tile)  # [R, I/BI, BI]
        if not params.tile_reduced:
            ref.reorder({1: 0, 0: 1})  # [I/BI, R, BI]
            _parallelize(ref, [ParallelType.grid_x, ParallelType.block_y, ParallelType.block_x])
            return
        ref.split(0, params.tile_reduced)  # [R/BR, BR, I/BI, BI]
        if params.split > 1:
            ref.split(0, params.split, inner_split=False)  # [G, R/BR/G, BR, I/BI, BI]
            ref.reorder({3: 0, 0: 1, 1: 2, 2: 3})  # [I/BI, G, R/BR/G, BR, BI]
            _parallelize(ref, [ParallelType.grid_x, ParallelType.grid_y, ParallelType.serial,
                               ParallelType.block_y, ParallelType.block_x])
            return
        ref.reorder({2: 0, 0: 1, 1: 2})  # [I/BI, R/BR, BR, BI]
        _parallelize(ref, [ParallelType.grid_x, ParallelType.serial, ParallelType.block_y, ParallelType.block_x])
        return
    if full:
        _schedule_inner_full(ref, params)
        return
    flatten(ref, analysis, reduced_first=False)  # [I, R]
    if params.shape == "tile":
        if params.rows > 1:
            ref.split(0, params.rows)  # [I/rows, rows, R]
            _parallelize(ref, [ParallelType.grid_x, ParallelType.block_y, ParallelType.block_x])
        else:
            _parallelize(ref, [ParallelType.grid_x, ParallelType.block_x])
        return
    ref.split(1, params.tile)  # [I, R/T, T]
    if params.shape == "split":
        ref.split(1, params.split, inner_split=False)  # [I, G, R/T/G, T]
        _parallelize(ref, [ParallelType.grid_x, ParallelType.grid_y, ParallelType.serial, ParallelType.block_x])
        return
    _parallelize(ref, [ParallelType.grid_x, ParallelType.serial, ParallelType.block_x])


def _schedule_inner_full(ref: TensorView, params: ReductionParams) -> None:
    """A reduction to one value: ``[R]`` as one tile, a loop, or split across programs."""
    for _ in range(len(ref.get_loop_domain()) - 1):
        ref.merge(0)
    if params.shape == "tile":
        _parallelize(ref, [ParallelType.block_x])
        return
    ref.split(0, params.tile)  # [R/T, T]
    if params.shape == "split":
        ref.split(0, params.split, inner_split=False)  # [G, R/T/G, T]
        _parallelize(ref, [ParallelType.grid_x, ParallelType.serial, ParallelType.block_x])
        return
    _parallelize(ref, [ParallelType.serial, ParallelType.block_x])


def _schedule_outer_full(ref: TensorView, params: ReductionParams) -> None:
    _schedule_inner_full(ref, ReductionParams(params.scheduler_type, params.reference, "loop",
                                              tile=params.tile * max(1, params.tile_reduced)))


def _parallelize(tv: TensorView, types: list[ParallelType]) -> None:
    for i, ptype in zip(tv.get_loop_domain(), types, strict=True):
        if ptype is not ParallelType.serial:
            i.parallelize(ptype)


def propagate(fusion: Fusion, ref: TensorView, caches: list[TensorView]) -> None:
    """Every other tensor follows the reference; caches get an allocation from their loop (docs/cached_inputs.md)."""
    transform_like(ref)
    parallelize_like(ref)
    inline_most(fusion=fusion)
    for cache in caches:
        derive_allocation_from_loop(cache)


def schedule_segment(fusion: Fusion, params: ReductionParams, kinds: Sequence[NormalizationKind]) -> None:
    """Schedule a reduction / persistent segment (inner-outer segments have their own module)."""
    analysis = checked_analysis(fusion, kinds)
    caches = cache_inputs(fusion, propagate_allocation_domain=False) if analysis.kind is not \
        NormalizationKind.reduction else []
    ref = next(tv for tv in fusion.tensors() if tv.name == params.reference)
    schedule_reference(ref, analysis, params)
    propagate(fusion, ref, caches)
    looped = params.shape == "loop" or (params.shape == "outer" and params.tile_reduced > 0 and params.split == 1)
    if params.online and looped:
        mark_online_sums(fusion)
    mark_rounded_sums(fusion)


def mark_online_sums(fusion: Fusion) -> None:
    """Each sum of ``exp(y - max(y))`` (``softmax_shift``) accumulates in its max's pass over the
    row (``ReductionOp.online_max``): a looped softmax reads its row twice, a log-softmax's or a
    cross-entropy's statistics once, where a pass for the max and one for the sum read it once more."""
    for e in fusion.exprs():
        if isinstance(e, ReductionOp):
            e.online_max = softmax_shift(e)


def mark_rounded_sums(fusion: Fusion) -> None:
    """Sums and means whose results are only ever rounded to 16 bits, or whose values are 16-bit floats
    widened to float32, add without a loop's compensation (``ReductionOp.compensated``).

    Rounded results: a float32 accumulator's rounding over a loop (about 2**-24 a step of the lane's
    total) stays far below a bfloat16 result's (2**-9), as in torch's own kernels, and the compensation's
    operations a value made the outer sums of 16-bit data arithmetic-bound (H200, column sums of bf16
    8192 x 4096: 44 us with Kahan's, 34 without, Inductor 28). A result combined with other tensors (a
    mean subtracted from its row), moved by a constant or passed through a function that magnifies
    relative errors keeps it: there its error is relative to something other than the result.

    Widened values: a bfloat16 / half value carries 8 / 11 significant bits, so a float32 accumulator adds
    most of them exactly and a lane's loop loses little. H200, float32 sums of bf16 columns (17 shapes from
    1023 x 127 to 1048576 x 64, data around 0 and around 100), max-abs error against float64: without the
    compensation 0.14-1.20x of torch's own (with it 0.14-0.80x). Speed, A/B in one process beside Inductor
    (100 bf16 sum / mean points of the kernel sweep): column sums 1.05-1.44x faster on 24 of 40 (256 x 128256:
    36.5 -> 26.0 us, Inductor 23.8; 8192 x 4096: 35.1 -> 31.1, Inductor 28.2), row sums up to 1.45x (128 x
    262144, wide rows split across programs); slower on rows of 127 elements, many of them (column sums of
    131072 x 127: 29.5 -> 52 us, where the column maximum, never compensated, takes 38.5: the plain loop's
    problem there) and row sums of 127 x 32000 (10.4 -> 12.4 us). Sums of float32 data, or of values computed
    from 16-bit ones (a product of two has 16 bits), keep it (float32 columns without it: up to 1.65x of
    torch's error)."""
    for e in fusion.exprs():
        if isinstance(e, ReductionOp) and e.kind in (ReductionOpType.sum, ReductionOpType.mean):
            e.compensated = not (_only_rounded_to_16_bits(e.output) or _widened_16_bit_values(e))


def _widened_16_bit_values(e: ReductionOp) -> bool:
    """Whether ``e`` adds values cast from a bfloat16 or half tensor, exactly as they were stored."""
    src = e.inputs[0]
    cast = src.definition if isinstance(src, TensorView) else None
    return isinstance(cast, UnaryOp) and cast.kind is UnaryOpType.cast and isinstance(cast.inputs[0], TensorView) \
        and cast.inputs[0].dtype in (DataType.BFloat16, DataType.Half)


#: Ops of one tensor that keep its relative error (at most): a sum's rounding passes through them to a
#: 16-bit result no larger than it was (an add of a constant could cancel it, an exp scale it).
_RELATIVE_UNARY = frozenset({UnaryOpType.cast, UnaryOpType.neg, UnaryOpType.abs, UnaryOpType.sqrt,
                             UnaryOpType.rsqrt, UnaryOpType.reciprocal})
_RELATIVE_BINARY = frozenset({BinaryOpType.mul, BinaryOpType.div, BinaryOpType.truediv})


def _only_rounded_to_16_bits(tv: TensorView) -> bool:
    """Whether every path from ``tv`` to an output ends in a 16-bit float tensor, passing only through
    ops that keep its relative error (casts, a scale by a scalar, square roots; ``_RELATIVE_UNARY``)
    and the finishing steps of a split reduction."""
    pending, seen = [tv], set()
    while pending:
        t = pending.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t.dtype in (DataType.BFloat16, DataType.Half):
            continue
        if t.is_fusion_output or not t.uses:
            return False
        for use in t.uses:
            tensors = [v for v in use.inputs if isinstance(v, TensorView)]
            passes = isinstance(use, LoadStoreOp | SqueezeOp) \
                or (isinstance(use, UnaryOp) and use.kind in _RELATIVE_UNARY) \
                or (isinstance(use, BinaryOp) and use.kind in _RELATIVE_BINARY and len(tensors) == 1) \
                or (isinstance(use, ReductionOp) and use.kind in (ReductionOpType.sum, ReductionOpType.mean))
            if not passes:
                return False
            pending += [v for v in use.outputs if isinstance(v, TensorView)]
    return True
