"""The CUDA P2P transport (``CommunicatorBackend.cuda``): buffers in torch symmetric memory, written by the
copy engines and ordered by stream-side signals, so no SM is taken from the GEMMs and the host never
blocks.

* **Buffers.** A channel is one ``torch.distributed._symmetric_memory`` allocation per shape, made and
  rendezvoused once and reused by every execution: the data, then a signal area of int32 flags
  (``ready[sender][slot]``, one per transfer a peer makes per execution, and ``free[receiver]``).
* **Transfers.** A send is ``cuMemcpyAsync`` from this rank's tensor to the same offset of the peer's
  allocation (its address in this process comes from the rendezvous), on a dedicated copy stream: the
  copy engines move it over NVLink.
* **Signals.** After the data, the same copy stream copies 4 bytes -- a 1, from a one-element tensor on this
  GPU -- into the peer's ``ready`` flag: a write by the copy engine, ordered after the data by the stream
  (``cuStreamWriteValue`` no longer writes a peer's memory from CUDA 13.1 on, and NCCL moved its own signals
  to ``cudaMemcpyAsync`` for that reason). The receiver's stream waits for its *local* flag to hold 1 with
  ``cuStreamWaitValue32`` (NVIDIA's ``cuda-bindings``) and sets it back to 0 (``cuStreamWriteValue32`` on its
  own memory): no kernel spins.
* **Reuse.** At the end of an execution each rank writes 1 into its ``free`` flag in every peer; a sender's
  first transfer of the next execution waits (on the copy stream) for the receiver's ``free`` and sets it
  back to 0, so a buffer is never overwritten while its owner still reads it (``free`` starts at 1). Every
  flag a wait reads was reset by that wait's stream before its writer could write it again (a peer is at
  most one execution ahead), so the values are the same in every execution: a CUDA graph of a program
  replays its transfers unchanged (``host_ir/cuda_graph.py``).
* **Faults.** A stream wait has no timeout, so a watchdog thread watches every execution's end: when one
  has not completed ``PYFUSER_DIST_TIMEOUT`` seconds after it became the oldest pending, a peer failed or
  stopped before its transfer; the watchdog prints which transfers and exits the process (NCCL's
  watchdog does the same), so no rank waits forever on a signal. The communicator's teardown (``shutdown()`` or
  interpreter exit) stops the watchdog once every watched execution completed, before the groups go.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Hashable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

from pyfuser.comm.communicator import before_teardown
from pyfuser.comm.p2p_transport import Channel, PendingTransfer
from pyfuser.ir.layout import dense_strides

try:  # optional dependency: stream memory operations of the CUDA driver API
    from cuda.bindings import driver as _cu
except ImportError:  # a CPU-only install: the transport reports itself unavailable
    _cu = None

#: A flag holding SIGNALED: the transfer landed (``ready``) / the buffer may be written (``free``).
SIGNALED = 1
_ALIGN = 256


def _check(result: Any, what: str) -> None:
    err = result[0] if isinstance(result, tuple) else result
    if err != _cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"pyfuser CUDA P2P transport: {what} failed: {err!r}")


def wait_value(stream: torch.cuda.Stream | None, address: int, value: int) -> None:
    """``stream`` (None: the current one, a program without stream loops) waits on the GPU until
    the int32 at ``address`` equals ``value``."""
    stream = stream if stream is not None else torch.cuda.current_stream()
    flag = _cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_EQ
    _check(_cu.cuStreamWaitValue32(_cu.CUstream(stream.cuda_stream), _cu.CUdeviceptr(address), value, flag),
           "cuStreamWaitValue32")


def write_value(stream: torch.cuda.Stream, address: int, value: int) -> None:
    """``stream`` writes ``value`` into the int32 at ``address`` (this GPU's memory) once its work before is done."""
    _check(_cu.cuStreamWriteValue32(_cu.CUstream(stream.cuda_stream), _cu.CUdeviceptr(address), value,
                                    _cu.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT), "cuStreamWriteValue32")


def wait_and_reset(stream: torch.cuda.Stream | None, address: int) -> None:
    """``stream`` (None: the current one) waits until the flag at ``address`` is SIGNALED, then clears it."""
    stream = stream if stream is not None else torch.cuda.current_stream()
    wait_value(stream, address, SIGNALED)
    write_value(stream, address, 0)


def copy_bytes(stream: torch.cuda.Stream, dst: int, src: int, nbytes: int) -> None:
    """``nbytes`` from ``src`` to ``dst`` (device addresses, possibly a peer's) by the copy engines."""
    _check(_cu.cuMemcpyAsync(_cu.CUdeviceptr(dst), _cu.CUdeviceptr(src), nbytes, _cu.CUstream(stream.cuda_stream)),
           "cuMemcpyAsync")


class _Device:
    """What every channel of one GPU shares: the copy stream and the value its signals copy."""

    def __init__(self, device: torch.device) -> None:
        self.copy_stream = torch.cuda.Stream(device=device)
        self.signal = torch.full((1,), SIGNALED, dtype=torch.int32, device=device)

    @property
    def signal_address(self) -> int:
        return self.signal.data_ptr()

    @staticmethod
    def of(device: torch.device) -> _Device:
        found = _DEVICES.get(device.index)
        if found is None:
            found = _DEVICES[device.index] = _Device(device)
        return found


_DEVICES: dict[int, _Device] = {}


class Watchdog:
    """Exits the process when an execution's P2P transfers stop making progress for ``timeout_s``."""

    _instance: Watchdog | None = None

    def __init__(self, timeout_s: float, rank: int) -> None:
        self.timeout_s = timeout_s
        self.rank = rank
        self._lock = threading.Lock()
        self._pending: deque[tuple[torch.cuda.Event, str]] = deque()
        self._spare: list[torch.cuda.Event] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pyfuser-p2p-watchdog", daemon=True)
        self._thread.start()

    @classmethod
    def get(cls, timeout_s: float, rank: int) -> Watchdog:
        if cls._instance is None:
            cls._instance = Watchdog(timeout_s, rank)
            before_teardown(cls._instance.stop)
        return cls._instance

    def stop(self) -> None:
        """Wait until every watched execution completed, then end the thread (the communicator's teardown:
        the symmetric buffers and groups go next). Still bounded: an execution that never completes ends the
        process after the timeout, as during a run."""
        self._stopping.set()
        self._thread.join()
        if Watchdog._instance is self:
            Watchdog._instance = None

    def watch(self, stream: torch.cuda.Stream, what: str) -> None:
        """Expect the work issued so far on ``stream`` (``what``) to complete."""
        with self._lock:
            event = self._spare.pop() if self._spare else torch.cuda.Event()
        event.record(stream)
        with self._lock:
            self._pending.append((event, what))

    def _run(self) -> None:
        head: object = None
        since = time.monotonic()
        while True:
            self._stopping.wait(min(0.2, self.timeout_s / 20))
            with self._lock:
                while self._pending and self._pending[0][0].query():
                    self._spare.append(self._pending.popleft()[0])
                oldest = self._pending[0] if self._pending else None
            if oldest is None and self._stopping.is_set():
                return
            if oldest is None or oldest is not head:
                head, since = oldest, time.monotonic()
            elif time.monotonic() - since > self.timeout_s:
                sys.stderr.write(f"pyfuser: rank {self.rank}: {oldest[1]} did not complete within {self.timeout_s:g}s "
                                 "(PYFUSER_DIST_TIMEOUT): a peer failed or stopped before its transfer; exiting\n")
                sys.stderr.flush()
                os._exit(1)


class CudaChannel(Channel):
    """One channel on this GPU for one shape: the symmetric allocation and the signal protocol."""

    def __init__(self, name: str, team: Sequence[int], rank: int, group: Any, shape: Sequence[int],
                 perm: Sequence[int], dtype: torch.dtype, slots: int, device: torch.device, timeout_s: float) -> None:
        self.name, self.team, self.rank, self.device = name, tuple(team), rank, device
        self.slots = slots
        self.position = self.team.index(rank)
        size = len(self.team)
        data_bytes = dtype.itemsize * _numel(shape)
        self._flags_at = -(-data_bytes // _ALIGN) * _ALIGN
        flag_count = size * slots + size
        _enable_group(group)
        raw = symm_mem.empty(self._flags_at + 4 * flag_count, dtype=torch.uint8, device=device)
        handle = symm_mem.rendezvous(raw, group.group_name)
        self._raw, self._handle = raw, handle
        self.local = raw[:data_bytes].view(dtype).as_strided(list(shape), dense_strides(list(shape), list(perm)))
        flags = raw[self._flags_at:].view(torch.int32)
        flags.zero_()
        flags[size * slots:] = SIGNALED  # every ``free`` flag: no execution has written the buffers yet
        group_ranks = sorted(self.team)
        pointers = list(handle.buffer_ptrs)
        offset = raw.data_ptr() - pointers[group_ranks.index(rank)]
        #: where this allocation starts in each team member's memory, as mapped into this process
        self._base = {peer: pointers[group_ranks.index(peer)] + offset for peer in self.team}
        self._group_rank = {peer: group_ranks.index(peer) for peer in self.team}
        self._shared = _Device.of(device)
        self._watchdog = Watchdog.get(timeout_s, rank)
        self._peer_tensors: dict[int, torch.Tensor] = {}
        #: executions begun (host side: which send of an execution is the first to a peer, what the watchdog names)
        self.epoch = 0
        self._free_waited: dict[int, int] = {}
        torch.cuda.synchronize(device)  # every flag is set up on every rank before anyone signals
        if dist.get_backend(group) == "nccl":
            dist.barrier(group=group, device_ids=[device.index])
        else:
            dist.barrier(group=group)

    # --- addresses -------------------------------------------------------------------------------------
    def _flag(self, owner: int, index: int) -> int:
        return self._base[owner] + self._flags_at + 4 * index

    def _ready(self, owner: int, sender: int, slot: int) -> int:
        return self._flag(owner, self.team.index(sender) * self.slots + slot)

    def _free(self, owner: int, receiver: int) -> int:
        return self._flag(owner, len(self.team) * self.slots + self.team.index(receiver))

    def _remote(self, block: torch.Tensor, peer: int) -> int:
        return self._base[peer] + block.data_ptr() - self._raw.data_ptr()

    def _remote_view(self, block: torch.Tensor, peer: int) -> torch.Tensor:
        whole = self._peer_tensors.get(peer)
        if whole is None:
            raw = self._handle.get_buffer(self._group_rank[peer], [self._raw.numel()], torch.uint8)
            whole = self._peer_tensors[peer] = raw[:self._flags_at].view(block.dtype)
        return whole.as_strided(block.shape, block.stride(), block.storage_offset())

    # --- the protocol ------------------------------------------------------------------------------------
    def begin(self) -> None:
        self.epoch += 1

    def send(self, src: torch.Tensor, block: torch.Tensor, peer: int, slot: int, step: Hashable, ready: Any,
             done: Any) -> PendingTransfer:
        copy = self._shared.copy_stream
        copy.wait_event(ready)
        if self._free_waited.get(peer) != self.epoch:
            wait_and_reset(copy, self._free(self.rank, peer))
            self._free_waited[peer] = self.epoch
        if src.numel() == 0:
            pass  # nothing to move; the signal still tells the peer this transfer is done
        elif src.is_contiguous() and block.is_contiguous() and src.dtype == block.dtype and src.shape == block.shape:
            copy_bytes(copy, self._remote(block, peer), src.data_ptr(), src.numel() * src.element_size())
        else:  # a strided piece: torch's copy kernel writes the peer's memory through its mapping
            with torch.cuda.stream(copy):
                self._remote_view(block, peer).copy_(src)
        copy_bytes(copy, self._ready(peer, self.rank, slot), self._shared.signal_address, 4)
        done.record(copy)
        return lambda stream: stream.wait_event(done)

    def recv(self, block: torch.Tensor, peer: int, slot: int, step: Hashable) -> PendingTransfer:
        address = self._ready(self.rank, peer, slot)
        return lambda stream: wait_and_reset(stream, address)

    def release(self, stream: Any) -> None:
        current: torch.cuda.Stream = stream
        for peer in self.team:
            if peer != self.rank:
                copy_bytes(current, self._free(peer, self.rank), self._shared.signal_address, 4)
        if not torch.cuda.is_current_stream_capturing():  # a graph's replays are not watched (nor NCCL's)
            self._watchdog.watch(current, f"the P2P transfers into {self.name} over team "
                                          f"({' '.join(map(str, self.team))}) in execution {self.epoch}")


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _enable_group(group: Any) -> None:
    """Register ``group`` with symmetric memory (needed by torch 2.11's rendezvous; deprecated later)."""
    name = group.group_name
    if symm_mem.is_symm_mem_enabled_for_group(name):
        return
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            enable(name)


_PROBED: dict[tuple[tuple[int, ...], int], str | None] = {}


def cuda_transport_problem(team: Sequence[int], rank: int, local_rank: int, local_size: int, device: torch.device,
                           group: Any) -> str | None:
    """Why the CUDA transport cannot run over ``team`` on this machine (None: it can). A collective over
    the team (every member compiles the program): the ranks agree, so all use it or none does."""
    key = (tuple(team), device.index if device.index is not None else -1)
    if key in _PROBED:
        return _PROBED[key]
    reason = _local_problem(team, rank, local_rank, local_size, device)
    agreed = _all_agree(reason is None, device, group)
    if agreed:
        try:
            # pyfuser's transport never multicasts: keep torch from setting multicast objects up.
            os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
            _enable_group(group)
            probe = symm_mem.empty(_ALIGN, dtype=torch.uint8, device=device)
            if len(symm_mem.rendezvous(probe, group.group_name).buffer_ptrs) != len(team):
                reason = "symmetric memory mapped a different number of peers than the team has"
        except Exception as e:  # any failure is a reason to fall back, reported in the warning
            reason = f"torch symmetric memory is unavailable ({type(e).__name__}: {str(e)[:160]})"
        agreed = _all_agree(reason is None, device, group)
    if not agreed and reason is None:
        reason = "another rank of the team cannot use it (its warning says why)"
    _PROBED[key] = reason
    return reason


def _local_problem(team: Sequence[int], rank: int, local_rank: int, local_size: int,
                   device: torch.device) -> str | None:
    if _cu is None:
        return "the cuda-bindings package (stream waits on copy-engine signals) is not installed"
    first = rank - local_rank
    remote = [r for r in team if not first <= r < first + local_size]
    if remote:
        return f"ranks {remote} run on other nodes (copy-engine transfers reach this node's GPUs only)"
    count = torch.cuda.device_count()
    for peer in team:
        other = (peer - first) % count
        if peer != rank and other != device.index and not torch.cuda.can_device_access_peer(device.index, other):
            return f"GPU {device.index} has no peer access to GPU {other} (rank {peer})"
    return None


def _all_agree(ok: bool, device: torch.device, group: Any) -> bool:
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())
