"""Host IR nodes for multi-device programs: ``Communication``, ``Wait`` and ``LocalSlice`` (data).

A ``Communication`` posts this rank's part of a collective asynchronously and leaves a handle; the
``Wait`` right after it (kept in the same loop body by the stream pass) waits for it on the current
stream. Output buffers come from the program: inside a stream loop they are chunks of a buffer
allocated once (``into``), elsewhere the node allocates this rank's piece from the bound sizes.
What they do at run time is ``comm/steps.py``.
"""

from __future__ import annotations

from pyfuser.comm.comm_plan import CommPlan, CommunicationType
from pyfuser.host_ir.nodes import HostNode, LoopIndex, chunk_of
from pyfuser.ir.base import Val, indent_str
from pyfuser.ir.ops import LoadStoreOp
from pyfuser.ir.tensor_view import TensorView

_ROOTED = (CommunicationType.Broadcast, CommunicationType.SendRecv, CommunicationType.Reduce,
           CommunicationType.Gather, CommunicationType.Scatter)


class Handle:
    """Slot key of one communication's in-flight work; shared by the Communication and its Wait."""

    __slots__ = ("number",)

    def __init__(self, number: int) -> None:
        self.number = number


class Communication(HostNode):
    """This rank's part of a collective moving ``input`` to ``output`` (``expr``: the resharding set).

    ``rank`` / ``backend``: who runs it and over what (printed); ``loop_index``: the stream loop's
    index when the root is ``team[index]`` (the "shard outermost" broadcast: each rank reads its
    whole shard in every iteration).
    """

    chunk_local = True  # collectives are issued in program order on every rank, whichever stream posts them
    inputs: list[TensorView]
    outputs: list[TensorView]

    def __init__(self, expr: LoadStoreOp, plan: CommPlan, rank: int, backend: str, *, into: bool = False,
                 handle: Handle | None = None, input_tv: TensorView | None = None,
                 output_tv: TensorView | None = None, loop_index: LoopIndex | None = None) -> None:
        self.expr = expr
        self.source_expr = expr
        self.plan = plan
        self.rank = rank
        self.backend = backend
        self.into = into
        self.handle = handle or Handle(expr.name)
        self.input_tv: TensorView = input_tv or expr.tensor_inputs[0]
        self.output_tv: TensorView = output_tv or expr.output
        self.loop_index = loop_index
        self.sends = _sends(expr, plan, rank)
        self.receives = _receives(expr, plan, rank)
        self.inputs = [self.input_tv] if self.sends else []
        self.outputs = [self.output_tv] if self.receives else []
        self.whole_inputs = (self.input_tv,) if plan.root_from_loop else ()

    def to_string(self, indent: int = 0) -> str:
        team = " ".join(map(str, self.plan.team))
        root = f", root={self.plan.root}" if self.plan.type in _ROOTED else ""
        if self.plan.root_from_loop:
            n = len(self.plan.team)
            root = f", root=team[{self.loop_index}]"
            if self.plan.type is CommunicationType.CollectivePermute:
                p = self.plan.team.index(self.rank)
                root = f", send to team[({p} - {self.loop_index}) % {n}], receive from team[({p} + {self.loop_index}) % {n}]"
        reduce = f", op={self.plan.reduce_op}" if self.plan.type in (
            CommunicationType.Allreduce, CommunicationType.ReduceScatter, CommunicationType.Reduce) else ""
        return (f"{indent_str(indent)}Communication {self.handle.number} (type={self.plan.type}, team=({team}){root}"
                f"{reduce}, input={self.input_tv}, output={self.output_tv}, backend={self.backend.upper()})\n")

    def substitute(self, mapping: dict[Val, Val], index: LoopIndex | None = None) -> Communication:
        return Communication(self.expr, self.plan, self.rank, self.backend, into=self.output_tv in mapping,
                             handle=self.handle,
                             input_tv=chunk_of(mapping, self.input_tv),
                             output_tv=chunk_of(mapping, self.output_tv),
                             loop_index=index if self.plan.root_from_loop else self.loop_index)


class Wait(HostNode):
    """Wait (on the current stream) for a posted ``Communication``."""

    binds_to_previous = True
    chunk_local = True

    inputs: list[TensorView]

    def __init__(self, communication: Communication, inputs: list[TensorView] | None = None) -> None:
        self.communication = communication
        # The collective reads its input until it completes: passes that free or reuse buffers (ring
        # buffers, deallocation) must see this Wait, not the Communication, as the input's last use.
        self.inputs = list(communication.inputs) if inputs is None else inputs
        self.outputs = []

    def substitute(self, mapping: dict[Val, Val], index: LoopIndex | None = None) -> Wait:
        return Wait(self.communication, [chunk_of(mapping, v) for v in self.inputs])

    def to_string(self, indent: int = 0) -> str:
        return f"{indent_str(indent)}Wait Communication {self.communication.handle.number}\n"


class LocalSlice(HostNode):
    """A replicated tensor becomes sharded on the same mesh: each rank keeps its slice (no traffic)."""

    chunk_local = True
    inputs: list[TensorView]
    outputs: list[TensorView]

    def __init__(self, expr: LoadStoreOp, plan: CommPlan, rank: int, *, into: bool = False,
                 input_tv: TensorView | None = None, output_tv: TensorView | None = None) -> None:
        self.expr = expr
        self.source_expr = expr
        self.plan = plan
        self.rank = rank
        self.into = into
        self.input_tv: TensorView = input_tv or expr.tensor_inputs[0]
        self.output_tv: TensorView = output_tv or expr.output
        self.inputs = [self.input_tv]
        self.outputs = [self.output_tv]

    def to_string(self, indent: int = 0) -> str:
        pad = indent_str(indent)
        return (f"{pad}{self.output_tv}\n{pad}   = LocalSlice( {self.input_tv}, dim = {self.plan.dim}, "
                f"team = ({' '.join(map(str, self.plan.team))}) )\n")

    def substitute(self, mapping: dict[Val, Val], index: LoopIndex | None = None) -> LocalSlice:
        return LocalSlice(self.expr, self.plan, self.rank, into=self.output_tv in mapping,
                          input_tv=chunk_of(mapping, self.input_tv),
                          output_tv=chunk_of(mapping, self.output_tv))


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
    return isinstance(tv, TensorView) and tv.device_mesh is not None and rank in tv.device_mesh
