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
    """One segment of a profiled execution (nvFuser's ``KernelProfile`` names; per-kernel device
    times are not measured)."""

    name: str
    segment_id: int
    scheduler: str
    device: str


@dataclass
class FusionProfile:
    """One profiled execution (nvFuser's ``FusionProfile`` names): ``host_time_ms`` is the wall time
    of the whole call, compilation included when it compiled."""

    fusion_id: int
    segments: int
    kernel_profiles: list[KernelProfile] = field(default_factory=list)
    host_time_ms: float = 0.0
    input_bytes: int = 0
    output_bytes: int = 0


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


def record(fusion: Fusion, segments: Sequence[SegmentInfo], device: torch.device, started: float,
           args: Sequence[Any], outputs: Sequence[Any]) -> None:
    """Add one execution (``started``: its ``time.perf_counter()`` at the call) to every active profiler."""
    profile = FusionProfile(
        fusion_id(fusion), len(segments),
        [KernelProfile(s.name, k, s.scheduler, str(device)) for k, s in enumerate(segments)],
        (time.perf_counter() - started) * 1e3, _bytes(args), _bytes(outputs))
    for sink in _SINKS:
        sink.append(profile)
