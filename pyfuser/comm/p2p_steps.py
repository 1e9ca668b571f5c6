"""Step builders of the P2P nodes (``comm/p2p.py``): open a channel per shape, transfer blocks, wait for
them, release the channel, add received partial sums, and take per-peer blocks of chunks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pyfuser.comm.communicator import Communicator
from pyfuser.comm.p2p import (
    BlockUpdate,
    P2PCommunication,
    P2PCommunicationType,
    P2PFork,
    P2PRelease,
    P2PWait,
    ShardSelect,
    SymmetricAllocate,
)
from pyfuser.comm.p2p_transport import Channel, ProcessGroupChannel, check_same_shapes
from pyfuser.comm.symmetric_memory import CudaChannel
from pyfuser.host_ir.frame import CompileContext, Frame, Step, StepBuilder
from pyfuser.ir.layout import dense_strides
from pyfuser.ir.tensor_view import TensorView


@dataclass(frozen=True)
class _ChannelSlot:
    """Key of the value slot holding a channel's run-time object during an execution."""

    buffer: TensorView


@dataclass(frozen=True)
class _ForkSlot:
    """Key of the value slot holding the event a fork recorded, until the sends that name it."""

    fork: P2PFork


@dataclass(frozen=True)
class _PendingSlot:
    """Key of the value slot holding a posted transfer until its wait."""

    communication: P2PCommunication


def build_symmetric_allocate(node: SymmetricAllocate, cc: CompileContext) -> Step:
    comm = Communicator.instance()
    rank, team, device, dtype = comm.rank(), node.team, cc.device, node.tv.dtype.torch_dtype
    comm.group(team)  # created when the program is compiled; looked up (not kept) when it runs
    out, channel_slot = cc.slot(node.tv), cc.slot(_ChannelSlot(node.tv))
    shape, perm, slots_expr, name = node.shape, node.perm, node.slots, node.tv.short_name
    timeout_s = comm.timeout.total_seconds()
    opened: dict[tuple[Any, ...], Channel] = {}  # the channel of the latest shape

    def open_channel(sizes: list[int], slots: int) -> Channel:
        check_same_shapes(comm.group(team), team, rank, name, node.source, sizes, dtype, slots, device)
        if node.backend == "cuda":
            return CudaChannel(name, team, rank, comm.group(team), sizes, perm, dtype, slots, device, timeout_s)
        local = torch.empty_strided(sizes, dense_strides(sizes, list(perm)), dtype=dtype, device=device)
        return ProcessGroupChannel(local, lambda: comm.group(team))

    def step(frame: Frame) -> None:
        env = frame.ctx.env
        sizes = [e.evaluate(env) for e in shape]
        slots = slots_expr.evaluate(env)
        key = (tuple(sizes), slots)
        channel = opened.get(key)
        if channel is None:
            opened.clear()
            channel = opened[key] = open_channel(sizes, slots)
        channel.begin()
        frame.values[out] = channel.local
        frame.values[channel_slot] = channel

    return step


def build_shard_select(node: ShardSelect, cc: CompileContext) -> Step:
    src, out, dim, parts, index = cc.slot(node.src), cc.slot(node.out), node.dim, node.parts, node.index

    def step(frame: Frame) -> None:
        values = frame.values
        whole = values[src]
        length = whole.shape[dim] // parts
        values[out] = whole.narrow(dim, index * length, length)

    return step


def build_p2p_communication(node: P2PCommunication, cc: CompileContext) -> Step:
    channel, buffer, pending = cc.slot(_ChannelSlot(node.channel)), cc.slot(node.buffer), cc.slot(_PendingSlot(node))
    index = cc.slot(node.loop_index) if node.loop_index is not None else None
    peer, step_key = node.peer, node.step
    if node.kind is P2PCommunicationType.RECV:
        def recv(frame: Frame) -> None:
            values = frame.values
            slot = values[index] if index is not None else 0
            values[pending] = values[channel].recv(values[buffer], peer, slot, step_key)

        return recv
    assert node.remote is not None  # checked when the node is made
    remote = cc.slot(node.remote)
    # The CUDA transport orders its copy stream with two events per send: the source is ready (recorded here,
    # or by the fork the send names), the copy done.
    cuda = node.backend == "cuda"
    own_ready, done = (torch.cuda.Event(), torch.cuda.Event()) if cuda else (None, None)
    forked = cc.slot(_ForkSlot(node.fork)) if node.fork is not None and cuda else None

    def send(frame: Frame) -> None:
        values = frame.values
        slot = values[index] if index is not None else 0
        ready = own_ready
        if forked is not None:
            ready = values[forked]
        elif ready is not None:
            ready.record(_current_stream(frame))
        values[pending] = values[channel].send(values[buffer], values[remote], peer, slot, step_key, ready, done)

    return send


def build_p2p_fork(node: P2PFork, cc: CompileContext) -> Step:
    if node.backend != "cuda":  # the process group's transfers are posted in program order
        return lambda frame: None
    forked, event = cc.slot(_ForkSlot(node)), torch.cuda.Event()

    def step(frame: Frame) -> None:
        event.record(_current_stream(frame))
        frame.values[forked] = event

    return step


def build_p2p_wait(node: P2PWait, cc: CompileContext) -> Step:
    communication = node.communication
    pending = cc.slot(_PendingSlot(communication))
    rank = Communicator.instance().rank()
    timeout = Communicator.instance().timeout.total_seconds()
    what = f"P2PCommunication {communication.label} ({communication.kind} with rank {communication.peer})"

    def step(frame: Frame) -> None:
        finish = frame.values[pending]
        frame.values[pending] = None
        try:
            finish(_current_stream(frame))
        except RuntimeError as e:  # a peer failed or never joined: say which transfer, keep the cause
            raise RuntimeError(f"{what} on rank {rank} failed; the peer did not complete it within the {timeout:g}s "
                               f"timeout (PYFUSER_DIST_TIMEOUT) or failed: {e}") from e

    return step


def build_p2p_release(node: P2PRelease, cc: CompileContext) -> Step:
    channel = cc.slot(_ChannelSlot(node.channel))

    def step(frame: Frame) -> None:
        frame.values[channel].release(_current_stream(frame))

    return step


def build_block_update(node: BlockUpdate, cc: CompileContext) -> Step:
    out, inp = cc.slot(node.out), cc.slot(node.inp)
    update = torch.Tensor.add_ if node.op == "add" else torch.Tensor.copy_

    def step(frame: Frame) -> None:
        values = frame.values
        update(values[out], values[inp])

    return step


P2P_STEP_BUILDERS: dict[type, StepBuilder] = {
    BlockUpdate: build_block_update,
    SymmetricAllocate: build_symmetric_allocate,
    ShardSelect: build_shard_select,
    P2PCommunication: build_p2p_communication,
    P2PFork: build_p2p_fork,
    P2PWait: build_p2p_wait,
    P2PRelease: build_p2p_release,
}


def _current_stream(frame: Frame) -> Any:
    """The stream the program runs on: the stream loop's, or torch's current one (a program without
    stream loops keeps no stream state)."""
    if frame.streams is not None and frame.streams.current is not None:
        return frame.streams.current
    return torch.cuda.current_stream() if torch.cuda.is_available() else None
