"""Benchmark: seed 004's all-gather + linear pipeline against its anchors, measured in one run.

    torchrun --nproc-per-node 4 benchmarks/ag_linear.py OUT.json            # GPUs, NCCL, bf16
    torchrun --nproc-per-node 2 benchmarks/ag_linear.py OUT.json --smoke    # CPU, gloo, tiny sizes

Each rank holds ``x`` rows ``[M / D, K]`` and its own weight ``[N, K]`` (N per rank, a column-parallel
shard). Compared, with the same buffers:

* ``gemm``: the local GEMM ``[M, K] x [K, N]`` alone; ``allgather``: ``all_gather_into_tensor`` alone;
* ``ag_then_gemm``: all-gather, then GEMM (anchor a); ``ideal``: max(gemm, allgather) (anchor b);
* ``pyfuser_S{S}``: the fusion of seed 004 (``x [S, D, M/(S*D), K]``, axis 1 on mesh_x, output axis 0 on
  stream) run through ``fd.execute``: S chunks, each all-gathered and multiplied on its own stream;
  ``pyfuser_overlap_S{S}``: the same with the ``stream_overlap`` host pass enabled;
* ``symm_mem_fused``: ``torch.ops.symm_mem.fused_all_gather_matmul`` when this torch build has it.

Times are medians over iterations (CUDA events on GPUs, wall clock on CPUs), then the max over ranks.
Rank 0 prints a table and writes everything, with the configuration, as JSON to OUT.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

from pyfuser import FusionDefinition, ParallelType  # imported after the NCCL environment is set
from pyfuser.multidevice import Communicator, DeviceMesh


def seed_004_fusion(d: int) -> FusionDefinition:
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1, -1], dtype=_DTYPE)  # [S, D, M / (S * D), K]
        w = fd.define_tensor([-1, -1], dtype=_DTYPE)
        out = fd.ops.linear(x, w)
        fd.add_output(out)
        for tv in (x, w, out):
            tv.set_device_mesh(mesh)
        x.axis(1).parallelize(ParallelType.mesh_x)
        out.axis(0).parallelize(ParallelType.stream)
    return fd


_DTYPE = torch.bfloat16
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13

#: pyfuser variants: seed 004's loop as lowered (iterations joined one by one, as in seed 002), and with
#: the opt-in ``stream_overlap`` host pass (iterations run concurrently, joined once after the loop).
VARIANTS: dict[str, tuple[str, ...]] = {"pyfuser": (), "pyfuser_overlap": ("stream_overlap",)}


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


def symm_mem_fused(x: torch.Tensor, w: torch.Tensor) -> Callable[[], object] | str:
    """The fused all-gather matmul of torch's symmetric memory, or why it is not available."""
    if x.device.type != "cuda":
        return "needs CUDA"
    try:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group  # registers symm_mem ops
    except ImportError as e:
        return f"no symmetric memory in this torch build: {e}"
    if not hasattr(torch.ops, "symm_mem") or not hasattr(torch.ops.symm_mem, "fused_all_gather_matmul"):
        return "torch.ops.symm_mem.fused_all_gather_matmul is not in this torch build"
    try:
        group_name = dist.group.WORLD.group_name  # type: ignore[union-attr]
        enable_symm_mem_for_group(group_name)
        wt = w.t()

        def run() -> object:
            return torch.ops.symm_mem.fused_all_gather_matmul(x, [wt], gather_dim=0, group_name=group_name)

        run()
        torch.cuda.synchronize()
        return run
    except Exception as e:  # an unsupported setup is a result to report, not a crash
        return f"{type(e).__name__}: {e}"[:300]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="where rank 0 writes the JSON results")
    parser.add_argument("--smoke", action="store_true", help="tiny fp32 sizes that run on CPUs with gloo")
    parser.add_argument("--m", type=int, default=8192)
    parser.add_argument("--k", type=int, default=8192)
    parser.add_argument("--n", type=int, default=8192, help="output features per rank")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    global _DTYPE
    if args.smoke:
        args.m, args.k, args.n, args.streams, args.warmup, args.iters = 64, 32, 16, [1, 2, 4], 1, 3
        _DTYPE = torch.float32

    comm = Communicator.instance()
    d, rank, device = comm.size(), comm.rank(), comm.device()
    comm.barrier()  # initializes the process group
    m, k, n = args.m, args.k, args.n
    if m % d:
        raise ValueError(f"--m {m} must be divisible by the {d} ranks")
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(m // d, k, generator=gen).to(device=device, dtype=_DTYPE)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(device=device, dtype=_DTYPE)
    full = torch.empty(m, k, device=device, dtype=_DTYPE)
    out = torch.empty(m, n, device=device, dtype=_DTYPE)
    timer = Timer(device, args.warmup, args.iters)

    results: dict[str, Any] = {}
    results["gemm_ms"] = timer(lambda: torch.matmul(full, w.t(), out=out))
    results["allgather_ms"] = timer(lambda: _all_gather(full, x))

    def ag_then_gemm() -> None:
        _all_gather(full, x)
        torch.matmul(full, w.t(), out=out)

    results["ag_then_gemm_ms"] = timer(ag_then_gemm)
    results["ideal_ms"] = max(results["gemm_ms"], results["allgather_ms"])
    _all_gather(full, x)
    reference = torch.matmul(full.float(), w.float().t())

    for s in args.streams:
        rows = m // d
        if rows % s:
            results[f"pyfuser_S{s}_error"] = f"M / D = {rows} is not divisible by S = {s}"
            continue
        fd = seed_004_fusion(d)
        local = x.view(s, 1, rows // s, k)  # rank r's rows of chunk i: global rows of x[i, r]
        # Global row order of the pipeline is [S, D, rows/S]; the reference is [D, S, rows/S].
        expected = reference.view(d, s, rows // s, n).transpose(0, 1)
        tol = 1e-3 if _DTYPE == torch.float32 else 5e-2
        for name, options in VARIANTS.items():
            (got,) = fd.execute([local, w], _enable_options=options)
            key = f"{name}_S{s}"
            results[f"{key}_correct"] = bool(torch.allclose(got.float(), expected, rtol=tol, atol=tol * 10))
            results[f"{key}_ms"] = timer(lambda fd=fd, local=local, options=options: fd.execute(
                [local, w], _enable_options=options))

    fused = symm_mem_fused(x, w)
    if callable(fused):
        results["symm_mem_fused_ms"] = timer(fused)
    else:
        results["symm_mem_fused_error"] = fused

    if rank == 0:
        config = {"world": d, "M": m, "K": k, "N_per_rank": n, "dtype": str(_DTYPE).removeprefix("torch."),
                  "backend": comm.backend, "device": torch.cuda.get_device_name(device) if device.type == "cuda"
                  else "cpu", "iters": args.iters, "warmup": args.warmup, "smoke": args.smoke}
        print(f"AG + linear, {config}")
        print(f"{'variant':<24}{'ms (median, max over ranks)':>30}{'vs ideal':>12}")
        for key, value in results.items():
            if key.endswith("_ms"):
                print(f"{key[:-3]:<24}{value:>30.3f}{value / results['ideal_ms']:>11.2f}x")
        for key, value in results.items():
            if not key.endswith("_ms"):
                print(f"{key}: {value}")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"config": config, "results": results}, indent=2) + "\n")
    comm.shutdown()
    failed = [key for key, value in results.items() if key.endswith("_correct") and not value]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
