"""Timing shared by the benchmarks: the median of per-step intervals, on the GPU's clock where there is one."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_ms(step: Callable[[], Any], device: str, warmup: int, iters: int) -> float:
    """Median milliseconds per step (CUDA events on a GPU, the wall clock on a CPU)."""
    for _ in range(warmup):
        step()
    synchronize(device)
    samples = []
    for _ in range(iters):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            step()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)
