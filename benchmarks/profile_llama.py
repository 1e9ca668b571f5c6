"""Where the time of ``benchmarks/compile_llama.py``'s decoder layer goes, per torch.compile variant.

For each case and variant: ``torch.profiler`` over a few cached iterations; prints the GPU time per
iteration (kernels and copies), the wall time per iteration, and the kernels that take the most GPU
time (name, calls and microseconds per iteration), plus what pyfuser's regions ran (kernels and ATen
calls by kind). Profile first, optimize second (the closing notes quote this output).

    python benchmarks/profile_llama.py --cases small --variants inductor_reduce_overhead,pyfuser_cuda_graph
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compile_llama import VARIANTS, DecoderLayer, compiled, rotary

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


def profile_variant(variant: str, shape: dict[str, int], training: bool, iters: int, top: int,
                    host: bool = False) -> str:
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
                                           args.host)
                except Exception as e:  # one failing variant does not stop the others
                    text = f"## {kind} {variant}: failed: {type(e).__name__}: {str(e)[:300]}"
                print(text, flush=True)
                report.append(text)
    if args.out:
        Path(args.out).write_text("\n".join(report) + "\n")


if __name__ == "__main__":
    main()
