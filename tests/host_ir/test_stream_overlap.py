"""Stream overlap (on by default where safe): iterations wait only for work issued before the loop; the
user's stream joins every worker once, after the loop. ``_disable_options=["stream_overlap"]`` keeps seed
002's per-iteration joins, and a loop holding a node that is not ``chunk_local`` keeps them too."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pyfuser import FusionDefinition
from pyfuser.host_ir.frame import CudaStreams
from pyfuser.host_ir.nodes import AtenCall
from pyfuser.ir.base import Expr
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.iter_domain import ParallelType
from pyfuser.ir.ops.common import positional_map
from pyfuser.ir.tensor_view import new_like
from pyfuser.runtime.backends import EXPR_LOWERINGS
from tests.host_ir.conftest import DoublingOp

STREAM = ParallelType.stream
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _two_matmuls(chunks: int) -> FusionDefinition:
    fd = FusionDefinition()
    x = fd.define_tensor([-1, -1])
    w1 = fd.define_tensor([-1, -1])
    w2 = fd.define_tensor([-1, -1])
    y = fd.ops.relu(fd.ops.matmul(x, w1))
    z = fd.ops.matmul(y, w2)
    fd.add_output(z)
    for t in (y, y.definition.inputs[0], z):
        t.outer_split(0, chunks)
        t.axis(0).parallelize(STREAM)
    return fd


def test_overlap_dump_moves_join_after_loop(run_dumped, normalize):
    fd = _two_matmuls(3)
    inputs = [torch.randn(7, 4), torch.randn(4, 5), torch.randn(5, 2)]
    (out,), dump = run_dumped(fd, inputs)  # the default
    torch.testing.assert_close(out, torch.relu(inputs[0] @ inputs[1]) @ inputs[2])
    lines = normalize(dump)
    loop = lines.index(next(x for x in lines if x.startswith("FOR StreamIdx in iStreamIdx")))
    assert lines[loop - 1] == "GetCurrentStream into Stream ?"
    assert lines[loop + 1:loop + 3] == ["SetCurrentStream to Stream ( StreamIdx % numberOfStreams )",
                                       "Synchronize Stream ?"]
    assert lines[-4:] == ["SetCurrentStream to Stream ?",
                          "FOR WorkerIdx in iS?{( min(3, numberOfStreams) )}:",
                          "Synchronize Stream ( WorkerIdx % numberOfStreams )",
                          "} // %HostIrContainer"]
    assert sum(x.startswith("SetCurrentStream") for x in lines) == 2


def test_overlap_can_be_disabled(run_dumped, normalize):
    fd = _two_matmuls(3)
    inputs = [torch.randn(7, 4), torch.randn(4, 5), torch.randn(5, 2)]
    (out,), dump = run_dumped(fd, inputs, _disable_options=["stream_overlap"])
    torch.testing.assert_close(out, torch.relu(inputs[0] @ inputs[1]) @ inputs[2])
    lines = normalize(dump)
    assert "WorkerIdx" not in dump
    assert lines[-3:] == ["SetCurrentStream to Stream ?", "Synchronize Stream ( StreamIdx % numberOfStreams )",
                          "} // %HostIrContainer"]


class _CarryOp(DoublingOp):
    """Test-only op with effects outside its chunks (as far as the compiler knows): not ``chunk_local``."""

    printed_as = "carry"


class _CarryNode(AtenCall):
    chunk_local = False

    def substitute(self, mapping: Any, index: Any = None) -> _CarryNode:
        chunked = super().substitute(mapping, index)
        return _CarryNode(chunked.expr, chunked.inputs, chunked.outputs, chunked.into)


def test_loop_with_a_node_not_known_chunk_local_keeps_seed_joins(run_dumped, monkeypatch):
    monkeypatch.setitem(EXPR_LOWERINGS, _CarryOp, lambda expr, lctx: [_CarryNode(expr)])
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1, -1])
    t1 = new_like(t0)
    _CarryOp(fd.fusion, t1, t0)
    fd.add_output(t1)
    t1.axis(0).parallelize(STREAM)
    x = torch.randn(3, 2)
    (out,), dump = run_dumped(fd, [x])
    torch.testing.assert_close(out, x * 2)
    assert "WorkerIdx" not in dump and dump.count("Synchronize Stream ( StreamIdx % numberOfStreams )") == 1


@pytest.mark.parametrize("num_streams", [1, 2, 4])
@pytest.mark.parametrize("chunks", [1, 3, 9])
def test_overlap_results_with_ring_buffers(chunks, num_streams, device, monkeypatch):
    monkeypatch.setenv("PYFUSER_NUM_STREAMS", str(num_streams))
    fd = _two_matmuls(chunks)
    inputs = [torch.randn(20, 8, device=device), torch.randn(8, 16, device=device), torch.randn(16, 4, device=device)]
    expected = torch.relu(inputs[0] @ inputs[1]) @ inputs[2]
    for _ in range(3):  # buffers and streams reused across executions
        (out,) = fd.execute(inputs)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


class _SpinOp(Expr):
    """Test-only op: a copy that first keeps its stream busy (``torch.cuda._sleep``) for a fixed time."""

    CYCLES = 20_000_000

    def __init__(self, fusion: Any, out: Any, inp: Any) -> None:
        super().__init__(fusion, [inp], [out])

    def evaluate(self, ctx: EvalContext, x: torch.Tensor) -> list[Any]:
        torch.cuda._sleep(self.CYCLES)
        return [x.clone()]

    def logical_map(self, producer: Any) -> dict:
        return positional_map(producer, self.output)

    def to_string(self, indent: int = 0) -> str:
        return f"{'  ' * indent}{self.output} = spin({self.inputs[0]})\n"


def _elapsed_ms(fn: Any) -> float:
    """GPU time of the work ``fn`` issues on the current stream (best of 3, after a warm-up run)."""
    fn()
    times = []
    for _ in range(3):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return min(times)


def _spin_fusion() -> tuple[FusionDefinition, torch.Tensor]:
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1, -1])
    t1 = new_like(t0)
    _SpinOp(fd.fusion, t1, t0)
    fd.add_output(t1)
    t1.axis(0).parallelize(STREAM)
    return fd, torch.randn(4, 8, device="cuda")


@pytest.mark.cuda
@cuda
def test_cuda_overlap_runs_iterations_concurrently(monkeypatch):
    """4 iterations that each keep a stream busy for time T: ~4T as seed 002 syncs, ~T with overlap."""
    monkeypatch.setenv("PYFUSER_NUM_STREAMS", "4")
    fd, x = _spin_fusion()
    one = _elapsed_ms(lambda: torch.cuda._sleep(_SpinOp.CYCLES))
    serial = _elapsed_ms(lambda: fd.execute([x], _disable_options=["stream_overlap"]))
    overlapped = _elapsed_ms(lambda: fd.execute([x]))
    torch.testing.assert_close(fd.execute([x])[0], x, rtol=0, atol=0)
    assert serial > 3.5 * one, (serial, one)
    assert overlapped < 2.0 * one, (overlapped, one)


class _FakeStream:
    """A stream as ``CudaStreams`` compares them (by identity here), logging what is issued on it."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def wait_event(self, event: Any) -> None:
        self.log.append(f"{self.name} waits")


class _FakeEvent:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def record(self, stream: _FakeStream) -> None:
        self.log.append(f"record on {stream.name}")


def test_the_join_of_a_worker_the_execution_never_used_issues_nothing():
    """A stream loop of one iteration runs on the caller's stream; the join loop after it must not record on
    the idle workers (inside a CUDA graph capture that is a dependency on uncaptured work), but still
    joins a worker it used and any stream that is no worker."""
    log: list[str] = []
    user, other = _FakeStream("user", log), _FakeStream("other", log)
    workers = [_FakeStream(f"w{i}", log) for i in range(3)]
    streams = CudaStreams(list(workers), user, {})
    event = _FakeEvent(log)
    for worker in workers:
        streams.wait_for(worker, event)
    assert log == []
    streams.switched_to.add(workers[1])  # what ``set`` records when an iteration switches to it
    for worker in workers:
        streams.wait_for(worker, event)
    streams.wait_for(other, event)
    assert log == ["record on w1", "user waits", "record on other", "user waits"]
