"""The CUDA P2P transport's protocol, simulated on CPU memory in one process.

Two ``CudaChannel``s (ranks 0 and 1) share fake symmetric memory: each "allocation" is a CPU tensor whose
address every rank knows; ``cuMemcpyAsync`` copies bytes at once, ``cuStreamWriteValue32`` writes at once and
``cuStreamWaitValue32`` checks that the flag already holds the value a stream would wait for (in this in-order
simulation a wait that is not satisfied would block forever). Data, signals and releases must land at the
right offsets of the peer's allocation, in the order the protocol promises, over several executions, and
every execution must issue the same driver calls (what lets a CUDA graph replay them).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import pyfuser.comm.symmetric_memory as sm

ROOT = Path(__file__).resolve().parents[2]


class _FakeDriver:
    """Just enough of ``cuda.bindings.driver``: copies and waits act on CPU addresses immediately."""

    class CUresult:
        CUDA_SUCCESS = 0

    class CUstreamWaitValue_flags:
        CU_STREAM_WAIT_VALUE_EQ = 1

    class CUstreamWriteValue_flags:
        CU_STREAM_WRITE_VALUE_DEFAULT = 0

    def __init__(self) -> None:
        self.log: list[tuple[str, int, int]] = []

    CUstream = staticmethod(lambda handle: handle)
    CUdeviceptr = staticmethod(lambda address: address)

    def cuMemcpyAsync(self, dst: int, src: int, nbytes: int, stream: Any) -> tuple[int]:
        ctypes.memmove(dst, src, nbytes)
        self.log.append(("copy", dst, nbytes))
        return (0,)

    def cuStreamWaitValue32(self, stream: Any, address: int, value: int, flags: int) -> tuple[int]:
        held = ctypes.c_int32.from_address(address).value
        assert held == value, f"a stream would wait forever: flag holds {held}, waits for {value}"
        self.log.append(("wait", address, value))
        return (0,)

    def cuStreamWriteValue32(self, stream: Any, address: int, value: int, flags: int) -> tuple[int]:
        ctypes.c_int32.from_address(address).value = value
        self.log.append(("write", address, value))
        return (0,)


class _Stream:
    cuda_stream = 0

    def wait_event(self, event: Any) -> None:
        pass


class _Event:
    def record(self, stream: Any = None) -> None:
        pass


@pytest.fixture
def ranks(monkeypatch: pytest.MonkeyPatch) -> tuple[list[sm.CudaChannel], _FakeDriver, list[str]]:
    """Channels of ranks 0 and 1 for a ``[S=2, 4 rows (2 per rank), 3]`` float buffer, 2 slots per peer."""
    driver = _FakeDriver()
    raws: list[torch.Tensor] = []
    watched: list[str] = []

    def empty(nbytes: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
        if not raws:  # both ranks' allocations exist before either maps the other's
            raws.extend(torch.full((nbytes,), 0xAB, dtype=torch.uint8) for _ in range(2))  # garbage, like fresh memory
        return raws[device.index]

    signal = torch.full((1,), sm.SIGNALED, dtype=torch.int32)
    shared = SimpleNamespace(copy_stream=_Stream(), signal=signal, signal_address=signal.data_ptr())
    monkeypatch.setattr(sm, "_cu", driver)
    monkeypatch.setattr(sm.symm_mem, "empty", empty)
    monkeypatch.setattr(sm.symm_mem, "rendezvous", lambda raw, name: SimpleNamespace(
        buffer_ptrs=[r.data_ptr() for r in raws], get_buffer=lambda rank, sizes, dtype: raws[rank]))
    monkeypatch.setattr(sm, "_enable_group", lambda group: None)
    monkeypatch.setattr(sm._Device, "of", staticmethod(lambda device: shared))
    monkeypatch.setattr(sm.Watchdog, "get", staticmethod(lambda timeout, rank: SimpleNamespace(
        watch=lambda stream, what: watched.append(what))))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(sm.dist, "get_backend", lambda group: "gloo")
    monkeypatch.setattr(sm.dist, "barrier", lambda **kwargs: None)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    group = SimpleNamespace(group_name="0_1")
    channels = [sm.CudaChannel("T3", (0, 1), rank, group, [2, 4, 3], (0, 1, 2), torch.float32, 2,
                               torch.device("cuda", rank), 60.0) for rank in (0, 1)]
    return channels, driver, watched


def _blocks(channel: sm.CudaChannel, chunk: int) -> list[torch.Tensor]:
    """Chunk ``chunk`` of the buffer, split into the two ranks' blocks of two rows."""
    return list(channel.local[chunk].split(2, 0))


def _execute(channels: list[sm.CudaChannel], epoch: int) -> None:
    """One execution of a two-chunk exchange: each rank sends its block of each chunk to the other."""
    for c in channels:
        c.begin()
    shards = [torch.full((2, 3), 10.0 * epoch + rank) for rank in (0, 1)]
    pending = []
    for chunk in (0, 1):
        for rank, c in enumerate(channels):
            peer = 1 - rank
            mine = _blocks(c, chunk)[rank]
            pending.append(c.send(shards[rank] + chunk, mine, peer, chunk, None, _Event(), _Event()))
        for rank, c in enumerate(channels):
            peer = 1 - rank
            c.recv(_blocks(c, chunk)[peer], peer, chunk, None)(_Stream())  # the signal must be there
            torch.testing.assert_close(_blocks(c, chunk)[peer], shards[peer] + chunk)
    for finish in pending:
        finish(_Stream())
    for c in channels:
        c.release(_Stream())


def test_data_lands_in_the_peers_block_and_every_flag_is_reset_by_its_waiter(ranks) -> None:
    channels, driver, watched = ranks
    for epoch in (1, 2, 3):
        _execute(channels, epoch)
    assert len(watched) == 6 and "T3 over team (0 1) in execution 3" in watched[-1]
    waits = [entry for entry in driver.log if entry[0] == "wait"]
    # per execution: every receive (2 ranks x 2 chunks) and each sender's first send (the peer's release)
    assert len(waits) == 3 * (4 + 2) and all(value == sm.SIGNALED for _, _, value in waits), waits
    resets = [entry for entry in driver.log if entry[0] == "write"]
    assert [(a, 0) for _, a, _ in waits] == [(a, v) for _, a, v in resets]  # each wait clears what it read
    assert len([w for w in driver.log if w[0] == "copy" and w[2] == 4]) == 3 * (2 * 2 + 2)  # signals + releases
    for c in channels:  # between executions: nothing received, every buffer free
        flags = c._raw[c._flags_at:].view(torch.int32).tolist()
        assert flags == [0] * 4 + [sm.SIGNALED] * 2, flags


def test_every_execution_issues_the_same_driver_calls(ranks) -> None:
    """What a CUDA graph captures of one execution replays the next ones: same addresses, same values."""
    channels, driver, _ = ranks
    calls = []
    for epoch in (1, 2, 3):
        driver.log.clear()
        _execute(channels, epoch)
        calls.append(list(driver.log))
    assert calls[0] == calls[1] == calls[2] and calls[0]


def test_a_strided_source_is_copied_through_the_peers_mapping(ranks) -> None:
    channels, driver, _ = ranks
    for c in channels:
        c.begin()
    source = torch.arange(6.0).reshape(3, 2).t()  # [2, 3], not contiguous
    channels[0].send(source, _blocks(channels[0], 1)[0], 1, 1, None, _Event(), _Event())(_Stream())
    channels[1].recv(_blocks(channels[1], 1)[0], 0, 1, None)(_Stream())
    torch.testing.assert_close(_blocks(channels[1], 1)[0], source)
    assert [entry[2] for entry in driver.log if entry[0] == "copy"] == [4]  # only the signal: the data took torch's copy


def test_a_missing_signal_is_a_wait_that_never_ends(ranks) -> None:
    channels, _, _ = ranks
    for c in channels:
        c.begin()
    with pytest.raises(AssertionError, match="would wait forever: flag holds 0, waits for 1"):
        channels[0].recv(_blocks(channels[0], 0)[1], 1, 0, None)(_Stream())


_WATCHDOG_SCRIPT = """
import sys, time, torch
import pyfuser.comm.symmetric_memory as sm

class Event:
    def __init__(self): self.done_at = None
    def record(self, stream=None): self.done_at = time.monotonic() + float(sys.argv[1])
    def query(self): return time.monotonic() >= self.done_at

torch.cuda.Event = Event
dog = sm.Watchdog(timeout_s=0.5, rank=3)
dog.watch(None, "the P2P transfers into T3 over team (2 3) in execution 7")
time.sleep(2.0)
print("still running", flush=True)
"""


@pytest.mark.parametrize("completes_after_s", [0.1, 3600.0])
def test_watchdog_exits_a_process_whose_transfers_stop(completes_after_s: float) -> None:
    """Transfers that complete are forgotten; transfers that make no progress for the timeout end the
    process with a line naming them (a GPU stream waiting on a lost peer's signal would wait forever)."""
    result = subprocess.run([sys.executable, "-c", _WATCHDOG_SCRIPT, str(completes_after_s)], capture_output=True,
                            text=True, timeout=60, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if completes_after_s < 1:
        assert result.returncode == 0 and "still running" in result.stdout, result.stderr
    else:
        assert result.returncode == 1 and "still running" not in result.stdout
        assert ("pyfuser: rank 3: the P2P transfers into T3 over team (2 3) in execution 7 did not complete "
                "within 0.5s (PYFUSER_DIST_TIMEOUT)") in result.stderr, result.stderr
