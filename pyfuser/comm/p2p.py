"""Host IR nodes of point-to-point pipelines (data): symmetric buffers, transfers between two ranks and
the per-peer blocks a pipeline computes on. What they do at run time is ``comm/p2p_steps.py``.

A *channel* is a buffer allocated on every rank of a team (``SymmetricAllocate``): peers write blocks of
it (``P2PCommunication`` send: this rank's data into the same block of a peer's buffer, by the copy
engines on CUDA), the owner waits for each block (``P2PCommunication`` recv + ``P2PWait``), and at the end
of an execution tells every peer that the buffer may be written again (``P2PRelease``). Each peer writes
``slots`` blocks into a channel per execution (one per iteration of the stream loop holding the
transfers), and every transfer names its slot, so signals never race.
"""

from __future__ import annotations

from enum import Enum
from typing import ClassVar, Literal

from pyfuser.host_ir.nodes import Allocate, HostNode, LoopIndex
from pyfuser.ir.base import indent_str
from pyfuser.ir.iter_domain import IterDomain
from pyfuser.ir.symbolic import SymExpr
from pyfuser.ir.tensor_view import MemoryType, TensorView


class P2PCommunicationType(Enum):
    SEND = "send"
    RECV = "recv"

    def __str__(self) -> str:
        return self.value


class SymmetricAllocate(Allocate):
    """``tv``'s buffer on every rank of ``team`` (a channel), set up once per shape and reused by every
    execution: peers map it and write blocks of it. ``slots``: how many blocks each peer writes per
    execution. ``backend``: the transport (``cuda``: torch symmetric memory; else an ordinary buffer that
    the process group's send / recv fill). ``source``: what it holds, for error messages."""

    def __init__(self, tv: TensorView, perm: tuple[int, ...], shape: list[SymExpr], team: tuple[int, ...],
                 slots: SymExpr, backend: str, source: str) -> None:
        super().__init__(tv, perm, shape, MemoryType.Symmetric)
        self.team = team
        self.slots = slots
        self.backend = backend
        #: what the buffer holds, for error messages ("the all-gather of T0")
        self.source = source

    def to_string(self, indent: int = 0) -> str:
        text = super().to_string(indent)
        return f"{text[:-1]} (team=({' '.join(map(str, self.team))}), backend={self.backend.upper()})\n"


class ShardSelect(HostNode):
    """``out`` = block ``index`` of ``parts`` equal blocks of ``src`` along dim ``dim`` (a view): the piece of
    a chunk that team position ``index`` owns (printed as a select of that index along ``axis``)."""

    chunk_local = True

    def __init__(self, out: TensorView, src: TensorView, axis: IterDomain, dim: int, parts: int, index: int) -> None:
        self.out = out
        self.src = src
        self.axis = axis
        self.dim = dim
        self.parts = parts
        self.index = index
        self.inputs = [src]
        self.outputs = [out]

    def to_string(self, indent: int = 0) -> str:
        pad = indent_str(indent)
        return f"{pad}{self.out}\n{pad}   = HirAliasSelect( {self.src}, axis = {self.axis}, index = {self.index} )\n"


class P2PStep:
    """What pairs a send with the receive of the same pipeline step (the process-group transport posts the
    two together, so two ranks sending to each other never both block in a send)."""

    __slots__ = ("label",)

    def __init__(self, label: str) -> None:
        self.label = label


class P2PFork(HostNode):
    """The point on the current stream after which the sources of the sends that name it (``sources``) are
    ready: those sends' copies wait for the work issued before this node, not for what is issued between it
    and them. A pipeline forks before this rank's GEMM and issues its sends after it, so the GEMM is submitted
    first (in a CUDA graph of the program, the first work a replay launches) while the copies start at once."""

    chunk_local = True

    def __init__(self, label: str, sources: list[TensorView], backend: str) -> None:
        self.label = label
        self.backend = backend
        self.inputs = list(sources)
        self.outputs = []

    def to_string(self, indent: int = 0) -> str:
        sources = ", ".join(str(tv) for tv in self.inputs)
        return f"{indent_str(indent)}Fork P2PCommunication {self.label} ready: {sources}\n"


class P2PCommunication(HostNode):
    """One transfer of a P2P pipeline, between this rank and ``peer`` (a global rank).

    send: this rank's ``buffer`` goes into block ``remote`` (a view of the channel) of ``peer``'s copy of
    the channel, once the work before ``fork`` (if given; else before this node) is done. recv: ``buffer`` (a
    block of this rank's channel) is being written by ``peer``; the ``P2PWait`` after it waits until it has
    landed. ``loop_index``: the stream loop the transfer runs in (its iteration is the transfer's signal
    slot), None at top level.
    """

    chunk_local = True

    def __init__(self, kind: P2PCommunicationType, buffer: TensorView, channel: TensorView, peer: int, backend: str,
                 step: P2PStep, label: str, *, remote: TensorView | None = None,
                 loop_index: LoopIndex | None = None, fork: P2PFork | None = None) -> None:
        self.kind = kind
        self.buffer = buffer
        self.channel = channel
        self.peer = peer
        self.backend = backend
        self.step = step
        self.label = label
        self.remote = remote
        self.loop_index = loop_index
        self.fork = fork
        if fork is not None and kind is not P2PCommunicationType.SEND:
            raise ValueError(f"P2PCommunication {label}: only a send waits for a fork")
        if kind is P2PCommunicationType.SEND:
            if remote is None:
                raise ValueError(f"P2PCommunication {label}: a send needs the remote block it writes")
            self.inputs = [buffer]
            self.outputs = []
        else:
            self.inputs = []
            self.outputs = [buffer]

    def to_string(self, indent: int = 0) -> str:
        remote = f", remote={self.remote}" if self.remote is not None else ""
        remote += f", after=fork {self.fork.label}" if self.fork is not None else ""
        return (f"{indent_str(indent)}P2PCommunication {self.label} (type={self.kind}, buffer={self.buffer}{remote}, "
                f"peer={self.peer}, backend={self.backend.upper()})\n")


class P2PWait(HostNode):
    """Wait, on the current stream, for a ``P2PCommunication``: a received block has landed; a sent
    buffer may be written again."""

    chunk_local = True

    def __init__(self, communication: P2PCommunication) -> None:
        self.communication = communication
        # The transfer reads (send) or fills (recv) its buffer until this wait: passes that free or reuse
        # buffers must see this node as the buffer's last use.
        self.inputs = [communication.buffer]
        self.outputs = [communication.buffer] if communication.kind is P2PCommunicationType.RECV else []

    def to_string(self, indent: int = 0) -> str:
        return f"{indent_str(indent)}Wait Communication {self.communication.label}\n"


class P2PRelease(HostNode):
    """End of an execution's use of ``channel``: every peer may write it again (the next execution's sends
    wait for this)."""

    keyword: ClassVar[str] = "ReleaseSymmetricBuffer"

    def __init__(self, channel: TensorView, team: tuple[int, ...], backend: str) -> None:
        self.channel = channel
        self.team = team
        self.backend = backend
        self.inputs = [channel]
        self.outputs = []

    def to_string(self, indent: int = 0) -> str:
        return (f"{indent_str(indent)}{self.keyword} {self.channel} (team=({' '.join(map(str, self.team))}), "
                f"backend={self.backend.upper()})\n")


class BlockUpdate(HostNode):
    """``out`` updated in place from ``inp`` (``out`` a block of a whole tensor): ``add`` for a
    reduce-scatter's received partial sums added to this rank's own, ``copy`` for an all-gather pipeline
    whose gathered tensor is also read after its GEMMs (this rank's shard and each received block)."""

    chunk_local = True

    def __init__(self, out: TensorView, inp: TensorView, op: Literal["add", "copy"]) -> None:
        self.out = out
        self.inp = inp
        self.op = op
        self.inputs = [out, inp]
        self.outputs = [out]

    def to_string(self, indent: int = 0) -> str:
        pad = indent_str(indent)
        value = f"{self.out}\n{pad}   + {self.inp}" if self.op == "add" else f"copy of {self.inp}"
        return f"{pad}{self.out}\n{pad}   = {value}\n"
