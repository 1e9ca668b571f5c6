"""What the overlap benchmarks (``ag_linear.py``, ``linear_rs.py``) share: the command line, timing across
ranks, the report files, profiling their programs and drawing the timeline.

Times are medians over iterations of CUDA events around one call (wall clock on CPUs), after a barrier
and a device synchronization, then the max over ranks. Rank 0 writes ``OUT/<benchmark>_<kind>.json`` and ``.md``
(``results_files.py``), over the previous run's.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import os
import pstats
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from results_files import machine_kind, now_stamp, write_results
from torch.distributed._symmetric_memory import enable_symm_mem_for_group, is_symm_mem_enabled_for_group
from torch.profiler import ProfilerActivity, profile

from pyfuser.ir.fusion import Fusion
from pyfuser.multidevice import (
    Communicator,
    CommunicatorBackend,
    MultiDeviceExecutor,
    MultiDeviceExecutorParams,
)

# NVLink multicast stays off on shared machines (read when the process group and symmetric memory start).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

#: Sizes of the issue's tables: (M, K, N) per rank as each benchmark reads them.
SIZES = [(8192, 8192, 8192), (4096, 4096, 4096), (16384, 8192, 8192)]


class Timer:
    """Median time of ``fn`` in milliseconds on this rank, then the max over ranks."""

    def __init__(self, device: torch.device, warmup: int, iters: int) -> None:
        self.device, self.warmup, self.iters = device, warmup, iters
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], object]) -> float:
        for _ in range(self.warmup):
            fn()
        self._sync()
        samples = []
        for _ in range(self.iters):
            Communicator.instance().barrier()
            self._sync()
            if self.cuda:
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                stop.record()
                torch.cuda.synchronize()
                samples.append(start.elapsed_time(stop))
            else:
                begin = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - begin) * 1e3)
        median = torch.tensor([statistics.median(samples)], dtype=torch.float64, device=self.device)
        dist.all_reduce(median, op=dist.ReduceOp.MAX)
        return float(median.item())

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """‖got − expected‖ / ‖expected‖ in float64, the max over ranks (NaN never passes)."""
    expected = expected.double()
    err = ((got.double() - expected).norm() / expected.norm().clamp_min(1e-30)).reshape(1)
    err = torch.nan_to_num(err, nan=float("inf")).to(got.device)
    dist.all_reduce(err, op=dist.ReduceOp.MAX)
    return float(err.item())


def captured(fn: Callable[[], object]) -> Callable[[], object] | None:
    """``fn`` (torch's own collective and GEMM: the anchor of pyfuser's graph column) captured into a CUDA
    graph on every rank, its replay returned; None where the capture fails (the row leaves it out)."""
    side, current = torch.cuda.Stream(), torch.cuda.current_stream()
    side.wait_stream(current)
    with torch.cuda.stream(side):
        for _ in range(3):  # lazy initialization, workspaces
            fn()
    current.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            fn()
    except RuntimeError as e:
        print(f"rank {dist.get_rank()}: the anchor could not be captured: {e}", flush=True)
        return None
    return graph.replay


def pyfuser_graph_run(executor: Any, inputs: list[torch.Tensor], weight: int) -> Callable[[], list[torch.Tensor]]:
    """A ``cuda_graph`` executor's call with input ``weight`` as a parameter (read in place by the graph,
    as a model's weight is; the activations are copied into the graph's buffers), after the signature's
    first call (which runs without a graph on every rank): the next call captures."""
    args = list(inputs)
    args[weight] = torch.nn.Parameter(args[weight], requires_grad=False)
    executor.run(args)
    return lambda: executor.run(args)


#: pyfuser's two programs with the overlap model's choice forced, replayed from CUDA graphs: what the choice
#: costs or saves at each size (the not-overlapped anchor within pyfuser's own host path).
FORCED_GRAPHS = {
    "plain_graph": MultiDeviceExecutorParams(backend_type=CommunicatorBackend.cuda, cuda_graph=True,
                                             disable_options=("p2p_pipelines",)),
    "pipeline_graph": MultiDeviceExecutorParams(backend_type=CommunicatorBackend.cuda, cuda_graph=True,
                                                enable_options=("p2p_pipelines_always",)),
}


def forced_graph_columns(fusion_of: Callable[[], Fusion], inputs: list[torch.Tensor], expected: torch.Tensor,
                         timer: Timer) -> dict[str, float]:
    """``pyfuser_<choice>_ms`` and ``_error`` of each ``FORCED_GRAPHS`` program of a fresh ``fusion_of()``, replayed
    with input 1 (the weight) a parameter."""
    row: dict[str, float] = {}
    for forced, params in FORCED_GRAPHS.items():
        replay = pyfuser_graph_run(MultiDeviceExecutor(fusion_of(), params), inputs, weight=1)
        (got,) = replay()
        row[f"pyfuser_{forced}_error"] = relative_error(got, expected)
        del got
        row[f"pyfuser_{forced}_ms"] = timer(replay)
    return row


def parse_size(text: str) -> tuple[int, int, int]:
    """``M,K,N`` for ``--sizes``."""
    try:
        m, k, n = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size is M,K,N (three integers), got {text!r}") from None
    return m, k, n


def symm_mem_group() -> str | None:
    """The default group's name with symmetric memory enabled for torch's fused ops, or None (no CUDA)."""
    if not torch.cuda.is_available():
        return None
    name = dist.group.WORLD.group_name  # type: ignore[union-attr]
    if not is_symm_mem_enabled_for_group(name):
        enable_symm_mem_for_group(name)
    return name


def machine(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    return f"{torch.cuda.get_device_name(device)} x{dist.get_world_size()}"


def write_report(out: Path, name: str, kind: str, title: str, config: dict[str, Any], rows: list[dict[str, Any]],
                 columns: Sequence[tuple[str, str]], notes: Sequence[str]) -> None:
    """``out/<name>_<kind>``.json (everything) and .md (a table: one row per size, ``columns`` as (key, header))."""
    stamp = now_stamp()
    config = {**config, "date": stamp, "torch": torch.__version__}
    lines = [f"# {title} ({config['machine']}, {stamp})", "",
             f"torch {torch.__version__}; {config.get('dtype', '')}; medians of {config['iters']} iterations after "
             f"{config['warmup']} warm-up, max over ranks; all in one run. Raw numbers: `{name}_{kind}.json`.", "",
             "| " + " | ".join(header for _, header in columns) + " |",
             "|" + "|".join(" ---: " if k != "size" else " --- " for k, _ in columns) + "|"]
    for row in rows:
        cells = []
        for key, _ in columns:
            value = row.get(key, "")
            cells.append(f"{value:.3f}" if isinstance(value, float) else str(value))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *notes, ""]
    write_results(name, kind, {"config": config, "results": rows}, "\n".join(lines), out, stamp)


def profile_program(fn: Callable[[], object], path: Path) -> None:
    """Write a chrome trace of one call of ``fn`` to ``path``: a warm-up call, then a barrier (an NCCL all-reduce
    kernel that ends at the same time on every rank: ``gpu_events`` measures from its end), then the call."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
        Communicator.instance().barrier()
        fn()
        torch.cuda.synchronize()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))


def host_profile(fn: Callable[[], object], runs: int = 200) -> dict[str, Any]:
    """Host time of ``fn`` (µs per call, the GPU left to catch up every 20 calls) and, on rank 0, the functions
    that take it (cProfile, by own time)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    total = 0.0
    for i in range(runs):
        begin = time.perf_counter()
        fn()
        total += time.perf_counter() - begin
        if i % 20 == 19:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    result: dict[str, Any] = {"host_us_per_call": total / runs * 1e6}
    # Every rank runs the profiled calls (each is a collective program); rank 0 records them.
    profiler = cProfile.Profile()
    if dist.get_rank() == 0:
        profiler.enable()
    for i in range(runs):
        fn()
        if i % 20 == 19:
            torch.cuda.synchronize()
    profiler.disable()
    if dist.get_rank() == 0:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
        result["cprofile"] = text.getvalue().splitlines()
    torch.cuda.synchronize()
    Communicator.instance().barrier()
    return result


def _category(event: dict[str, Any]) -> str:
    name = event.get("name", "").lower()
    if event.get("cat") in ("gpu_memcpy", "gpu_memset") or "memcpy" in name or "memset" in name:
        return "copy engine (memcpy)"
    if "nccl" in name:
        return "NCCL kernel"
    if "gemm" in name or "sm90" in name or "cutlass" in name or "xmma" in name or "nvjet" in name:
        return "GEMM"
    return "other kernel"


_COLORS = {"GEMM": "tab:blue", "copy engine (memcpy)": "tab:orange", "NCCL kernel": "tab:red",
           "other kernel": "tab:gray"}


def gpu_events(trace: Path, origin: float | None = None) -> list[dict[str, Any]]:
    """Kernels and memory copies of the call after the barrier in a ``profile_program`` trace: name, category,
    stream, start (µs since the barrier ended, or since ``origin``, a trace timestamp) and duration (µs)."""
    data = json.loads(trace.read_text())
    events = [e for e in data.get("traceEvents", [])
              if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if origin is None:
        barriers = [float(e["ts"]) + float(e.get("dur", 0.0)) for e in events if "AllReduce" in e.get("name", "")]
        origin = max(barriers) if barriers else min((float(e["ts"]) for e in events), default=0.0)
    return [{"name": e.get("name", ""), "category": _category(e), "stream": e.get("tid"),
             "ts": float(e["ts"]) - origin, "dur": float(e.get("dur", 0.0))} for e in events if float(e["ts"]) >= origin]


def summarize(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Span (from the barrier), per-stream busy time and per-category totals (ms) of one profiled program, with
    its operations."""
    if not events:
        return {}
    start, end = 0.0, max(e["ts"] + e["dur"] for e in events)
    streams: dict[str, float] = {}
    categories: dict[str, float] = {}
    for e in events:
        streams[str(e["stream"])] = streams.get(str(e["stream"]), 0.0) + e["dur"] / 1e3
        categories[e["category"]] = categories.get(e["category"], 0.0) + e["dur"] / 1e3
    ops = [f"{(e['ts'] - start) / 1e3:.3f}+{e['dur'] / 1e3:.3f} ms s{e['stream']} {e['category']}: {e['name'][:60]}"
           for e in sorted(events, key=lambda e: e["ts"])]
    return {"span_ms": (end - start) / 1e3, "stream_busy_ms": streams, "category_ms": categories, "operations": ops}


def draw_timeline(lanes: list[tuple[str, list[dict[str, Any]]]], path: Path, title: str,
                  xlabel: str = "ms since the barrier before the call ended (the same instant on every rank)") -> bool:
    """A PNG with one band per (label, events) -- a program on one rank -- and one row per CUDA stream in it;
    bars colored by what ran. False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        return False
    rows: list[tuple[str, list[dict[str, Any]]]] = []
    for label, events in lanes:
        for stream in sorted({e["stream"] for e in events}, key=str):
            rows.append((f"{label} · stream {stream}", [e for e in events if e["stream"] == stream]))
    fig, ax = plt.subplots(figsize=(14, 0.45 * len(rows) + 1.5))
    for y, (_, events) in enumerate(rows):
        for e in events:
            ax.broken_barh([(e["ts"] / 1e3, max(e["dur"], 1.0) / 1e3)], (y - 0.4, 0.8),
                           facecolors=_COLORS[e["category"]])
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in _COLORS.items()], loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


#: A program to profile: (backend name, number of stream chunks S) -> a call that runs it once
ProgramRunner = Callable[[str, int], Callable[[], object]]


def profile_variants(name: str, m: int, runner: ProgramRunner, backends: Sequence[str], directory: Path, host: bool,
                     title: str) -> dict[str, Any]:
    """Traces of pyfuser's S = 1 and S = 2 programs (every backend, without and with CUDA graphs) on every rank,
    and with ``host`` where their host time goes; rank 0 reads them all, writes ``{name}_profile_{m}.json`` and
    draws the timeline."""
    comm = Communicator.instance()
    d, rank = comm.size(), comm.rank()
    variants = [(backend, s) for s in (1, 2) for backend in backends]
    hosts = {}
    for backend, s in variants:
        run = runner(backend, s)
        profile_program(run, directory / f"{name}_{m}_{backend}_S{s}_rank{rank}.json")
        if host:
            hosts[f"{backend}_S{s}"] = host_profile(run)
    comm.barrier()
    if rank != 0:
        return {}
    summary: dict[str, Any] = {"host": hosts}
    lanes = []
    for backend, s in variants:
        for r in range(d):
            events = gpu_events(directory / f"{name}_{m}_{backend}_S{s}_rank{r}.json")
            summary[f"{backend}_S{s}_rank{r}"] = summarize(events)
            if s == 1 or backend.startswith("p2p"):
                lanes.append((f"{backend} S={s} rank {r}", events))
    draw_timeline(lanes, directory / f"{name}_timeline_{m}.png", f"{title}, d={d}: pyfuser programs per rank and "
                  "CUDA stream")
    (directory / f"{name}_profile_{m}.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


Measure = Callable[[int, int, int, list[int], torch.dtype, Timer], dict[str, Any]]
Profile = Callable[[int, int, int, torch.dtype, Path, bool], dict[str, Any]]


def main(name: str, doc: str | None, title: str, columns: list[tuple[str, str]], measure: Measure, profile: Profile) -> int:
    """The command line both benchmarks share: measure every size, profile on GPUs when asked, check the
    results against the fp32 reference, and (rank 0) write the report; exit 1 on a wrong or missing result."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help=f"results folder: rank 0 writes OUT/{name}_<kind>.json and .md")
    parser.add_argument("--smoke", action="store_true", help="tiny fp32 sizes that run on CPUs with gloo")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--profile", type=Path, help="directory for traces, their summary and the timeline PNG")
    parser.add_argument("--sizes", type=parse_size, nargs="+", default=SIZES, metavar="M,K,N",
                        help="sizes to measure (default: the issue's three)")
    args = parser.parse_args()
    sizes, dtype = args.sizes, torch.bfloat16
    if args.smoke:
        sizes, dtype, args.warmup, args.iters = [(64, 32, 16), (32, 16, 8)], torch.float32, 1, 3
    comm = Communicator.instance()
    comm.barrier()  # initializes the process group
    timer = Timer(comm.device(), args.warmup, args.iters)
    rows = [measure(m, k, n, args.streams, dtype, timer) for m, k, n in sizes]
    if args.profile is not None and comm.device().type == "cuda":
        for m, k, n in sizes:
            profile(m, k, n, dtype, args.profile, m == min(size[0] for size in sizes))
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    failed = [f"{row['size']}: {key} = {value:.2e}" for row in rows for key, value in row.items()
              if key.endswith("_error") and not (isinstance(value, float) and value < tolerance)]
    if comm.rank() == 0:
        config = {"world": comm.size(), "dtype": str(dtype).removeprefix("torch."), "backend": comm.backend,
                  "machine": machine(comm.device()), "iters": args.iters, "warmup": args.warmup, "smoke": args.smoke}
        notes = ["All ms. pyfuser errors (‖out − ref‖ / ‖ref‖ against an fp32 reference, max over ranks) are in "
                 "the JSON; every one is below 2e-2 (bf16) unless listed here: " + ("; ".join(failed) or "none") + "."]
        kind = machine_kind(torch.cuda.get_device_name(comm.device()) if comm.device().type == "cuda" else "cpu",
                            comm.size())
        write_report(args.out, name, kind, title, config, rows, columns, notes)
        for row in rows:
            print(" | ".join(f"{key}={value:.3f}" if isinstance(value, float) else f"{key}={value}"
                             for key, value in row.items() if not key.endswith("_error")), flush=True)
        if failed:
            print("WRONG RESULTS: " + "; ".join(failed), flush=True)
    comm.shutdown()
    return 1 if failed or any(math.isnan(v) for row in rows for v in row.values() if isinstance(v, float)) else 0
