"""Whether an all-gather + GEMM or a GEMM + reduce-scatter pays to pipeline: one decision, from a model of
the machine.

A P2P pipeline (``comm/p2p_pipelines.py``) hides the transfers behind the GEMMs but cuts the GEMM into
``ranks * chunks`` pieces, each issued by the host with its transfer, select and wait nodes. At large sizes
the hidden communication wins; at small ones the host's issue time and the smaller, less efficient GEMMs
cost more than the communication the pipeline hides (issue 32's table: 4096^3 on 4 H100s, 2x slower than
the plain all-gather then GEMM). ``decide`` estimates both from a ``MachineModel`` and picks one. A program
replayed from a CUDA graph (``EnableOption.cuda_graph``) issues no node from the host, so only the device
terms count: there the pipeline paid at 4096^3 on 2 and 4 H200s too (0.22 / 0.28 ms against 0.29 / 0.35 for
the collective then GEMM, both replayed).

The model is a set of constants per device kind (H100 and H200 over NVLink from issue 32's measurements,
conservative ones for other GPUs and CPUs), overridable with ``PYFUSER_OVERLAP_MODEL``. It is not measured
at run time on purpose: every rank must take the same decision (one rank running a pipeline while its peer
runs a collective would hang both), and per-rank timings differ; constants of the device kind and the
shapes, which all ranks share, keep the choice identical everywhere without a collective at compile time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum

import torch

from pyfuser.options import CompileOptions, DisableOption, EnableOption


class Pattern(StrEnum):
    allgather_gemm = "all-gather + GEMM"
    gemm_reduce_scatter = "GEMM + reduce-scatter"


@dataclass(frozen=True, slots=True)
class MachineModel:
    """What the estimate reads: dense GEMM throughput, per-peer link bandwidth and latencies."""

    name: str
    gemm_flops: float  # FLOP/s of a large GEMM
    gemm_fixed_s: float  # per GEMM launch, on the device
    link_bytes_s: float  # bytes/s one GPU sends to one peer (one transfer per GPU per step)
    transfer_s: float  # per transfer: signal and copy-engine setup
    collective_s: float  # per collective call (NCCL / gloo), besides its bandwidth term
    host_node_s: float  # host time to issue one Host IR node (the Python evaluator)

    @staticmethod
    def parse(raw: str) -> MachineModel:
        """``PYFUSER_OVERLAP_MODEL``: ``gemm_tflops,link_gb_s,transfer_us,collective_us,host_node_us``."""
        parts = [p.strip() for p in raw.split(",")]
        try:
            values = [float(p) for p in parts]
        except ValueError:
            values = []
        if len(values) != 5 or any(v < 0 for v in values) or values[0] <= 0 or values[1] <= 0:
            raise ValueError(f"PYFUSER_OVERLAP_MODEL must be 5 non-negative numbers gemm_tflops,link_gb_s,"
                             f"transfer_us,collective_us,host_node_us (the first two positive), got {raw!r}")
        tflops, gb_s, transfer, collective, host = values
        return MachineModel("PYFUSER_OVERLAP_MODEL", tflops * 1e12, 4e-6, gb_s * 1e9, transfer * 1e-6,
                            collective * 1e-6, host * 1e-6)


#: Issue 32's 4-H100 run (bf16): a 8192^3 GEMM in ~1.3 ms, NCCL all-gather of 2048 x 8192 rows per peer in
#: ~0.1 ms (~300 GB/s per link), and the Python Host IR issuing ~25 us per node (the 4096^3 pipelines).
H100 = MachineModel("H100 NVLink", 700e12, 4e-6, 300e9, 10e-6, 20e-6, 25e-6)
H200 = MachineModel("H200 NVLink", 750e12, 4e-6, 300e9, 10e-6, 20e-6, 25e-6)
#: Another GPU: PCIe-class links, so overlap pays sooner; the host cost is the evaluator's.
OTHER_GPU = MachineModel("GPU", 200e12, 5e-6, 25e9, 15e-6, 30e-6, 25e-6)
#: CPUs with gloo (where the choice is exercised by tests): a few GFLOP/s of GEMM, loopback TCP.
CPU = MachineModel("CPU gloo", 20e9, 20e-6, 1e9, 100e-6, 200e-6, 50e-6)


def machine_model(device: torch.device) -> MachineModel:
    """The model of ``device``'s kind (``PYFUSER_OVERLAP_MODEL`` wins); the same on every rank of one kind."""
    raw = os.environ.get("PYFUSER_OVERLAP_MODEL")
    if raw:
        return MachineModel.parse(raw)
    if device.type != "cuda":
        return CPU
    name = torch.cuda.get_device_name(device) if torch.cuda.is_available() else ""
    return H200 if "H200" in name else H100 if "H100" in name else OTHER_GPU


@dataclass(frozen=True, slots=True)
class Decision:
    pipelined: bool
    pipelined_s: float | None  # None: not estimated (forced, or sizes unknown at compile time)
    plain_s: float | None
    why: str

    def __str__(self) -> str:
        return f"{'pipeline' if self.pipelined else 'plain collective + GEMM'} ({self.why})"


def _gemm(model: MachineModel, m: float, k: int, n: int) -> float:
    return model.gemm_fixed_s + 2.0 * m * k * n / model.gemm_flops


def estimate_pipelined(pattern: Pattern, m: int, k: int, n: int, itemsize: int, ranks: int, chunks: int,
                       model: MachineModel, replayed: bool = False) -> float:
    """Seconds of the P2P pipeline: per chunk, ``ranks`` GEMM pieces of ``m / (ranks * chunks)`` rows, each
    peer's transfer one at a time per GPU; the host issues every node, the device runs behind it (``replayed``:
    a CUDA graph's replay issues them, no host term)."""
    piece_rows = m / (ranks * chunks)
    piece = _gemm(model, piece_rows, k, n)
    # all-gather moves row blocks of x [m, k]; reduce-scatter moves partial sums of out [m, n]
    block_bytes = piece_rows * (k if pattern is Pattern.allgather_gemm else n) * itemsize
    transfer = model.transfer_s + block_bytes / model.link_bytes_s
    device = link = 0.0
    for _ in range(chunks):
        if pattern is Pattern.allgather_gemm:  # sends issued first, the own block computed meanwhile
            start = max(device, link)
            device = start + piece
            link = start
            for _ in range(ranks - 1):
                link += transfer
                device = max(device, link) + piece
        else:  # each peer's partial sums computed, then pushed while the next piece computes
            for _ in range(ranks - 1):
                device += piece
                link = max(link, device) + transfer
            device += piece
            device = max(device, link) + (ranks - 1) * model.gemm_fixed_s  # the received sums added
    # per chunk and peer: select, transfer, wait, select, GEMM (and the send, release, accumulate)
    host = 0.0 if replayed else chunks * ranks * 6 * model.host_node_s
    return max(device, host + piece)


def estimate_plain(pattern: Pattern, m: int, k: int, n: int, itemsize: int, ranks: int, chunks: int,
                   model: MachineModel, replayed: bool = False) -> float:
    """Seconds of the collective then the GEMM (per chunk when a stream loop runs them)."""
    rows = m / chunks
    moved = (ranks - 1) / ranks * rows * (k if pattern is Pattern.allgather_gemm else n) * itemsize
    per_chunk = model.collective_s + moved / model.link_bytes_s + _gemm(model, rows, k, n)
    host = 0.0 if replayed else chunks * 3 * model.host_node_s
    return max(chunks * per_chunk, host + per_chunk)


def forced(options: CompileOptions) -> Decision | None:
    """The user's choice, if any: ``EnableOption.p2p_pipelines_always`` pipelines, ``DisableOption.p2p_pipelines``
    never does (the disable wins when both are given)."""
    if options.is_disabled(DisableOption.p2p_pipelines):
        return Decision(False, None, None, "forced: p2p_pipelines disabled")
    if options.is_enabled(EnableOption.p2p_pipelines_always):
        return Decision(True, None, None, "forced: p2p_pipelines_always enabled")
    return None


def decide(pattern: Pattern, m: int, k: int, n: int, dtype: torch.dtype, ranks: int, chunks: int,
           options: CompileOptions, model: MachineModel | None = None) -> Decision:
    """Pipeline or plain for a GEMM ``[m, k] x [k, n]`` on each rank (``m``: the gathered rows of an all-gather,
    the rows of the partial sums before a reduce-scatter), over ``ranks`` ranks in ``chunks`` stream chunks."""
    if ranks < 1 or chunks < 1 or min(m, k, n) < 0:
        raise ValueError(f"overlap decision: ranks ({ranks}) and chunks ({chunks}) must be positive and m, k, n "
                         f"({m}, {k}, {n}) non-negative")
    chosen = forced(options)
    if chosen is not None:
        return chosen
    model = model if model is not None else machine_model(options.device)
    itemsize = torch.empty((), dtype=dtype).element_size()
    replayed = options.is_enabled(EnableOption.cuda_graph) and options.device.type == "cuda"
    pipelined = estimate_pipelined(pattern, m, k, n, itemsize, ranks, chunks, model, replayed)
    plain = estimate_plain(pattern, m, k, n, itemsize, ranks, chunks, model, replayed)
    return Decision(pipelined < plain, pipelined, plain,
                    f"{model.name} model, M={m} K={k} N={n} over {ranks} ranks, S={chunks}"
                    f"{', replayed from a CUDA graph' if replayed else ''}: pipeline {pipelined * 1e3:.3f} ms, "
                    f"plain {plain * 1e3:.3f} ms")
