"""Shards of one benchmark run on one GPU (``benchmarks/models.py``, ``benchmarks/kernels.py``): timed steps
never overlap (``timing.timing_lock``), and the shards' results files combine into one run."""

from __future__ import annotations

import importlib
import itertools
import json
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "benchmarks"))  # the benchmarks import their sibling modules by name

timing: ModuleType = importlib.import_module("timing")
models: ModuleType = importlib.import_module("models")


def test_timed_sections_of_several_holders_never_overlap(tmp_path: Path) -> None:
    """Each holder opens the lock file itself, as separate processes do: their sections run one at a time."""
    lock, spans = str(tmp_path / "gpu.lock"), []

    def hold() -> None:
        for _ in range(3):
            with timing.timing_lock(lock):
                start = time.perf_counter()
                time.sleep(0.01)
                spans.append((start, time.perf_counter()))

    threads = [threading.Thread(target=hold) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans.sort()
    assert len(spans) == 9
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(spans)), spans
    with timing.timing_lock(None):  # no lock file: nothing to hold
        pass


def test_shared_sections_overlap_each_other_but_never_a_timed_one(tmp_path: Path) -> None:
    """Compiling holders (shared) run side by side; a timing holder (exclusive) runs alone."""
    lock, spans = str(tmp_path / "gpu.lock"), []
    both_compiling = threading.Barrier(2, timeout=10)  # fails if the shared sections cannot overlap

    def compile_(shared_rounds: int, meet: bool) -> None:
        for _ in range(shared_rounds):
            with timing.timing_lock(lock, shared=True):
                start = time.perf_counter()
                if meet:
                    both_compiling.wait()
                time.sleep(0.01)
                spans.append(("shared", start, time.perf_counter()))

    def time_() -> None:
        for _ in range(3):
            with timing.timing_lock(lock):
                start = time.perf_counter()
                time.sleep(0.01)
                spans.append(("exclusive", start, time.perf_counter()))

    overlapping = [threading.Thread(target=compile_, args=(3, True)) for _ in range(2)]
    for t in overlapping:
        t.start()
    for t in overlapping:
        t.join()
    threads = [threading.Thread(target=compile_, args=(3, False)) for _ in range(2)] + [threading.Thread(target=time_)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(spans) == 15
    for kind, start, end in spans:
        if kind == "exclusive":
            assert all(e <= start or end <= s for k, s, e in spans if (k, s, e) != (kind, start, end)), spans


def test_a_waiting_timed_section_goes_before_later_shared_ones(tmp_path: Path) -> None:
    """While a shared holder works, a timing holder asks for the lock, then another process asks for a
    share: the timed section runs as soon as the first share ends, before the later share starts (shared
    holders coming one after another would otherwise hold the timed step off)."""
    lock, order = str(tmp_path / "gpu.lock"), []
    first_holds, timer_waits = threading.Event(), threading.Event()

    def first() -> None:
        with timing.timing_lock(lock, shared=True):
            first_holds.set()
            timer_waits.wait(10)
            time.sleep(0.05)  # (the timer is blocked on the lock by now)
            order.append("first share")

    def timer() -> None:
        first_holds.wait(10)
        timer_waits.set()
        with timing.timing_lock(lock):
            order.append("timed")

    def later() -> None:
        timer_waits.wait(10)
        time.sleep(0.02)  # (asks after the timer did)
        with timing.timing_lock(lock, shared=True):
            order.append("later share")

    threads = [threading.Thread(target=f) for f in (first, timer, later)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert order == ["first share", "timed", "later share"]


def _case(model: str, mode: str, variant: str, ms: float) -> dict[str, object]:
    return {"model": model, "mode": mode, "dtype": "bf16", "variant": variant, "status": "ok", "ms": ms,
            "unit": "tokens", "units_per_step": 100, "first_call_s": 1.0, "units_per_s": 1.0, "errors": {}}


def test_shards_combine_into_one_run_in_the_zoo_order(tmp_path: Path) -> None:
    """Cases of several shards, a case repeated by a later shard replaced by it, ordered as the zoo lists the
    models; ratios and the summary are those of the combined cases."""
    meta = {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "size": "default", "warmup": 1, "iters": 2,
            "models": ["llama", "vit"],
            "timer": "CUDA events", "torch": "2", "transformers": "5", "command": "python models.py"}
    shards = [[_case("vit", "inference", "eager", 4.0), _case("vit", "inference", "inductor", 2.0),
               _case("vit", "inference", "pyfuser", 4.0)],
              [_case("llama", "training", "inductor", 3.0), _case("llama", "training", "pyfuser", 2.0),
               _case("vit", "inference", "pyfuser", 1.0)]]
    combined = models.merged_cases([c for shard in shards for c in shard])
    assert [(c["model"], c["variant"]) for c in combined] == [
        ("llama", "inductor"), ("llama", "pyfuser"), ("vit", "eager"), ("vit", "inductor"), ("vit", "pyfuser")]
    assert models.write_report(combined, meta, "h100", tmp_path, "") == 0
    report = json.loads((tmp_path / "models_h100.json").read_text())
    ratios = {(c["model"], c["variant"]): c.get("vs_inductor") for c in report["cases"]}
    assert ratios[("vit", "pyfuser")] == 2.0 and ratios[("llama", "pyfuser")] == 1.5
    (training,) = [row for row in report["summary"] if row["mode"] == "training"]
    assert (training["models"], training["worst"]) == (1, 1.5)


def test_interleaved_timing_rotates_the_order_and_drops_a_failing_variant() -> None:
    """Variants are timed in rounds whose order rotates (each is first in some round), every variant gets its
    share of steps, a warmup runs once per variant, and a variant that raises in a later round is dropped
    with its exception while the others finish."""
    calls: list[str] = []
    entered: list[str] = []

    def step(name: str) -> None:
        calls.append(name)
        if name == "c" and calls.count("c") > 4:
            raise RuntimeError("c broke")

    class Around:
        def __init__(self, name: str) -> None:
            self.name = name

        def __enter__(self) -> None:
            entered.append(self.name)

        def __exit__(self, *exc: object) -> None:
            pass

    steps = {name: (lambda name=name: step(name)) for name in "abc"}
    times = timing.time_ms_interleaved(steps, "cpu", warmup=2, iters=8, rounds=4, around=Around)
    assert isinstance(times["a"], float) and isinstance(times["b"], float)
    assert isinstance(times["c"], RuntimeError)
    # warmup 2 + 2 steps in round 0, then 1 warmup + 2 steps in each later round
    assert calls.count("a") == calls.count("b") == 4 + 3 * 3
    # rounds: a b c | b c a (c fails on its warmup step) | a b | b a
    assert entered == ["a", "b", "c", "b", "c", "a", "a", "b", "b", "a"]
