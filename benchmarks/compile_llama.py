"""One Llama-style decoder layer through torch.compile backends, side by side in one run.

Variants: eager; ``torch.compile`` (Inductor) default and ``mode="reduce-overhead"`` (CUDA graphs);
``backend="pyfuser"`` without and with CUDA graphs. Cases: the large shape of issue 14 (hidden 4096,
32 heads, MLP 11008, sequence 2048, batch 4, bf16) and a small one where host overhead dominates
(batch 1, sequence 128), each as forward (no grad) and forward + backward. Plus the host overhead
of a cached one-kernel region (``x * 2 + 1`` on 1024 elements): calls per second with the GPU idle.

The layer is written here in plain torch (RMSNorm, rotary embeddings, causal SDPA, SwiGLU MLP), the
math of Hugging Face's ``LlamaDecoderLayer``, so the benchmark needs no ``transformers``.

    python benchmarks/compile_llama.py --interleave 20 --out benchmarks/results   # on a GPU
    python benchmarks/compile_llama.py --cases small --interleave 12              # host-bound A/B
    python benchmarks/compile_llama.py --device cpu --quick                       # CPU smoke run

Not a test: numbers depend on the machine. With ``--out DIR`` writes ``DIR/compile_llama_<kind>.json`` and
``.md`` (``compile_llama_<cases>_<kind>`` for a subset of the cases), over the previous run's.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
import torch.nn.functional as F
from results_files import machine_kind, write_results
from timing import synchronize, time_ms

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyfuser import FusionDefinition
from pyfuser.integrations.torch_compile import PyfuserBackend

VARIANTS = ("eager", "inductor", "inductor_reduce_overhead", "pyfuser", "pyfuser_cuda_graph")
CUDA_ONLY = {"inductor_reduce_overhead", "pyfuser_cuda_graph"}


class RMSNorm(torch.nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class DecoderLayer(torch.nn.Module):
    def __init__(self, hidden: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.input_norm, self.post_norm = RMSNorm(hidden), RMSNorm(hidden)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(hidden, hidden, bias=False) for _ in range(4))
        self.gate, self.up = torch.nn.Linear(hidden, mlp, bias=False), torch.nn.Linear(hidden, mlp, bias=False)
        self.down = torch.nn.Linear(mlp, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        h = self.input_norm(x)
        q, k, v = (proj(h).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
                   for proj in (self.q, self.k, self.v))
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attn.transpose(1, 2).reshape(batch, seq, hidden))
        h = self.post_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def rotary(seq: int, dim: int, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=device).float() / dim))
    angles = torch.outer(torch.arange(seq, device=device).float(), inv_freq)
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


# --- timing ------------------------------------------------------------------------------------------
def compiled(variant: str, layer: torch.nn.Module, reset: bool = True) -> tuple[Callable[..., Any], Any]:
    """``reset=False`` keeps the variants compiled before (for interleaved turns, in the groups that can
    share a process: see ``INTERLEAVABLE``)."""
    # Nothing of the previous variant may outlive it: an autograd graph it left to the garbage collector
    # holds the parameters' AccumulateGrad nodes, whose stream then differs from a CUDA-graph capture's.
    gc.collect()
    if reset:
        torch._dynamo.reset()
    if variant == "eager":
        return layer, None
    if variant == "inductor":
        return torch.compile(layer), None
    if variant == "inductor_reduce_overhead":
        return torch.compile(layer, mode="reduce-overhead"), None
    backend = PyfuserBackend(cuda_graph=variant == "pyfuser_cuda_graph")
    return torch.compile(layer, backend=backend), backend


#: Variants timed together in rotated turns, in groups that share a process without resets: the
#: eager ones, and the CUDA-graph ones (Inductor's graph trees and pyfuser's graphs side by side).
INTERLEAVABLE = ("eager", "inductor", "pyfuser")
INTERLEAVABLE_GRAPHS = ("inductor_reduce_overhead", "pyfuser_cuda_graph")


def group_anchor(variant: str) -> str:
    """What a variant timed interleaved is compared with: Inductor, or with CUDA graphs ``reduce-overhead``."""
    return "inductor_reduce_overhead" if variant in INTERLEAVABLE_GRAPHS else "inductor"


def interleaved_samples(calls: dict[str, Callable[[], Any]], device: str, turns: int, iters: int) -> dict[str, list[float]]:
    """Wall milliseconds per call of each variant in each of ``turns`` turns of ``iters`` calls, the
    variants' order rotated each turn, in one process: on the H200's host a host-bound step drifts by
    a third between runs, which sequential medians attribute to whichever variant ran then."""
    names = list(calls)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for turn in range(turns):
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            synchronize(device)
            t0 = time.perf_counter()
            for _ in range(iters):
                calls[name]()
            synchronize(device)
            samples[name].append((time.perf_counter() - t0) / iters * 1e3)
    return samples


def paired_ratios(anchor: list[float], variant: list[float]) -> dict[str, float]:
    """The anchor's time over the variant's, turn by turn (the host's drift cancels within a turn):
    median and quartiles."""
    ratios = sorted(a / v for a, v in zip(anchor, variant, strict=True))
    return {"median": statistics.median(ratios), "q1": ratios[len(ratios) // 4], "q3": ratios[(3 * len(ratios)) // 4]}


def run_case(name: str, shape: dict[str, int], training: bool, variants: list[str], device: str, dtype: torch.dtype,
             warmup: int, iters: int, interleave: int = 0) -> dict[str, Any]:
    torch.manual_seed(0)
    layer = DecoderLayer(shape["hidden"], shape["heads"], shape["mlp"]).to(device=device, dtype=dtype)
    x = torch.randn(shape["batch"], shape["seq"], shape["hidden"], device=device, dtype=dtype)
    cos, sin = rotary(shape["seq"], shape["hidden"] // shape["heads"], device, dtype)
    grad = torch.randn_like(x)
    with torch.no_grad():
        reference = layer(x, cos, sin)
    result: dict[str, Any] = {"case": name, "shape": shape, "training": training, "variants": {}}

    def make_call(fn: Callable[..., Any], mark_step: bool) -> Callable[[], torch.Tensor]:
        def call() -> torch.Tensor:
            if mark_step:
                torch.compiler.cudagraph_mark_step_begin()
            if training:
                layer.zero_grad(set_to_none=True)
                out = fn(x.detach().requires_grad_(), cos, sin)
                out.backward(grad)
                return out.detach()
            with torch.no_grad():
                return fn(x, cos, sin).clone()

        return call

    for variant in variants:
        fn, backend = compiled(variant, layer)
        call = make_call(fn, variant == "inductor_reduce_overhead")

        entry: dict[str, Any] = {}
        try:
            t0 = time.perf_counter()
            first = call()
            synchronize(device)
            entry["first_call_s"] = time.perf_counter() - t0
            entry["max_abs_diff_vs_eager"] = (first.float() - reference.float()).abs().max().item()
            entry["ms"] = time_ms(call, device, warmup, iters)
            entry["tokens_per_s"] = shape["batch"] * shape["seq"] / (entry["ms"] / 1e3)
            if backend is not None:
                regions = [r for g in backend.graphs for r in g.regions]
                entry["regions"] = len(regions)
                entry["eager_ops"] = sum(len(g.eager) for g in backend.graphs)
                runners = [g.replay.runner for g in backend.graphs if g.replay is not None and g.replay.runner]
                runners += [r.graph_runner for r in regions if r.graph_runner is not None]
                if runners:  # replicas captured, and calls that found every replica's results held
                    entry["cuda_graphs_captured"] = sum(g.graphs_captured for g in runners)
                    entry["calls_without_graph"] = sum(g.plain_runs for g in runners)
        except Exception as e:  # a failing variant is reported, the others still run
            entry["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        result["variants"][variant] = entry
        print(f"{name:>6} {'fwd+bwd' if training else 'fwd':>7} {variant:>26}: "
              + (f"{entry['ms']:8.3f} ms" if "ms" in entry else entry.get("error", ""))
              + (f"  (graphs {entry['cuda_graphs_captured']}, calls without one {entry['calls_without_graph']})"
                 if "cuda_graphs_captured" in entry else ""), flush=True)
    for group in (INTERLEAVABLE, INTERLEAVABLE_GRAPHS):
        together = [v for v in variants if v in group and "ms" in result["variants"][v]]
        if not interleave or len(together) < 2:
            continue
        torch._dynamo.reset()
        gc.collect()
        calls = {}
        for variant in together:
            calls[variant] = make_call(compiled(variant, layer, reset=False)[0], variant == "inductor_reduce_overhead")
            for _ in range(warmup):
                calls[variant]()
        samples = interleaved_samples(calls, device, interleave, max(1, iters // 2))
        anchor = group_anchor(together[0])
        for variant, times in samples.items():
            entry = result["variants"][variant]
            entry["interleaved_ms"] = statistics.median(times)
            line = f"{name:>6} {'fwd+bwd' if training else 'fwd':>7} {variant:>26}: {entry['interleaved_ms']:8.3f} ms interleaved"
            if anchor in samples and variant != anchor:
                entry["interleaved_ratio"] = paired_ratios(samples[anchor], times)
                line += f", {anchor}/{variant} per turn {entry['interleaved_ratio']['median']:.3f}"
            print(line, flush=True)
    return result


def host_overhead(device: str, iters: int) -> dict[str, float]:
    """Microseconds per call of a cached one-kernel computation, called back to back with the GPU idle
    (tiny tensor): the host's cost of each way to launch it."""
    x = torch.randn(1024, device=device)

    def per_call_us(fn: Callable[[], Any]) -> float:
        for _ in range(50):
            fn()
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        synchronize(device)
        return (time.perf_counter() - t0) / iters * 1e6

    def kernel(t: torch.Tensor) -> torch.Tensor:
        return t * 2 + 1

    with FusionDefinition() as fd:
        tv = fd.define_tensor([-1], contiguity=True)
        fd.add_output(fd.ops.add(fd.ops.mul(tv, 2), 1))
    results = {
        "eager_torch_two_ops_us": per_call_us(lambda: kernel(x)),
        "fd_execute_us": per_call_us(lambda: fd.execute([x])),
        "fec_run_us": per_call_us(lambda: fd.fec.run([x])),
    }
    if device == "cuda":
        torch._dynamo.reset()
        inductor_kernel = torch.compile(kernel)
        results["inductor_compiled_us"] = per_call_us(lambda: inductor_kernel(x))
    for name, graphs in (("pyfuser", False), ("pyfuser_cuda_graph", True)):
        if graphs and device != "cuda":
            continue
        torch._dynamo.reset()
        backend = PyfuserBackend(cuda_graph=graphs)
        compiled_kernel = torch.compile(kernel, backend=backend)
        compiled_kernel(x)
        graph = backend.graphs[0]
        results[f"{name}_compiled_us"] = per_call_us(lambda f=compiled_kernel: f(x))
        if graph.replay is not None:  # the compiled graph's replay, called as AOTAutograd calls it
            results[f"{name}_graph_replay_us"] = per_call_us(lambda r=graph.replay: r([x]))
        else:
            results[f"{name}_region_call_us"] = per_call_us(lambda r=graph.regions[0]: r(x))
    return results


def markdown(report: dict[str, Any]) -> str:
    meta = report["meta"]
    lines = [f"# torch.compile backends on a Llama-style decoder layer ({meta['date']})", "",
             f"Device: {meta['device_name']}; torch {meta['torch']}, Python {meta['python']}; dtype {meta['dtype']}; "
             f"medians of {meta['iters']} iterations after {meta['warmup']} warm-up ones (CUDA events on a GPU).", "",
             "| case | pass | variant | ms / iteration | tokens / s | vs eager | vs inductor | max abs diff vs eager |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for case in report["cases"]:
        variants = case["variants"]
        eager = variants.get("eager", {}).get("ms")
        inductor = variants.get("inductor", {}).get("ms")
        for name, entry in variants.items():
            kind = "fwd+bwd" if case["training"] else "fwd"
            if "ms" not in entry:
                lines.append(f"| {case['case']} | {kind} | {name} | failed: {entry.get('error', '?')} | | | | |")
                continue
            ms = entry["ms"]
            lines.append(f"| {case['case']} | {kind} | {name} | {ms:.3f} | {entry['tokens_per_s']:.0f} | "
                         f"{eager / ms:.2f}x | {(inductor / ms) if inductor else float('nan'):.2f}x | "
                         f"{entry['max_abs_diff_vs_eager']:.3g} |")
    turns = meta.get("interleave", 0)
    if turns:
        lines += ["", f"### Interleaved in one process ({turns} turns, variants rotated; wall ms per iteration)", "",
                  "| case | pass | variant | ms / iteration | vs its anchor (inductor; with CUDA graphs reduce-overhead): "
                  "ratio of medians | anchor / variant turn by turn: median (quartiles) |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for case in report["cases"]:
            variants = case["variants"]
            for name, entry in variants.items():
                if "interleaved_ms" in entry:
                    ms = entry["interleaved_ms"]
                    anchor = variants.get(group_anchor(name), {}).get("interleaved_ms")
                    paired = entry.get("interleaved_ratio")
                    lines.append(f"| {case['case']} | {'fwd+bwd' if case['training'] else 'fwd'} | {name} | {ms:.3f} | "
                                 f"{(anchor / ms) if anchor else float('nan'):.2f}x | "
                                 + (f"{paired['median']:.3f}x ({paired['q1']:.3f}-{paired['q3']:.3f})" if paired else "")
                                 + " |")
    shapes = {c["case"]: c["shape"] for c in report["cases"]}
    lines += ["", "Shapes: " + "; ".join(f"{k}: {v}" for k, v in shapes.items()), "",
              "## Host overhead of a cached one-kernel computation (`x * 2 + 1`, 1024 elements)", "",
              "| how it is launched | us per call (back to back, GPU idle) |", "| --- | --- |"]
    for name, value in report["host_overhead"].items():
        lines.append(f"| {name.removesuffix('_us')} | {value:.1f} |")
    lines += ["", f"Command: `{meta['command']}`"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny shapes and few iterations (a smoke run)")
    parser.add_argument("--variants", default=None, help=f"comma-separated subset of {','.join(VARIANTS)}")
    parser.add_argument("--cases", default="large,small", help="comma-separated subset of large,small")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--out", default=None, help="results folder (benchmarks/results: the current results)")
    parser.add_argument("--interleave", type=int, default=0, metavar="TURNS",
                        help=f"also time {', '.join(INTERLEAVABLE)} together in TURNS rotated turns, and "
                             f"{', '.join(INTERLEAVABLE_GRAPHS)} (host-bound cases)")
    args = parser.parse_args()
    device = args.device
    quick = args.quick or device == "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    variants = args.variants.split(",") if args.variants else [
        v for v in VARIANTS if device == "cuda" or (v not in CUDA_ONLY and not v.startswith("inductor"))]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    shapes = {"large": {"hidden": 4096, "heads": 32, "mlp": 11008, "seq": 2048, "batch": 4},
              "small": {"hidden": 4096, "heads": 32, "mlp": 11008, "seq": 128, "batch": 1}}
    if quick:
        shapes = {"large": {"hidden": 64, "heads": 4, "mlp": 172, "seq": 32, "batch": 2},
                  "small": {"hidden": 64, "heads": 4, "mlp": 172, "seq": 8, "batch": 1}}
    warmup = args.warmup if args.warmup is not None else (2 if quick else 5)
    iters = args.iters if args.iters is not None else (5 if quick else 20)
    cases = []
    for name in args.cases.split(","):
        for training in (False, True):
            cases.append(run_case(name, shapes[name], training, variants, device, dtype, warmup, iters,
                                  args.interleave))
    overhead = host_overhead(device, 200 if quick else 2000)
    for key, value in overhead.items():
        print(f"host overhead {key}: {value:.1f}")
    report = {"meta": {"date": datetime.date.today().isoformat(), "device": device, "dtype": str(dtype),
                       "device_name": torch.cuda.get_device_name() if device == "cuda" else "CPU",
                       "torch": torch.__version__, "python": sys.version.split()[0], "warmup": warmup,
                       "iters": iters, "interleave": args.interleave, "command": " ".join(["python", *sys.argv])},
              "cases": cases, "host_overhead": overhead}
    if args.out:
        variant = "" if set(args.cases.split(",")) == {"large", "small"} else "-".join(args.cases.split(","))
        kind = machine_kind(report["meta"]["device_name"])
        prefix = write_results("compile_llama", kind, report, markdown(report), Path(args.out), variant=variant)
        print(f"wrote {prefix}.json and {prefix}.md")


if __name__ == "__main__":
    main()
