"""Host IR: the per-rank program that allocates buffers, launches segments and drives CUDA streams.

Nodes are data. A ``HostIrContainer`` holds a list of top-level ``HostNode``s; a ``ForLoop`` and a
``CaptureGraph`` each hold a body of nodes. Stream management nodes (``GetCurrentStream``, ``SetCurrentStream``, ``Synchronize``,
ring-buffer slot events) live in ``stream_nodes.py``. Values are the fusion's own ``TensorView``s /
``Scalar``s plus two host-only kinds: ``LoopIndex`` (``StreamIdx``) and ``HostStream`` (``Stream 0``,
``Stream ( StreamIdx % numberOfStreams )``). What a node does at run time is the business of the
executor that visits the program (``host_ir/evaluator.py`` and the step builders it is given).

Adding a node:

1. subclass ``HostNode``; set ``inputs`` / ``outputs`` (the Vals it reads / writes: passes use them
   to find producers and last uses) and implement ``to_string(indent)``;
2. give the evaluator a step builder for it (``runtime/backends.py`` lists them all);
3. if it may sit in a stream loop, implement ``substitute(mapping, index)`` returning the node
   rewritten on per-chunk tensors (``mapping``: full tensor -> its ``HirAliasSelect`` chunk;
   ``index``: the loop's index), and set ``source_expr`` to the fusion Expr it computes so the
   stream pass can read its stream axis. A node that must stay right after its predecessor
   (``Wait`` after ``Communication``) sets ``binds_to_previous = True``; one that reads an input
   whole in every iteration lists it in ``whole_inputs``; one whose effects stay within the chunks it
   reads and writes (no state carried from one iteration to the next) sets ``chunk_local = True``,
   which lets iterations of its loop run concurrently (``passes/stream_overlap.py``).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast, runtime_checkable

import torch

from pyfuser.ir.analysis.sharding import local_extents
from pyfuser.ir.base import Expr, Scalar, Val, indent_str
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.symbolic import SymExpr, SymVar, product
from pyfuser.ir.tensor_view import MemoryType, TensorView

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion
    from pyfuser.ir.iter_domain import IterDomain

#: Bound at evaluation to the size of the evaluator's worker-stream pool.
NUMBER_OF_STREAMS = SymVar("numberOfStreams")


# --- host-only values ------------------------------------------------------------------------------
class LoopIndex:
    """The index of a stream ``ForLoop`` and the chunk of a logical axis each iteration covers.

    Iteration ``i`` covers ``[i * chunk, min((i + 1) * chunk, extent))`` of the chunked logical
    axis: ``chunk`` is 1 for a stream-parallel logical ID and ``ceilDiv`` for an outer split.
    """

    def __init__(self, extent: SymExpr, chunk: SymExpr, name: str = "StreamIdx",
                 rotation: tuple[int, int] | None = None) -> None:
        self.name = name
        self.extent = extent
        self.chunk = chunk
        #: a swizzled loop (``IterDomain.swizzle``): (``p``, ``n``), iteration ``i`` covers chunk ``(i + p) % n``
        #: (``p`` this rank's position in a team of ``n`` along the swizzle's parallel type)
        self.rotation = rotation

    def chunk_index(self, i: int) -> int:
        """The chunk iteration ``i`` covers."""
        if self.rotation is None:
            return i
        shift, count = self.rotation
        return (i + shift) % count

    def chunk_text(self) -> str:
        """The chunk index as dumps print it."""
        return self.name if self.rotation is None else f"( {self.name} + {self.rotation[0]} ) % {self.rotation[1]}"

    def __str__(self) -> str:
        return self.name


class HostStream:
    """A CUDA stream value: a named one (``Stream 0``) or the worker picked by a loop index."""

    def __init__(self, number: int | None = None, index: LoopIndex | None = None) -> None:
        self.number = number
        self.index = index

    def __str__(self) -> str:
        if self.index is not None:
            return f"Stream ( {self.index} % {NUMBER_OF_STREAMS} )"
        return f"Stream {self.number}"


HostVal = Val | LoopIndex | HostStream


# --- nodes ----------------------------------------------------------------------------------------------
class HostNode(ABC):
    #: Read-only to passes (a pass rewrites a node with ``substitute``), so a node holding fusion values
    #: only declares ``list[Val]``.
    inputs: Sequence[HostVal]
    outputs: Sequence[HostVal]
    #: The fusion Expr this node computes, for nodes the stream pass may put in a loop.
    source_expr: Expr | None = None
    binds_to_previous: ClassVar[bool] = False
    #: Inputs read whole in every iteration of a stream loop rather than chunk by chunk.
    whole_inputs: tuple[Val, ...] = ()
    #: Its effects stay within the chunks it reads and writes: iterations of a loop made only of such
    #: nodes are independent and may run concurrently (a custom node keeps the per-iteration joins of docs/stream_lowering.md).
    chunk_local: ClassVar[bool] = False

    @abstractmethod
    def to_string(self, indent: int = 0) -> str:
        """The node in nvFuser's Host IR dump format (docs/stream_lowering.md)."""

    def substitute(self, mapping: dict[Val, Val], index: LoopIndex | None = None) -> HostNode:
        """This node on per-chunk values inside the loop of ``index``; nodes that only read
        loop-invariant values return self. A node whose ``source_expr`` can read one tensor at several
        positions (``AtenCall``) also takes ``operands=``: the expr's inputs position by position, for
        when one position reads a chunk and another the whole tensor (``matmul(x, x)`` by rows); the
        stream pass passes it only then."""
        return self

    def __str__(self) -> str:
        return self.to_string()


def chunk_of(mapping: dict[Val, Val], tv: TensorView) -> TensorView:
    """``tv`` as a substituted node reads it: its chunk where ``mapping`` has one, else itself."""
    # cast: the stream pass maps a tensor only to a tensor (its HirAliasSelect chunk)
    return cast(TensorView, mapping.get(tv, tv))


def tensor_shape(tv: TensorView) -> list[SymExpr]:
    """Extents of the piece of ``tv`` this rank holds (reductions dropped)."""
    if tv.device_mesh is not None:
        return local_extents(tv)
    return [i.extent for i in tv.get_logical_domain(no_reductions=True)]


class Allocate(HostNode):
    """Allocate ``tv``'s buffer: ``shape`` in logical order, laid out in allocation order ``perm``."""

    def __init__(self, tv: TensorView, perm: Sequence[int], shape: Sequence[SymExpr] | None = None,
                 mem_type: MemoryType = MemoryType.Global, zero_init: bool = False) -> None:
        self.tv = tv
        self.perm = tuple(perm)
        self.shape = list(shape) if shape is not None else tensor_shape(tv)
        self.mem_type = mem_type
        self.zero_init = zero_init
        self.inputs = []
        self.outputs = [tv]

    @property
    def size(self) -> SymExpr:
        return product([self.shape[d] for d in self.perm])

    def to_string(self, indent: int = 0) -> str:
        init = "true" if self.zero_init else "false"
        return (f"{indent_str(indent)}{self.tv} = ALLOCATE(buffer={self.tv}, mem_type={self.mem_type.name.lower()}, "
                f"size={self.size}, zero_init={init}, resets_to_zero=false)\n")


class Deallocate(HostNode):
    """Drop the host's reference to a buffer so the allocator can reuse it."""

    def __init__(self, tv: TensorView) -> None:
        self.tv = tv
        self.inputs = [tv]
        self.outputs = []

    def to_string(self, indent: int = 0) -> str:
        return f"{indent_str(indent)}Deallocate {self.tv}\n"


class AtenCall(HostNode):
    """Run a fusion Expr with its torch reference (an ATen-evaluated segment).

    ``inputs`` / ``outputs`` default to the expr's operands; in a stream loop they are the chunks
    the expr runs on (the expr itself is unchanged, so its attributes keep referring to the
    fusion's tensors). ``into``: outputs are preallocated buffers (chunks) that the expr writes
    with ``evaluate_into``; otherwise the results become the output values.
    """

    chunk_local = True
    #: the expr's operands (or their chunks): fusion values only
    inputs: list[Val]
    outputs: list[Val]

    def __init__(self, expr: Expr, inputs: Sequence[Val] | None = None, outputs: Sequence[Val] | None = None,
                 into: bool = False) -> None:
        self.expr = expr
        self.source_expr = expr
        self.into = into
        self.inputs = list(expr.inputs if inputs is None else inputs)
        self.outputs = list(expr.outputs if outputs is None else outputs)

    def to_string(self, indent: int = 0) -> str:
        shown = copy.copy(self.expr)  # printing only: the expr on this node's operands
        shown.inputs, shown.outputs = self.inputs, self.outputs
        return shown.to_string(indent)

    def substitute(self, mapping: dict[Val, Val], index: LoopIndex | None = None, *,
                   operands: Sequence[Val] | None = None) -> AtenCall:
        inputs = list(operands) if operands is not None else [mapping.get(v, v) for v in self.inputs]
        return AtenCall(self.expr, inputs, [mapping.get(v, v) for v in self.outputs],
                        into=any(v in mapping for v in self.outputs))


class BoundSegment(Protocol):
    """A segment's launches bound to one binding's arguments (``KernelSegment.bind``): ``run(args)``
    replays them on a later run's arguments, returning the outputs, or None where the caller runs
    the segment (an argument whose alignment differs from the recorded run's)."""

    @property
    def run(self) -> Callable[[Sequence[Any]], list[torch.Tensor] | None]: ...


@runtime_checkable
class KernelSegment(Protocol):
    """A compiled kernel segment (codegen's kernels, sequences and size-bucketed kernels): every
    attribute the host program and the runtime read of one.

    ``run`` launches it on concrete tensors, allocating its outputs or writing into ``out``;
    ``bind`` runs it once and returns its launches bound to these arguments' binding (None: nothing to
    bind); ``output_perms``: the memory order of each output it allocates (None: not dense in a known
    order); ``code``: the generated source; ``scheduled_ir``: the segment as scheduled (``""``: none);
    ``scheduler_params``: the heuristics it was compiled with."""

    @property
    def name(self) -> str: ...

    @property
    def output_perms(self) -> tuple[tuple[int, ...], ...] | None: ...

    @property
    def code(self) -> str: ...

    @property
    def scheduled_ir(self) -> str: ...

    @property
    def scheduler_params(self) -> object: ...

    def run(self, ctx: EvalContext, *args: Any, out: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]: ...

    def bind(self, ctx: EvalContext, args: Sequence[Any]) -> tuple[list[torch.Tensor], BoundSegment | None]: ...


class SegmentRun(Protocol):
    """What a registered lowering may launch instead (``runtime/backends.py``): a name and
    ``run(ctx, *args)``, given ``out=`` buffers too where a stream loop writes into chunks."""

    @property
    def name(self) -> str: ...

    def run(self, ctx: EvalContext, *args: Any, **out: Any) -> list[torch.Tensor]: ...


class PlainSegment:
    """A ``SegmentRun`` as a ``KernelSegment``: no generated code, outputs in whatever layout its
    ``run`` returns, nothing bound (each run calls it)."""

    def __init__(self, segment: SegmentRun) -> None:
        self.segment = segment
        self.name = segment.name
        self.output_perms = None
        self.code = ""
        self.scheduled_ir = ""
        self.scheduler_params = None

    def run(self, ctx: EvalContext, *args: Any, out: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        return self.segment.run(ctx, *args) if out is None else self.segment.run(ctx, *args, out=out)

    def bind(self, ctx: EvalContext, args: Sequence[Any]) -> tuple[list[torch.Tensor], BoundSegment | None]:
        return self.run(ctx, *args), None


class LaunchKernel(HostNode):
    """Launch a compiled kernel segment on its inputs, producing its outputs.

    chunk_local = True

    ``source``: the exprs the kernel computes (as one expr, for the stream pass); ``into``: the
    outputs are preallocated buffers (chunks, in a stream loop) the kernel writes.
    """

    #: the kernel's arguments: fusion values only
    inputs: list[Val]
    outputs: list[Val]

    def __init__(self, segment: KernelSegment | SegmentRun, inputs: Sequence[Val], outputs: Sequence[Val],
                 source: Any = None, into: bool = False) -> None:
        # checked once here, so that everything downstream reads the whole protocol
        self.segment: KernelSegment = segment if isinstance(segment, KernelSegment) else PlainSegment(segment)
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.source_expr = source
        self.into = into

    def to_string(self, indent: int = 0) -> str:
        ins = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.outputs))
        return f"{indent_str(indent)}LaunchKernel( {self.segment.name}, inputs = ( {ins} ), outputs = ( {outs} ) )\n"

    def substitute(self, mapping: dict[Val, Val], index: LoopIndex | None = None) -> LaunchKernel:
        return LaunchKernel(self.segment, [mapping.get(v, v) for v in self.inputs],
                            [mapping.get(v, v) for v in self.outputs], self.source_expr,
                            into=any(v in mapping for v in self.outputs))


class NotOnThisRank(HostNode):
    """A fusion output whose mesh does not include this rank: an empty tensor (every dim 0) stands in
    for it, so every rank returns one tensor per output."""

    def __init__(self, tv: TensorView) -> None:
        self.tv = tv
        self.inputs = []
        self.outputs = [tv]

    def to_string(self, indent: int = 0) -> str:
        return f"{indent_str(indent)}{self.tv} = NotOnThisRank()\n"


@dataclass(eq=False)
class ForLoop(HostNode):
    """``FOR index in iter_domain:``; iterations whose chunk is empty (non-divisible split) are skipped."""

    index: LoopIndex
    iter_domain: IterDomain
    start: SymExpr
    stop: SymExpr
    body: list[HostNode] = field(default_factory=list)

    @property
    def inputs(self) -> list[HostVal]:  # type: ignore[override]  # read-only, computed from the body
        return [v for node in self.body for v in node.inputs]

    @property
    def outputs(self) -> list[HostVal]:  # type: ignore[override]  # read-only, computed from the body
        return [v for node in self.body for v in node.outputs]

    def to_string(self, indent: int = 0) -> str:
        body = "".join(node.to_string(indent + 1) for node in self.body)
        return f"{indent_str(indent)}FOR {self.index} in {self.iter_domain}:\n{body}"


class CaptureGraph(HostNode):
    """Run ``body`` by replaying a CUDA graph captured per key of what it reads from outside (every
    tensor's signature, the addresses of inputs that keep theirs, scalar values): ``inputs`` are
    those values, read off the body; ``outputs`` the values it hands on (written by the body, read
    after it: for the ``capture_graph`` pass, the program's outputs). The body's steps run in the
    warm-up and the capture only; a replay writes ``outputs`` (``host_ir/cuda_graph.py``).

    ``collective``: the body communicates with other processes (a multi-device program), so every rank
    captures and replays it at the same calls; each new key runs once without a graph first (communicators
    and P2P buffers are set up by a first run, with host synchronizations no capture may contain)."""

    def __init__(self, body: Sequence[HostNode], outputs: Sequence[HostVal], collective: bool = False) -> None:
        self.body = list(body)
        self.collective = collective
        written = {v for node in _flat(self.body) for v in node.outputs}
        missing = [str(v) for v in outputs if v not in written]
        if missing:
            raise ValueError(f"CaptureGraph outputs {', '.join(missing)} are not written by its body")
        self.outputs = list(outputs)

    @property
    def inputs(self) -> list[HostVal]:  # type: ignore[override]  # read-only, computed from the body
        """The fusion values the body reads before writing them (constants aside), in order of first read."""
        written: set[HostVal] = set()
        read: dict[HostVal, None] = {}
        for node in _flat(self.body):
            for v in node.inputs:
                if isinstance(v, Val) and v not in written and not (isinstance(v, Scalar) and v.is_const):
                    read[v] = None
            written.update(node.outputs)
        return list(read)

    def to_string(self, indent: int = 0) -> str:
        ins = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.outputs))
        body = "".join(node.to_string(indent + 1) for node in self.body)
        kind = ", collective" if self.collective else ""
        return f"{indent_str(indent)}CaptureGraph( inputs = ( {ins} ), outputs = ( {outs} ){kind} ):\n{body}"


def _flat(nodes: Sequence[HostNode]) -> list[HostNode]:
    """``nodes`` in program order with every block (a loop's, a graph's body) replaced by its nodes."""
    result: list[HostNode] = []
    for node in nodes:
        if isinstance(node, ForLoop | CaptureGraph):
            result += _flat(node.body)
        else:
            result.append(node)
    return result


class HirAliasSelect(HostNode):
    """``out`` = the chunk of ``src`` at the loop's current iteration along logical dim ``dim`` (a view).

    ``ring``: ``src`` is a ring buffer of ``numberOfStreams`` chunks, indexed by
    ``StreamIdx % numberOfStreams``. At run time the selected dim is kept (with the chunk's
    length, 1 for a plain stream ID) so every op's positional attributes stay valid; the printed
    type drops a dim of length one, like nvFuser's select.
    """

    chunk_local = True

    def __init__(self, out: TensorView, src: TensorView, axis: IterDomain, index: LoopIndex, dim: int,
                 ring: bool = False) -> None:
        self.out = out
        self.src = src
        self.axis = axis
        self.index = index
        self.dim = dim
        self.ring = ring
        self.inputs = [src]
        self.outputs = [out]

    def to_string(self, indent: int = 0) -> str:
        pad = indent_str(indent)
        index = f"( {self.index} % {NUMBER_OF_STREAMS} )" if self.ring else self.index.chunk_text()
        return (f"{pad}{self.out}\n{pad}   = HirAliasSelect( {self.src}, axis = {self.axis}, "
                f"index = {index} )\n")


# --- container ---------------------------------------------------------------------------------------
class HostIrContainer:
    """A host program: ``inputs`` -> ``outputs`` computed by ``nodes`` in order.

    ``fusion``: the (compiled copy of the) fusion the program was lowered from (default: the one its
    values belong to); host passes read layout requirements from it and create IDs in it.
    """

    def __init__(self, inputs: Sequence[Val], outputs: Sequence[Val], nodes: Sequence[HostNode] = (),
                 fusion: Fusion | None = None) -> None:
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.nodes: list[HostNode] = list(nodes)
        if fusion is None:
            if not self.outputs:
                raise ValueError("a Host IR program needs outputs (or the fusion it computes)")
            fusion = self.outputs[0].fusion
        self.fusion: Fusion = fusion
        self._stream_count = 0

    def new_stream(self) -> HostStream:
        stream = HostStream(self._stream_count)
        self._stream_count += 1
        return stream

    def new_worker_stream(self, index: LoopIndex) -> HostStream:
        """``Stream ( StreamIdx % numberOfStreams )``; takes a number like any stream value."""
        stream = HostStream(self._stream_count, index)
        self._stream_count += 1
        return stream

    def walk(self) -> list[HostNode]:
        """Every node, loop bodies included, in program order."""
        result: list[HostNode] = []
        stack = list(reversed(self.nodes))
        while stack:
            node = stack.pop()
            result.append(node)
            if isinstance(node, ForLoop | CaptureGraph):
                stack.extend(reversed(node.body))
        return result

    def to_string(self) -> str:
        ins = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.outputs))
        body = "".join(node.to_string(1) for node in self.nodes)
        return f"%HostIrContainer {{ ({ins}) -> ({outs}) :\n{body}}} // %HostIrContainer\n"

    def __str__(self) -> str:
        return self.to_string()


__all__ = [
    "NUMBER_OF_STREAMS", "Allocate", "AtenCall", "CaptureGraph", "Deallocate", "ForLoop", "HirAliasSelect", "HostIrContainer",
    "HostNode", "HostStream", "HostVal", "KernelSegment", "LaunchKernel", "LoopIndex", "NotOnThisRank",
    "PlainSegment", "SegmentRun", "chunk_of", "tensor_shape",
]
