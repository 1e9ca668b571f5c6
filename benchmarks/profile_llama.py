"""Where the time of ``benchmarks/compile_llama.py``'s decoder layer goes, per torch.compile variant.

For each case and variant: ``torch.profiler`` over a few cached iterations; prints the GPU time per
iteration (kernels and copies), the wall time per iteration, and the kernels that take the most GPU
time (name, calls and microseconds per iteration), plus what pyfuser's regions ran (kernels and ATen
calls by kind). Profile first, optimize second (the closing notes quote this output).

    python benchmarks/profile_llama.py --cases small --variants inductor_reduce_overhead,pyfuser_cuda_graph
    python benchmarks/profile_llama.py --cases small --passes fwd+bwd --variants pyfuser --steps
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compile_llama import VARIANTS, DecoderLayer, compiled, rotary

from pyfuser.host_ir.evaluator import HostIrEvaluator
from pyfuser.integrations.torch_compile.region import FusionRegion
from pyfuser.runtime.executor import BoundProgram

SHAPES = {"large": {"hidden": 4096, "heads": 32, "mlp": 11008, "seq": 2048, "batch": 4},
          "small": {"hidden": 4096, "heads": 32, "mlp": 11008, "seq": 128, "batch": 1}}


def is_copy(kernel: str) -> bool:
    return "Memcpy" in kernel or "copy" in kernel or "multi_tensor_apply" in kernel


def launchers(prof: profile, names: set[str], iters: int) -> list[str]:
    """Which host ops launched the copies among the top kernels (innermost op, its shapes, its callers):
    a copy is either in the program or the price of how its inputs and results are handed over."""
    found: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        for kernel in getattr(event, "kernels", ()) or ():
            if kernel.name not in names:
                continue
            chain, parent = [], event
            while parent is not None and len(chain) < 5:
                chain.append(parent.name)
                parent = parent.cpu_parent
            entry = found[(kernel.name[:40], f"{' < '.join(chain)} {event.input_shapes}"[:300])]
            entry[0] += 1
            entry[1] += kernel.duration
    lines = ["  copies launched by:"] if found else []
    for (kernel, by), (calls, total) in sorted(found.items(), key=lambda kv: -kv[1][1])[:12]:
        lines.append(f"    {total / iters:8.1f} us  x{calls / iters:5.1f}  {kernel}: {by}")
    return lines


def host_profile(call, iters: int, top: int) -> list[str]:
    """The Python functions the host spends its time in (cProfile, by own time and cumulative)."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(iters):
        call()
    torch.cuda.synchronize()
    profiler.disable()
    lines = []
    for order in ("tottime", "cumulative"):
        stream = io.StringIO()
        pstats.Stats(profiler, stream=stream).sort_stats(order).print_stats(top)
        body = stream.getvalue().splitlines()
        start = next(i for i, line in enumerate(body) if line.lstrip().startswith("ncalls"))
        lines.append(f"  host functions by {order} ({iters} iterations):")
        lines.extend("    " + line for line in body[start:] if line.strip())
    return lines


def _step_label(step: Any) -> str:
    """What a Host IR step runs: an ATen call (by the expr's type), a kernel launch (its generated
    launcher's kernel, or the segment's type: size-dispatched, a sequence of launches), or the kind
    of step."""
    cells = [c.cell_contents for c in (step.__closure__ or ()) if not isinstance(c.cell_contents, (int, list, str))]
    for value in cells:
        owner = getattr(value, "__self__", None)
        if owner is not None and type(owner).__name__.endswith("Op"):
            return f"aten {type(owner).__name__}"
    for value in cells:
        owner = getattr(value, "__self__", None)
        if owner is not None and hasattr(owner, "name"):
            return f"launch {type(owner).__name__} {owner.name}"
        code = getattr(value, "__code__", None)
        if code is not None and code.co_filename.startswith("<launcher of"):
            return f"launch {code.co_filename.strip('<>').removeprefix('launcher of ')}"
    return step.__qualname__.split(".<locals>")[0] + "." + step.__name__


def step_breakdown(call: Callable[[], None], iters: int, top: int) -> list[str]:
    """Host time per Host IR step kind, per region call and per program run (``perf_counter`` around
    each: a few hundred ns each of overhead), in microseconds per iteration."""
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    labels: dict[int, list[str]] = {}
    real_execute, real_run, real_region = HostIrEvaluator._execute, HostIrEvaluator.run, FusionRegion.__call__
    real_bound = BoundProgram.run

    def execute(self: Any, frame: Any, recorded: Any = None) -> None:
        if recorded is not None:  # a binding's first run, recorded for its straight-line function
            real_execute(self, frame, recorded)
            return
        names = labels.get(id(self))
        if names is None:
            names = labels[id(self)] = [_step_label(step) for step in self._steps]
        clock = time.perf_counter
        start = clock()
        for name, step in zip(names, self._steps, strict=True):
            step(frame)
            now = clock()
            total[name] += now - start
            calls[name] += 1
            start = now

    def timed(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                total[key] += time.perf_counter() - start
                calls[key] += 1
        return wrapper

    HostIrEvaluator._execute = execute  # type: ignore[method-assign]
    HostIrEvaluator.run = timed("(program runs, steps included)", real_run)  # type: ignore[method-assign]
    FusionRegion.__call__ = timed("(region calls, programs included)", real_region)  # type: ignore[method-assign]
    BoundProgram.run = timed("(bound program runs: straight-line functions after their first)", real_bound)  # type: ignore[method-assign]
    try:
        call()
        total.clear()
        calls.clear()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / iters * 1e6
    finally:
        HostIrEvaluator._execute, HostIrEvaluator.run, FusionRegion.__call__ = real_execute, real_run, real_region
        BoundProgram.run = real_bound  # type: ignore[method-assign]
    lines = [f"  host time per Host IR step kind ({iters} iterations, {wall:.0f} us each with the timers):"]
    for name, seconds in sorted(total.items(), key=lambda kv: -kv[1])[:2 * top]:
        lines.append(f"    {seconds / iters * 1e6:8.1f} us  x{calls[name] / iters:5.1f}  {name[:100]}")
    return lines


def profile_variant(variant: str, shape: dict[str, int], training: bool, iters: int, top: int,
                    host: bool = False, steps: bool = False) -> str:
    torch.manual_seed(0)
    layer = DecoderLayer(shape["hidden"], shape["heads"], shape["mlp"]).to(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(shape["batch"], shape["seq"], shape["hidden"], device="cuda", dtype=torch.bfloat16)
    cos, sin = rotary(shape["seq"], shape["hidden"] // shape["heads"], "cuda", torch.bfloat16)
    grad = torch.randn_like(x)
    fn, backend = compiled(variant, layer)

    def call() -> None:
        if variant == "inductor_reduce_overhead":
            torch.compiler.cudagraph_mark_step_begin()
        if training:
            layer.zero_grad(set_to_none=True)
            fn(x.detach().requires_grad_(), cos, sin).backward(grad)
        else:
            with torch.no_grad():
                fn(x, cos, sin).clone()

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t0) / iters * 1e6
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = kernels[event.name]
            entry[0] += 1
            entry[1] += event.device_time
    gpu_us = sum(t for _, t in kernels.values()) / iters
    lines = [f"## {'fwd+bwd' if training else 'fwd'} {variant}: GPU {gpu_us:.0f} us / iteration, wall {wall_us:.0f} us"]
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]
    for name, (calls, total) in ranked:
        lines.append(f"  {total / iters:9.1f} us  x{calls / iters:5.1f}  {name[:110]}")
    lines.extend(launchers(prof, {name for name, _ in ranked if is_copy(name)}, iters))
    if host:
        lines.extend(host_profile(call, iters, 2 * top))
    if steps and backend is not None:
        lines.extend(step_breakdown(call, max(iters, 20), top))
    if backend is not None:
        for graph in backend.graphs:
            for region in graph.regions:
                lines.append("  " + region.summary().replace("\n", "\n  "))
            if graph.eager:
                lines.append(f"  {graph.kind} eager ops: {', '.join(sorted(graph.eager))[:300]}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="small,large")
    parser.add_argument("--passes", default="fwd,fwd+bwd")
    parser.add_argument("--variants", default="inductor,inductor_reduce_overhead,pyfuser,pyfuser_cuda_graph")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--out", default=None, help="also write the report to this file")
    parser.add_argument("--host", action="store_true", help="add a cProfile of the host's Python functions")
    parser.add_argument("--steps", action="store_true", help="add pyfuser's host time per Host IR step kind")
    args = parser.parse_args()
    unknown = sorted(set(args.variants.split(",")) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    report: list[str] = [f"# Profile of the Llama-style layer, {torch.cuda.get_device_name()}, torch {torch.__version__}"]
    for case in args.cases.split(","):
        for kind in args.passes.split(","):
            report.append(f"\n# {case} {kind} {SHAPES[case]}")
            for variant in args.variants.split(","):
                try:
                    text = profile_variant(variant, SHAPES[case], kind == "fwd+bwd", args.iters, args.top,
                                           args.host, args.steps)
                except Exception as e:  # one failing variant does not stop the others
                    text = f"## {kind} {variant}: failed: {type(e).__name__}: {str(e)[:300]}"
                print(text, flush=True)
                report.append(text)
    if args.out:
        Path(args.out).write_text("\n".join(report) + "\n")


if __name__ == "__main__":
    main()
