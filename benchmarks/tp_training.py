"""Benchmark: tensor + sequence parallel training steps of a Llama, tokens/s per compiler, in one run.

    torchrun --nproc-per-node 2 benchmarks/tp_training.py benchmarks/results [--profile DIR]
    torchrun --nproc-per-node 4 benchmarks/tp_training.py benchmarks/results
    torchrun --nproc-per-node 2 benchmarks/tp_training.py /tmp/tp --dry-run     # CPU, gloo, tiny sizes

The model is ``examples/tp_llama.py``'s (a Hugging Face Llama from a config in code, random weights, torch's
TP + SP plans as torchtitan writes them), sized by the flags (default: hidden 4096, 32 heads, 8 key / value
heads, MLP 14336, 4 layers, sequence 4096, batch 1, bf16). One SGD step (forward, backward, update) is
timed for each variant, each on a fresh copy of the same model:

* ``eager``: no compiler;
* ``inductor``: ``torch.compile`` (Inductor, default mode);
* ``inductor_async_tp``: the same with ``torch._inductor.config._micro_pipeline_tp = True`` and symmetric
  memory enabled for the tensor-parallel group (Inductor's fused all-gather + matmul and matmul +
  reduce-scatter ops; GPUs only);
* ``pyfuser``: ``backend="pyfuser"`` (all-gather -> matmul and matmul -> reduce-scatter as pyfuser's P2P
  pipelines, the other collectives torch's).

Per variant: the median step time over ranks' maxima, tokens/s (batch x sequence per step; every rank of the
tensor-parallel group works on the same tokens), the first step's loss against eager's, and for pyfuser
the number of pipelines in its graphs. ``--profile DIR``: one profiled step per variant (chrome traces per
rank) and, in the results, the GPU time of each kind of kernel on rank 0 (GEMM, NCCL, copy engine,
other) and the step's span: where the communication time went. Rank 0 writes
``OUT/tp_training_<kind>.json`` and ``.md`` (kind ``h100x4``: four H100s; ``--dry-run`` writes the ``dryrun``
variant, never over a GPU run's numbers).
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
import torch._inductor.config
import torch.distributed as dist
from overlap_common import gpu_events, machine, profile_program, summarize
from results_files import machine_kind, now_stamp, write_results
from torch.distributed._symmetric_memory import enable_symm_mem_for_group, is_symm_mem_enabled_for_group
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from tp_llama import build_model, parallelize, train_step  # noqa: E402  (the example's model and plans)

from pyfuser.integrations.torch_compile import PyfuserBackend  # noqa: E402
from pyfuser.multidevice import Communicator  # noqa: E402

VARIANTS = ("eager", "inductor", "inductor_async_tp", "pyfuser")


def make_runner(variant: str, model: torch.nn.Module, mesh: DeviceMesh) -> tuple[Callable[..., Any], PyfuserBackend | None]:
    """The callable a step runs for ``variant`` (compiled lazily, on its first call) and pyfuser's backend."""
    torch._dynamo.reset()  # every variant compiles anew: no graph of an earlier variant is reused
    if variant == "eager":
        return model, None
    if variant == "pyfuser":
        backend = PyfuserBackend()
        return torch.compile(model, backend=backend), backend
    if variant == "inductor_async_tp":
        group = mesh.get_group().group_name
        if not is_symm_mem_enabled_for_group(group):
            enable_symm_mem_for_group(group)
    return torch.compile(model), None


def timed_steps(step: Callable[[], torch.Tensor], device: torch.device, warmup: int, iters: int) -> tuple[float, float]:
    """(first loss, median step time in ms, max over ranks): ``warmup`` steps (compilation), then ``iters``."""
    first = float(step().float())
    for _ in range(warmup - 1):
        step()
    samples = []
    for _ in range(iters):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()
        begin = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - begin) * 1e3)
    median = torch.tensor([statistics.median(samples)], dtype=torch.float64, device=device)
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    return first, float(median.item())


def measure(variant: str, base: torch.nn.Module, mesh: DeviceMesh, batches: list[torch.Tensor], args: argparse.Namespace,
            device: torch.device) -> dict[str, Any]:
    model = copy.deepcopy(base)
    parallelize(model, mesh)  # type: ignore[arg-type]
    run, backend = make_runner(variant, model, mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    calls = iter(range(1 << 30))

    def step() -> torch.Tensor:
        return train_step(run, optimizer, batches[next(calls) % len(batches)])

    async_tp = variant == "inductor_async_tp"
    with torch._inductor.config.patch(_micro_pipeline_tp=async_tp):
        first_loss, ms = timed_steps(step, device, args.warmup, args.iters)
        row: dict[str, Any] = {"variant": variant, "step_ms": ms, "first_loss": first_loss,
                               "tokens_per_s": args.batch * args.seq / (ms / 1e3)}
        if backend is not None:
            row["pyfuser_pipelines"] = {g.kind: [c.kind for c in g.collective_matmuls] for g in backend.graphs}
            row["pyfuser_regions"] = sum(len(g.regions) for g in backend.graphs)
        if args.profile is not None and device.type == "cuda":
            trace = args.profile / f"tp_training_{variant}_rank{dist.get_rank()}.json"
            profile_program(step, trace)
            summary = summarize(gpu_events(trace))
            row["profile"] = {"span_ms": summary.get("span_ms"), "category_ms": summary.get("category_ms")}
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="results folder: rank 0 writes OUT/tp_training_<kind>.json and .md")
    parser.add_argument("--dry-run", action="store_true", help="tiny fp32 sizes on CPUs with gloo (checks the logic)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=14336)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--profile", type=Path, help="directory for one profiled step's traces per variant")
    args = parser.parse_args()
    comm = Communicator.instance()  # joins the world: NCCL with a GPU per rank, else gloo
    comm.barrier()
    d, device = comm.size(), comm.device()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.dry_run:
        args.hidden, args.heads, args.kv_heads, args.intermediate = 32, 2 * d, 2 * d, 64
        args.layers, args.vocab, args.seq, args.batch, args.warmup, args.iters = 1, 32 * d, 4 * d, 2, 2, 2
    variants = [v for v in args.variants if device.type == "cuda" or v != "inductor_async_tp"]
    for name, value in (("heads", args.heads), ("kv-heads", args.kv_heads), ("intermediate", args.intermediate),
                        ("vocab", args.vocab), ("seq", args.seq)):
        if value % d:
            sys.exit(f"--{name} {value} must be divisible by the {d} ranks")
    mesh = init_device_mesh(device.type, (d,))
    base = build_model(args.heads, args.layers, args.hidden, args.vocab, dtype, device, kv_heads=args.kv_heads,
                       intermediate=args.intermediate, max_positions=args.seq)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen).to(device) for _ in range(2)]
    rows = []
    for variant in variants:
        rows.append(measure(variant, base, mesh, batches, args, device))
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the variant's model and graphs are gone: its cached blocks go too
    eager = next((r for r in rows if r["variant"] == "eager"), None)
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-4
    failed = []
    for row in rows:
        if eager is not None:
            row["loss_vs_eager"] = abs(row["first_loss"] - eager["first_loss"]) / max(abs(eager["first_loss"]), 1e-9)
            if not row["loss_vs_eager"] <= tolerance:
                failed.append(f"{row['variant']}: first loss {row['first_loss']:.5f} vs eager {eager['first_loss']:.5f}")
    inductor = next((r["tokens_per_s"] for r in rows if r["variant"] == "inductor"), None)
    for row in rows:
        if inductor:
            row["vs_inductor"] = row["tokens_per_s"] / inductor
    if comm.rank() == 0:
        kind = machine_kind(torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", d)
        stamp = now_stamp()
        config = {"world": d, "dtype": str(dtype).removeprefix("torch."), "machine": machine(device), "date": stamp,
                  "torch": torch.__version__, "hidden": args.hidden, "heads": args.heads, "kv_heads": args.kv_heads,
                  "intermediate": args.intermediate, "layers": args.layers, "vocab": args.vocab, "seq": args.seq,
                  "batch": args.batch, "warmup": args.warmup, "iters": args.iters, "dry_run": args.dry_run}
        lines = [f"# TP + SP training step, {d} ranks ({config['machine']}, {stamp})", "",
                 f"torch {torch.__version__}; {config['dtype']}; Llama hidden {args.hidden}, {args.layers} layers, "
                 f"sequence {args.seq}, batch {args.batch}; median of {args.iters} steps after {args.warmup}, max over "
                 "ranks. Raw numbers: the JSON beside this file.", "",
                 "| variant | step ms | tokens/s | vs Inductor | first loss vs eager |", "| --- | ---: | ---: | ---: | ---: |"]
        for row in rows:
            lines.append(f"| {row['variant']} | {row['step_ms']:.3f} | {row['tokens_per_s']:.0f} | "
                         f"{row.get('vs_inductor', float('nan')):.3f} | {row.get('loss_vs_eager', float('nan')):.1e} |")
        lines += ["", "Wrong losses: " + ("; ".join(failed) or "none") + ".", ""]
        write_results("tp_training", kind, {"config": config, "results": rows}, "\n".join(lines), args.out, stamp,
                      variant="dryrun" if args.dry_run else "")
        for row in rows:
            print(" | ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
        if failed:
            print("WRONG LOSSES: " + "; ".join(failed), flush=True)
    comm.shutdown()
    return 1 if failed or any(math.isnan(r["step_ms"]) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
