"""Timing shared by the benchmarks: the median of per-step intervals, on the GPU's clock where there is one
(``time_ms_flushed``: one call's GPU time with the L2 cache flushed and host time kept out, for kernels)."""

from __future__ import annotations

import fcntl
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@contextmanager
def timing_lock(path: str | None, shared: bool = False) -> Iterator[None]:
    """Hold ``path``'s ``flock`` (nothing without a path): exclusive for timed steps, shared
    (``shared=True``) for a benchmark process's other work, its compilation and first calls above all.
    Processes sharing a machine then compile in parallel with each other but never beside a timed step,
    whose host time another process's compile threads would otherwise take.

    Timed steps go first: a process asking for the exclusive lock first takes ``path.gate``, which every
    shared holder passes through before taking its share, so no new share starts while it waits. Without
    it a timed step waits for a moment when none of the other processes is compiling, which with four
    compiling processes a GPU can take minutes (a suspect in the model breadth run's 12 cases in 420 s on
    eight processes). A holder must not ask for the lock again inside its section."""
    if not path:
        yield
        return
    with open(path + ".gate", "a") as gate, open(path, "a") as handle:
        fcntl.flock(gate, fcntl.LOCK_EX)
        if shared:
            fcntl.flock(gate, fcntl.LOCK_UN)
        fcntl.flock(handle, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
            if not shared:
                fcntl.flock(gate, fcntl.LOCK_UN)


def time_ms(step: Callable[[], Any], device: str, warmup: int, iters: int) -> float:
    """Median milliseconds per step (CUDA events on a GPU, the wall clock on a CPU)."""
    for _ in range(warmup):
        step()
    synchronize(device)
    return statistics.median(_intervals(step, device, iters))


def time_ms_interleaved(steps: dict[str, Callable[[], Any]], device: str, warmup: int, iters: int, rounds: int = 4,
                        around: Callable[[str], AbstractContextManager[Any]] = lambda name: nullcontext(),
                        ) -> dict[str, float | BaseException]:
    """Median milliseconds per step of each of ``steps`` (as ``time_ms``), timed in ``rounds`` rounds of
    ``iters / rounds`` steps each, the order rotated every round: no variant is always timed first or
    last in the process (host time a step drifts as a process runs: allocator, caches, Python's heap).
    Each variant's block of steps runs inside ``around(name)``. A variant whose step raises is dropped
    from the later rounds; its entry is the exception."""
    live = dict(steps)
    result: dict[str, float | BaseException] = {}
    samples: dict[str, list[float]] = {name: [] for name in steps}
    per_round = max(1, -(-iters // rounds))
    for k in range(rounds):
        names = list(live)
        names = names[k % len(names):] + names[:k % len(names)] if names else names
        for name in names:
            try:
                with around(name):
                    for _ in range(warmup if k == 0 else 1):
                        live[name]()
                    synchronize(device)
                    samples[name] += _intervals(live[name], device, per_round)
            except Exception as e:  # recorded; the other variants go on
                result[name] = e
                del live[name]
    for name in live:
        result[name] = statistics.median(samples[name])
    return result


def _intervals(step: Callable[[], Any], device: str, iters: int) -> list[float]:
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
    return samples


#: Cycles of the spin kernel queued before each timed call (~0.5 ms at the H200's 1.98 GHz): longer
#: than any call's host time, so the call's launches are queued before the GPU reaches them.
HOST_HEADROOM_CYCLES = 1_000_000


def time_ms_flushed(fn: Callable[[], Any], rep_ms: float = 200.0, warmup: int = 25, max_reps: int = 1000) -> float:
    """Median GPU time (ms) of ``fn``'s launches, L2 flushed before each call as ``do_bench`` does.

    ``do_bench`` alone times from an event queued right after its L2 flush: a call whose host time
    exceeds the flush's GPU time (~80 us on the H200) leaves the GPU waiting inside the timed
    interval, so host time shows up as GPU time, intermittently, as the host's speed drifts
    (seed 003: 41.6 against 58-90 us in stretches; Inductor's and pyfuser's calls, not a bare
    Triton launch's). A spin kernel queued between the flush and the start event holds the GPU
    while the host queues the call (nvbench's blocking kernel); host time is measured apart. Each sample
    costs the spin's ~0.5 ms whatever the call's length: ``max_reps`` bounds a sweep's time on short calls."""
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    probe = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    probe[0].record()
    for _ in range(5):
        fn()
    probe[1].record()
    torch.cuda.synchronize()
    reps = max(10, min(max_reps, int(rep_ms / max(probe[0].elapsed_time(probe[1]) / 5, 1e-3))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends, strict=True):
        flush.zero_()
        torch.cuda._sleep(HOST_HEADROOM_CYCLES)
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))
