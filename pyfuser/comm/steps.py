"""Step builders of the multi-device nodes: post a collective, wait for it, slice locally."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from pyfuser.comm.collectives import Pending, post
from pyfuser.comm.comm_plan import CommPlan, CommunicationType
from pyfuser.comm.communicator import Communicator
from pyfuser.comm.nodes import Communication, LocalSlice, Wait
from pyfuser.host_ir.frame import CompileContext, Frame, Step, StepBuilder
from pyfuser.ir.analysis.sharding import local_extents


def build_communication(node: Communication, cc: CompileContext) -> Step:
    plan, rank, into = node.plan, node.rank, node.into
    comm = Communicator.instance()
    # A team of one moves nothing between processes (post copies locally): no group to create, which
    # on NCCL would need the ranks outside the team to take part.
    solo = len(plan.team) == 1
    grouped = not (plan.type is CommunicationType.SendRecv or solo)
    if grouped:
        comm.group(plan.team)  # created when the program is compiled; looked up (not kept) when it runs
    src_slot = cc.slot(node.input_tv) if node.sends else None
    dst_slot = cc.slot(node.output_tv) if node.receives else None
    work_slot = cc.slot(node.handle)
    extents, dtype, device = local_extents(node.expr.output), node.output_tv.dtype.torch_dtype, cc.device
    if plan.root_from_loop and node.loop_index is None:
        raise ValueError(f"Communication {node.handle.number}: its root is the stream loop's index, but it is "
                         f"not in a stream loop ({node.output_tv.short_name} must be stream-parallel)")
    index_slot = cc.slot(node.loop_index) if plan.root_from_loop else None
    team = plan.team

    permute = plan.type is CommunicationType.CollectivePermute
    position = team.index(rank) if rank in team else 0

    def peers(i: int) -> CommPlan:
        """The plan of iteration ``i`` of the loop: the broadcast's root, or the permute's receive-from (root)
        and send-to (peer) ranks."""
        if permute:
            return replace(plan, root=team[(position + i) % len(team)], peer=team[(position - i) % len(team)])
        return replace(plan, root=team[i])

    def step(frame: Frame) -> None:
        values = frame.values
        current = plan if index_slot is None else peers(values[index_slot])
        src = values[src_slot] if src_slot is not None else None
        dst = None
        if dst_slot is not None:
            if into:
                dst = values[dst_slot]
            else:
                env = frame.ctx.env
                dst = torch.empty([e.evaluate(env) for e in extents], dtype=dtype, device=device)
                values[dst_slot] = dst
        values[work_slot] = post(current, rank, comm.group(team) if grouped else None, src, dst)

    return step


def build_wait(node: Wait, cc: CompileContext) -> Step:
    slot = cc.slot(node.communication.handle)
    communication = node.communication
    timeout = Communicator.instance().timeout.total_seconds()
    what = (f"Communication {communication.handle.number} ({communication.plan.type} over team "
            f"({' '.join(map(str, communication.plan.team))}))")

    def step(frame: Frame) -> None:
        pending: Pending = frame.values[slot]
        frame.values[slot] = None
        try:
            pending.wait()
        except RuntimeError as e:  # a peer failed or never joined: say which collective, keep the cause
            raise RuntimeError(f"{what} on rank {communication.rank} failed; a peer did not complete it within the "
                               f"{timeout:g}s timeout (PYFUSER_DIST_TIMEOUT) or failed: {e}") from e

    return step


def build_local_slice(node: LocalSlice, cc: CompileContext) -> Step:
    src, dst, into = cc.slot(node.input_tv), cc.slot(node.output_tv), node.into
    dim, parts, index = node.plan.dim or 0, len(node.plan.team), node.plan.team.index(node.rank)

    def step(frame: Frame) -> None:
        values = frame.values
        full: Any = values[src]
        length = full.shape[dim] // parts
        piece = full.narrow(dim, index * length, length)
        if into:
            values[dst].copy_(piece)
        else:
            values[dst] = piece

    return step


COMM_STEP_BUILDERS: dict[type, StepBuilder] = {
    Communication: build_communication,
    Wait: build_wait,
    LocalSlice: build_local_slice,
}
