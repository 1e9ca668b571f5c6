"""Host IR nodes for multi-device programs: ``Communication``, ``Wait`` and ``LocalSlice``.

A ``Communication`` posts this rank's part of a collective asynchronously and leaves a handle; the
``Wait`` right after it (kept in the same loop body by the stream pass) waits for it on the current
stream. Output buffers come from the program: inside a stream loop they are chunks of a buffer
allocated once (``into``), elsewhere the node allocates this rank's piece from the bound sizes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from pyfuser.host_ir.nodes import CompileContext, Frame, HostNode, Step
from pyfuser.ir.base import Val, indent_str
from pyfuser.ir.ops import LoadStoreOp
from pyfuser.ir.tensor_view import TensorView
from pyfuser.multidevice.collectives import Pending, post
from pyfuser.multidevice.comm_plan import CommPlan, CommunicationType
from pyfuser.multidevice.sharding import local_extents

if TYPE_CHECKING:
    from pyfuser.multidevice.communicator import Communicator

_ROOTED = (CommunicationType.Broadcast, CommunicationType.SendRecv, CommunicationType.Reduce,
           CommunicationType.Gather, CommunicationType.Scatter)


class _Handle:
    """Slot key of one communication's in-flight work; shared by the Communication and its Wait."""

    __slots__ = ("number",)

    def __init__(self, number: int) -> None:
        self.number = number


class Communication(HostNode):
    """This rank's part of a collective moving ``input`` to ``output`` (``expr``: the resharding set)."""

    def __init__(self, expr: LoadStoreOp, plan: CommPlan, comm: Communicator, *, into: bool = False,
                 handle: _Handle | None = None, input_tv: TensorView | None = None,
                 output_tv: TensorView | None = None) -> None:
        self.expr = expr
        self.source_expr = expr
        self.plan = plan
        self.comm = comm
        self.into = into
        self.handle = handle or _Handle(expr.name)
        self.input_tv: TensorView = input_tv or expr.inputs[0]  # type: ignore[assignment]
        self.output_tv: TensorView = output_tv or expr.output
        #: The stream loop's index when the root is ``team[index]`` (set by ``bind_loop_roots``).
        self.loop_index: Any = None
        rank = comm.rank()
        self._sends = _sends(expr, plan, rank)
        self._receives = _receives(expr, plan, rank)
        self.inputs = [self.input_tv] if self._sends else []
        self.outputs = [self.output_tv] if self._receives else []

    def to_string(self, indent: int = 0) -> str:
        team = " ".join(map(str, self.plan.team))
        root = f", root={self.plan.root}" if self.plan.type in _ROOTED else ""
        if self.plan.root_from_loop:
            root = f", root=team[{self.loop_index}]"
        reduce = f", op={self.plan.reduce_op}" if self.plan.type in (
            CommunicationType.Allreduce, CommunicationType.ReduceScatter, CommunicationType.Reduce) else ""
        return (f"{indent_str(indent)}Communication {self.handle.number} (type={self.plan.type}, team=({team}){root}"
                f"{reduce}, input={self.input_tv}, output={self.output_tv}, backend={self.comm.backend.upper()})\n")

    def substitute(self, mapping: dict[Val, Val]) -> Communication:
        node = Communication(self.expr, self.plan, self.comm, into=self.output_tv in mapping, handle=self.handle,
                             input_tv=mapping.get(self.input_tv, self.input_tv),  # type: ignore[arg-type]
                             output_tv=mapping.get(self.output_tv, self.output_tv))  # type: ignore[arg-type]
        node.loop_index = self.loop_index
        return node

    def read_whole_input(self, tv: TensorView) -> None:
        """Read ``tv`` (this rank's whole shard) instead of a per-iteration chunk of it."""
        self.input_tv = tv
        self.inputs = [tv] if self._sends else []

    def compile(self, cc: CompileContext) -> Step:
        plan, rank, into = self.plan, self.comm.rank(), self.into
        # A team of one moves nothing between processes (post copies locally): no group to create, which
        # on NCCL would need the ranks outside the team to take part.
        solo = len(plan.team) == 1
        group = None if plan.type is CommunicationType.SendRecv or solo else self.comm.group(plan.team)
        src_slot = cc.slot(self.input_tv) if self._sends else None
        dst_slot = cc.slot(self.output_tv) if self._receives else None
        work_slot = cc.slot(self.handle)  # type: ignore[arg-type]
        extents, dtype, device = local_extents(self.expr.output), self.output_tv.dtype.torch_dtype, cc.device
        if plan.root_from_loop and self.loop_index is None:
            raise ValueError(f"Communication {self.handle.number}: its root is the stream loop's index, but it is "
                             f"not in a stream loop ({self.output_tv.short_name} must be stream-parallel)")
        index_slot = cc.slot(self.loop_index) if plan.root_from_loop else None
        team = plan.team

        def step(frame: Frame) -> None:
            values = frame.values
            current = plan if index_slot is None else replace(plan, root=team[values[index_slot]])
            src = values[src_slot] if src_slot is not None else None
            dst = None
            if dst_slot is not None:
                if into:
                    dst = values[dst_slot]
                else:
                    env = frame.ctx.env
                    dst = torch.empty([e.evaluate(env) for e in extents], dtype=dtype, device=device)
                    values[dst_slot] = dst
            values[work_slot] = post(current, rank, group, src, dst)

        return step


class Wait(HostNode):
    """Wait (on the current stream) for a posted ``Communication``."""

    binds_to_previous = True

    def __init__(self, communication: Communication, inputs: list[Any] | None = None) -> None:
        self.communication = communication
        # The collective reads its input until it completes: passes that free or reuse buffers (ring
        # buffers, deallocation) must see this Wait, not the Communication, as the input's last use.
        self.inputs = list(communication.inputs) if inputs is None else inputs
        self.outputs = []

    def substitute(self, mapping: dict[Val, Val]) -> Wait:
        return Wait(self.communication, [mapping.get(v, v) for v in self.inputs])

    def to_string(self, indent: int = 0) -> str:
        return f"{indent_str(indent)}Wait Communication {self.communication.handle.number}\n"

    def compile(self, cc: CompileContext) -> Step:
        slot = cc.slot(self.communication.handle)  # type: ignore[arg-type]
        communication = self.communication
        what = (f"Communication {communication.handle.number} ({communication.plan.type} over team "
                f"({' '.join(map(str, communication.plan.team))}))")

        def step(frame: Frame) -> None:
            pending: Pending = frame.values[slot]
            frame.values[slot] = None
            try:
                pending.wait()
            except RuntimeError as e:  # a peer failed or never joined: say which collective, keep the cause
                raise RuntimeError(f"{what} on rank {communication.comm.rank()} failed; a peer did not complete "
                                   f"it within the {communication.comm.timeout.total_seconds():g}s timeout "
                                   f"(PYFUSER_DIST_TIMEOUT) or failed: {e}") from e

        return step


class LocalSlice(HostNode):
    """A replicated tensor becomes sharded on the same mesh: each rank keeps its slice (no traffic)."""

    def __init__(self, expr: LoadStoreOp, plan: CommPlan, rank: int, *, into: bool = False,
                 input_tv: TensorView | None = None, output_tv: TensorView | None = None) -> None:
        self.expr = expr
        self.source_expr = expr
        self.plan = plan
        self.rank = rank
        self.into = into
        self.input_tv: TensorView = input_tv or expr.inputs[0]  # type: ignore[assignment]
        self.output_tv: TensorView = output_tv or expr.output
        self.inputs = [self.input_tv]
        self.outputs = [self.output_tv]

    def to_string(self, indent: int = 0) -> str:
        pad = indent_str(indent)
        return (f"{pad}{self.output_tv}\n{pad}   = LocalSlice( {self.input_tv}, dim = {self.plan.dim}, "
                f"team = ({' '.join(map(str, self.plan.team))}) )\n")

    def substitute(self, mapping: dict[Val, Val]) -> LocalSlice:
        return LocalSlice(self.expr, self.plan, self.rank, into=self.output_tv in mapping,
                          input_tv=mapping.get(self.input_tv, self.input_tv),  # type: ignore[arg-type]
                          output_tv=mapping.get(self.output_tv, self.output_tv))  # type: ignore[arg-type]

    def compile(self, cc: CompileContext) -> Step:
        src, dst, into = cc.slot(self.input_tv), cc.slot(self.output_tv), self.into
        dim, parts, index = self.plan.dim or 0, len(self.plan.team), self.plan.team.index(self.rank)

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


def _sends(expr: LoadStoreOp, plan: CommPlan, rank: int) -> bool:
    if plan.root_from_loop:
        return True  # every member is the root of one iteration
    if plan.type in (CommunicationType.Broadcast, CommunicationType.Scatter, CommunicationType.SendRecv):
        return rank == plan.root
    return _on_mesh(expr.inputs[0], rank)


def _receives(expr: LoadStoreOp, plan: CommPlan, rank: int) -> bool:
    if plan.type in (CommunicationType.Reduce, CommunicationType.Gather):
        return rank == plan.root
    if plan.type is CommunicationType.SendRecv:
        return rank == plan.peer
    return _on_mesh(expr.output, rank)


def _on_mesh(tv: Val, rank: int) -> bool:
    mesh = getattr(tv, "device_mesh", None)
    return mesh is not None and rank in mesh
