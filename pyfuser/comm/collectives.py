"""Running one rank's part of a communication with torch.distributed, asynchronously.

Every collective is posted with ``async_op=True`` and returns a ``Pending``; ``Pending.wait()`` waits for
it (on CUDA: makes the *current* stream wait for NCCL's stream, so the host never blocks) and then runs
the copy, if any, that moves a staging buffer into the destination. Staging is needed when the gathered
or scattered dim is not the outermost one of a contiguous tensor, or when a team is not in ascending rank
order (torch.distributed numbers group members by ascending global rank).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from pyfuser.comm.comm_plan import CommPlan, CommunicationType

# torch >= 2.13 names the flat-tensor collectives ``*_single`` (the old names warn); older builds lack them.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
               "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


@dataclass(slots=True)
class Pending:
    works: list[Any] = field(default_factory=list)
    #: copies a staging buffer to its destination once the work is done (its result is not read)
    finish: Callable[[], object] | None = None

    def wait(self) -> None:
        for work in self.works:
            work.wait()
        if self.finish is not None:
            self.finish()


def _group_order(team: Sequence[int]) -> list[int] | None:
    """Team positions in group-rank order, or None when the team is already ascending."""
    ordered = sorted(team)
    return None if list(team) == ordered else [list(team).index(r) for r in ordered]


def _team_order(team: Sequence[int]) -> list[int] | None:
    """Group ranks in team order, or None when the team is already ascending."""
    ordered = sorted(team)
    return None if list(team) == ordered else [ordered.index(r) for r in team]


def _outer_contiguous(t: torch.Tensor, dim: int) -> bool:
    """True when splitting ``t`` along ``dim`` gives contiguous, consecutive pieces of its memory."""
    return t.is_contiguous() and math.prod(t.shape[:dim]) == 1


def _staging(dst: torch.Tensor) -> torch.Tensor:
    return dst if dst.is_contiguous() else torch.empty(dst.shape, dtype=dst.dtype, device=dst.device)


def _finish_reduce(buf: torch.Tensor, dst: torch.Tensor | None, op: str, parts: int) -> Callable[[], None] | None:
    if op != "mean" and (dst is None or buf is dst):
        return None

    def finish() -> None:
        if op == "mean":
            buf.div_(parts)
        if dst is not None and buf is not dst:
            dst.copy_(buf)

    return finish


def post(plan: CommPlan, rank: int, group: Any, src: torch.Tensor | None, dst: torch.Tensor | None) -> Pending:
    """Start this rank's part of ``plan``: ``src`` is its input piece (None where it holds none), ``dst``
    the buffer it receives into (None where it receives nothing)."""
    kind = plan.type
    team = plan.team
    parts = len(team)
    if parts == 1 and kind is not CommunicationType.SendRecv:
        return _solo(src, dst)
    if kind is CommunicationType.Allgather:
        return _allgather(plan, group, _need(src, plan, "input"), _need(dst, plan, "output"))
    if kind is CommunicationType.ReduceScatter:
        return _reduce_scatter(plan, group, _need(src, plan, "input"), _need(dst, plan, "output"))
    if kind is CommunicationType.Allreduce:
        src_t, dst_t = _need(src, plan, "input"), _need(dst, plan, "output")
        buf = _staging(dst_t)
        buf.copy_(src_t)
        work = dist.all_reduce(buf, op=_REDUCE_OPS[plan.reduce_op], group=group, async_op=True)
        return Pending([work], _finish_reduce(buf, dst_t, plan.reduce_op, parts))
    if kind is CommunicationType.Broadcast:
        if dst is not None:
            buf = _staging(dst)
            if rank == plan.root:
                buf.copy_(_need(src, plan, "input"))
        else:
            buf = _need(src, plan, "input").contiguous()
        work = dist.broadcast(buf, src=plan.root, group=group, async_op=True)
        return Pending([work], None if dst is None or buf is dst else (lambda: dst.copy_(buf)))
    if kind is CommunicationType.SendRecv:
        return _send_recv(plan, rank, src, dst)
    if kind is CommunicationType.Reduce:
        buf = _need(src, plan, "input").contiguous().clone()
        work = dist.reduce(buf, dst=plan.root, op=_REDUCE_OPS[plan.reduce_op], group=group, async_op=True)
        return Pending([work], _finish_reduce(buf, dst, plan.reduce_op, parts) if rank == plan.root else None)
    if kind is CommunicationType.Gather:
        return _gather(plan, rank, group, _need(src, plan, "input"), dst)
    if kind is CommunicationType.Scatter:
        return _scatter(plan, rank, group, src, _need(dst, plan, "output"))
    if kind is CommunicationType.AllToAll:
        return _all_to_all(plan, group, _need(src, plan, "input"), _need(dst, plan, "output"))
    if kind is CommunicationType.CollectivePermute:
        return _collective_permute(plan, rank, _need(src, plan, "input"), _need(dst, plan, "output"))
    raise ValueError(f"{kind} is not a communication that torch.distributed runs")


def _collective_permute(plan: CommPlan, rank: int, src: torch.Tensor, dst: torch.Tensor) -> Pending:
    """This rank's shard to ``plan.peer`` and ``plan.root``'s into ``dst``, together (every rank sends and
    receives once: no order to deadlock on); its own shard (``peer`` is this rank) is a local copy."""
    if plan.peer == rank:
        dst.copy_(src.reshape(dst.shape))
        return Pending()
    staging = _staging(dst)
    ops = [dist.P2POp(dist.isend, src.contiguous(), plan.peer), dist.P2POp(dist.irecv, staging, plan.root)]
    works = dist.batch_isend_irecv(ops)
    return Pending(list(works), None if staging is dst else (lambda: dst.copy_(staging)))


def _solo(src: torch.Tensor | None, dst: torch.Tensor | None) -> Pending:
    """A collective over a team of one rank: its input is its output (a sum / mean / max of one part)."""
    if dst is not None and src is not None:
        dst.copy_(src.reshape(dst.shape))
    return Pending()


def _need(t: torch.Tensor | None, plan: CommPlan, what: str) -> torch.Tensor:
    if t is None:
        raise ValueError(f"{plan.type} over team {list(plan.team)}: this rank has no {what} tensor")
    return t


def _allgather(plan: CommPlan, group: Any, src: torch.Tensor, dst: torch.Tensor) -> Pending:
    parts, dim = len(plan.team), plan.dim or 0
    order = _team_order(plan.team)
    src = src.contiguous()
    if order is None and _outer_contiguous(dst, dim):
        work = _all_gather_flat(dst.view(-1), src.view(-1), group=group, async_op=True)
        return Pending([work])
    stacked = torch.empty((parts, *src.shape), dtype=src.dtype, device=src.device)
    work = _all_gather_flat(stacked.view(-1), src.view(-1), group=group, async_op=True)

    def finish() -> None:
        pieces = stacked if order is None else stacked[order]
        dst.copy_(pieces.movedim(0, dim).reshape(dst.shape))

    return Pending([work], finish)


def _reduce_scatter(plan: CommPlan, group: Any, src: torch.Tensor, dst: torch.Tensor) -> Pending:
    parts, dim = len(plan.team), plan.dim or 0
    order = _group_order(plan.team)
    stacked = src.unflatten(dim, (parts, src.shape[dim] // parts)).movedim(dim, 0)
    if order is not None:
        stacked = stacked[order]
    buf = _staging(dst)
    work = _reduce_scatter_flat(buf.view(-1), stacked.contiguous().view(-1), op=_REDUCE_OPS[plan.reduce_op],
                                group=group, async_op=True)
    return Pending([work], _finish_reduce(buf, dst, plan.reduce_op, parts))


def _send_recv(plan: CommPlan, rank: int, src: torch.Tensor | None, dst: torch.Tensor | None) -> Pending:
    sender, receiver = plan.root, plan.peer
    if sender == receiver:
        _need(dst, plan, "output").copy_(_need(src, plan, "input"))
        return Pending()
    if rank == sender:
        return Pending([dist.isend(_need(src, plan, "input").contiguous(), dst=receiver)])
    out = _need(dst, plan, "output")
    buf = _staging(out)
    work = dist.irecv(buf, src=sender)
    return Pending([work], None if buf is out else (lambda: out.copy_(buf)))


def _gather(plan: CommPlan, rank: int, group: Any, src: torch.Tensor, dst: torch.Tensor | None) -> Pending:
    parts, dim = len(plan.team), plan.dim or 0
    src = src.contiguous()
    if rank != plan.root:
        return Pending([dist.gather(src, None, dst=plan.root, group=group, async_op=True)])
    stacked = torch.empty((parts, *src.shape), dtype=src.dtype, device=src.device)
    work = dist.gather(src, list(stacked.unbind(0)), dst=plan.root, group=group, async_op=True)
    order = _team_order(plan.team)
    target = _need(dst, plan, "output")

    def finish() -> None:
        pieces = stacked if order is None else stacked[order]
        target.copy_(pieces.movedim(0, dim).reshape(target.shape))

    return Pending([work], finish)


def _scatter(plan: CommPlan, rank: int, group: Any, src: torch.Tensor | None, dst: torch.Tensor) -> Pending:
    parts, dim = len(plan.team), plan.dim or 0
    pieces = None
    if rank == plan.root:
        full = _need(src, plan, "input")
        stacked = full.unflatten(dim, (parts, full.shape[dim] // parts)).movedim(dim, 0)
        order = _group_order(plan.team)
        if order is not None:
            stacked = stacked[order]
        pieces = [p.contiguous() for p in stacked.unbind(0)]
    buf = _staging(dst)
    work = dist.scatter(buf, pieces, src=plan.root, group=group, async_op=True)
    return Pending([work], None if buf is dst else (lambda: dst.copy_(buf)))


def _all_to_all(plan: CommPlan, group: Any, src: torch.Tensor, dst: torch.Tensor) -> Pending:
    """Split the local shard along ``plan.dim`` into one piece per team member, exchange, and lay the
    pieces received (team order) along ``plan.concat_dim``."""
    parts, split, concat = len(plan.team), plan.dim or 0, plan.concat_dim or 0
    pieces = src.unflatten(split, (parts, src.shape[split] // parts)).movedim(split, 0)
    order = _group_order(plan.team)
    send = (pieces if order is None else pieces[order]).contiguous()  # send[k] goes to group rank k
    received = torch.empty_like(send)
    work = dist.all_to_all_single(received.view(-1), send.view(-1), group=group, async_op=True)
    team_order = _team_order(plan.team)

    def finish() -> None:
        ordered = received if team_order is None else received[team_order]
        dst.copy_(ordered.movedim(0, concat).reshape(dst.shape))

    return Pending([work], finish)
