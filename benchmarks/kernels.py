"""Generated kernels against torch eager and torch.compile (Inductor) over a sweep of op families, sizes, dtypes
and layouts: where is pyfuser below the best anchor, and by how much.

The families and the point tables are in ``kernel_cases.py`` (pointwise with broadcasts, transposes, inner and
outer reductions, norms forward and backward, softmax and log-softmax, cross-entropy forward and backward,
rotary, batch-norm, embedding backward). Each point is checked against the torch function before it is timed;
a point that fails (a pyfuser error, a wrong answer) is kept with its reason and left out of the summary.
Per point: GPU ms of one call (L2 flushed, host time kept out: ``timing.time_ms_flushed``) of eager, Inductor
and pyfuser, GB/s by the bytes the fusion must move, and a device copy of as many bytes (its physical limit).
Per family and overall: the worst ratio beside the geomean, against the faster anchor and against copy.

    python benchmarks/kernels.py --quick                  # a few points per family (one GPU call)
    python benchmarks/kernels.py [--shard 1/4]            # the full sweep (or a quarter of it)
    python benchmarks/kernels.py --merge A.json B.json    # the shards' results as the full sweep's file
    python benchmarks/kernels.py --merge full.json rerun.jsonl   # a re-run's points replace the full sweep's
    python benchmarks/kernels.py --families softmax,rotary --match 128256 [--sweep]
    python benchmarks/kernels.py --dry-run                # CPU: every family at a tiny size, correctness only

``--sweep`` also times hand-edited heuristics of each point's scheduler (``schedule.compute_heuristics`` +
``fd.manual_execute``) to tune the defaults, and where the point runs an outer reduction, the whole fusion under
variants of ``OuterHeuristic`` (every segment follows it: ``OUTER_HEURISTICS``; a var_mean also with outer
var_means staged), where it runs a plain reduction of rows, under variants of ``InnerHeuristic``
(``INNER_HEURISTICS``), where it runs an inner-outer kernel, under variants of ``ManyRows``
(``MANY_ROWS_HEURISTICS``); ``--sweep-heuristics`` times only the heuristic variants (one GPU call for the
reduction families). Writes ``kernels_<kind>.json``
and ``.md`` into ``--out``; a partial selection (``--quick``, ``--families``, ``--match``, ``--shard``, ``--sweep``)
writes ``kernels_<selection>_<kind>``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from kernel_cases import FAMILIES, QUICK, Point, check, float64_outputs, full_points, moved_bytes, outputs_of, tiny_points
from results_files import RESULTS, machine_kind, write_results
from timing import synchronize, time_ms_flushed, timing_lock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pyfuser import FusionDefinition, schedule
from pyfuser.codegen.values import L2Hint
from pyfuser.host_ir.nodes import LaunchKernel
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.ops import VarMeanOp
from pyfuser.preseg.staged_var_mean import stage_outer_var_means
from pyfuser.schedule import SchedulerType
from pyfuser.scheduler.inner_outer_persistent import ManyRows, many_rows
from pyfuser.scheduler.reduction_schedule import InnerHeuristic, OuterHeuristic, inner_heuristic, outer_heuristic
from pyfuser.utils import next_power_of_2

#: The fusions other benchmarks time (``seed003_ceiling.py``, ``persistent_tiles.py``) and their timer.
bench = time_ms_flushed
_seed003 = FAMILIES["seed003"].define
_layernorm = FAMILIES["layernorm"].define
_softmax = FAMILIES["softmax"].define


#: Milliseconds of one call of a function (``time_ms_flushed`` on a GPU).
Timer = Callable[[Callable[[], Any]], float]


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _define(point: Point, inputs: list[Any]) -> FusionDefinition:
    with FusionDefinition() as fd:
        FAMILIES[point.family].define(fd, inputs)
    return fd


def dry_run(points: Sequence[Point]) -> list[dict[str, Any]]:
    """Each point on the CPU through Triton's interpreter, checked against the torch function (no timing):
    the families cannot rot between GPU runs. A row per point: ``status`` ok, skipped (with its reason) or
    error (with the message)."""
    rows = []
    for point in points:
        row: dict[str, Any] = {"point": point.name, "family": point.family}
        reason = FAMILIES[point.family].skip(point)
        if reason is not None:
            rows.append({**row, "status": "skipped", "reason": reason})
            continue
        torch.manual_seed(0)
        try:
            inputs = FAMILIES[point.family].make(point, "cpu")
            expected = outputs_of(FAMILIES[point.family].torch_fn(*inputs))
            got = _define(point, inputs).execute(inputs, _enable_options=["triton_interpreter"])
            check(got, expected, point.name, exact=partial(float64_outputs, FAMILIES[point.family], inputs))
        except Exception as e:  # recorded per point: one family's failure must not hide the others'
            rows.append({**row, "status": "error", "reason": f"{type(e).__name__}: {str(e)[:500]}"})
            continue
        rows.append({**row, "status": "ok"})
    return rows


class CopyBandwidth:
    """GB/s of a device copy moving as many bytes as a point (half read, half written), measured once per
    size: launch, ramp-up and tail weigh more on fewer bytes, so a fusion's limit is the copy of its own bytes
    (on the H200, 3650-3700 GB/s for 128 MiB moved against 4250 for 2 GiB)."""

    def __init__(self, dev: str, timer: Timer) -> None:
        self.dev, self.timer, self.cache = dev, timer, dict[int, float]()

    def __call__(self, nbytes: int) -> float:
        half = max(1, nbytes // 2)
        if half not in self.cache:
            x = torch.empty(half, dtype=torch.uint8, device=self.dev)
            y = torch.empty_like(x)
            self.cache[half] = gbps(2 * half, self.timer(lambda: y.copy_(x)))
        return self.cache[half]


def run_point(point: Point, dev: str, copy: CopyBandwidth, timer: Timer, max_autotune: bool = False,
              sweep: bool = False, enable_options: Sequence[str] = (), hand_edited: bool = True) -> dict[str, Any]:
    """One point: eager, Inductor and pyfuser timed by ``timer`` after pyfuser's answer is checked against
    eager's. ``enable_options`` go to every ``fd.execute`` (the interpreter where the timing is not the point)."""
    family = FAMILIES[point.family]
    row: dict[str, Any] = {"point": point.name, "family": point.family, "shape": list(point.shape),
                           "dtype": str(point.dtype).removeprefix("torch."), "layout": point.layout}
    reason = family.skip(point)
    if reason is not None:
        return {**row, "status": "skipped", "reason": reason}
    stage = "inputs"
    try:
        torch.manual_seed(0)
        inputs = family.make(point, dev)
        expected = outputs_of(family.torch_fn(*inputs))
        nbytes = moved_bytes(inputs, expected)
        row["bytes"] = nbytes
        stage = "pyfuser"
        fd = _define(point, inputs)
        start = time.perf_counter()
        got = fd.execute(inputs, _enable_options=list(enable_options))
        synchronize(dev)
        row["pyfuser_first_call_s"] = time.perf_counter() - start
        stage = "check"
        check(got, expected, point.name, exact=partial(float64_outputs, FAMILIES[point.family], inputs))
        del got
        row["kernels"] = len(fd.fec.kernel_codes())
        stage = "timing"
        row["pyfuser_ms"] = timer(lambda: fd.execute(inputs, _enable_options=list(enable_options)))
        row["eager_ms"] = timer(lambda: family.torch_fn(*inputs))
        modes = {"inductor": {}, **({"inductor_max_autotune": {"mode": "max-autotune-no-cudagraphs"}}
                                    if max_autotune else {})}
        for name, options in modes.items():
            try:
                torch._dynamo.reset()  # a fresh compile per point: no recompile limit, no dynamic-shape fallback
                compiled = torch.compile(family.torch_fn, dynamic=False, **options)
                start = time.perf_counter()
                compiled(*inputs)
                synchronize(dev)
                row[f"{name}_compile_s"] = time.perf_counter() - start
                row[f"{name}_ms"] = timer(lambda compiled=compiled: compiled(*inputs))
            except Exception as e:  # an anchor that fails leaves the others: the point still tells pyfuser's speed
                row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        stage = "copy"
        row["copy_GBps"] = copy(nbytes)
    except Exception as e:  # recorded per point: the sweep goes on and the summary names what failed
        return {**row, "status": "error", "stage": stage, "reason": f"{type(e).__name__}: {str(e)[:500]}"}
    anchors = [row[k] for k in ("eager_ms", "inductor_ms", "inductor_max_autotune_ms") if k in row]
    for k in ("pyfuser", "eager", "inductor", "inductor_max_autotune"):
        if f"{k}_ms" in row:
            row[f"{k}_GBps"] = gbps(nbytes, row[f"{k}_ms"])
    row["best_anchor_ms"] = min(anchors)
    row["vs_best_anchor"] = row["best_anchor_ms"] / row["pyfuser_ms"]
    if "inductor_ms" in row:
        row["vs_inductor"] = row["inductor_ms"] / row["pyfuser_ms"]
    row["vs_copy"] = row["pyfuser_GBps"] / row["copy_GBps"]
    row["status"] = "ok"
    if sweep:
        outer = sweep_outer(point, inputs, nbytes, timer, enable_options) if runs_outer(fd) else []
        inner = sweep_inner(point, inputs, nbytes, timer, enable_options) if runs_inner(fd) else []
        both = sweep_inner_outer(point, inputs, nbytes, timer, enable_options) if runs_inner_outer(fd) else []
        edited = sweep_point(point, inputs, nbytes, timer) if hand_edited else []
        row["sweep"] = sorted(edited + outer + inner + both, key=lambda r: r["ms"])
    return row


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per family and overall: the worst ratio (and its point) beside the geomean, against the faster anchor
    and against a copy of the same bytes; the points that did not run, counted."""
    def stats(group: Sequence[dict[str, Any]]) -> dict[str, Any]:
        ok = [r for r in group if r["status"] == "ok"]
        out: dict[str, Any] = {"points": len(group), "ok": len(ok),
                               "errors": sum(r["status"] == "error" for r in group),
                               "skipped": sum(r["status"] == "skipped" for r in group),
                               "not_run": sum(r["status"] == "not run" for r in group)}
        if ok:
            worst = min(ok, key=lambda r: r["vs_best_anchor"])
            worst_copy = min(ok, key=lambda r: r["vs_copy"])
            out.update(geomean=geomean([r["vs_best_anchor"] for r in ok]), worst=worst["vs_best_anchor"],
                       worst_point=worst["point"], below_0_95=sum(r["vs_best_anchor"] < 0.95 for r in ok),
                       geomean_copy=geomean([r["vs_copy"] for r in ok]), worst_copy=worst_copy["vs_copy"],
                       worst_copy_point=worst_copy["point"])
        return out

    families = {name: stats([r for r in rows if r["family"] == name])
                for name in dict.fromkeys(r["family"] for r in rows)}
    return {"overall": stats(rows), "families": families}


def _variants(scheduler: SchedulerType, params: Any, shape: Sequence[int]) -> list[Any]:
    """Hand-edited heuristics around ``params`` for ``--sweep``."""
    if params.shape == "outer":
        return _outer_variants(params)
    if scheduler is SchedulerType.inner_persistent and params.shape in ("loop", "split"):
        # Looped rows: step x warps x online softmax (max and sum of exp in one pass) on / off, and the
        # split across programs for few wide rows.
        loops = [dataclasses.replace(params, shape="loop", tile=t, num_warps=w, online=online, num_stages=0)
                 for t in (1024, 2048, 4096, 8192) for w in (4, 8, 16) for online in (True, False)
                 if w != 4 or (online and t in (2048, 4096))]
        # at the default step and warps: the L2 hint flipped (``L2Hint``),
        # and the loops software-pipelined (more loads in flight per program)
        loops += [dataclasses.replace(loops[0], tile=params.tile, num_warps=params.num_warps, online=online,
                                      l2=L2Hint.none if params.l2 is L2Hint.keep else L2Hint.keep)
                   for online in (True, False)]
        loops += [dataclasses.replace(loops[0], tile=params.tile, num_warps=params.num_warps, online=True,
                                      num_stages=stages) for stages in (2, 3)]
        splits = [dataclasses.replace(params, shape="split", tile=t, split=g, num_warps=w)
                  for g in (2, 4, 8) for t in (2048, 4096) for w in (8, 16)]
        return loops + (splits if params.shape == "split" else [])
    if scheduler in (SchedulerType.inner_persistent, SchedulerType.reduction):
        tiles = [dataclasses.replace(params, shape="tile", rows=r, num_warps=w) for r in (1, 2, 4, 8, 16) for w in (2, 4, 8, 16)]
        loops = [dataclasses.replace(params, shape="loop", tile=t, num_warps=w, num_stages=st)
                 for t in (2048, 4096, 8192) for w in (2, 4, 8) for st in (0, 3)]
        # Programs per row for few wide rows (the split's heuristic: two programs per SM, at most one per
        # 4 loop steps of the row; ``reduction_schedule.inner_params``).
        splits = [dataclasses.replace(params, shape="split", tile=t, split=g, num_warps=w)
                  for g in (2, 3, 4, 6, 8, 12) for t in (4096, 8192) for w in (4, 8)]
        return tiles + loops + (splits if params.shape in ("loop", "split") else [])
    if scheduler is SchedulerType.inner_outer_persistent:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        wide = [dataclasses.replace(params, split=waves * sms, rows=r, num_warps=w, num_stages=stages)
                for waves in (1, 2) for r in (1, 2, 4) for w in (8, 16) for stages in (1, 3)]
        # narrow rows (a channels-last layer norm's 96 channels): 1024-8192 elements a step on 2-8 warps, 1-8
        # programs an SM, the step's rows added up each step or kept as partials until the block is done
        width = next_power_of_2(shape[-1])
        narrow = [dataclasses.replace(params, split=waves * sms, rows=step // width, num_warps=w, num_stages=3,
                                      keep_step_rows=keep)
                  for step, w in ((1024, 2), (1024, 4), (1024, 8), (2048, 4), (2048, 8), (4096, 8), (8192, 8))
                  for waves in (1, 2, 4, 8) for keep in (False, True) if step // width > 1]
        return wide + narrow
    if scheduler is SchedulerType.transpose:
        return [dataclasses.replace(params, tile_in=t, tile_out=t, num_warps=w) for t in (32, 64) for w in (4, 8)]
    flat = [dataclasses.replace(params, block=(b,), num_warps=w) for b in (512, 1024, 2048, 4096) for w in (4, 8)]
    if len(shape) < 2:
        return flat
    # The 2-D schedule (outer x inner axes), which the heuristics leave to manual schedules.
    inner = params.block[0] // 4
    return flat + [dataclasses.replace(params, break_point=1, block=(o, i), num_warps=w)
                   for i in (inner // 2, inner, inner * 2) for o in (1, 2, 4, 8) for w in (4, 8)]


def _outer_variants(params: Any) -> list[Any]:
    """An outer reduction's column block ``BI`` (``tile``), rows per loop step ``BR`` (``tile_reduced``),
    programs along the reduced axis (``split``: half, the heuristic's and twice, where it splits) and warps
    (``reduction_schedule.outer_params``)."""
    splits = sorted({max(2, params.split // 2), params.split, params.split * 2}) if params.split > 1 else [1]
    if not params.tile_reduced:  # the reduced extent whole on chip (a persistent block of columns)
        return [dataclasses.replace(params, tile=t, num_warps=w) for t in (8, 16, 32, 64, 128) for w in (2, 4, 8)]
    return [dataclasses.replace(params, tile=t, tile_reduced=r, split=g, num_warps=w)
            for t in (32, 64, 128, 256) for r in (8, 16, 32, 64) for g in splits for w in (4, 8)]


def launched_params(fd: FusionDefinition) -> list[Any]:
    """The scheduler parameters of each kernel the latest program of ``fd`` launches, in launch order."""
    program = fd.fec.last_program
    program = getattr(program, "program", program)  # the program a CUDA graph replays
    container = getattr(program, "container", None)
    if container is None:
        return []
    return [params for n in container.walk() if isinstance(n, LaunchKernel)
            if (params := getattr(n.segment, "scheduler_params", None)) is not None]


def runs_outer(fd: FusionDefinition) -> bool:
    """Whether the latest program of ``fd`` launches a kernel scheduled as an outer reduction."""
    return any(getattr(p, "shape", None) == "outer" for p in launched_params(fd))


def _outer_summary(params: Any) -> str:
    return (f"{params.scheduler_type.name}: tile {params.tile}, tile_reduced {params.tile_reduced}, "
            f"split {params.split}, warps {params.num_warps}")


def _outer_variants_of_heuristic() -> list[OuterHeuristic]:
    """The outer heuristic's variants ``--sweep`` times a fusion with outer segments under: each knob of
    ``OuterHeuristic`` moved alone from its default (column block, loop step, programs per SM, loop steps
    per program of a split, narrowing before a split, a var_mean's columns / steps / programs / elements per
    thread, the final step's columns and programs, pipelining, L2 hints), then the schedule before narrowing
    and the small Welford steps."""
    base = OuterHeuristic()
    knobs: dict[str, tuple[Any, ...]] = {
        "column_bytes": (256, 1024), "reduction_columns": (64, 256), "step_bytes": (8192, 32768),
        "reduction_step_bytes": (4096, 16384), "waves": (1, 4), "split_waves": (2, 8),
        "min_steps": (1, 2), "reduction_min_steps": (1, 4), "streamed_16bit_stages": (3, 5),
        "min_columns": (64,), "narrow_bytes": (0, 64, 256), "welford_column_bytes": (64, 256, 512),
        "welford_step_elements": (2048, 8192), "small_welford_elements": (0, 1 << 23),
        "small_welford_step_elements": (1024, 4096), "welford_waves": (2, 4, 8),
        "welford_elements": (4, 16, 32), "narrow_elements": (0, 16), "narrowed_step_bytes": (0, 32768),
        "final_waves": (2, 4), "final_min_columns": (1, 16, 32), "stages": (2, 4),
        "l2": (L2Hint.none,), "reduction_l2": (L2Hint.keep, L2Hint.none)}
    variants = [base] + [dataclasses.replace(base, **{k: v}) for k, values in knobs.items() for v in values]
    # split-first column blocks and the first var_mean split (fewer, fuller programs; wide final columns)
    variants.append(OuterHeuristic(narrow_bytes=0, welford_step_elements=8192, welford_waves=2, welford_elements=32,
                                   final_waves=0, final_min_columns=32))
    return variants


#: The outer heuristics ``--sweep`` times (``_outer_variants_of_heuristic``).
OUTER_HEURISTICS = _outer_variants_of_heuristic()


def heuristic_name(heuristic: Any) -> str:
    """``heuristic``'s fields that differ from its class's defaults (``default`` where none do)."""
    changed = [f"{f.name}={getattr(heuristic, f.name)}" for f in dataclasses.fields(heuristic)
               if getattr(heuristic, f.name) != f.default]
    return f"{type(heuristic).__name__}({', '.join(changed) or 'default'})"


def _inner_variants_of_heuristic() -> list[InnerHeuristic]:
    """The inner heuristic's variants ``--sweep`` times a plain reduction of rows under: each knob of
    ``InnerHeuristic`` moved alone from its default, then long rows looped without a bound on the
    waste past their end."""
    base = InnerHeuristic()
    knobs: dict[str, tuple[Any, ...]] = {
        "max_tile": (1024, 2048, 4096, 8192), "rows_tile": (1024, 4096, 8192), "max_rows": (16, 128),
        "waves": (1, 4), "loop_step": (2048, 4096, 16384), "max_waste": (0.125, 0.5, 1.0), "loop_warps": (4, 8, 16),
        "min_steps": (2, 8), "short_step_warps": (4, 8), "l2": (L2Hint.keep, L2Hint.none)}
    variants = [base] + [dataclasses.replace(base, **{k: v}) for k, values in knobs.items() for v in values]
    variants.append(InnerHeuristic(max_tile=4096, max_waste=1.0))
    return variants


#: The inner heuristics ``--sweep`` times (``_inner_variants_of_heuristic``).
INNER_HEURISTICS = _inner_variants_of_heuristic()


def _many_rows_variants() -> list[ManyRows]:
    """``ManyRows``' variants ``--sweep`` times an inner-outer fusion under: off (one program an SM), then each
    knob moved alone from its default (rows a block, blocks an SM, step elements, elements a lane on aligned
    and on narrow rows, the width from which a step's rows are kept)."""
    base = ManyRows()
    knobs: dict[str, tuple[Any, ...]] = {
        "block_rows": (32, 128), "waves": (2, 10 ** 9), "step_elements": (256, 1024), "step_elements_wide": (512, 2048),
        "elements_per_lane": (8,), "narrow_elements_per_lane": (8, 16), "keep_from_width": (0, 1024)}
    return [base] + [dataclasses.replace(base, **{k: v}) for k, values in knobs.items() for v in values]


#: The many-rows rules ``--sweep`` times (``_many_rows_variants``).
MANY_ROWS_HEURISTICS = _many_rows_variants()


def runs_inner_outer(fd: FusionDefinition) -> bool:
    """Whether the latest program of ``fd`` launches an inner-outer persistent kernel."""
    return any(getattr(p, "scheduler_type", None) is SchedulerType.inner_outer_persistent for p in launched_params(fd))


def runs_inner(fd: FusionDefinition) -> bool:
    """Whether the latest program of ``fd`` launches a plain reduction kernel of rows (tile, loop or split)."""
    return any(getattr(p, "scheduler_type", None) is SchedulerType.reduction and p.shape in ("tile", "loop", "split")
               for p in launched_params(fd))


def sweep_outer(point: Point, inputs: list[Any], nbytes: int, timer: Timer, enable_options: Sequence[str] = (),
                heuristics: Sequence[OuterHeuristic] = tuple(OUTER_HEURISTICS)) -> list[dict[str, Any]]:
    """The whole fusion (every segment, as ``fd.execute`` runs it) compiled and timed under each outer
    heuristic: also fusions of several segments (batch-norm statistics' two stages), which ``sweep_point``
    cannot schedule as one. A fusion with a var_mean is also timed with outer var_means staged (H, W first)
    under the first few heuristics (``stage_outer_var_means``)."""
    variants = [(h, InnerHeuristic(), False, ManyRows()) for h in heuristics]
    if _has_var_mean(_define(point, inputs)):
        variants += [(h, InnerHeuristic(), True, ManyRows()) for h in heuristics[:4]]
    return _sweep_heuristics(point, inputs, nbytes, timer, enable_options, variants)


def sweep_inner(point: Point, inputs: list[Any], nbytes: int, timer: Timer, enable_options: Sequence[str] = (),
                heuristics: Sequence[InnerHeuristic] = tuple(INNER_HEURISTICS)) -> list[dict[str, Any]]:
    """The whole fusion compiled and timed under each inner heuristic (plain reductions of rows)."""
    return _sweep_heuristics(point, inputs, nbytes, timer, enable_options,
                             [(OuterHeuristic(), h, False, ManyRows()) for h in heuristics])


def sweep_inner_outer(point: Point, inputs: list[Any], nbytes: int, timer: Timer, enable_options: Sequence[str] = (),
                      heuristics: Sequence[ManyRows] = tuple(MANY_ROWS_HEURISTICS)) -> list[dict[str, Any]]:
    """The whole fusion compiled and timed under each many-rows rule (inner-outer kernels: norm backwards)."""
    return _sweep_heuristics(point, inputs, nbytes, timer, enable_options,
                             [(OuterHeuristic(), InnerHeuristic(), False, h) for h in heuristics])


def _sweep_heuristics(point: Point, inputs: list[Any], nbytes: int, timer: Timer, enable_options: Sequence[str],
                      variants: Sequence[tuple[OuterHeuristic, InnerHeuristic, bool, ManyRows]]) -> list[dict[str, Any]]:
    """``point``'s fusion defined, checked against torch and timed under each (outer heuristic, inner
    heuristic, outer var_means staged, many-rows rule), fastest first; a variant that fails is recorded, the
    sweep goes on."""
    results = []
    for outer, inner, staged, many in variants:
        names = [heuristic_name(h) for h in (outer, inner, many) if h != type(h)()]
        name = " ".join(names or ["default"]) + (" staged" if staged else "")
        with outer_heuristic(outer), inner_heuristic(inner), stage_outer_var_means(staged), many_rows(many):
            fd = _define(point, inputs)

            def run(fd: FusionDefinition = fd) -> Any:
                return fd.execute(inputs, _enable_options=list(enable_options))

            try:
                check(run(), outputs_of(FAMILIES[point.family].torch_fn(*inputs)), point.name,
                      exact=partial(float64_outputs, FAMILIES[point.family], inputs))
                ms = timer(run)
            except Exception as e:  # a variant over the machine's limits: recorded, the sweep goes on
                results.append({"params": name, "ms": float("inf"), "GBps": 0.0,
                                "error": f"{type(e).__name__}: {str(e)[:200]}"})
                continue
        kernels = [_outer_summary(p) for p in launched_params(fd) if getattr(p, "shape", None) == "outer"]
        kernels += [_inner_summary(p) for p in launched_params(fd)
                    if getattr(p, "shape", None) in ("tile", "loop", "split")]
        results.append({"params": f"{name} ({'; '.join(kernels)}; {len(launched_params(fd))} launches)", "ms": ms,
                        "GBps": gbps(nbytes, ms)})
    return sorted(results, key=lambda r: r["ms"])


def _inner_summary(params: Any) -> str:
    return (f"{params.scheduler_type.name}: {params.shape} rows {params.rows}, tile {params.tile}, "
            f"split {params.split}, warps {params.num_warps}")


def _has_var_mean(fd: FusionDefinition) -> bool:
    return any(isinstance(e, VarMeanOp) for e in fd.fusion.exprs())


def sweep_point(point: Point, inputs: list[Any], nbytes: int, timer: Timer) -> list[dict[str, Any]]:
    """The family's scheduler with hand-edited parameters, fastest first (the fusion must be one segment of
    that scheduler: a point where it is not records the error)."""
    scheduler = FAMILIES[point.family].scheduler
    try:
        base = schedule.compute_heuristics(_define(point, inputs).fusion, scheduler, inputs)
    except Exception as e:  # not one segment of this scheduler: nothing to tune here
        return [{"params": "", "ms": float("inf"), "GBps": 0.0, "error": f"{type(e).__name__}: {str(e)[:200]}"}]
    results = []
    for params in _variants(scheduler, base, point.shape):
        fd = _define(point, inputs)
        try:
            schedule.schedule(fd.fusion, scheduler, params)
            fd.manual_execute(inputs, params)
        except Exception as e:  # a variant over the machine's limits (shared memory of deep pipelines)
            results.append({"params": str(params).replace("\n", " "), "ms": float("inf"), "GBps": 0.0,
                            "error": f"{type(e).__name__}: {str(e)[:200]}"})
            continue
        ms = timer(lambda fd=fd, params=params: fd.manual_execute(inputs, params))
        results.append({"params": str(params).replace("\n", " "), "ms": ms, "GBps": gbps(nbytes, ms)})
    return sorted(results, key=lambda r: r["ms"])


def host_overhead(dev: str) -> dict[str, float]:
    """Host time of a cached ``fd.execute`` of a one-kernel fusion over launching its compiled variant
    with the arguments ``prepare`` computed (the launch alone)."""
    x = torch.randn(1024, device=dev)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.add(fd.from_pytorch(x), 1.0))
    fd.execute([x])
    kernel = fd.fec.last_program.container.nodes[0].segment  # the LaunchKernel's compiled kernel
    _, grid, params = kernel.prepare(EvalContext(device=x.device), x)

    def direct() -> None:
        kernel.launch(grid, params)

    def timed(fn: Callable[[], Any], n: int = 2000) -> float:
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - start
        torch.cuda.synchronize()
        return elapsed / n * 1e6

    direct_us = timed(direct)
    execute_us = timed(lambda: fd.execute([x]))
    return {"execute_us": execute_us, "launch_us": direct_us, "overhead_us": execute_us - direct_us}


def copy_bandwidth(dev: str, nbytes: int = 2 << 30) -> float:
    """GB/s of a device copy moving ``nbytes`` (half read, half written). The physical limit of a
    fusion is the copy of its own bytes: launch, ramp-up and tail weigh more on fewer bytes (on the
    H200, 3650-3700 GB/s for 128 MiB moved against 4250 for 2 GiB)."""
    x = torch.empty(nbytes // 2, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    return gbps(2 * x.numel(), ms)


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def markdown(result: dict[str, Any]) -> str:
    """The summary per family (worst beside geomean), then every point."""
    s = result["summary"]
    lines = [f"# Generated kernels over a sweep, {result['device']} ({result['date']})", "",
             f"Selection: `{result['selection']}`, {s['overall']['points']} points ({s['overall']['ok']} ran, "
             f"{s['overall']['errors']} failed, {s['overall']['skipped']} skipped, {s['overall']['not_run']} not run). "
             "Copy bandwidth (1 GiB, read + "
             f"write): {result['copy_GBps']:.0f} GB/s. Ratios: pyfuser's speed over the faster of eager and "
             "Inductor (>1: pyfuser faster) and over a device copy of the point's own bytes; GB/s by the bytes "
             "the fusion must move; GPU time of one call, L2 flushed."
             + (f" Merged from: {'; '.join(result['merged_from'])} (a point in several parts: the later part's row)."
                if result.get("merged_from") else ""), "",
             "| family | points ok | geomean vs best anchor | worst | worst point | points < 0.95 | geomean vs copy "
             "| worst vs copy | failed / skipped |",
             "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for name, f in [*s["families"].items(), ("**overall**", s["overall"])]:
        lines.append(f"| {name} | {f['ok']}/{f['points']} | {_ratio(f.get('geomean'))} | {_ratio(f.get('worst'))} | "
                     f"{f.get('worst_point', '')} | {f.get('below_0_95', '')} | {_ratio(f.get('geomean_copy'))} | "
                     f"{_ratio(f.get('worst_copy'))} | {f['errors']} / {f['skipped']} |")
    lines += ["", "| point | pyfuser ms | pyfuser GB/s | eager GB/s | Inductor GB/s | copy GB/s | vs best anchor "
              "| vs copy | kernels | first call (s) |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["points"]:
        if r["status"] == "ok":
            inductor = f"{r['inductor_GBps']:.0f}" if "inductor_GBps" in r else "failed"
            lines.append(f"| {r['point']} | {r['pyfuser_ms']:.4f} | {r['pyfuser_GBps']:.0f} | {r['eager_GBps']:.0f} | "
                         f"{inductor} | {r['copy_GBps']:.0f} | {r['vs_best_anchor']:.2f} | "
                         f"{r['vs_copy']:.2f} | {r['kernels']} | {r['pyfuser_first_call_s']:.2f} |")
    failed = [r for r in result["points"] if r["status"] != "ok"]
    if failed:
        lines += ["", "Not timed:"] + [f"- {r['point']}: {r['status']}{' in ' + r['stage'] if 'stage' in r else ''}: "
                                       f"{r['reason'].splitlines()[0] if r['reason'] else ''}" for r in failed]
    anchors = [r for r in result["points"] if r["status"] == "ok" and any(k.endswith("_error") for k in r)]
    if anchors:
        lines += ["", "Anchors that failed (the point compares with the others):"]
        lines += [f"- {r['point']}: " + "; ".join(f"{k.removesuffix('_error')}: {v.splitlines()[0] if v else ''}"
                                                  for k, v in r.items() if k.endswith("_error")) for r in anchors]
    h = result.get("host")
    if h:
        lines += ["", f"Host time of a cached one-kernel `fd.execute`: {h['execute_us']:.1f} us; launch of its "
                  f"compiled variant alone: {h['launch_us']:.1f} us; overhead {h['overhead_us']:.1f} us."]
    for r in result["points"]:
        if r.get("sweep"):
            best = r["sweep"][0]
            lines.append(f"- sweep {r['point']}: best {best['GBps']:.0f} GB/s with {best['params'] or best.get('error')}")
    return "\n".join(lines) + "\n"


def select(args: argparse.Namespace) -> tuple[list[Point], str]:
    """The points a run takes and the name of its selection (empty: the full sweep)."""
    points = list(QUICK) if args.quick else full_points()
    parts = ["quick"] if args.quick else []
    if args.families:
        unknown = set(args.families.split(",")) - set(FAMILIES)
        if unknown:
            raise SystemExit(f"--families: unknown {sorted(unknown)}; known: {', '.join(FAMILIES)}")
        points = [p for p in points if p.family in args.families.split(",")]
        parts.append(args.families.replace(",", "-"))
    if args.match:
        points = [p for p in points if any(part in p.name for part in args.match.split(","))]
        parts.append(args.match.replace(",", "-"))
    if args.shard:
        index, count = (int(v) for v in args.shard.split("/"))
        if not 1 <= index <= count:
            raise SystemExit(f"--shard {args.shard}: expected K/N with 1 <= K <= N")
        points = points[index - 1::count]  # interleaved: every shard gets every family
        parts.append(f"shard{index}of{count}")
    if args.sweep or args.sweep_heuristics:
        parts.append("sweep")
    return points, "_".join(parts)


def _load_result(path: Path) -> dict[str, Any]:
    """A results file, or a ``--progress`` file (a header line, then a line per point) of a run cut short."""
    if path.suffix != ".jsonl":
        return dict(json.loads(path.read_text()))
    header, *rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {**header, "points": rows}


def merge(paths: Sequence[str]) -> dict[str, Any]:
    """Shards' results (``--shard``; results files or ``--progress`` files) as one result: their points,
    summarized again. A point in several files keeps the later file's row (a full sweep, then a re-run of
    the families a change touched); the result is dated by its latest part, and ``merged_from`` names each
    part's selection and date."""
    parts = [_load_result(Path(p)) for p in paths]
    devices = {p["device"] for p in parts}
    if len(devices) != 1:
        raise SystemExit(f"--merge: the shards ran on different devices {sorted(devices)}")
    by_name = {r["point"]: r for p in parts for r in p["points"]}
    points = list(by_name.values())
    host = next((p["host"] for p in parts if "host" in p), None)
    latest = max(parts, key=lambda p: str(p.get("date", "")))
    first = {k: v for k, v in parts[0].items() if k != "run"}  # the merge's own run line (write_results)
    return {**first, **({"host": host} if host else {}), "date": latest.get("date", parts[0].get("date")),
            "selection": "full", "points": points, "summary": summarize(points),
            "merged_from": [f"{p['selection']} ({p.get('date', '?')})" for p in parts]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few points per family")
    parser.add_argument("--families", default="", help="comma-separated family names: only those")
    parser.add_argument("--match", default="", help="comma-separated parts of point names: only those")
    parser.add_argument("--shard", default="", help="K/N: every N-th point from the K-th")
    parser.add_argument("--sweep", action="store_true", help="also time hand-edited heuristics per point")
    parser.add_argument("--sweep-heuristics", action="store_true",
                        help="also time the outer / inner heuristic variants per point (not the hand-edited params)")
    parser.add_argument("--max-autotune", action="store_true", help="also Inductor mode=max-autotune-no-cudagraphs")
    parser.add_argument("--budget-s", type=float, default=0.0, help="start no point after this many seconds")
    parser.add_argument("--rep-ms", type=float, default=100.0, help="time per measurement")
    parser.add_argument("--max-reps", type=int, default=200, help="samples per measurement at most")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, Triton's interpreter, no timing")
    parser.add_argument("--merge", nargs="+", default=[], help="kernels_shard*.json files: write them as one run")
    parser.add_argument("--list", action="store_true", help="print the selected points and exit")
    parser.add_argument("--progress", default="", help="append each point's row to this JSON-lines file as it "
                        "finishes (a run that dies keeps its points: --merge takes the file)")
    parser.add_argument("--timing-lock", default=None, metavar="FILE",
                        help="hold FILE's exclusive lock while timing (other benchmarks in parallel on one GPU)")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    if args.dry_run:
        chosen = [p for p in tiny_points() if not args.families or p.family in args.families.split(",")]
        rows = dry_run(chosen)
        for row in rows:
            print(f"{row['status']:8} {row['point']} {row.get('reason', '')}")
        raise SystemExit(1 if any(r["status"] == "error" for r in rows) else 0)
    if args.merge:
        result = merge(args.merge)
        prefix = write_results("kernels", machine_kind(result["device"]), result, markdown(result), Path(args.out))
        print(f"wrote {prefix}.json and {prefix}.md")
        return
    points, selection = select(args)
    if args.list:
        print("\n".join(p.name for p in points), f"\n{len(points)} points", sep="")
        return
    dev = "cuda"
    with timing_lock(args.timing_lock):
        copy_gbps = copy_bandwidth(dev)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                              "torch": torch.__version__, "selection": selection or "full",
                              "copy_GBps": copy_gbps, "points": []}
    def timer(fn: Callable[[], Any]) -> float:
        with timing_lock(args.timing_lock):
            return bench(fn, args.rep_ms, max_reps=args.max_reps)

    copy = CopyBandwidth(dev, timer)
    progress = Path(args.progress) if args.progress else None
    if progress is not None:
        progress.write_text(json.dumps({k: v for k, v in result.items() if k != "points"}) + "\n")
    start = time.perf_counter()
    for k, point in enumerate(points):
        if args.budget_s and time.perf_counter() - start > args.budget_s:
            skipped = [{"point": p.name, "family": p.family, "status": "not run",
                        "reason": f"--budget-s {args.budget_s:g} spent"} for p in points[k:]]
            result["points"] += skipped
            if progress is not None:  # a merge of progress files counts them too
                with progress.open("a") as f:
                    f.writelines(json.dumps(row) + "\n" for row in skipped)
            break
        row = run_point(point, dev, copy, timer, args.max_autotune, args.sweep or args.sweep_heuristics,
                        hand_edited=not args.sweep_heuristics)
        print(json.dumps({k: v for k, v in row.items() if k != "sweep"}), flush=True)
        result["points"].append(row)
        if progress is not None:
            with progress.open("a") as f:
                f.write(json.dumps(row) + "\n")
        torch.cuda.empty_cache()
    result["summary"] = summarize(result["points"])
    try:
        with timing_lock(args.timing_lock):
            result["host"] = host_overhead(dev)
    except Exception as e:  # it reaches into the runtime's program: a change there must not lose the sweep
        result["host_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    result["seconds"] = time.perf_counter() - start
    # A partial run writes beside the full sweep's results, never over them.
    prefix = write_results("kernels", machine_kind(result["device"]), result, markdown(result), Path(args.out),
                           variant=selection)
    print(markdown(result))
    print(f"wrote {prefix}.json and {prefix}.md")


if __name__ == "__main__":
    main()
