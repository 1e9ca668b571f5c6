"""CPU overhead of pyfuser's Python layers on a 20-op pointwise fusion of tiny tensors.

Measures definition time, first execute (compile + run), cached execute (median of many) and the
same 20 torch ops run eagerly, then writes ``benchmarks/results/cpu_overhead_<kind>.{md,json}`` over the previous run's.
Not a test: numbers depend on the machine.

    python benchmarks/cpu_overhead.py [--repeats 2000] [--size 8] [--profile] [--machine "..."]
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import os
import pstats
import site
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from results_files import write_results

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyfuser import FusionDefinition
from pyfuser.ir.base import Scalar, Val
from pyfuser.ir.eval_context import EvalContext


def twenty_ops(ops: Any, x: Any, y: Any) -> Any:
    """20 pointwise ops; ``ops`` is ``fd.ops`` or a torch shim with the same names."""
    a = ops.add(x, y)  # 1
    a = ops.mul(a, 0.5)  # 2
    a = ops.sin(a)  # 3
    a = ops.exp(a)  # 4
    b = ops.sub(a, y)  # 5
    b = ops.tanh(b)  # 6
    b = ops.mul(b, b)  # 7
    c = ops.add(b, 1.0)  # 8
    c = ops.sqrt(c)  # 9
    c = ops.reciprocal(c)  # 10
    d = ops.maximum(c, a)  # 11
    d = ops.neg(d)  # 12
    d = ops.abs(d)  # 13
    e = ops.sigmoid(d)  # 14
    e = ops.mul(e, x)  # 15
    e = ops.add(e, 2.0)  # 16
    f = ops.log(e)  # 17
    f = ops.cos(f)  # 18
    f = ops.relu(f)  # 19
    return ops.div(f, e)  # 20


class TorchOps:
    add, sub, mul, div, maximum = torch.add, torch.sub, torch.mul, torch.div, torch.maximum
    sin, cos, exp, log, tanh, sqrt = torch.sin, torch.cos, torch.exp, torch.log, torch.tanh, torch.sqrt
    reciprocal, neg, abs, sigmoid, relu = torch.reciprocal, torch.neg, torch.abs, torch.sigmoid, torch.relu


def define() -> FusionDefinition:
    with FusionDefinition() as fd:
        x, y = fd.define_tensor([-1, -1], contiguity=True), fd.define_tensor([-1], contiguity=True)
        fd.add_output(twenty_ops(fd.ops, x, y))
    return fd


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    for _ in range(min(50, repeats)):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure(size: int, repeats: int) -> dict[str, Any]:
    x, y = torch.rand(size, size), torch.randn(size)  # x >= 0 keeps log() finite
    definition = median_seconds(define, max(repeats // 20, 10))
    fd = define()
    assert sum(isinstance(v, Val) for v in fd.fusion.vals()) > 20
    start = time.perf_counter()
    (out,) = fd.execute([x, y])
    first = time.perf_counter() - start
    torch.testing.assert_close(out, twenty_ops(TorchOps, x, y))
    fresh = define()  # a second fusion: its first execute is compilation alone, modules already imported
    start = time.perf_counter()
    fresh.execute([x, y])
    compile_only = time.perf_counter() - start
    cached = median_seconds(lambda: fd.execute([x, y]), repeats)
    eager = median_seconds(lambda: twenty_ops(TorchOps, x, y), repeats)
    return {"size": [size, size], "ops": 20, "repeats": repeats,
            "definition_ms": definition * 1e3, "first_execute_ms": first * 1e3,
            "first_execute_of_another_fusion_ms": compile_only * 1e3,
            "cached_execute_us": cached * 1e6, "eager_torch_us": eager * 1e6,
            "cached_over_eager": cached / eager}


def breakdown(size: int, repeats: int) -> dict[str, float]:
    """Where a cached execute spends its time: the executor (signature lookup, size binding), the
    compiled program, and inside it the op nodes' torch evaluations run back to back."""
    x, y = torch.rand(size, size), torch.randn(size)  # x >= 0 keeps log() finite
    fd = define()
    fd.execute([x, y])
    executor = fd.fec
    program = getattr(executor, "last_program", None)
    if program is None:
        return {}
    args = [x, y]
    ctx = EvalContext(executor._binder.bind(args), torch.device("cpu"))
    fusion = fd.fusion
    exprs = fusion.exprs()
    env: dict[int, Any] = {id(v): v.value for e in exprs for v in e.inputs if isinstance(v, Scalar) and v.is_const}
    env.update({id(v): a for v, a in zip(fusion.inputs(), args, strict=True)})
    plan = [(e.evaluate, [id(v) for v in e.inputs], [id(v) for v in e.outputs]) for e in exprs]

    def op_nodes_only() -> None:
        values = dict(env)
        for evaluate, ins, outs in plan:
            for key, result in zip(outs, evaluate(ctx, *[values[k] for k in ins]), strict=True):
                values[key] = result

    return {"program_run_us": median_seconds(lambda: program.run(args, ctx), repeats) * 1e6,
            "op_nodes_back_to_back_us": median_seconds(op_nodes_only, repeats) * 1e6,
            "exprs": len(exprs)}


def profile_cached(size: int, repeats: int) -> str:
    x, y = torch.rand(size, size), torch.randn(size)  # x >= 0 keeps log() finite
    fd = define()
    fd.execute([x, y])
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(repeats):
        fd.execute([x, y])
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(15)
    return _relative_paths(text.getvalue())


def _relative_paths(text: str) -> str:
    """``text`` with file names relative to the repository, site-packages or the standard library: the
    results file names modules (``pyfuser/...``, ``torch/...``), not this machine's directories."""
    roots = {str(Path(__file__).resolve().parent.parent), *site.getsitepackages(),
             *(sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib"))}
    for root in sorted(roots, key=len, reverse=True):  # site-packages inside the repository's .venv first
        text = text.replace(root.rstrip(os.sep) + os.sep, "")
    return text


def write(result: dict[str, Any], machine: str, profile: str | None) -> Path:
    today = datetime.date.today().isoformat()
    meta = {"machine": machine, "date": today, "torch": torch.__version__, "python": sys.version.split()[0],
            "load_average_1min": round(os.getloadavg()[0], 2)}
    lines = [
        f"# CPU overhead: 20-op pointwise fusion ({today})", "",
        f"Machine: {machine}; torch {meta['torch']}, Python {meta['python']}; one torch thread; load average "
        f"{meta['load_average_1min']} while measuring (a shared machine: expect +-20% run to run).",
        f"Inputs: float32 `[{result['size'][0]}, {result['size'][1]}]` and `[{result['size'][1]}]`; "
        f"medians of {result['repeats']} runs (definition: of {max(result['repeats'] // 20, 10)}).", "",
        "| what | time |", "| --- | --- |",
        f"| definition (20 `fd.ops` calls + add_output) | {result['definition_ms']:.3f} ms |",
        f"| first execute (compile + run; the process's first, so lazy imports too) | "
        f"{result['first_execute_ms']:.3f} ms |",
        f"| first execute of a second, identical definition (compile + run) | "
        f"{result['first_execute_of_another_fusion_ms']:.3f} ms |",
        f"| cached execute | {result['cached_execute_us']:.1f} us |",
        f"| same 20 torch ops, eager | {result['eager_torch_us']:.1f} us |",
        f"| cached / eager | {result['cached_over_eager']:.2f}x |", "",
    ]
    if "program_run_us" in result:
        extra = result["cached_execute_us"] - result["eager_torch_us"]
        lines += [
            "Where a cached execute goes:", "",
            f"- executor (signature lookup, binding sizes, picking the program): "
            f"{result['cached_execute_us'] - result['program_run_us']:.1f} us",
            f"- the compiled Host IR program: {result['program_run_us']:.1f} us, for {result['exprs']} exprs "
            f"(20 ops plus the inserted broadcast of the 1-D operand)",
            f"- the same exprs' `evaluate` called back to back without Host IR: "
            f"{result['op_nodes_back_to_back_us']:.1f} us", "",
            f"Reading: the cached path adds {extra:.1f} us over eager torch, about {extra / result['exprs']:.1f} us "
            "per expr. Signature lookup and size binding (`runtime/executor.py`, `runtime/inputs.py`) are a small "
            "part; what dominates is per-expr Python dispatch: the Host IR step gathering operands and storing "
            "results, the op node's `evaluate` (one dict-free call to a torch function chosen at definition), one "
            "broadcast expr that eager torch does implicitly, and two runtime size checks of the symbolic "
            "broadcast (`T0 axis 1` against `T1 axis 0`). On tensors this small each torch call costs about "
            "1 us, so any per-op Python layer shows; closing the gap needs fewer Python calls per op (e.g. one "
            "generated straight-line function per program, or a fused kernel), not a faster cache lookup.", "",
        ]
    lines += [
        "Command: `python benchmarks/cpu_overhead.py --profile`.",
    ]
    if profile is not None:
        lines += ["", "## cProfile of cached executes (top 15 by own time)", "", "```", profile.strip(), "```"]
    return write_results("cpu_overhead", "cpu", {**meta, **result}, "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--profile", action="store_true", help="append a cProfile of cached executes")
    parser.add_argument("--machine", default="2-core CPU dev machine")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = measure(args.size, args.repeats)
    result.update(breakdown(args.size, args.repeats))
    print(json.dumps(result, indent=2))
    profile = profile_cached(args.size, args.repeats // 4) if args.profile else None
    if profile is not None:
        print(profile)
    if not args.no_write:
        print(f"wrote {write(result, args.machine, profile)}.json and .md")


if __name__ == "__main__":
    main()
