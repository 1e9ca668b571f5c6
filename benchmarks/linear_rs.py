"""Benchmark: GEMM + reduce-scatter (a row-parallel linear with a sharded output) against its anchors.

    torchrun --nproc-per-node 2 benchmarks/linear_rs.py benchmarks/results [--profile DIR]
    torchrun --nproc-per-node 2 benchmarks/linear_rs.py /tmp/rs --smoke       # CPU, gloo, tiny sizes

Each rank holds ``x [M, K]`` and ``w [N, K]`` (K per rank: the contraction is sharded), computes the partial
sums ``[M, N]`` and keeps its ``M / D`` rows of their sum. Measured with the same buffers, per size:

* ``gemm``: the local GEMM alone; ``reduce_scatter``: NCCL's reduce-scatter of ``[M, N]`` alone;
* ``gemm_then_rs``; ``gemm_then_rs_graph``: the same captured into a CUDA graph (torch's own ops replayed);
  ``ideal``: max(gemm, reduce_scatter);
* ``nccl_chunks_S2``: the hand-written NCCL chunk pipeline (2 row chunks, each multiplied then
  reduce-scattered on its own stream);
* ``torch_fused``: ``torch.ops.symm_mem.fused_matmul_reduce_scatter``;
* ``pyfuser_nccl_S{S}``: the fusion ``x [S, D, M/(S*D), K]`` (K sharded on mesh_x) -> ``out`` (axis 1 on
  mesh_x, axis 0 on stream) with NCCL collectives; ``pyfuser_p2p_S{S}``: with ``CommunicatorBackend.cuda``;
  ``pyfuser_auto``: S = 1 with the sizes given, so the machine model (``comm/overlap_model.py``) picks the
  pipeline or GEMM then reduce-scatter; ``pyfuser_auto_graph``: that program with ``cuda_graph`` (captured per
  signature, replayed: no host latency before the first GPU operation; the weight a parameter, read in place),
  whose choice the model makes without host time per node (``pyfuser_auto_graph`` names it).
* ``pyfuser_plain_graph`` / ``pyfuser_pipeline_graph``: the same replayed program with the model's choice
  forced each way (``FORCED_GRAPHS``): what the choice costs or saves at each size.

Rank 0 writes ``OUT/linear_rs_<kind>.json`` and ``.md``, over the previous run's; ``--profile DIR`` as in ``ag_linear.py``.
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

_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # renamed in 2.13
BACKENDS = {"nccl": None, "p2p": CommunicatorBackend.cuda}


def row_parallel_fusion(d: int, dtype: torch.dtype, shapes: tuple[list[int], list[int]] | None = None) -> FusionDefinition:
    """``shapes``: the global sizes of ``x`` and ``w`` (the pipeline-or-collective choice reads them), else
    symbolic; an ``x`` of 3 dims ``[D, M / D, K]`` has no stream loop (S = 1)."""
    mesh = DeviceMesh(range(d))
    x_shape, w_shape = shapes if shapes is not None else ([-1] * 4, [-1] * 2)
    with FusionDefinition() as fd:
        x = fd.define_tensor(x_shape, dtype=dtype)  # [S, D, M / (S * D), K], K sharded
        w = fd.define_tensor(w_shape, dtype=dtype)  # [N, K], K sharded
        out = fd.ops.linear(x, w)  # [S, D, M / (S * D), N]: axis 1 sharded, axis 0 on stream
        fd.add_output(out)
        for tv in (x, w, out):
            tv.set_device_mesh(mesh)
        streams = len(x_shape) == 4
        x.outer_split(x.ndim - 1, d)
        x.axis(x.ndim - 1).parallelize(ParallelType.mesh_x)
        w.outer_split(1, d)
        w.axis(1).parallelize(ParallelType.mesh_x)
        out.axis(1 if streams else 0).parallelize(ParallelType.mesh_x)
        if streams:
            out.axis(0).parallelize(ParallelType.stream)
    return fd


def pyfuser_program(d: int, dtype: torch.dtype, backend: str) -> MultiDeviceExecutor:
    """``backend``: a name of ``BACKENDS``, with ``_graph`` appended: the program replayed from a CUDA graph."""
    fd = row_parallel_fusion(d, dtype)
    params = MultiDeviceExecutorParams(backend_type=BACKENDS[backend.removesuffix("_graph")],
                                       cuda_graph=backend.endswith("_graph"))
    return MultiDeviceExecutor(fd.fusion, params)


def measure(m: int, k: int, n: int, streams: list[int], dtype: torch.dtype, timer: Timer) -> dict[str, Any]:
    comm = Communicator.instance()
    d, rank, device = comm.size(), comm.rank(), comm.device()
    if m % d:
        raise ValueError(f"M = {m} must be divisible by the {d} ranks")
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype)
    w = (torch.randn(n, k, generator=gen) / (k * d) ** 0.5).to(device=device, dtype=dtype)
    partial = torch.empty(m, n, device=device, dtype=dtype)
    out = torch.empty(m // d, n, device=device, dtype=dtype)
    r: dict[str, Any] = {"size": f"{m}, {k}, {n}", "M": m, "K_per_rank": k, "N": n}
    r["gemm_ms"] = timer(lambda: torch.matmul(x, w.t(), out=partial))
    r["reduce_scatter_ms"] = timer(lambda: _reduce_scatter(out, partial))

    def gemm_then_rs() -> None:
        torch.matmul(x, w.t(), out=partial)
        _reduce_scatter(out, partial)

    r["gemm_then_rs_ms"] = timer(gemm_then_rs)
    graphed = captured(gemm_then_rs) if device.type == "cuda" else None
    if graphed is not None:
        r["gemm_then_rs_graph_ms"] = timer(graphed)
    r["ideal_ms"] = max(r["gemm_ms"], r["reduce_scatter_ms"])
    total = torch.matmul(x.float(), w.float().t())
    dist.all_reduce(total)  # the sum of every rank's partial products, [M, N]
    if device.type == "cuda" and m % (2 * d) == 0:
        r["nccl_chunks_S2_ms"] = timer(_nccl_chunks(x, w, d, 2))
        group = symm_mem_group()
        wt = w.t()
        fused = lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(x, wt, "sum", 0, group)  # noqa: E731
        r["torch_fused_error"] = relative_error(fused(), total.chunk(d, 0)[rank])
        r["torch_fused_ms"] = timer(fused)
    for s in streams:
        if m % (s * d):
            continue
        local = x.view(s, d, m // (s * d), k)
        expected = total.view(s, d, m // (s * d), n)[:, rank:rank + 1]
        for name in BACKENDS:
            executor = pyfuser_program(d, dtype, name)
            (got,) = executor.run([local, w])
            r[f"pyfuser_{name}_S{s}_error"] = relative_error(got, expected)
            r[f"pyfuser_{name}_S{s}_ms"] = timer(lambda executor=executor, local=local: executor.run([local, w]))
    # pyfuser's own choice (comm/overlap_model.py) at S = 1: the sizes given, so the model sees them
    auto = MultiDeviceExecutor(row_parallel_fusion(d, dtype, ([d, m // d, k * d], [n, k * d])).fusion,
                               MultiDeviceExecutorParams(backend_type=CommunicatorBackend.cuda))
    local = x.view(d, m // d, k)
    (got,) = auto.run([local, w])
    r["pyfuser_auto_error"] = relative_error(got, total.view(d, m // d, n)[rank:rank + 1])
    r["pyfuser_auto_ms"] = timer(lambda: auto.run([local, w]))
    # the same program captured into a CUDA graph per signature (``cuda_graph``): no host latency before the GPU's work
    graph = MultiDeviceExecutor(row_parallel_fusion(d, dtype, ([d, m // d, k * d], [n, k * d])).fusion,
                                MultiDeviceExecutorParams(backend_type=CommunicatorBackend.cuda, cuda_graph=True))
    replay = pyfuser_graph_run(graph, [local, w], weight=1)
    (got,) = replay()
    r["pyfuser_auto_graph_error"] = relative_error(got, total.view(d, m // d, n)[rank:rank + 1])
    del got
    r["pyfuser_auto_graph_ms"] = timer(replay)
    # the model's two choices, each forced
    r |= forced_graph_columns(lambda: row_parallel_fusion(d, dtype, ([d, m // d, k * d], [n, k * d])).fusion,
                              [local, w], total.view(d, m // d, n)[rank:rank + 1], timer)
    r["pyfuser_auto"] = "P2P S=1" if "P2PCommunication" in auto.host_ir() else "GEMM then reduce-scatter"
    # replayed, the model counts no host time per node: it may choose otherwise (``overlap_model.decide``)
    r["pyfuser_auto_graph"] = "P2P S=1" if "P2PCommunication" in graph.host_ir() else "GEMM then reduce-scatter"
    p2p = {key: value for key, value in r.items() if key.startswith("pyfuser_p2p_S") and key.endswith("_ms")}
    if p2p:
        best = min(p2p, key=p2p.__getitem__)
        r["pyfuser_best_ms"], r["pyfuser_best"] = p2p[best], best.removeprefix("pyfuser_").removesuffix("_ms")
        r["best_vs_ideal"] = r["pyfuser_best_ms"] / r["ideal_ms"]
    return r


def _nccl_chunks(x: torch.Tensor, w: torch.Tensor, d: int, chunks: int) -> Any:
    """The hand-written NCCL pipeline: row chunk i multiplied, then reduce-scattered, on its own stream."""
    m, _ = x.shape
    xs = x.view(chunks, m // chunks, -1)
    partials = torch.empty(chunks, m // chunks, w.shape[0], device=x.device, dtype=x.dtype)
    outs = torch.empty(chunks, m // (chunks * d), w.shape[0], device=x.device, dtype=x.dtype)
    workers = [torch.cuda.Stream() for _ in range(chunks)]

    def run() -> None:
        main = torch.cuda.current_stream()
        for i, stream in enumerate(workers):
            stream.wait_stream(main)
            with torch.cuda.stream(stream):
                torch.matmul(xs[i], w.t(), out=partials[i])
                _reduce_scatter(outs[i], partials[i])
        for stream in workers:
            main.wait_stream(stream)

    return run


def profile(m: int, k: int, n: int, dtype: torch.dtype, directory: Path, host: bool) -> dict[str, Any]:
    """Traces (and with ``host`` host profiles) of pyfuser's programs; rank 0 draws the timeline."""
    comm = Communicator.instance()
    d, device = comm.size(), comm.device()
    x = torch.randn(m, k, device=device, dtype=dtype)
    w = torch.randn(n, k, device=device, dtype=dtype) / (k * d) ** 0.5

    def runner(backend: str, s: int) -> Callable[[], object]:
        executor, local = pyfuser_program(d, dtype, backend), x.view(s, d, m // (s * d), k)
        if backend.endswith("_graph"):
            return pyfuser_graph_run(executor, [local, w], weight=1)
        return lambda: executor.run([local, w])

    backends = [*BACKENDS, *(f"{b}_graph" for b in BACKENDS)]
    return profile_variants("linear_rs", m, runner, backends, directory, host,
                            f"linear + reduce-scatter, M={m}, K={k}/rank, N={n}")


COLUMNS = [("size", "M, K per rank, N"), ("gemm_ms", "GEMM"), ("reduce_scatter_ms", "reduce-scatter"),
           ("gemm_then_rs_ms", "GEMM then RS"), ("gemm_then_rs_graph_ms", "GEMM then RS, CUDA graph"),
           ("torch_fused_ms", "torch fused_matmul_reduce_scatter"),
           ("nccl_chunks_S2_ms", "NCCL chunks S=2"), ("pyfuser_nccl_S1_ms", "pyfuser NCCL S=1"),
           ("pyfuser_nccl_S2_ms", "pyfuser NCCL S=2"), ("pyfuser_p2p_S1_ms", "pyfuser P2P S=1"),
           ("pyfuser_p2p_S2_ms", "pyfuser P2P S=2"), ("pyfuser_p2p_S4_ms", "pyfuser P2P S=4"),
           ("pyfuser_best_ms", "pyfuser best"), ("pyfuser_auto_ms", "pyfuser auto"), ("pyfuser_auto", "auto chose"),
           ("pyfuser_auto_graph_ms", "pyfuser auto, CUDA graph"), ("pyfuser_auto_graph", "graph chose"),
           ("pyfuser_plain_graph_ms", "pyfuser plain, CUDA graph"), ("pyfuser_pipeline_graph_ms", "pyfuser pipeline, CUDA graph"),
           ("ideal_ms", "ideal max(GEMM, RS)"), ("best_vs_ideal", "best / ideal")]


if __name__ == "__main__":
    sys.exit(main("linear_rs", __doc__, "GEMM + reduce-scatter (row-parallel linear, sharded output)", COLUMNS, measure,
                  profile))
