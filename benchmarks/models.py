"""The model zoo (``benchmarks/model_zoo.py``) through torch.compile backends, side by side in one process.

For every model, mode (``inference``: eval, no grad; ``training``: train mode, forward + loss + backward,
gradients zeroed with ``set_to_none``), dtype (bf16, fp32) and variant:

    eager                 the model as built
    inductor              torch.compile(model)
    inductor_cuda_graph   torch.compile(model, mode="reduce-overhead")
    pyfuser               torch.compile(model, backend=PyfuserBackend())
    pyfuser_cuda_graph    torch.compile(model, backend=PyfuserBackend(cuda_graph=True))
                          (what backend="pyfuser", options={"cuda_graph": True} builds)

it records the median milliseconds per step over ``--iters`` steps after ``--warmup`` (CUDA events on a GPU;
a case's variants are all compiled first, then timed in rounds whose order rotates, so none is always timed
first or last in the process), tokens / images / seconds of audio per second, the ratio to Inductor
(CUDA-graph variants: to ``reduce-overhead``) and to eager (anchor time / variant time: above 1 is faster),
the first call's seconds (compilation included; Inductor's FX-graph and autotuning caches are off, so it
compiles as in a fresh process) and the error against an fp32 eager reference of the same weights and inputs
(max abs error, and that over the reference's max abs value; training: loss, logits and three parameters'
gradients), beside eager's own error in the same dtype. A ``KernelFallbackWarning`` (a region whose
generated kernels failed, running as ATen calls) fails its case: its text (error and kernel source) is
printed and kept in the results. A case that raises (an OOM included) records the error; the run goes on and
exits with status 1 when any case failed.

    python benchmarks/models.py                                    # every model, default size, on a GPU
    python benchmarks/models.py --models llama,vit --modes training --dtypes bf16 --merge
    python benchmarks/models.py --size small                       # host-bound scale (models_small_<kind>)
    python benchmarks/models.py --profile deberta_v2 --modes training --dtypes bf16
    python benchmarks/models.py --device cpu --quick --models llama,vit   # CPU smoke (Triton interpreter)

Writes ``<out>/models[_<variant>]_<kind>.json`` and ``.md`` (``benchmarks/results_files.py``; ``--out``
defaults to ``benchmarks/results``); a run of another size or a quick run is a variant of its own.
``--merge`` keeps the cases of the file it writes over that this run did not repeat (a full run in
several processes, one after another); the file is rewritten after each model, so a run cut short keeps
what it finished. Shards in parallel on one machine: ``--timing-lock FILE`` (timed steps hold it alone; compilation,
first calls and checks share it, so shards compile in parallel, their first calls' seconds including
contention, but never beside a timed step) and ``--out`` per shard, then
``--combine shard*/models_<kind>.json`` writes them as one run.

``--profile MODEL`` instead writes ``models_profile_<model>_<mode>_<dtype>_<kind>.md``: each variant's kernels by GPU time
side by side (``torch.profiler``, aggregated by name) with totals of generated kernels, GEMM / convolution /
attention library kernels and other ATen kernels, and what each pyfuser region ran.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import math
import re
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
import torch._inductor.config
import transformers
from model_zoo import ARCHS, SIZES, Batch, Size, build_model, make_batch, output_logits, output_loss
from results_files import RESULTS, kind_label, machine_kind, now_stamp, run_line, write_results
from timing import synchronize, time_ms, time_ms_interleaved, timing_lock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyfuser.integrations.torch_compile import PyfuserBackend
from pyfuser.integrations.torch_compile.region import KernelFallbackWarning

VARIANTS = ("eager", "inductor", "inductor_cuda_graph", "pyfuser", "pyfuser_cuda_graph")
CUDA_ONLY = {"inductor_cuda_graph", "pyfuser_cuda_graph"}
#: What each variant's speed is compared with (besides eager).
ANCHOR = {"inductor": "inductor", "pyfuser": "inductor", "inductor_cuda_graph": "inductor_cuda_graph",
          "pyfuser_cuda_graph": "inductor_cuda_graph"}
MODES = ("inference", "training")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
#: The variants the summary rates (against their anchor): pyfuser without and with CUDA graphs.
RATED = ("pyfuser", "pyfuser_cuda_graph")


@dataclass
class Options:
    device: str
    size: Size
    warmup: int
    iters: int
    interpreter: bool
    grads: int = 3
    seed: int = 0
    #: a file whose exclusive lock the timed steps hold (shards of one run in parallel processes on one GPU)
    timing_lock: str | None = None


# --- steps ---------------------------------------------------------------------------------------------------
@dataclass
class StepResult:
    """What one step leaves to check: the logits, the loss (training) and the gradients by parameter name."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None
    grads: dict[str, torch.Tensor] = field(default_factory=dict)


def make_step(run: Callable[..., Any], model: torch.nn.Module, batch: Batch, training: bool,
              mark_step: bool) -> Callable[[], Any]:
    """One inference or training step of ``run`` (the model or its compiled form); it returns the output."""
    kwargs = batch.kwargs(training)

    def step() -> Any:
        if mark_step:  # Inductor's CUDA graph trees: a new step may overwrite the last one's outputs
            torch.compiler.cudagraph_mark_step_begin()
        if training:
            model.zero_grad(set_to_none=True)
            out = run(**kwargs)
            output_loss(out).backward()
            return out
        with torch.no_grad():
            return run(**kwargs)

    return step


def checked(out: Any, model: torch.nn.Module, training: bool, grad_names: list[str]) -> StepResult:
    """Copies of what a step's output and gradients hold (a CUDA-graph replay overwrites them)."""
    result = StepResult(output_logits(out).detach().float().clone())
    if training:
        result.loss = output_loss(out).detach().float().clone()
        params = dict(model.named_parameters())
        result.grads = {n: params[n].grad.detach().float().clone() for n in grad_names if params[n].grad is not None}
    return result


def error(got: torch.Tensor, want: torch.Tensor) -> dict[str, float]:
    """Max abs error, and that over the reference's max abs value (elementwise relative error is
    meaningless where the reference is near zero)."""
    if got.shape != want.shape:
        return {"abs": math.inf, "rel": math.inf}
    diff = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
    scale = want.double().abs().max().item() if want.numel() else 0.0
    return {"abs": diff, "rel": diff / scale if scale else diff}


def errors(got: StepResult, want: StepResult) -> dict[str, dict[str, float]]:
    out = {"logits": error(got.logits, want.logits)}
    if want.loss is not None and got.loss is not None:
        out["loss"] = error(got.loss, want.loss)
    for name, grad in want.grads.items():
        out[f"grad {name}"] = error(got.grads[name], grad) if name in got.grads else {"abs": math.inf, "rel": math.inf}
    return out


def compiled(variant: str, model: torch.nn.Module, opts: Options) -> tuple[Callable[..., Any], PyfuserBackend | None]:
    if variant == "eager":
        return model, None
    if variant == "inductor":
        return torch.compile(model), None
    if variant == "inductor_cuda_graph":
        return torch.compile(model, mode="reduce-overhead"), None
    backend = PyfuserBackend(cuda_graph=variant == "pyfuser_cuda_graph", triton_interpreter=opts.interpreter)
    return torch.compile(model, backend=backend), backend


def release(device: str) -> None:
    """Between cases: nothing compiled or captured by one case outlives it."""
    torch._dynamo.reset()
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


@contextmanager
def watched(record: dict[str, Any]) -> Iterator[None]:
    """Collect the warnings of a case: a ``KernelFallbackWarning`` fails it (printed in full, kept in
    ``record["fallbacks"]``); pyfuser's other warnings (a region leaving CUDA graphs) go to ``notes``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for w in caught:
                text = str(w.message)
                if isinstance(w.message, KernelFallbackWarning):
                    record.setdefault("fallbacks", []).append(text)
                    print(f"KernelFallbackWarning in {case_name(record)}:\n{text}\n", flush=True)
                elif "pyfuser" in text or "region" in text:
                    notes = record.setdefault("notes", [])
                    if text[:300] not in notes:
                        notes.append(text[:300])


def case_name(record: dict[str, Any]) -> str:
    return f"{record['model']} {record['mode']} {record['dtype']} {record['variant']}"


@dataclass
class Case:
    """One (model, mode, dtype, variant) of a run: its record and, once compiled and run, its step."""

    record: dict[str, Any]
    step: Callable[[], Any] | None = None
    backend: PyfuserBackend | None = None


def failed(case: Case, e: BaseException) -> None:
    """Record ``e`` as the case's failure (an OOM included); the other cases still run."""
    record = case.record
    record["status"] = "oom" if isinstance(e, torch.OutOfMemoryError) else "error"
    record["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
    record["traceback"] = "".join(traceback.format_exception(e))[-4000:]
    print(f"{case_name(record)}: {record['error'][:500]}", flush=True)
    case.step = case.backend = None


def prepare_case(case: Case, model: torch.nn.Module, batch: Batch, opts: Options) -> None:
    """Compile the case's variant and run its first step (timed: compilation included)."""
    record = case.record
    training = record["mode"] == "training"
    variant = record["variant"]
    try:
        with timing_lock(opts.timing_lock, shared=True), watched(record):
            run, case.backend = compiled(variant, model, opts)
            case.step = make_step(run, model, batch, training, variant == "inductor_cuda_graph")
            if opts.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            case.step()
            synchronize(opts.device)
            record["first_call_s"] = time.perf_counter() - t0
            if opts.device == "cuda":
                record["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    except Exception as e:
        failed(case, e)


def time_cases(cases: list[Case], batch: Batch, opts: Options) -> None:
    """The prepared cases timed together (``time_ms_interleaved``), each into its record."""
    live = {c.record["variant"]: c for c in cases if c.step is not None}
    with timing_lock(opts.timing_lock):
        times = time_ms_interleaved({v: c.step for v, c in live.items()}, opts.device,
                                    opts.warmup, opts.iters, around=lambda variant: watched(live[variant].record))
    for case in live.values():
        ms = times[case.record["variant"]]
        if isinstance(ms, BaseException):
            failed(case, ms)
        else:
            case.record["ms"] = ms
            case.record["units_per_s"] = batch.units / (ms / 1e3)


def finish_case(case: Case, model: torch.nn.Module, reference: StepResult, grad_names: list[str],
                opts: Options) -> None:
    """Check a timed case's step against the float32 reference and count what its backend compiled."""
    record = case.record
    if case.step is None:
        return
    training = record["mode"] == "training"
    try:
        with timing_lock(opts.timing_lock, shared=True), watched(record):
            record["errors"] = errors(checked(case.step(), model, training, grad_names), reference)
            if case.backend is not None:
                record["regions"] = sum(len(g.regions) for g in case.backend.graphs)
                record["eager_ops"] = sum(len(g.eager) for g in case.backend.graphs)
        record["status"] = "fallback" if record.get("fallbacks") else "ok"
    except Exception as e:
        failed(case, e)
    finally:
        case.step = case.backend = None  # drop the compiled model before the reset
        if training:
            model.zero_grad(set_to_none=True)


def picked_gradients(model: torch.nn.Module, reference: torch.nn.Module) -> list[str]:
    """Names of ``grads`` parameters spread over the model (first, middle, last) that the reference's
    step gave a gradient."""
    names = [n for n, p in reference.named_parameters() if p.grad is not None]
    return [names[i] for i in sorted({0, len(names) // 2, len(names) - 1})] if names else []


def run_model(name: str, modes: list[str], dtypes: list[str], variants: list[str], opts: Options) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    try:
        pristine = build_model(name, opts.size, opts.device, opts.seed)
    except Exception as e:
        print(f"{name}: cannot build: {type(e).__name__}: {e}", flush=True)
        return [{"model": name, "mode": m, "dtype": d, "variant": v, "status": "error",
                 "error": f"building the model: {type(e).__name__}: {str(e)[:2000]}"}
                for m in modes for d in dtypes for v in variants]
    for mode in modes:
        training = mode == "training"
        reference_model = copy.deepcopy(pristine).train(training)
        batch32 = make_batch(name, opts.size, opts.device, torch.float32, opts.seed)
        try:
            with timing_lock(opts.timing_lock, shared=True):
                out = make_step(reference_model, reference_model, batch32, training, False)()
            grad_names = picked_gradients(reference_model, reference_model) if training else []
            reference = checked(out, reference_model, training, grad_names)
            error_text = None
        except Exception as e:
            error_text = f"the fp32 eager reference: {type(e).__name__}: {str(e)[:2000]}"
            print(f"{name} {mode}: {error_text}", flush=True)
        del reference_model, batch32
        release(opts.device)
        for dtype_name in dtypes:
            model = copy.deepcopy(pristine).to(DTYPES[dtype_name]).train(training)
            batch = make_batch(name, opts.size, opts.device, DTYPES[dtype_name], opts.seed)
            cases = [Case({"model": name, "mode": mode, "dtype": dtype_name, "variant": variant,
                           "unit": batch.unit, "units_per_step": batch.units}) for variant in variants]
            records += [c.record for c in cases]
            for case in cases:
                if error_text is not None:
                    case.record.update(status="error", error=error_text)
                elif case.record["variant"] in CUDA_ONLY and opts.device != "cuda":
                    case.record.update(status="skipped", error="CUDA graphs need a GPU")
                else:
                    prepare_case(case, model, batch, opts)
            time_cases(cases, batch, opts)
            for case in cases:
                finish_case(case, model, reference, grad_names, opts)
                print(line(case.record), flush=True)
            del model, batch, cases
            release(opts.device)
    return records


def line(record: dict[str, Any]) -> str:
    head = f"{record['model']:>10} {record['mode']:>9} {record['dtype']:>4} {record['variant']:>19}: "
    if "ms" not in record:
        return head + f"{record['status']}: {record.get('error', '')[:200]}"
    worst = max((e["rel"] for e in record["errors"].values()), default=0.0)
    return (head + f"{record['ms']:9.3f} ms  {record['units_per_s']:12.1f} {record['unit']}/s  first call "
            f"{record['first_call_s']:6.1f} s  max rel err {worst:.1e}" + ("  FALLBACK" if record.get("fallbacks") else ""))


# --- ratios and summary --------------------------------------------------------------------------------------
def add_ratios(records: list[dict[str, Any]]) -> None:
    """``vs_inductor`` / ``vs_eager``: anchor ms over the variant's ms, within each (model, mode, dtype)."""
    timed = {(r["model"], r["mode"], r["dtype"], r["variant"]): r["ms"] for r in records if "ms" in r}
    for r in records:
        if "ms" not in r:
            continue
        key = (r["model"], r["mode"], r["dtype"])
        anchor = ANCHOR.get(r["variant"])
        if anchor and anchor != r["variant"] and (*key, anchor) in timed:
            r["vs_inductor"] = timed[(*key, anchor)] / r["ms"]
        if (*key, "eager") in timed and r["variant"] != "eager":
            r["vs_eager"] = timed[(*key, "eager")] / r["ms"]


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mode, dtype and rated variant: geomean and worst ratio to its anchor across models."""
    rows = []
    for mode in MODES:
        for dtype in DTYPES:
            for variant in RATED:
                cases = [r for r in records if (r["mode"], r["dtype"], r["variant"]) == (mode, dtype, variant)]
                rated = [r for r in cases if "vs_inductor" in r]
                if not rated and not any(r["status"] not in ("ok", "skipped") for r in cases):
                    continue  # not run here (CUDA graphs on a CPU)
                row: dict[str, Any] = {"mode": mode, "dtype": dtype, "variant": variant, "anchor": ANCHOR[variant],
                                       "models": len(rated), "failed": sorted(r["model"] for r in cases
                                                                             if r["status"] not in ("ok", "skipped"))}
                if rated:
                    worst = min(rated, key=lambda r: r["vs_inductor"])
                    row.update(geomean=geomean([r["vs_inductor"] for r in rated]), worst=worst["vs_inductor"],
                               worst_model=worst["model"])
                    vs_eager = [r["vs_eager"] for r in rated if "vs_eager" in r]
                    if vs_eager:
                        row["geomean_vs_eager"] = geomean(vs_eager)
                rows.append(row)
    return rows


# --- report --------------------------------------------------------------------------------------------------
def fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "-" if value is None else format(value, spec) + unit


def markdown(report: dict[str, Any]) -> str:
    meta, records = report["meta"], report["cases"]
    lines = [f"# Model zoo through torch.compile: {meta['device_name']}, size `{meta['size']}`", "",
             f"`{meta['command']}`: torch {meta['torch']}, transformers {meta['transformers']}; median of "
             f"{meta['iters']} steps after {meta['warmup']} warm-up steps ({meta['timer']}). Ratios: anchor time over "
             "the variant's (above 1: faster than Inductor, CUDA-graph variants against `reduce-overhead`). "
             "Errors: max abs error over the fp32 eager reference's max abs value, worst of logits, loss and "
             "gradients." + (" Shards ran in parallel processes, timed steps alone (one lock: "
                             "exclusive for timing, shared for compiling): first calls compiled beside other "
                             "shards' compilation." if meta.get("timing_lock") else ""),
             "", "## Summary: pyfuser / Inductor across models", "",
             "| mode | dtype | variant | models | geomean | worst | geomean vs eager | failed |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for row in report["summary"]:
        worst = f"{row['worst']:.2f}x ({row['worst_model']})" if "worst" in row else "-"
        lines.append(f"| {row['mode']} | {row['dtype']} | {row['variant']} | {row['models']} | "
                     f"{fmt(row.get('geomean'), '.2f', 'x')} | {worst} | {fmt(row.get('geomean_vs_eager'), '.2f', 'x')} | "
                     f"{', '.join(row['failed']) or '-'} |")
    variants = list(dict.fromkeys(r["variant"] for r in records))
    for mode in MODES:
        for dtype in DTYPES:
            group = [r for r in records if (r["mode"], r["dtype"]) == (mode, dtype)]
            if not group:
                continue
            models = list(dict.fromkeys(r["model"] for r in group))
            by = {(r["model"], r["variant"]): r for r in group}
            lines += ["", f"## {mode}, {dtype}: ms per step (ratio to the anchor), first call s, max rel error", "",
                      "| model | " + " | ".join(variants) + " | pyfuser per s | first call s, inductor / pyfuser |",
                      "| --- | " + " | ".join("---:" for _ in variants) + " | ---: | ---: |"]
            for model in models:
                cells = []
                for variant in variants:
                    r = by.get((model, variant))
                    if r is None or "ms" not in r:
                        cells.append("-" if r is None or r["status"] == "skipped" else f"**{r['status']}**")
                        continue
                    rel = max((e["rel"] for e in r["errors"].values()), default=0.0)
                    ratio = f" ({r['vs_inductor']:.2f}x)" if "vs_inductor" in r else ""
                    flag = " **fallback**" if r.get("fallbacks") else ""
                    cells.append(f"{r['ms']:.2f}{ratio} err {rel:.0e}{flag}")
                pyfuser = by.get((model, "pyfuser"), {})
                first = (f"{fmt(by.get((model, 'inductor'), {}).get('first_call_s'), '.1f')} / "
                         f"{fmt(pyfuser.get('first_call_s'), '.1f')}")
                speed = fmt(pyfuser.get("units_per_s"), ".0f", f" {pyfuser.get('unit', '')}")
                lines.append(f"| {model} | " + " | ".join(cells) + f" | {speed} | {first} |")
    failures = [r for r in records if r["status"] not in ("ok", "skipped")]
    if failures:
        lines += ["", "## Failures", ""]
        for r in failures:
            text = "; ".join(r.get("fallbacks", [])) or r.get("error", "")
            first = text.strip().splitlines()[0] if text.strip() else ""
            lines.append(f"- {case_name(r)}: {r['status']}: {first[:600]}")
    lines += ["", "## Models", "", "| model | family | what it exercises |", "| --- | --- | --- |"]
    lines += [f"| {a.name} | {a.family} | {a.note} |" for a in ARCHS.values() if a.name in meta["models"]]
    return "\n".join(lines) + "\n"


def results_variant(args: argparse.Namespace, profile: str | None = None) -> str:
    """A run that is not the full one at the default size names its own file: never over the full run's."""
    size = "" if args.size == "default" or (args.quick and args.size == "tiny") else args.size
    parts = [f"profile_{profile}" if profile else "", size, "quick" if args.quick else ""]
    return "_".join(p for p in parts if p)


# --- profile -------------------------------------------------------------------------------------------------
GEMM = re.compile(r"gemm|gemv|nvjet|cutlass|xmma|cublas|splitkreduce|flash|fmha|cudnn|attention|sdpa|convolution|"
                  r"aten::(mm|bmm|addmm|baddbmm|linear|matmul|_grouped_mm)$", re.I)


def kernel_kind(name: str) -> str:
    """Generated (Triton: Inductor's ``triton_*``, pyfuser's ``<scheduler>_<ops>_kernel`` and the steps of
    its launch sequences), GEMM / convolution / attention library kernels, or other ATen kernels
    (elementwise, copies, fills, reductions)."""
    if name.startswith("triton_") or re.fullmatch(r"\w+_kernel(_step\d+|_partial\d+|_final|_init|_values|_add|_store)?", name):
        return "generated"
    return "GEMM / conv / attention" if GEMM.search(name) else "other ATen"


def profile_kernels(step: Callable[[], Any], device: str, steps: int) -> dict[str, list[float]]:
    """Per kernel name: [microseconds per step, calls per step] over ``steps`` profiled steps (CPU: ops'
    self time, no kernels)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        synchronize(device)
    table: dict[str, list[float]] = {}
    for event in prof.key_averages():
        on_gpu = event.device_type == torch.autograd.DeviceType.CUDA
        if device == "cuda" and on_gpu:
            us = event.self_device_time_total
        elif device != "cuda" and not on_gpu and event.key.startswith("aten::"):
            us = event.self_cpu_time_total
        else:
            continue
        entry = table.setdefault(event.key, [0.0, 0.0])
        entry[0] += us / steps
        entry[1] += event.count / steps
    return table


def run_profile(name: str, mode: str, dtype: str, variants: list[str], opts: Options, top: int,
                steps: int) -> tuple[str, list[str]]:
    training = mode == "training"
    model = build_model(name, opts.size, opts.device, opts.seed).to(DTYPES[dtype]).train(training)
    batch = make_batch(name, opts.size, opts.device, DTYPES[dtype], opts.seed)
    tables: dict[str, dict[str, list[float]]] = {}
    step_ms: dict[str, float] = {}  # unprofiled: beside the kernels' sum it shows host-bound steps
    regions: dict[str, list[str]] = {}
    failures = []
    for variant in variants:
        record: dict[str, Any] = {"model": name, "mode": mode, "dtype": dtype, "variant": variant}
        try:
            with watched(record):
                with timing_lock(opts.timing_lock, shared=True):
                    run, backend = compiled(variant, model, opts)
                    step = make_step(run, model, batch, training, variant == "inductor_cuda_graph")
                    for _ in range(1 + opts.warmup):
                        step()
                with timing_lock(opts.timing_lock):
                    step_ms[variant] = time_ms(step, opts.device, 2, 10)
                    tables[variant] = profile_kernels(step, opts.device, steps)
                if backend is not None:
                    regions[variant] = [r.summary() for g in backend.graphs for r in g.regions]
        except Exception as e:
            record["error"] = f"{type(e).__name__}: {str(e)[:1000]}"
        finally:
            run = step = backend = None
            model.zero_grad(set_to_none=True)
            release(opts.device)
        if record.get("fallbacks") or record.get("error"):
            failures.append(f"{variant}: " + "; ".join(record.get("fallbacks", [])) + record.get("error", ""))
        print(f"profiled {name} {mode} {dtype} {variant}", flush=True)
    what = "kernels by GPU time" if opts.device == "cuda" else "ATen ops by self CPU time"
    lines = [f"## {name}, {mode}, {dtype}: {what} per step, top {top}", ""]
    lines += ["| kind | " + " | ".join(f"{v} us/step (launches)" for v in tables) + " |",
              "| --- | " + " | ".join("---:" for _ in tables) + " |"]
    for kind in ("generated", "GEMM / conv / attention", "other ATen"):
        cells = []
        for table in tables.values():
            chosen = [e for k, e in table.items() if kernel_kind(k) == kind]
            cells.append(f"{sum(e[0] for e in chosen):.1f} ({sum(e[1] for e in chosen):.0f})")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    lines.append("| **total** | " + " | ".join(f"**{sum(e[0] for e in t.values()):.1f}** ({sum(e[1] for e in t.values()):.0f})"
                                               for t in tables.values()) + " |")
    lines.append("| step (median of 10, not profiled) | " + " | ".join(f"{step_ms[v] * 1e3:.1f}" for v in tables) + " |")
    ranked = {v: sorted(t.items(), key=lambda kv: -kv[1][0])[:top] for v, t in tables.items()}
    lines += ["", "| # | " + " | ".join(f"{v} | us" for v in ranked) + " |",
              "| ---: | " + " | ".join("--- | ---:" for _ in ranked) + " |"]
    for k in range(max((len(r) for r in ranked.values()), default=0)):
        cells = []
        for entries in ranked.values():
            if k < len(entries):
                kname, (us, calls) = entries[k]
                short = kname if len(kname) <= 90 else kname[:87] + "..."
                cells.append(f"`{short}` x{calls:g} ({kernel_kind(kname)}) | {us:.1f}")
            else:
                cells.append(" | ")
        lines.append(f"| {k + 1} | " + " | ".join(cells) + " |")
    for variant, summaries in regions.items():
        lines += ["", f"### What {variant}'s regions ran (each generated kernel with the FX nodes it writes)", "", "```",
                  *summaries, "```"]
    return "\n".join(lines) + "\n", failures


# --- main ----------------------------------------------------------------------------------------------------
def choose(parser: argparse.ArgumentParser, text: str | None, known: Any, what: str) -> list[str]:
    if text is None:
        return list(known)
    chosen = [c for c in text.split(",") if c]
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        parser.error(f"unknown {what} {unknown}; known: {list(known)}")
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", default=None, choices=list(SIZES), help="model scale (default: default; --quick: tiny)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few steps (a smoke run)")
    parser.add_argument("--models", default=None, help=f"comma-separated subset of {','.join(ARCHS)}")
    parser.add_argument("--modes", default=None, help="comma-separated subset of inference,training")
    parser.add_argument("--dtypes", default=None, help="comma-separated subset of bf16,fp32")
    parser.add_argument("--variants", default=None, help=f"comma-separated subset of {','.join(VARIANTS)}")
    parser.add_argument("--warmup", type=int, default=None, help="steps after the first call, before timing")
    parser.add_argument("--iters", type=int, default=None, help="timed steps (their median is reported)")
    parser.add_argument("--interpreter", action=argparse.BooleanOptionalAction, default=None,
                        help="pyfuser's kernels through Triton's interpreter (default: on a CPU)")
    parser.add_argument("--inductor-caches", action="store_true",
                        help="keep Inductor's FX-graph / autotune caches (first calls then reuse earlier runs)")
    parser.add_argument("--out", default=str(RESULTS), help="results folder")
    parser.add_argument("--merge", action="store_true", help="keep the written file's cases this run does not repeat")
    parser.add_argument("--timing-lock", default=None, metavar="FILE",
                        help="hold FILE's exclusive lock while timing, its shared lock while compiling (shards in parallel)")
    parser.add_argument("--combine", nargs="+", default=[], metavar="JSON",
                        help="write these results files' cases as one run (no model runs)")
    parser.add_argument("--profile", default=None, metavar="MODEL", help="profile MODEL's kernels instead")
    parser.add_argument("--top", type=int, default=25, help="--profile: kernels listed per variant")
    parser.add_argument("--profile-steps", type=int, default=3, help="--profile: steps profiled")
    args = parser.parse_args()
    args.size = args.size or ("tiny" if args.quick else "default")
    models = choose(parser, args.models, ARCHS, "models")
    modes = choose(parser, args.modes, MODES, "modes")
    dtypes = choose(parser, args.dtypes, DTYPES, "dtypes")
    variants = choose(parser, args.variants, VARIANTS, "variants")
    opts = Options(device=args.device, size=SIZES[args.size],
                   warmup=args.warmup if args.warmup is not None else (1 if args.quick else 5),
                   iters=args.iters if args.iters is not None else (2 if args.quick else 20),
                   interpreter=args.interpreter if args.interpreter is not None else args.device == "cpu",
                   timing_lock=args.timing_lock)
    if not args.inductor_caches:
        torch._inductor.config.force_disable_caches = True
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    kind = machine_kind(device_name)
    out = Path(args.out)
    if args.profile:
        if args.profile not in ARCHS:
            parser.error(f"unknown model {args.profile!r}; known: {list(ARCHS)}")
        chosen = [v for v in (variants if args.variants else ("eager", "inductor", "pyfuser"))
                  if v not in CUDA_ONLY or args.device == "cuda"]
        body, failures = run_profile(args.profile, modes[0], dtypes[0], chosen, opts, args.top, args.profile_steps)
        stamp = now_stamp()
        title = f"# Kernels of {args.profile} ({modes[0]}, {dtypes[0]}, size `{args.size}`) by compiler: {device_name}"
        text = (f"{title}\n\n{run_line('models', kind, stamp)}\n\n`python {' '.join(sys.argv)}`: torch.profiler over "
                f"{args.profile_steps} steps after {1 + opts.warmup}; kernels aggregated by name.\n\n{body}")
        if failures:
            text += "\n## Failures\n\n" + "\n".join(f"```\n{f}\n```" for f in failures) + "\n"
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"models_{results_variant(args, f'{args.profile}_{modes[0]}_{dtypes[0]}')}_{kind}.md"
        path.write_text(text)
        print(f"wrote {path}")
        return 1 if failures else 0
    variant = results_variant(args)
    if args.combine:
        shards = [json.loads(Path(f).read_text()) for f in args.combine]
        combined = merged_cases([r for shard in shards for r in shard["cases"]])
        meta = {**shards[0]["meta"], "models": list(dict.fromkeys(r["model"] for r in combined)),
                "command": "; ".join(shard["meta"]["command"] for shard in shards)}
        return write_report(combined, meta, machine_kind(meta["device_name"]), out, variant)
    meta = {"device": args.device, "device_name": device_name, "machine_kind": kind_label(kind),
            "size": args.size, "shape": dataclasses.asdict(opts.size), "warmup": opts.warmup,
            "iters": opts.iters, "timer": "CUDA events" if args.device == "cuda" else "wall clock",
            "interpreter": opts.interpreter, "inductor_caches": args.inductor_caches,
            "timing_lock": bool(args.timing_lock), "torch": torch.__version__,
            "transformers": transformers.__version__, "command": " ".join(["python", *sys.argv])}
    path = out / ("_".join(p for p in ("models", variant, kind) if p) + ".json")
    kept = json.loads(path.read_text())["cases"] if args.merge and path.exists() else []
    records: list[dict[str, Any]] = []
    status = 0
    for name in models:
        records += run_model(name, modes, dtypes, variants, opts)
        status = write_report(merged_cases(kept + records), {**meta, "models": models}, kind, out, variant)
    return status


def merged_cases(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per (model, mode, dtype, variant), the later one kept, in the zoo's order."""
    key = ("model", "mode", "dtype", "variant")
    latest = {tuple(r[k] for k in key): r for r in records}
    order = {name: k for k, name in enumerate(ARCHS)}
    return sorted(latest.values(), key=lambda r: (order.get(r["model"], len(order)), MODES.index(r["mode"]),
                                                  list(DTYPES).index(r["dtype"]), VARIANTS.index(r["variant"])))


def write_report(records: list[dict[str, Any]], meta: dict[str, Any], kind: str, out: Path, variant: str) -> int:
    """Write the results files of ``records``; 1 when a case failed."""
    add_ratios(records)
    report: dict[str, Any] = {"meta": meta, "summary": summarize(records), "cases": records}
    for row in report["summary"]:
        if "geomean" in row:
            print(f"{row['mode']} {row['dtype']} {row['variant']} / {row['anchor']}: geomean {row['geomean']:.2f}x, "
                  f"worst {row['worst']:.2f}x ({row['worst_model']}) over {row['models']} models; failed: "
                  f"{', '.join(row['failed']) or 'none'}")
    prefix = write_results("models", kind, report, markdown(report), out, variant=variant)
    print(f"wrote {prefix}.json and {prefix}.md")
    failed = [r for r in records if r["status"] not in ("ok", "skipped")]
    if failed:
        print(f"{len(failed)} case(s) failed: " + ", ".join(f"{case_name(r)} ({r['status']})" for r in failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
