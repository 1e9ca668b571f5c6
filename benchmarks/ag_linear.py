"""Benchmark: all-gather + linear (seed 004) against its anchors, every size in one run.

    torchrun --nproc-per-node 2 benchmarks/ag_linear.py benchmarks/results [--profile DIR]
    torchrun --nproc-per-node 2 benchmarks/ag_linear.py /tmp/ag --smoke       # CPU, gloo, tiny sizes

Each rank holds ``M / D`` rows of ``x [M, K]`` and its own weight ``[N, K]`` (N per rank, a column-parallel
shard); the output is ``[M, N]`` per rank. Measured with the same buffers, per size:

* ``gemm``: the local GEMM ``[M, K] x [K, N]`` alone; ``allgather``: NCCL's all-gather alone;
* ``ag_then_gemm``: all-gather, then GEMM; ``ag_then_gemm_graph``: the same captured into a CUDA graph (torch's
  own ops replayed); ``ideal``: max(gemm, allgather);
* ``nccl_chunks_S2``: the hand-written NCCL chunk pipeline (2 chunks, each all-gathered and multiplied on its
  own stream);
* ``torch_fused``: ``torch.ops.symm_mem.fused_all_gather_matmul``;
* ``pyfuser_nccl_S{S}``: seed 004's fusion (``x [S, D, M/(S*D), K]``, axis 1 on mesh_x, output axis 0 on
  stream) with NCCL collectives; ``pyfuser_p2p_S{S}``: the same with ``CommunicatorBackend.cuda`` (the P2P
  pipeline over the copy engines). ``pyfuser_best``: the fastest P2P variant. ``pyfuser_auto``: S = 1 with
  the sizes given, so the machine model (``comm/overlap_model.py``) picks the pipeline or all-gather then GEMM;
  ``pyfuser_auto_graph``: that program with ``cuda_graph`` (captured per signature, replayed: no host latency
  before the first GPU operation; the weight a parameter, read in place), whose choice the model
  makes without host time per node (``pyfuser_auto_graph`` names it).
* ``pyfuser_plain_graph`` / ``pyfuser_pipeline_graph``: the same replayed program with the model's choice
  forced each way (``FORCED_GRAPHS``): what the choice costs or saves at each size.

Rank 0 writes ``OUT/ag_linear_<kind>.json`` and ``.md`` (kind ``h200x2``: two H200s), over the previous
run's. ``--profile DIR``: chrome traces of pyfuser's S = 1 and S = 2 programs at the first size on every
rank, a summary and a timeline PNG (compute and copy streams per rank).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from overlap_common import (
    Timer,
    captured,
    forced_graph_columns,
    main,
    profile_variants,
    pyfuser_graph_run,
    relative_error,
    symm_mem_group,
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


def seed_004_fusion(d: int, dtype: torch.dtype, shapes: tuple[list[int], list[int]] | None = None) -> FusionDefinition:
    """``shapes``: the global sizes of ``x`` and ``w`` (the pipeline-or-collective choice reads them), else
    symbolic; an ``x`` of 3 dims ``[D, M / D, K]`` has no stream loop (S = 1)."""
    mesh = DeviceMesh(range(d))
    x_shape, w_shape = shapes if shapes is not None else ([-1] * 4, [-1] * 2)
    with FusionDefinition() as fd:
        x = fd.define_tensor(x_shape, dtype=dtype)  # [S, D, M / (S * D), K]
        w = fd.define_tensor(w_shape, dtype=dtype)
        out = fd.ops.linear(x, w)
        fd.add_output(out)
        for tv in (x, w, out):
            tv.set_device_mesh(mesh)
        streams = len(x_shape) == 4
        x.axis(1 if streams else 0).parallelize(ParallelType.mesh_x)
        if streams:
            out.axis(0).parallelize(ParallelType.stream)
    return fd


def pyfuser_program(d: int, dtype: torch.dtype, backend: str) -> MultiDeviceExecutor:
    """``backend``: a name of ``BACKENDS``, with ``_graph`` appended: the program replayed from a CUDA graph."""
    fd = seed_004_fusion(d, dtype)
    params = MultiDeviceExecutorParams(backend_type=BACKENDS[backend.removesuffix("_graph")],
                                       cuda_graph=backend.endswith("_graph"))
    return MultiDeviceExecutor(fd.fusion, params)


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
    graphed = captured(ag_then_gemm) if device.type == "cuda" else None
    if graphed is not None:
        r["ag_then_gemm_graph_ms"] = timer(graphed)
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
    # pyfuser's own choice (comm/overlap_model.py) at S = 1: the sizes given, so the model sees them
    auto = MultiDeviceExecutor(seed_004_fusion(d, dtype, ([d, rows, k], [n, k])).fusion,
                               MultiDeviceExecutorParams(backend_type=CommunicatorBackend.cuda))
    local = x.view(1, rows, k)
    (got,) = auto.run([local, w])
    r["pyfuser_auto_error"] = relative_error(got, reference.view(d, rows, n))
    r["pyfuser_auto_ms"] = timer(lambda: auto.run([local, w]))
    # the same program captured into a CUDA graph per signature (``cuda_graph``): no host latency before the GPU's work
    graph = MultiDeviceExecutor(seed_004_fusion(d, dtype, ([d, rows, k], [n, k])).fusion,
                                MultiDeviceExecutorParams(backend_type=CommunicatorBackend.cuda, cuda_graph=True))
    replay = pyfuser_graph_run(graph, [local, w], weight=1)
    (got,) = replay()
    r["pyfuser_auto_graph_error"] = relative_error(got, reference.view(d, rows, n))
    del got
    r["pyfuser_auto_graph_ms"] = timer(replay)
    # the model's two choices, each forced
    r |= forced_graph_columns(lambda: seed_004_fusion(d, dtype, ([d, rows, k], [n, k])).fusion, [local, w],
                              reference.view(d, rows, n), timer)
    r["pyfuser_auto"] = "P2P S=1" if "P2PCommunication" in auto.host_ir() else "all-gather then GEMM"
    # replayed, the model counts no host time per node: it may choose otherwise (``overlap_model.decide``)
    r["pyfuser_auto_graph"] = "P2P S=1" if "P2PCommunication" in graph.host_ir() else "all-gather then GEMM"
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
    """Traces (and with ``host`` host profiles) of pyfuser's programs; rank 0 draws the timeline."""
    comm = Communicator.instance()
    d, device = comm.size(), comm.device()
    rows = m // d
    x = torch.randn(rows, k, device=device, dtype=dtype)
    w = torch.randn(n, k, device=device, dtype=dtype) / k**0.5

    def runner(backend: str, s: int) -> Callable[[], object]:
        executor, local = pyfuser_program(d, dtype, backend), x.view(s, 1, rows // s, k)
        if backend.endswith("_graph"):
            return pyfuser_graph_run(executor, [local, w], weight=1)
        return lambda: executor.run([local, w])

    backends = [*BACKENDS, *(f"{b}_graph" for b in BACKENDS)]
    return profile_variants("ag_linear", m, runner, backends, directory, host,
                            f"all-gather + linear, M=K={m}, N={n}/rank")


COLUMNS = [("size", "M, K, N per rank"), ("gemm_ms", "GEMM"), ("allgather_ms", "all-gather"),
           ("ag_then_gemm_ms", "AG then GEMM"), ("ag_then_gemm_graph_ms", "AG then GEMM, CUDA graph"),
           ("nccl_chunks_S2_ms", "NCCL chunks S=2"),
           ("torch_fused_ms", "torch fused_all_gather_matmul"), ("pyfuser_nccl_S1_ms", "pyfuser NCCL S=1"),
           ("pyfuser_nccl_S2_ms", "pyfuser NCCL S=2"), ("pyfuser_p2p_S1_ms", "pyfuser P2P S=1"),
           ("pyfuser_p2p_S2_ms", "pyfuser P2P S=2"), ("pyfuser_p2p_S4_ms", "pyfuser P2P S=4"),
           ("pyfuser_best_ms", "pyfuser best"), ("pyfuser_auto_ms", "pyfuser auto"), ("pyfuser_auto", "auto chose"),
           ("pyfuser_auto_graph_ms", "pyfuser auto, CUDA graph"), ("pyfuser_auto_graph", "graph chose"),
           ("pyfuser_plain_graph_ms", "pyfuser plain, CUDA graph"), ("pyfuser_pipeline_graph_ms", "pyfuser pipeline, CUDA graph"),
           ("ideal_ms", "ideal max(GEMM, AG)"), ("best_vs_ideal", "best / ideal")]


if __name__ == "__main__":
    sys.exit(main("ag_linear", __doc__, "All-gather + linear (seed 004)", COLUMNS, measure, profile))
