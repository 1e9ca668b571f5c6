"""Host overhead of stream-parallel loops: pyfuser's Host IR evaluator against hand-written torch.

Each case runs a fusion whose output is computed in ``S`` chunks by a stream loop (stream switch,
selects, one ATen call per chunk, stream syncs), and hand-written torch code doing the same work the
same way (``torch.cuda.stream``, reusable events, ``out=`` into chunk views), in the same process.
Small sizes expose host overhead per iteration; large sizes show whether it is hidden by GPU work.

    python benchmarks/stream_overhead.py benchmarks/results      # on a GPU
    python benchmarks/stream_overhead.py /tmp --smoke            # tiny, on CPU

Writes ``OUT/stream_overhead_<kind>.json`` and ``.md`` (over the previous run's) and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from results_files import machine_kind, write_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pyfuser import FusionDefinition
from pyfuser.host_ir.evaluator import stream_pool
from pyfuser.ir.iter_domain import ParallelType
from pyfuser.options import DEFAULT_NUM_STREAMS


@dataclass
class Case:
    name: str
    kind: str  # "pointwise" | "matmul"
    shape: tuple[int, ...]  # pointwise: (rows, cols); matmul: (m, k, n)
    dtype: torch.dtype
    chunks: int
    reps: int


@dataclass
class Row:
    case: str
    shape: str
    dtype: str
    chunks: int
    streams: int
    pyfuser_ms: float
    torch_ms: float
    ratio: float
    pyfuser_us_per_iteration: float
    torch_us_per_iteration: float
    pyfuser_overlap_ms: float  # the default program: iterations may run concurrently (stream overlap)


def _pointwise_fusion(chunks: int, dtype: torch.dtype) -> FusionDefinition:
    fd = FusionDefinition()
    x = fd.define_tensor([-1, -1], dtype=dtype)
    y = fd.ops.mul(x, 2.0)
    fd.add_output(y)
    y.outer_split(0, chunks)
    y.axis(0).parallelize(ParallelType.stream)
    return fd


def _matmul_fusion(chunks: int, dtype: torch.dtype) -> FusionDefinition:
    fd = FusionDefinition()
    a = fd.define_tensor([-1, -1], dtype=dtype)
    b = fd.define_tensor([-1, -1], dtype=dtype)
    out = fd.ops.matmul(a, b)
    fd.add_output(out)
    out.outer_split(0, chunks)
    out.axis(0).parallelize(ParallelType.stream)
    return fd


class _HandWritten:
    """The stream loop written directly in torch: the same syncs as the Host IR, reusable events."""

    def __init__(self, device: torch.device, num_streams: int) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.pool = stream_pool(device, num_streams)  # same streams as pyfuser: same conditions
            self.enter = torch.cuda.Event()
            self.leave = torch.cuda.Event()

    def run(self, out: torch.Tensor, chunks: int, body: Callable[[int, int], None]) -> torch.Tensor:
        rows = out.shape[0]
        size = -(-rows // chunks)
        if not self.cuda:
            for i in range(chunks):
                if i * size < rows:
                    body(i * size, min(size, rows - i * size))
            return out
        main = torch.cuda.current_stream()
        for i in range(chunks):
            begin = i * size
            if begin >= rows:
                continue
            worker = self.pool[i % len(self.pool)]
            with torch.cuda.stream(worker):
                self.enter.record(main)
                worker.wait_event(self.enter)
                body(begin, min(size, rows - begin))
            self.leave.record(worker)
            main.wait_event(self.leave)
        return out


Runner = Callable[..., object]


def _make(case: Case, device: torch.device, hand: _HandWritten) -> tuple[Runner, Runner, Callable[[], None]]:
    """(pyfuser run taking execute() keyword options, hand-written run, correctness check)."""
    if case.kind == "pointwise":
        rows, cols = case.shape
        x = torch.randn(rows, cols, device=device, dtype=case.dtype)
        fd = _pointwise_fusion(case.chunks, case.dtype)

        def hand_written() -> torch.Tensor:
            out = torch.empty_like(x)
            return hand.run(out, case.chunks, lambda b, n: torch.mul(x.narrow(0, b, n), 2.0, out=out.narrow(0, b, n)))

        def check() -> None:
            torch.testing.assert_close(fd.execute([x])[0], x * 2.0)
            torch.testing.assert_close(hand_written(), x * 2.0)

        return (lambda **kw: fd.execute([x], **kw)), hand_written, check
    m, k, n = case.shape
    a = torch.randn(m, k, device=device, dtype=case.dtype)
    b = torch.randn(k, n, device=device, dtype=case.dtype)
    fd = _matmul_fusion(case.chunks, case.dtype)

    def hand_written_mm() -> torch.Tensor:
        out = torch.empty(m, n, device=device, dtype=case.dtype)
        return hand.run(out, case.chunks, lambda r, c: torch.matmul(a.narrow(0, r, c), b, out=out.narrow(0, r, c)))

    def check_mm() -> None:
        tol = {"rtol": 2e-2, "atol": 2e-2 * k ** 0.5} if case.dtype != torch.float32 else {}
        torch.testing.assert_close(fd.execute([a, b])[0], a @ b, **tol)
        torch.testing.assert_close(hand_written_mm(), a @ b, **tol)

    return (lambda **kw: fd.execute([a, b], **kw)), hand_written_mm, check_mm


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_ms(fns: list[Callable[[], object]], reps: int, device: torch.device) -> list[float]:
    """Per function, the median over 5 rounds of the mean wall time of ``reps`` back-to-back calls;
    rounds interleave the functions so clock and thermal drift hit them alike."""
    for fn in fns:
        for _ in range(max(3, reps // 10)):
            fn()
    _sync(device)
    rounds: list[list[float]] = [[] for _ in fns]
    for _ in range(5):
        for fn, times in zip(fns, rounds, strict=True):
            start = time.perf_counter()
            for _ in range(reps):
                fn()
            _sync(device)
            times.append((time.perf_counter() - start) / reps * 1e3)
    return [sorted(times)[len(times) // 2] for times in rounds]


def _cases(smoke: bool) -> list[Case]:
    if smoke:
        return [Case("pointwise small", "pointwise", (32, 16), torch.float32, 4, 3),
                Case("matmul small", "matmul", (16, 8, 8), torch.float32, 4, 3)]
    cases = []
    for chunks in (4, 8):
        cases += [
            Case("pointwise small", "pointwise", (256, 256), torch.float32, chunks, 300),
            Case("pointwise large", "pointwise", (16384, 8192), torch.float32, chunks, 20),
            Case("matmul small", "matmul", (512, 512, 512), torch.bfloat16, chunks, 300),
            Case("matmul large", "matmul", (8192, 8192, 8192), torch.bfloat16, chunks, 10),
        ]
    return cases


def _stream_trace(device: torch.device, directory: Path) -> dict[str, object]:
    """Which CUDA streams the GEMMs of one 8-chunk stream-parallel matmul ran on (profiler trace)."""
    if device.type != "cuda":
        return {}
    from torch.profiler import ProfilerActivity, profile

    fd = _matmul_fusion(8, torch.bfloat16)
    a = torch.randn(4096, 1024, device=device, dtype=torch.bfloat16)
    b = torch.randn(1024, 1024, device=device, dtype=torch.bfloat16)
    fd.execute([a, b])
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fd.execute([a, b])
        torch.cuda.synchronize(device)
    trace = directory / "stream_overhead_trace.json"
    prof.export_chrome_trace(str(trace))
    kernels = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    trace.unlink()
    kernels.sort(key=lambda e: e["ts"])
    return {"chunks": 8, "kernels": len(kernels), "kernel_streams": [e["args"]["stream"] for e in kernels],
            "user_stream": torch.cuda.current_stream(device).stream_id}


def _markdown(rows: list[Row], meta: dict[str, str], trace: dict[str, object]) -> str:
    lines = [f"# Stream-loop host overhead ({meta['device']}, torch {meta['torch']}, {meta['date']})", "",
             "Wall time per execution (median of 5 interleaved rounds); per-iteration = time / chunks. "
             "Hand-written: the same loop in torch with `torch.cuda.stream` and events. "
             "pyfuser: seed 002's program (`_disable_options=[\"stream_overlap\"]`, as the hand-written loop); overlap: "
             "pyfuser's default program (iterations may run concurrently).", "",
             "| case | shape | dtype | chunks | streams | pyfuser ms | torch ms | ratio | pyfuser µs/iter | torch µs/iter "
             "| overlap ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.case} | {r.shape} | {r.dtype} | {r.chunks} | {r.streams} | {r.pyfuser_ms:.4f} | "
                     f"{r.torch_ms:.4f} | {r.ratio:.2f} | {r.pyfuser_us_per_iteration:.1f} | "
                     f"{r.torch_us_per_iteration:.1f} | {r.pyfuser_overlap_ms:.4f} |")
    if trace:
        lines += ["", f"Profiler trace of an 8-chunk stream-parallel matmul: {trace['kernels']} kernels on streams "
                  f"{trace['kernel_streams']} (user stream {trace['user_stream']}): iterations run on the "
                  "worker streams, round-robin."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="results folder: writes OUT/stream_overhead_<kind>.json and .md")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, few repetitions (runs on CPU)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    hand = _HandWritten(device, DEFAULT_NUM_STREAMS)
    rows = []
    for case in _cases(args.smoke):
        default, theirs, check = _make(case, device, hand)
        check()
        ours = functools.partial(default, _disable_options=["stream_overlap"])  # seed 002's joins, like `theirs`
        ours_ms, theirs_ms, overlap_ms = _time_ms([ours, theirs, default], case.reps, device)
        row = Row(case.name, "x".join(map(str, case.shape)), str(case.dtype).removeprefix("torch."), case.chunks,
                  DEFAULT_NUM_STREAMS, ours_ms, theirs_ms, ours_ms / theirs_ms,
                  ours_ms * 1e3 / case.chunks, theirs_ms * 1e3 / case.chunks, overlap_ms)
        rows.append(row)
        print(f"{row.case:16s} {row.shape:>16s} {row.dtype:9s} S={row.chunks}  pyfuser {ours_ms:9.4f} ms  "
              f"torch {theirs_ms:9.4f} ms  ratio {row.ratio:5.2f}  overlap {overlap_ms:9.4f} ms", flush=True)
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "smoke": str(args.smoke)}
    args.out.mkdir(parents=True, exist_ok=True)
    trace = _stream_trace(device, args.out)
    report = {"meta": meta, "rows": [asdict(r) for r in rows], "stream_trace": trace}
    table = _markdown(rows, meta, trace)
    write_results("stream_overhead", machine_kind(meta["device"]), report, table, args.out)
    print(table)


if __name__ == "__main__":
    main()
