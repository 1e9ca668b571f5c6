"""What ``PythonProfiler`` records: per execution of a fusion, its segments and their schedulers and
the host time and bytes of the call. Recording costs nothing while no profiler is active."""

from __future__ import annotations

import itertools
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from pyfuser.ir.fusion import Fusion


@dataclass(frozen=True)
class SegmentInfo:
    """One segment of a compiled program: its kernel's name (or its ATen ops) and its scheduler."""

    name: str
    scheduler: str


@dataclass(frozen=True)
class KernelProfile:
    """One segment of a profiled execution, with nvFuser's ``KernelProfile`` fields so that code printing
    them runs. Measured: the name, scheduler, device, the CUDA stream the call ran on (0 on a CPU) and,
    when the execution was this one kernel (``manual_execute``, or a program of one segment), the call's
    compile time and bytes. CUPTI's counters (kernel time, bandwidth, registers, launch geometry) are not
    measured: they keep nvFuser's values without CUPTI (0, empty strings)."""

    name: str
    segment_id: int
    scheduler: str
    device: str
    stream: int = 0
    correlation_id: int = 0
    compile_time_ms: float = 0.0
    time_ms: float = 0.0
    effective_bandwidth_gbs: float = 0.0
    percentage_peak_bandwidth: float = 0.0
    grid_str: str = ""
    block_str: str = ""
    cluster_str: str = ""
    shared_mem_str: str = ""
    registers: int = 0
    input_bytes: int = 0
    output_bytes: int = 0


@dataclass
class FusionProfile:
    """One profiled execution (nvFuser's ``FusionProfile`` fields): ``host_time_ms`` is the wall time
    of the whole call, compilation included when it compiled, ``compile_time_ms`` that compilation's
    part (0 when the program was cached). Device times and bandwidths are not measured (0)."""

    fusion_id: int
    segments: int
    kernel_profiles: list[KernelProfile] = field(default_factory=list)
    host_time_ms: float = 0.0
    input_bytes: int = 0
    output_bytes: int = 0
    compile_time_ms: float = 0.0
    verbose: bool = False
    cuda_evt_time_ms: float = 0.0
    kernel_time_ms: float = 0.0
    effective_bandwidth_gbs: float = 0.0
    percentage_peak_bandwidth: float = 0.0

    @property
    def percentage_peak_bandwith(self) -> float:
        """nvFuser's spelling of ``percentage_peak_bandwidth`` on a ``FusionProfile``."""
        return self.percentage_peak_bandwidth


#: The record lists of the active profilers (innermost last).
_SINKS: list[list[FusionProfile]] = []
_FUSION_IDS: weakref.WeakKeyDictionary[Fusion, int] = weakref.WeakKeyDictionary()
_NEXT_ID = itertools.count()


def active() -> bool:
    return bool(_SINKS)


@contextmanager
def unseen_by_torch_profiler() -> Iterator[None]:
    """The ops dispatched inside are not recorded by a torch profiler active on this thread (torch's
    RecordFunction is off for the thread meanwhile): a rehearsal's ATen calls on meta tensors are no
    work of the program, and a profile of a first call would otherwise count each of them twice (nvFuser's
    stream tests count the ``aten::mm`` of a profiled call). Costs nothing while no profiler runs."""
    if not torch.autograd._profiler_enabled():
        yield
        return
    torch.autograd._enable_record_function(False)
    try:
        yield
    finally:
        torch.autograd._enable_record_function(True)  # a profiler records only with it on


@contextmanager
def recording() -> Iterator[list[FusionProfile]]:
    """Collect the profiles of the executions inside the block."""
    sink: list[FusionProfile] = []
    _SINKS.append(sink)
    try:
        yield sink
    finally:
        _SINKS.remove(sink)


def fusion_id(fusion: Fusion) -> int:
    """A number per fusion, stable for the process (nvFuser's id of a fusion in its cache)."""
    if fusion not in _FUSION_IDS:
        _FUSION_IDS[fusion] = next(_NEXT_ID)
    return _FUSION_IDS[fusion]


def _bytes(values: Sequence[Any]) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def _stream(device: torch.device) -> int:
    """The id of the CUDA stream current on ``device`` (where the call's kernels were queued); 0 on a CPU."""
    return torch.cuda.current_stream(device).stream_id if device.type == "cuda" else 0


def record(fusion: Fusion, segments: Sequence[SegmentInfo], device: torch.device, started: float,
           args: Sequence[Any], outputs: Sequence[Any], compile_time_ms: float = 0.0) -> None:
    """Add one execution (``started``: its ``time.perf_counter()`` at the call; ``compile_time_ms``: the
    part of it spent compiling) to every active profiler."""
    input_bytes, output_bytes = _bytes(args), _bytes(outputs)
    stream = _stream(device)
    # One segment is the whole call: its compile time and bytes are the call's.
    whole = (compile_time_ms, input_bytes, output_bytes) if len(segments) == 1 else (0.0, 0, 0)
    kernels = [KernelProfile(s.name, k, s.scheduler, str(device), stream=stream, compile_time_ms=whole[0],
                             input_bytes=whole[1], output_bytes=whole[2]) for k, s in enumerate(segments)]
    profile = FusionProfile(fusion_id(fusion), len(segments), kernels, (time.perf_counter() - started) * 1e3,
                            input_bytes, output_bytes, compile_time_ms)
    for sink in _SINKS:
        sink.append(profile)
