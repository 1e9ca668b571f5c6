"""Fused memory-bound kernels on one GPU: pyfuser's generated kernels against copy bandwidth, torch
eager and torch.compile (Inductor), measured side by side in one run.

GB/s counts the bytes a fusion must move (each input read once, each output written once).
Also measured: the first call of a new fusion (compile included) and the host time a cached
``fd.execute`` adds over launching the same Triton kernel directly. ``--sweep`` also times
hand-edited heuristics through ``schedule.compute_heuristics`` + ``fd.manual_execute`` (to tune the
defaults). Writes ``kernels_<kind>.json`` and ``.md`` into ``--out`` (default: benchmarks/results), over the
previous run's; a partial run (``--cases``, ``--match``, ``--sweep``) writes ``kernels_<selection>_<kind>``.

    python benchmarks/kernels.py [--sweep] [--cases all|pointwise|normalization|looped] [--match A,B] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from results_files import RESULTS, machine_kind, write_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pyfuser import DataType, FusionDefinition, schedule
from pyfuser.ir.eval_context import EvalContext
from pyfuser.schedule import SchedulerType


@dataclasses.dataclass
class Case:
    name: str
    eager: Callable[..., Any]
    define: Callable[[FusionDefinition, list[torch.Tensor]], None]
    inputs: list[torch.Tensor]
    nbytes: int
    scheduler: SchedulerType = SchedulerType.pointwise


#: Cycles of the spin kernel queued before each timed call (~0.5 ms at the H200's 1.98 GHz): longer
#: than any call's host time, so the call's launches are queued before the GPU reaches them.
HOST_HEADROOM_CYCLES = 1_000_000


def bench(fn: Callable[[], Any], rep_ms: float = 200.0, warmup: int = 25) -> float:
    """Median GPU time (ms) of ``fn``'s launches, L2 flushed before each call as ``do_bench`` does.

    ``do_bench`` alone times from an event queued right after its L2 flush: a call whose host time
    exceeds the flush's GPU time (~80 us on the H200) leaves the GPU waiting inside the timed
    interval, so host time shows up as GPU time, intermittently, as the host's speed drifts
    (seed 003: 41.6 against 58-90 us in stretches; Inductor's and pyfuser's calls, not a bare
    Triton launch's). A spin kernel queued between the flush and the start event holds the GPU
    while the host queues the call (nvbench's blocking kernel); host time is measured apart
    (``host_overhead``)."""
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    probe = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    probe[0].record()
    for _ in range(5):
        fn()
    probe[1].record()
    torch.cuda.synchronize()
    reps = max(10, min(1000, int(rep_ms / max(probe[0].elapsed_time(probe[1]) / 5, 1e-3))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends, strict=True):
        flush.zero_()
        torch.cuda._sleep(HOST_HEADROOM_CYCLES)
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def _bias_gelu(fd: FusionDefinition, inputs: list[torch.Tensor]) -> None:
    x, b = (fd.from_pytorch(t) for t in inputs)
    y = fd.ops.gelu(fd.ops.add(fd.ops.cast(x, DataType.Float), fd.ops.cast(b, DataType.Float)), approximate="tanh")
    fd.add_output(fd.ops.cast(y, DataType.BFloat16))


def _transpose_add(fd: FusionDefinition, inputs: list[torch.Tensor]) -> None:
    a, b = (fd.from_pytorch(t) for t in inputs)
    fd.add_output(fd.ops.add(fd.ops.permute(a, [1, 0]), b))


def _chain4(fd: FusionDefinition, inputs: list[torch.Tensor]) -> None:
    a, b, c, d = (fd.from_pytorch(t) for t in inputs)
    fd.add_output(fd.ops.sub(fd.ops.mul(fd.ops.add(a, b), fd.ops.sigmoid(c)), d))


def _casts(fd: FusionDefinition, inputs: list[torch.Tensor]) -> None:
    x, y = (fd.from_pytorch(t) for t in inputs)
    xf, yf = fd.ops.cast(x, DataType.Float), fd.ops.cast(y, DataType.Float)
    h = fd.ops.cast(fd.ops.mul(xf, yf), DataType.Half)
    z = fd.ops.add(fd.ops.cast(h, DataType.Float), 1.0)
    fd.add_output(fd.ops.cast(z, DataType.BFloat16))


def _layernorm(fd: FusionDefinition, inputs: list[torch.Tensor]) -> None:
    x, w, b = (fd.from_pytorch(t) for t in inputs)
    xf = fd.ops.cast(x, DataType.Float)
    var, mean = fd.ops.var_mean(xf, [1], correction=0, keepdim=True)
    y = fd.ops.mul(fd.ops.sub(xf, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
    y = fd.ops.add(fd.ops.mul(y, fd.ops.broadcast(fd.ops.cast(w, DataType.Float), [True, False])),
                   fd.ops.broadcast(fd.ops.cast(b, DataType.Float), [True, False]))
    fd.add_output(fd.ops.cast(y, DataType.BFloat16))


def _rmsnorm(fd: FusionDefinition, inputs: list[torch.Tensor]) -> None:
    x, w = (fd.from_pytorch(t) for t in inputs)
    xf = fd.ops.cast(x, DataType.Float)
    ms = fd.ops.mean(fd.ops.mul(xf, xf), [1], keepdim=True)
    y = fd.ops.mul(fd.ops.mul(xf, fd.ops.rsqrt(fd.ops.add(ms, 1e-6))),
                   fd.ops.broadcast(fd.ops.cast(w, DataType.Float), [True, False]))
    fd.add_output(fd.ops.cast(y, DataType.BFloat16))


def _softmax(fd: FusionDefinition, inputs: list[torch.Tensor]) -> None:
    x = fd.ops.cast(fd.from_pytorch(inputs[0]), DataType.Float)
    m = fd.ops.max(x, [1], keepdim=True)
    e = fd.ops.exp(fd.ops.sub(x, m))
    fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)), DataType.BFloat16))


def _seed003(fd: FusionDefinition, inputs: list[torch.Tensor]) -> None:
    t0 = fd.from_pytorch(inputs[0])
    t2 = fd.ops.sum(fd.ops.squeeze(t0, [0]), [1])
    t4 = fd.ops.add(t0, fd.ops.broadcast(t2, [True, False, True]))
    fd.add_output(t4)
    fd.add_output(fd.ops.sum(fd.ops.squeeze(t4, [0]), [0]))


def _layernorm_backward(fd: FusionDefinition, inputs: list[torch.Tensor]) -> None:
    dy, x, mean, rstd, w = (fd.from_pytorch(t) for t in inputs)
    dyf, xf, wf = (fd.ops.cast(t, DataType.Float) for t in (dy, x, w))
    n = float(inputs[1].shape[1])
    xhat = fd.ops.mul(fd.ops.sub(xf, mean), rstd)
    g = fd.ops.mul(dyf, fd.ops.broadcast(wf, [True, False]))
    a = fd.ops.sum(g, [1], keepdim=True)
    c = fd.ops.sum(fd.ops.mul(g, xhat), [1], keepdim=True)
    dx = fd.ops.mul(rstd, fd.ops.sub(fd.ops.sub(g, fd.ops.div(a, n)), fd.ops.mul(xhat, fd.ops.div(c, n))))
    fd.add_output(fd.ops.cast(dx, DataType.BFloat16))
    fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.mul(dyf, xhat), [0]), DataType.BFloat16))
    fd.add_output(fd.ops.cast(fd.ops.sum(dyf, [0]), DataType.BFloat16))


def _rmsnorm_backward(fd: FusionDefinition, inputs: list[torch.Tensor]) -> None:
    dy, x, rstd, w = (fd.from_pytorch(t) for t in inputs)
    dyf, xf, wf = (fd.ops.cast(t, DataType.Float) for t in (dy, x, w))
    n = float(inputs[1].shape[1])
    g = fd.ops.mul(dyf, fd.ops.broadcast(wf, [True, False]))
    c = fd.ops.sum(fd.ops.mul(g, xf), [1], keepdim=True)
    r3 = fd.ops.mul(fd.ops.mul(rstd, rstd), rstd)
    dx = fd.ops.sub(fd.ops.mul(g, rstd), fd.ops.mul(xf, fd.ops.mul(r3, fd.ops.div(c, n))))
    fd.add_output(fd.ops.cast(dx, DataType.BFloat16))
    fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.mul(dyf, fd.ops.mul(xf, rstd)), [0]), DataType.BFloat16))


def _eager_layernorm_backward(dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                              w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(torch.ops.aten.native_layer_norm_backward(dy, x, [x.shape[1]], mean, rstd, w, w,
                                                           [True, True, True]))


def _eager_rmsnorm_backward(dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor,
                            w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    dyf, xf, wf = dy.float(), x.float(), w.float()
    g = dyf * wf
    c = (g * xf).sum(1, keepdim=True)
    dx = g * rstd - xf * (rstd ** 3) * c / x.shape[1]
    return dx.to(dy.dtype), (dyf * xf * rstd).sum(0).to(dy.dtype)


def _row_sum(fd: FusionDefinition, inputs: list[torch.Tensor]) -> None:
    fd.add_output(fd.ops.sum(fd.from_pytorch(inputs[0]), [1]))


def _column_sum(fd: FusionDefinition, inputs: list[torch.Tensor]) -> None:
    fd.add_output(fd.ops.sum(fd.from_pytorch(inputs[0]), [0]))


def looped_cases(dev: str) -> list[Case]:
    """Rows too long to stay on chip (a vocabulary's softmax) and plain sums: looped reductions."""
    bf = torch.bfloat16
    wide = torch.randn(4096, 65536, device=dev, dtype=bf)
    vocab = torch.randn(8192, 32000, device=dev, dtype=bf)
    rows, columns = torch.randn(4096, 65536, device=dev), torch.randn(65536, 4096, device=dev)
    return [
        Case("softmax_bf16_4096x65536", lambda x: torch.softmax(x.float(), -1).to(bf), _softmax, [wide],
             2 * wide.numel() * 2, SchedulerType.inner_persistent),
        Case("softmax_bf16_8192x32000", lambda x: torch.softmax(x.float(), -1).to(bf), _softmax, [vocab],
             2 * vocab.numel() * 2, SchedulerType.inner_persistent),
        Case("row_sum_f32_4096x65536", lambda x: x.sum(1), _row_sum, [rows], rows.numel() * 4, SchedulerType.reduction),
        Case("column_sum_f32_65536x4096", lambda x: x.sum(0), _column_sum, [columns], columns.numel() * 4,
             SchedulerType.reduction),
    ]


def normalization_cases(dev: str) -> list[Case]:
    bf = torch.bfloat16
    m, n = 16384, 8192
    x = torch.randn(m, n, device=dev, dtype=bf)
    w, b = torch.randn(n, device=dev, dtype=bf), torch.randn(n, device=dev, dtype=bf)
    small = torch.randn(8192, 1024, device=dev, dtype=bf)
    ws, bs = torch.randn(1024, device=dev, dtype=bf), torch.randn(1024, device=dev, dtype=bf)
    seed = torch.randn(4096, 1, 4096, device=dev).permute(1, 0, 2)
    dy = torch.randn(m, n, device=dev, dtype=bf)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [n], w, b, 1e-5)  # statistics as eager saves them
    xf = x.float()
    rms = torch.rsqrt((xf * xf).mean(1, keepdim=True) + 1e-6)
    del xf
    return [
        Case("layernorm_bf16_16384x8192", lambda x, w, b: F.layer_norm(x, (n,), w, b), _layernorm, [x, w, b],
             2 * x.numel() * 2, SchedulerType.inner_persistent),
        Case("layernorm_bf16_8192x1024", lambda x, w, b: F.layer_norm(x, (1024,), w, b), _layernorm,
             [small, ws, bs], 2 * small.numel() * 2, SchedulerType.inner_persistent),
        Case("rmsnorm_bf16_16384x8192",
             lambda x, w: (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(bf),
             _rmsnorm, [x, w], 2 * x.numel() * 2, SchedulerType.inner_persistent),
        Case("softmax_bf16_16384x8192", lambda x: torch.softmax(x.float(), -1).to(bf), _softmax, [x],
             2 * x.numel() * 2, SchedulerType.inner_persistent),
        Case("seed003_f32_1x4096x4096_permuted",
             lambda t0: (t0 + t0.squeeze(0).sum(-1)[None, :, None],
                         (t0 + t0.squeeze(0).sum(-1)[None, :, None]).squeeze(0).sum(0)),
             _seed003, [seed], 2 * seed.numel() * 4 + 4096 * 4, SchedulerType.inner_outer_persistent),
        Case("layernorm_backward_bf16_16384x8192", _eager_layernorm_backward, _layernorm_backward,
             [dy, x, mean, rstd, w], 3 * x.numel() * 2 + 2 * m * 4, SchedulerType.inner_outer_persistent),
        Case("rmsnorm_backward_bf16_16384x8192", _eager_rmsnorm_backward, _rmsnorm_backward, [dy, x, rms, w],
             3 * x.numel() * 2 + m * 4, SchedulerType.inner_outer_persistent),
    ]


def cases(dev: str) -> list[Case]:
    bf = torch.bfloat16
    m, n = 16384, 8192
    x = torch.randn(m, n, device=dev, dtype=bf)
    bias = torch.randn(n, device=dev, dtype=bf)
    a32, b32 = torch.randn(8192, 8192, device=dev), torch.randn(8192, 8192, device=dev)
    c4 = [torch.randn(8192, 8192, device=dev) for _ in range(3)] + [torch.randn(8192, device=dev)]
    h = torch.randn(m, n, device=dev, dtype=bf)
    return [
        Case("bias_gelu_tanh_bf16_16384x8192", lambda x, b: F.gelu(x.float() + b.float(), approximate="tanh").to(bf),
             _bias_gelu, [x, bias], 2 * x.numel() * 2 + n * 2),
        Case("transpose_add_f32_8192x8192", lambda a, b: a.t() + b, _transpose_add, [a32, b32], 3 * a32.numel() * 4,
             SchedulerType.transpose),
        Case("chain4_broadcast_f32_8192x8192", lambda a, b, c, d: (a + b) * torch.sigmoid(c) - d, _chain4, c4,
             4 * c4[0].numel() * 4 + 8192 * 4),
        Case("cast_chain_bf16_16384x8192", lambda x, y: ((x.float() * y.float()).half().float() + 1.0).to(bf),
             _casts, [x, h], 3 * x.numel() * 2),
    ]


def run_case(case: Case, sweep: bool) -> dict[str, Any]:
    eager_out = case.eager(*case.inputs)
    eager_ms = bench(lambda: case.eager(*case.inputs))
    start = time.perf_counter()
    compiled = torch.compile(case.eager)
    compiled(*case.inputs)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - start
    inductor_ms = bench(lambda: compiled(*case.inputs))

    with FusionDefinition() as fd:
        case.define(fd, case.inputs)
    start = time.perf_counter()
    outs = fd.execute(case.inputs)
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - start
    expected = eager_out if isinstance(eager_out, tuple) else (eager_out,)
    for got, ref in zip(outs, expected, strict=True):
        # Sums over 16384 rows in bf16 differ by the order of additions: compare relative to the scale.
        scale = max(1.0, float(ref.float().abs().max()))
        torch.testing.assert_close(got.float(), ref.float(), atol=3e-2 * scale, rtol=3e-2)
    pyfuser_ms = bench(lambda: fd.execute(case.inputs))
    row: dict[str, Any] = {
        "case": case.name, "bytes": case.nbytes, "eager_ms": eager_ms, "inductor_ms": inductor_ms,
        "pyfuser_ms": pyfuser_ms, "eager_GBps": gbps(case.nbytes, eager_ms),
        "inductor_GBps": gbps(case.nbytes, inductor_ms), "pyfuser_GBps": gbps(case.nbytes, pyfuser_ms),
        "pyfuser_first_call_s": first_call_s, "inductor_compile_s": compile_s,
        "kernels": len(fd.fec.kernel_codes()),
        "copy_same_bytes_GBps": copy_bandwidth(str(case.inputs[0].device), case.nbytes),
    }
    if case.scheduler is SchedulerType.inner_outer_persistent:
        # A grid reduction: one cooperative launch against a launch per step, measured in turns (the
        # variant measured first in a row ran up to 30% slower on the H200 host).
        two = lambda: fd.execute(case.inputs, _disable_options=["cooperative_launch"])  # noqa: E731
        two()
        turns = [(bench(lambda: fd.execute(case.inputs)), bench(two)) for _ in range(3)]
        row["pyfuser_cooperative_ms"] = statistics.median(t[0] for t in turns)
        row["pyfuser_two_launches_ms"] = statistics.median(t[1] for t in turns)
        row["pyfuser_cooperative_GBps"] = gbps(case.nbytes, row["pyfuser_cooperative_ms"])
        row["pyfuser_two_launches_GBps"] = gbps(case.nbytes, row["pyfuser_two_launches_ms"])
    if sweep:
        row["sweep"] = sweep_case(case)
    return row


def _variants(case: Case, params: Any) -> list[Any]:
    if case.scheduler in (SchedulerType.inner_persistent, SchedulerType.reduction):
        tiles = [dataclasses.replace(params, shape="tile", rows=r, num_warps=w) for r in (1, 2, 4, 8, 16) for w in (2, 4, 8, 16)]
        loops = [dataclasses.replace(params, shape="loop", tile=t, num_warps=w, num_stages=st)
                 for t in (2048, 4096, 8192) for w in (2, 4, 8) for st in (0, 3)]
        return tiles + loops
    if case.scheduler is SchedulerType.inner_outer_persistent:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        return [dataclasses.replace(params, split=waves * sms, rows=r, num_warps=w, num_stages=stages)
                for waves in (1, 2) for r in (1, 2, 4) for w in (8, 16) for stages in (1, 3)]
    if case.scheduler is SchedulerType.transpose:
        return [dataclasses.replace(params, tile_in=t, tile_out=t, num_warps=w) for t in (32, 64) for w in (4, 8)]
    flat = [dataclasses.replace(params, block=(b,), num_warps=w) for b in (512, 1024, 2048, 4096) for w in (4, 8)]
    if case.inputs[0].dim() < 2:
        return flat
    # The 2-D schedule (outer x inner axes), which the heuristics leave to manual schedules.
    inner = params.block[0] // 4
    return flat + [dataclasses.replace(params, break_point=1, block=(o, i), num_warps=w)
                   for i in (inner // 2, inner, inner * 2) for o in (1, 2, 4, 8) for w in (4, 8)]


def sweep_case(case: Case) -> list[dict[str, Any]]:
    with FusionDefinition() as probe:
        case.define(probe, case.inputs)
    base = schedule.compute_heuristics(probe.fusion, case.scheduler, case.inputs)
    results = []
    for params in _variants(case, base):
        with FusionDefinition() as fd:
            case.define(fd, case.inputs)
            schedule.schedule(fd.fusion, case.scheduler, params)
        try:
            fd.manual_execute(case.inputs, params)
        except Exception as e:  # a variant over the machine's limits (shared memory of deep pipelines)
            results.append({"params": str(params).replace("\n", " "), "ms": float("inf"), "GBps": 0.0,
                            "error": f"{type(e).__name__}: {str(e)[:200]}"})
            continue
        ms = bench(lambda fd=fd, params=params: fd.manual_execute(case.inputs, params))
        results.append({"params": str(params).replace("\n", " "), "ms": ms, "GBps": gbps(case.nbytes, ms)})
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


def markdown(result: dict[str, Any]) -> str:
    copy = result["copy_GBps"]
    lines = [f"# Fused kernels, {result['device']} ({result['date']})", "",
             f"Copy bandwidth (1 GiB, read + write): {copy:.0f} GB/s. GB/s: bytes read + written by the fusion; "
             "copy of its bytes: a device copy moving as many bytes as the case (its physical limit).", "",
             "| case | eager | torch.compile | pyfuser | copy of its bytes | pyfuser / compile | pyfuser / copy "
             "| pyfuser / copy of its bytes | first call (s) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["cases"]:
        same = r["copy_same_bytes_GBps"]
        lines.append(f"| {r['case']} | {r['eager_GBps']:.0f} | {r['inductor_GBps']:.0f} | {r['pyfuser_GBps']:.0f} | "
                     f"{same:.0f} | {r['pyfuser_GBps'] / r['inductor_GBps']:.2f} | {r['pyfuser_GBps'] / copy:.2f} | "
                     f"{r['pyfuser_GBps'] / same:.2f} | {r['pyfuser_first_call_s']:.2f} |")
    h = result["host"]
    lines += ["", f"Host time of a cached one-kernel `fd.execute`: {h['execute_us']:.1f} us; launch of its compiled "
              f"variant alone: {h['launch_us']:.1f} us; overhead {h['overhead_us']:.1f} us."]
    for r in result["cases"]:
        if "pyfuser_two_launches_GBps" in r:
            lines.append(f"- {r['case']}: grid reduction in one cooperative launch "
                         f"{r['pyfuser_cooperative_GBps']:.0f} GB/s, a launch per step "
                         f"{r['pyfuser_two_launches_GBps']:.0f} GB/s (medians of three turns each)")
    for r in result["cases"]:
        if "sweep" in r:
            best = r["sweep"][0]
            lines.append(f"- sweep {r['case']}: best {best['GBps']:.0f} GB/s with {best['params']}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--cases", choices=["all", "pointwise", "normalization", "looped"], default="all")
    parser.add_argument("--match", default="", help="comma-separated parts of case names: run only those")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                              "torch": torch.__version__, "copy_GBps": copy_bandwidth(dev), "cases": []}
    chosen = cases(dev) if args.cases in ("all", "pointwise") else []
    if args.cases in ("all", "normalization"):
        chosen += normalization_cases(dev)
    if args.cases in ("all", "looped"):
        chosen += looped_cases(dev)
    if args.match:
        chosen = [c for c in chosen if any(part in c.name for part in args.match.split(","))]
    for case in chosen:
        row = run_case(case, args.sweep)
        print(json.dumps({k: v for k, v in row.items() if k != "sweep"}), flush=True)
        for r in row.get("sweep", [])[:4]:
            print("   sweep", json.dumps(r), flush=True)
        result["cases"].append(row)
    result["host"] = host_overhead(dev)
    # A partial run (some cases, a sweep) writes beside the current results of every case, never over them.
    partial = [part for part in (args.cases if args.cases != "all" else "", args.match.replace(",", "-"),
                                 "sweep" if args.sweep else "") if part]
    prefix = write_results("kernels", machine_kind(result["device"]), result, markdown(result), Path(args.out),
                           variant="_".join(partial))
    print(markdown(result))
    print(f"wrote {prefix}.json and {prefix}.md")


if __name__ == "__main__":
    main()
