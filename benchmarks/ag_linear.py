"""Benchmark: all-gather + linear (seed 004) against its anchors, every size in one run.

    torchrun --nproc-per-node 2 benchmarks/ag_linear.py benchmarks/results/ag_linear_h200x2 [--profile DIR]
    torchrun --nproc-per-node 2 benchmarks/ag_linear.py /tmp/ag --smoke       # CPU, gloo, tiny sizes

Each rank holds ``M / D`` rows of ``x [M, K]`` and its own weight ``[N, K]`` (N per rank, a column-parallel
shard); the output is ``[M, N]`` per rank. Measured with the same buffers, per size:

* ``gemm``: the local GEMM ``[M, K] x [K, N]`` alone; ``allgather``: NCCL's all-gather alone;
* ``ag_then_gemm``: all-gather, then GEMM; ``ideal``: max(gemm, allgather);
* ``nccl_chunks_S2``: the hand-written NCCL chunk pipeline (2 chunks, each all-gathered and multiplied on its
  own stream);
* ``torch_fused``: ``torch.ops.symm_mem.fused_all_gather_matmul``;
* ``pyfuser_nccl_S{S}``: seed 004's fusion (``x [S, D, M/(S*D), K]``, axis 1 on mesh_x, output axis 0 on
  stream) with NCCL collectives; ``pyfuser_p2p_S{S}``: the same with ``CommunicatorBackend.cuda`` (the P2P
  pipeline over the copy engines). ``pyfuser_best``: the fastest P2P variant.

Rank 0 writes PREFIX.json and PREFIX.md. ``--profile DIR``: chrome traces of pyfuser's S = 1 and S = 2
programs at the first size on every rank, a summary and a timeline PNG (compute and copy streams per rank).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from overlap_common import (
    SIZES,
    Timer,
    draw_timeline,
    gpu_events,
    host_profile,
    machine,
    profile_program,
    relative_error,
    summarize,
    symm_mem_group,
    write_report,
)

from pyfuser import FusionDefinition, ParallelType
from pyfuser.multidevice import (
    Communicator,
    CommunicatorBackend,
    DeviceMesh,
    MultiDeviceExecutor,
    MultiDeviceExecutorParams,
)

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
BACKENDS = {"nccl": None, "p2p": CommunicatorBackend.cuda}


def seed_004_fusion(d: int, dtype: torch.dtype) -> FusionDefinition:
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1, -1], dtype=dtype)  # [S, D, M / (S * D), K]
        w = fd.define_tensor([-1, -1], dtype=dtype)
        out = fd.ops.linear(x, w)
        fd.add_output(out)
        for tv in (x, w, out):
            tv.set_device_mesh(mesh)
        x.axis(1).parallelize(ParallelType.mesh_x)
        out.axis(0).parallelize(ParallelType.stream)
    return fd


def pyfuser_program(d: int, dtype: torch.dtype, backend: str) -> MultiDeviceExecutor:
    fd = seed_004_fusion(d, dtype)
    return MultiDeviceExecutor(fd.fusion, MultiDeviceExecutorParams(backend_type=BACKENDS[backend]))


def measure(m: int, k: int, n: int, streams: list[int], dtype: torch.dtype, timer: Timer) -> dict[str, Any]:
    comm = Communicator.instance()
    d, rank, device = comm.size(), comm.rank(), comm.device()
    if m % d:
        raise ValueError(f"M = {m} must be divisible by the {d} ranks")
    rows = m // d
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(rows, k, generator=gen).to(device=device, dtype=dtype)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(device=device, dtype=dtype)
    full = torch.empty(m, k, device=device, dtype=dtype)
    out = torch.empty(m, n, device=device, dtype=dtype)
    r: dict[str, Any] = {"size": f"{m}, {k}, {n}", "M": m, "K": k, "N_per_rank": n}
    r["gemm_ms"] = timer(lambda: torch.matmul(full, w.t(), out=out))
    r["allgather_ms"] = timer(lambda: _all_gather(full, x))

    def ag_then_gemm() -> None:
        _all_gather(full, x)
        torch.matmul(full, w.t(), out=out)

    r["ag_then_gemm_ms"] = timer(ag_then_gemm)
    r["ideal_ms"] = max(r["gemm_ms"], r["allgather_ms"])
    _all_gather(full, x)
    reference = torch.matmul(full.float(), w.float().t())
    if device.type == "cuda" and rows % 2 == 0:
        r["nccl_chunks_S2_ms"] = timer(_nccl_chunks(x, w, d, 2))
        group = symm_mem_group()
        wt = w.t()
        fused = lambda: torch.ops.symm_mem.fused_all_gather_matmul(x, [wt], gather_dim=0, group_name=group)  # noqa: E731
        _, (got,) = fused()
        r["torch_fused_error"] = relative_error(got, reference)
        r["torch_fused_ms"] = timer(fused)
    for s in streams:
        if rows % s:
            continue
        local = x.view(s, 1, rows // s, k)  # rank r's rows of chunk i: global rows of x[i, r]
        expected = reference.view(d, s, rows // s, n).transpose(0, 1)  # pipeline order [S, D, rows / S]
        for name in BACKENDS:
            executor = pyfuser_program(d, dtype, name)
            (got,) = executor.run([local, w])
            r[f"pyfuser_{name}_S{s}_error"] = relative_error(got, expected)
            r[f"pyfuser_{name}_S{s}_ms"] = timer(lambda executor=executor, local=local: executor.run([local, w]))
    p2p = {key: value for key, value in r.items() if key.startswith("pyfuser_p2p_S") and key.endswith("_ms")}
    if p2p:
        best = min(p2p, key=p2p.__getitem__)
        r["pyfuser_best_ms"], r["pyfuser_best"] = p2p[best], best.removeprefix("pyfuser_").removesuffix("_ms")
        r["best_vs_ideal"] = r["pyfuser_best_ms"] / r["ideal_ms"]
    return r


def _nccl_chunks(x: torch.Tensor, w: torch.Tensor, d: int, chunks: int) -> Any:
    """The hand-written NCCL pipeline: chunk i all-gathered and multiplied on its own stream."""
    rows, k = x.shape
    xs = x.view(chunks, rows // chunks, k)
    gathered = torch.empty(chunks, d * rows // chunks, k, device=x.device, dtype=x.dtype)
    outs = torch.empty(chunks, d * rows // chunks, w.shape[0], device=x.device, dtype=x.dtype)
    workers = [torch.cuda.Stream() for _ in range(chunks)]

    def run() -> None:
        main = torch.cuda.current_stream()
        for i, stream in enumerate(workers):
            stream.wait_stream(main)
            with torch.cuda.stream(stream):
                _all_gather(gathered[i], xs[i])
                torch.matmul(gathered[i], w.t(), out=outs[i])
        for stream in workers:
            main.wait_stream(stream)

    return run


def profile(m: int, k: int, n: int, dtype: torch.dtype, directory: Path, host: bool) -> dict[str, Any]:
    """Traces of pyfuser's S = 1 and S = 2 programs (both backends) on every rank, and with ``host`` where their
    host time goes; rank 0 reads them all and draws the timeline."""
    comm = Communicator.instance()
    d, rank, device = comm.size(), comm.rank(), comm.device()
    rows = m // d
    x = torch.randn(rows, k, device=device, dtype=dtype)
    w = torch.randn(n, k, device=device, dtype=dtype) / k**0.5
    variants = [(name, s) for s in (1, 2) for name in BACKENDS]
    hosts = {}
    for name, s in variants:
        executor = pyfuser_program(d, dtype, name)
        local = x.view(s, 1, rows // s, k)
        run = lambda executor=executor, local=local: executor.run([local, w])  # noqa: E731
        profile_program(run, directory / f"ag_{m}_{name}_S{s}_rank{rank}.json")
        if host:
            hosts[f"{name}_S{s}"] = host_profile(run)
    comm.barrier()
    if rank != 0:
        return {}
    summary: dict[str, Any] = {"host": hosts}
    lanes = []
    for name, s in variants:
        for r in range(d):
            events = gpu_events(directory / f"ag_{m}_{name}_S{s}_rank{r}.json")
            summary[f"{name}_S{s}_rank{r}"] = summarize(events)
            if s == 1 or name == "p2p":
                lanes.append((f"{name} S={s} rank {r}", events))
    draw_timeline(lanes, directory / f"ag_linear_timeline_{m}.png",
                  f"all-gather + linear, M=K={m}, N={n}/rank, d={d}: pyfuser programs per rank and CUDA stream")
    (directory / f"ag_linear_profile_{m}.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


COLUMNS = [("size", "M, K, N per rank"), ("gemm_ms", "GEMM"), ("allgather_ms", "all-gather"),
           ("ag_then_gemm_ms", "AG then GEMM"), ("nccl_chunks_S2_ms", "NCCL chunks S=2"),
           ("torch_fused_ms", "torch fused_all_gather_matmul"), ("pyfuser_nccl_S1_ms", "pyfuser NCCL S=1"),
           ("pyfuser_nccl_S2_ms", "pyfuser NCCL S=2"), ("pyfuser_p2p_S1_ms", "pyfuser P2P S=1"),
           ("pyfuser_p2p_S2_ms", "pyfuser P2P S=2"), ("pyfuser_p2p_S4_ms", "pyfuser P2P S=4"),
           ("pyfuser_best_ms", "pyfuser best"), ("ideal_ms", "ideal max(GEMM, AG)"), ("best_vs_ideal", "best / ideal")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="PREFIX: rank 0 writes PREFIX.json and PREFIX.md")
    parser.add_argument("--smoke", action="store_true", help="tiny fp32 sizes that run on CPUs with gloo")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--profile", type=Path, help="directory for traces, their summary and the timeline PNG")
    args = parser.parse_args()
    sizes, dtype = SIZES, torch.bfloat16
    if args.smoke:
        sizes, dtype, args.warmup, args.iters = [(64, 32, 16), (32, 16, 8)], torch.float32, 1, 3
    comm = Communicator.instance()
    comm.barrier()  # initializes the process group
    timer = Timer(comm.device(), args.warmup, args.iters)
    rows = [measure(m, k, n, args.streams, dtype, timer) for m, k, n in sizes]
    if args.profile is not None and comm.device().type == "cuda":
        for m, k, n in sizes:
            profile(m, k, n, dtype, args.profile, host=m == min(size[0] for size in sizes))
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    failed = [f"{row['size']}: {key} = {value:.2e}" for row in rows for key, value in row.items()
              if key.endswith("_error") and not (isinstance(value, float) and value < tolerance)]
    if comm.rank() == 0:
        config = {"world": comm.size(), "dtype": str(dtype).removeprefix("torch."), "backend": comm.backend,
                  "machine": machine(comm.device()), "iters": args.iters, "warmup": args.warmup, "smoke": args.smoke}
        notes = ["All ms. pyfuser errors (‖out − ref‖ / ‖ref‖ against an fp32 reference, max over ranks) are in "
                 "the JSON; every one is below 2e-2 (bf16) unless listed here: " + ("; ".join(failed) or "none") + "."]
        write_report(args.out, "All-gather + linear (seed 004)", config, rows, COLUMNS, notes)
        for row in rows:
            print(" | ".join(f"{key}={value:.3f}" if isinstance(value, float) else f"{key}={value}"
                             for key, value in row.items() if not key.endswith("_error")), flush=True)
        if failed:
            print("WRONG RESULTS: " + "; ".join(failed), flush=True)
    comm.shutdown()
    return 1 if failed or any(math.isnan(v) for row in rows for v in row.values() if isinstance(v, float)) else 0


if __name__ == "__main__":
    sys.exit(main())
