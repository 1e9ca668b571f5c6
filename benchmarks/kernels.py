"""Fused memory-bound kernels on one GPU: pyfuser's generated kernels against copy bandwidth, torch
eager and torch.compile (Inductor), measured side by side in one run.

GB/s counts the bytes a fusion must move (each input read once, each output written once).
Also measured: the first call of a new fusion (compile included) and the host time a cached
``fd.execute`` adds over launching the same Triton kernel directly. ``--sweep`` also times
hand-edited heuristics through ``schedule.compute_heuristics`` + ``fd.manual_execute`` (to tune the
defaults). Writes JSON and Markdown to ``--out`` (default: benchmarks/results).

    python benchmarks/kernels.py [--sweep] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

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


def bench(fn: Callable[[], Any]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))


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
    (out,) = fd.execute(case.inputs)
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - start
    torch.testing.assert_close(out.float(), eager_out.float(), atol=2e-2, rtol=2e-2)
    pyfuser_ms = bench(lambda: fd.execute(case.inputs))
    row: dict[str, Any] = {
        "case": case.name, "bytes": case.nbytes, "eager_ms": eager_ms, "inductor_ms": inductor_ms,
        "pyfuser_ms": pyfuser_ms, "eager_GBps": gbps(case.nbytes, eager_ms),
        "inductor_GBps": gbps(case.nbytes, inductor_ms), "pyfuser_GBps": gbps(case.nbytes, pyfuser_ms),
        "pyfuser_first_call_s": first_call_s, "inductor_compile_s": compile_s,
        "kernels": len(fd.fec.kernel_codes()),
    }
    if sweep:
        row["sweep"] = sweep_case(case)
    return row


def _variants(case: Case, params: Any) -> list[Any]:
    if case.scheduler is SchedulerType.transpose:
        return [dataclasses.replace(params, tile_in=t, tile_out=t, num_warps=w) for t in (32, 64) for w in (4, 8)]
    if params.break_point:
        inner = params.block[1]
        return [dataclasses.replace(params, block=(o, i), num_warps=w)
                for i in (inner // 2, inner, inner * 2) for o in (1, 2, 4, 8) for w in (4, 8)]
    return [dataclasses.replace(params, block=(b,), num_warps=w) for b in (512, 1024, 2048, 4096) for w in (4, 8)]


def sweep_case(case: Case) -> list[dict[str, Any]]:
    with FusionDefinition() as probe:
        case.define(probe, case.inputs)
    base = schedule.compute_heuristics(probe.fusion, case.scheduler, case.inputs)
    results = []
    for params in _variants(case, base):
        with FusionDefinition() as fd:
            case.define(fd, case.inputs)
            schedule.schedule(fd.fusion, case.scheduler, params)
        fd.manual_execute(case.inputs, params)
        ms = bench(lambda fd=fd, params=params: fd.manual_execute(case.inputs, params))
        results.append({"params": str(params).replace("\n", " "), "ms": ms, "GBps": gbps(case.nbytes, ms)})
    return sorted(results, key=lambda r: r["ms"])


def host_overhead(dev: str) -> dict[str, float]:
    """Host time of a cached ``fd.execute`` of a one-kernel fusion over launching that kernel directly."""
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
    return {"execute_us": execute_us, "triton_launch_us": direct_us, "overhead_us": execute_us - direct_us}


def copy_bandwidth(dev: str) -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    return gbps(2 * x.numel(), ms)


def markdown(result: dict[str, Any]) -> str:
    copy = result["copy_GBps"]
    lines = [f"# Fused kernels, {result['device']} ({result['date']})", "",
             f"Copy bandwidth (1 GiB, read + write): {copy:.0f} GB/s. GB/s: bytes read + written by the fusion.", "",
             "| case | eager | torch.compile | pyfuser | pyfuser / compile | pyfuser / copy | first call (s) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["cases"]:
        lines.append(f"| {r['case']} | {r['eager_GBps']:.0f} | {r['inductor_GBps']:.0f} | {r['pyfuser_GBps']:.0f} | "
                     f"{r['pyfuser_GBps'] / r['inductor_GBps']:.2f} | {r['pyfuser_GBps'] / copy:.2f} | "
                     f"{r['pyfuser_first_call_s']:.2f} |")
    h = result["host"]
    lines += ["", f"Host time of a cached one-kernel `fd.execute`: {h['execute_us']:.1f} us; direct Triton launch of "
              f"the same kernel: {h['triton_launch_us']:.1f} us; overhead {h['overhead_us']:.1f} us."]
    for r in result["cases"]:
        if "sweep" in r:
            best = r["sweep"][0]
            lines.append(f"- sweep {r['case']}: best {best['GBps']:.0f} GB/s with {best['params']}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                              "torch": torch.__version__, "copy_GBps": copy_bandwidth(dev), "cases": []}
    for case in cases(dev):
        row = run_case(case, args.sweep)
        print(json.dumps({k: v for k, v in row.items() if k != "sweep"}), flush=True)
        result["cases"].append(row)
    result["host"] = host_overhead(dev)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"kernels_{result['date']}"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (out / f"{stem}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
