"""The run-time side of a P2P channel (``comm/p2p.py``), for one shape: what a send, a receive and a release
do. Two transports implement it:

* ``ProcessGroupChannel`` (here): an ordinary buffer filled by the process group's ``isend`` / ``irecv``
  (gloo on CPUs; NCCL where the CUDA transport is unavailable). A send is posted together with the
  receive of the same pipeline step (``batch_isend_irecv``), so two ranks sending to each other never
  both block in a send.
* ``CudaChannel`` (``comm/symmetric_memory.py``): torch symmetric memory, copy-engine writes and
  stream-side signals.

Every channel is opened by a collective over its team that first compares the shapes the ranks derived
from their inputs: shards of different shapes are a ValueError on every rank, before any transfer.
"""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
import torch.distributed as dist

#: Completes a posted transfer (a received block has landed / a sent buffer may be written again) on the
#: stream current when it is called (None on CPUs).
PendingTransfer = Callable[[Any], None]

_META_LEN = 16  # ints describing a channel's shape on one rank (rank, dtype, slots, ndim, sizes...)


class Channel(ABC):
    """This rank's part of a P2P channel for one shape; ``local`` is its buffer."""

    local: torch.Tensor

    @abstractmethod
    def begin(self) -> None:
        """An execution starts using the channel."""

    @abstractmethod
    def send(self, src: torch.Tensor, block: torch.Tensor, peer: int, slot: int, step: Hashable, ready: Any,
             done: Any) -> PendingTransfer:
        """Start writing ``src`` into ``peer``'s copy of ``block`` (a view of ``local``) as transfer ``slot``, once
        ``ready`` (an event recorded where ``src`` is ready; None on CPUs) completes; ``done``: the event the
        transport may record when the copy is done."""

    @abstractmethod
    def recv(self, block: torch.Tensor, peer: int, slot: int, step: Hashable) -> PendingTransfer:
        """Start receiving ``peer``'s transfer ``slot`` into ``block`` (a view of ``local``)."""

    @abstractmethod
    def release(self, stream: Any) -> None:
        """The execution is done with the buffer (on ``stream``): peers may write it again."""


def check_same_shapes(group: Any, team: Sequence[int], rank: int, name: str, source: str, shape: Sequence[int],
                      dtype: torch.dtype, slots: int, device: torch.device) -> None:
    """Every rank of ``team`` derived the same buffer from its shards, else a ValueError (on every rank,
    since every rank sees all shapes) naming the buffer, the axis and the ranks."""
    if len(shape) + 4 > _META_LEN:
        raise ValueError(f"{name}: a P2P buffer has at most {_META_LEN - 4} dims, got {len(shape)}")
    mine = [_dtype_code(dtype), slots, len(shape), *shape]
    mine += [0] * (_META_LEN - 1 - len(mine))
    meta = torch.tensor([rank, *mine], dtype=torch.int64, device=device)
    gathered = torch.empty(len(team) * _META_LEN, dtype=torch.int64, device=device)
    dist.all_gather_into_tensor(gathered, meta, group=group)
    rows = {int(r[0]): [int(v) for v in r[1:]] for r in gathered.view(len(team), _META_LEN).cpu()}
    for other, theirs in rows.items():
        if theirs == mine:
            continue
        their_shape = theirs[3:3 + theirs[2]]
        if theirs[2] != len(shape):
            what = f"has {len(shape)} dims on rank {rank} but {theirs[2]} on rank {other}"
        else:
            axis = next((a for a, (x, y) in enumerate(zip(shape, their_shape, strict=True)) if x != y), None)
            if axis is None:
                what = f"differs in dtype or pipeline length between rank {rank} and rank {other}"
            else:
                what = f"axis {axis} has extent {shape[axis]} on rank {rank} but {their_shape[axis]} on rank {other}"
        raise ValueError(f"{name} (the P2P buffer of {source}) {what}: every rank of team "
                         f"({' '.join(map(str, team))}) must pass shards of the same shape")


def _dtype_code(dtype: torch.dtype) -> int:
    return zlib.crc32(str(dtype).encode())  # the same number in every process (``hash`` is salted per process)


class _Posted:
    """Works posted together; waited for once, by whichever of their transfers is waited for first (a
    gloo work must not be waited for twice)."""

    __slots__ = ("works",)

    def __init__(self, works: list[Any]) -> None:
        self.works: list[Any] | None = works

    def wait(self) -> None:
        works, self.works = self.works, None
        for work in works or ():
            work.wait()


class ProcessGroupChannel(Channel):
    """A plain buffer filled by the process group's send / recv (gloo on CPUs, NCCL as the fallback).

    ``group`` returns the team's group when a transfer is posted: the channel keeps no reference to it, so
    the communicator's teardown ends the group."""

    def __init__(self, local: torch.Tensor, group: Callable[[], Any]) -> None:
        self.local = local
        self._group = group
        self._unposted: dict[tuple[Hashable, int], tuple[torch.Tensor, int]] = {}
        self._posted: dict[tuple[Hashable, int], _Posted] = {}

    def begin(self) -> None:
        self._unposted.clear()
        self._posted.clear()

    def send(self, src: torch.Tensor, block: torch.Tensor, peer: int, slot: int, step: Hashable, ready: Any,
             done: Any) -> PendingTransfer:
        key = (step, slot)
        self._unposted[key] = (src.contiguous(), peer)

        def wait(stream: Any) -> None:
            posted = self._posted.pop(key, None)
            if posted is None:  # no receive of this step was posted: send alone
                tensor, to = self._unposted.pop(key)
                posted = _Posted([dist.isend(tensor, dst=to, group=self._group())])
            posted.wait()

        return wait

    def recv(self, block: torch.Tensor, peer: int, slot: int, step: Hashable) -> PendingTransfer:
        key = (step, slot)
        staging = block if block.is_contiguous() else torch.empty(block.shape, dtype=block.dtype, device=block.device)
        group = self._group()
        ops = [dist.P2POp(dist.irecv, staging, peer, group=group)]
        paired = self._unposted.pop(key, None)
        if paired is not None:
            ops.insert(0, dist.P2POp(dist.isend, paired[0], paired[1], group=group))
        posted = _Posted(list(dist.batch_isend_irecv(ops)))
        if paired is not None:
            self._posted[key] = posted

        def wait(stream: Any) -> None:
            posted.wait()
            if staging is not block:
                block.copy_(staging)

        return wait

    def release(self, stream: Any) -> None:
        """Nothing to tell the peers: a receive is posted only when the buffer may be written (program order)."""
