"""Host IR: the per-rank program that allocates buffers, launches segments and drives CUDA streams.

A ``HostIrContainer`` holds a list of top-level ``HostNode``s; a ``ForLoop`` holds a body of nodes.
Stream management nodes (``GetCurrentStream``, ``SetCurrentStream``, ``Synchronize``, ring-buffer slot
events) live in ``stream_nodes.py``.
Values are the fusion's own ``TensorView``s / ``Scalar``s plus two host-only kinds: ``LoopIndex``
(``StreamIdx``) and ``HostStream`` (``Stream 0``, ``Stream ( StreamIdx % numberOfStreams )``).

Adding a node (e.g. ``Communication`` / ``Wait`` for multi-device):

1. subclass ``HostNode``; set ``inputs`` / ``outputs`` (the Vals it reads / writes: passes use them
   to find producers and last uses);
2. implement ``to_string(indent)`` (one or more lines, each prefixed with ``indent_str(indent)``);
3. implement ``compile(cc) -> Step | None``: return a closure ``step(frame)`` doing the work with
   ``frame.values[cc.slot(val)]`` (precompute everything you can here, the closure runs per
   iteration), or None when the node does nothing on ``cc.device`` (stream nodes on CPU);
4. if it may sit in a stream loop, implement ``substitute(mapping)`` returning the node rewritten
   on per-chunk tensors (``mapping``: full tensor -> its ``HirAliasSelect`` chunk), and set
   ``source_expr`` to the fusion Expr it computes so the stream pass can read its stream axis.
   A node that must stay right after its predecessor (``Wait`` after ``Communication``) sets
   ``binds_to_previous = True``: the stream pass keeps it in the same loop body.

How lowering dispatches: ``pyfuser.host_ir.lowering.register_lowering(ExprType, fn)`` where
``fn(expr, lctx) -> list[HostNode]``; exprs without a registered lowering become one ``AtenCall``.
Host passes run afterwards, in the order of ``pyfuser.host_ir.passes.HOST_PASSES``.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from pyfuser.ir.base import Expr, Val, indent_str
from pyfuser.ir.layout import dense_strides
from pyfuser.ir.symbolic import SymExpr, SymVar, product
from pyfuser.ir.tensor_view import MemoryType, TensorView

if TYPE_CHECKING:
    from pyfuser.ir.iter_domain import IterDomain
    from pyfuser.runtime.context import EvalContext

#: Bound at evaluation to the size of the evaluator's worker-stream pool.
NUMBER_OF_STREAMS = SymVar("numberOfStreams")


# --- host-only values ------------------------------------------------------------------------------
class LoopIndex:
    """The index of a stream ``ForLoop`` and the chunk of a logical axis each iteration covers.

    Iteration ``i`` covers ``[i * chunk, min((i + 1) * chunk, extent))`` of the chunked logical
    axis: ``chunk`` is 1 for a stream-parallel logical ID and ``ceilDiv`` for an outer split.
    """

    def __init__(self, extent: SymExpr, chunk: SymExpr, name: str = "StreamIdx") -> None:
        self.name = name
        self.extent = extent
        self.chunk = chunk

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


# --- compilation protocol -------------------------------------------------------------------------------
class Frame:
    """Runtime state of one execution: value slots, the eval context and the stream runtime."""

    __slots__ = ("ctx", "streams", "values")

    def __init__(self, values: list[Any], ctx: EvalContext, streams: Any) -> None:
        self.values = values
        self.ctx = ctx
        self.streams = streams


Step = Callable[[Frame], None]


class CompileContext(Protocol):
    """What a node sees while being compiled to a step (implemented by the evaluator)."""

    device: torch.device

    def slot(self, val: HostVal | Hashable) -> int:
        """The value slot of ``val`` (a Val, a host value, or a private key like a loop's chunk bounds)."""
        ...

    def compile_body(self, nodes: Sequence[HostNode]) -> list[Step]: ...


# --- nodes ----------------------------------------------------------------------------------------------
class HostNode(ABC):
    inputs: list[HostVal]
    outputs: list[HostVal]
    #: The fusion Expr this node computes, for nodes the stream pass may put in a loop.
    source_expr: Expr | None = None
    binds_to_previous: ClassVar[bool] = False

    @abstractmethod
    def to_string(self, indent: int = 0) -> str:
        """The node in the seed's Host IR dump format."""

    @abstractmethod
    def compile(self, cc: CompileContext) -> Step | None:
        """A closure the evaluator calls per execution (None: nothing to do at run time)."""

    def substitute(self, mapping: dict[Val, Val]) -> HostNode:
        """This node on per-chunk values; nodes that only read loop-invariant values return self."""
        return self

    def __str__(self) -> str:
        return self.to_string()


def _tensor_shape(tv: TensorView) -> list[SymExpr]:
    if tv.device_mesh is not None:  # a device-sharded tensor holds only this rank's piece
        from pyfuser.multidevice.sharding import local_extents

        return local_extents(tv)
    return [i.extent for i in tv.get_logical_domain(no_reductions=True)]


class Allocate(HostNode):
    """Allocate ``tv``'s buffer: ``shape`` in logical order, laid out in allocation order ``perm``."""

    def __init__(self, tv: TensorView, perm: Sequence[int], shape: Sequence[SymExpr] | None = None,
                 mem_type: MemoryType = MemoryType.Global, zero_init: bool = False) -> None:
        self.tv = tv
        self.perm = tuple(perm)
        self.shape = list(shape) if shape is not None else _tensor_shape(tv)
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

    def compile(self, cc: CompileContext) -> Step:
        out, shape, perm = cc.slot(self.tv), self.shape, self.perm
        dtype, device = self.tv.dtype.torch_dtype, cc.device
        zero_init = self.zero_init

        def step(frame: Frame) -> None:
            sizes = [e.evaluate(frame.ctx.env) for e in shape]
            buffer = torch.empty_strided(sizes, dense_strides(sizes, perm), dtype=dtype, device=device)
            frame.values[out] = buffer.zero_() if zero_init else buffer

        return step


class Deallocate(HostNode):
    """Drop the host's reference to a buffer so the allocator can reuse it."""

    def __init__(self, tv: TensorView) -> None:
        self.tv = tv
        self.inputs = [tv]
        self.outputs = []

    def to_string(self, indent: int = 0) -> str:
        return f"{indent_str(indent)}Deallocate {self.tv}\n"

    def compile(self, cc: CompileContext) -> Step:
        slot = cc.slot(self.tv)

        def step(frame: Frame) -> None:
            frame.values[slot] = None

        return step


class AtenCall(HostNode):
    """Run a fusion Expr with its torch reference (an ATen-evaluated segment).

    ``inputs`` / ``outputs`` default to the expr's operands; in a stream loop they are the chunks
    the expr runs on (the expr itself is unchanged, so its attributes keep referring to the
    fusion's tensors). ``into``: outputs are preallocated buffers (chunks) that the expr writes
    with ``evaluate_into``; otherwise the results become the output values.
    """

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

    def substitute(self, mapping: dict[Val, Val]) -> AtenCall:
        return AtenCall(self.expr, [mapping.get(v, v) for v in self.inputs],
                        [mapping.get(v, v) for v in self.outputs], into=any(v in mapping for v in self.outputs))

    def compile(self, cc: CompileContext) -> Step:
        expr = self.expr
        ins = [cc.slot(v) for v in self.inputs]
        outs = [cc.slot(v) for v in self.outputs]
        if self.into and len(outs) == 1:
            (out,) = outs
            evaluate_into = expr.evaluate_into
            if len(ins) == 1:  # the common shapes of a stream-loop body, without building an arg list
                (a,) = ins
                return lambda frame: evaluate_into(frame.ctx, frame.values[out], frame.values[a])
            if len(ins) == 2:
                a, b = ins

                def step_into2(frame: Frame) -> None:
                    values = frame.values
                    evaluate_into(frame.ctx, values[out], values[a], values[b])

                return step_into2

            def step_into(frame: Frame) -> None:
                values = frame.values
                evaluate_into(frame.ctx, values[out], *[values[i] for i in ins])

            return step_into
        evaluate, into = expr.evaluate, self.into
        if not into and len(outs) == 1 and len(ins) <= 2:
            # The common straight-line shapes, without building argument lists or looping over results.
            (o,) = outs
            if len(ins) == 1:
                (a,) = ins

                def step_unary(frame: Frame) -> None:
                    values = frame.values
                    values[o] = evaluate(frame.ctx, values[a])[0]

                return step_unary
            if len(ins) == 2:
                a, b = ins

                def step_binary(frame: Frame) -> None:
                    values = frame.values
                    values[o] = evaluate(frame.ctx, values[a], values[b])[0]

                return step_binary

        def step(frame: Frame) -> None:
            values = frame.values
            results = evaluate(frame.ctx, *[values[i] for i in ins])
            for o, r in zip(outs, results, strict=True):
                if into:
                    values[o].copy_(r)
                else:
                    values[o] = r

        return step


class KernelSegment(Protocol):
    """A compiled kernel segment (produced by codegen): runs on concrete tensors."""

    name: str

    def run(self, ctx: EvalContext, *args: Any) -> list[torch.Tensor]: ...


class LaunchKernel(HostNode):
    """Launch a compiled kernel segment on its inputs, producing its outputs."""

    def __init__(self, segment: KernelSegment, inputs: Sequence[Val], outputs: Sequence[Val]) -> None:
        self.segment = segment
        self.inputs = list(inputs)
        self.outputs = list(outputs)

    def to_string(self, indent: int = 0) -> str:
        ins = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.outputs))
        return f"{indent_str(indent)}LaunchKernel( {self.segment.name}, inputs = ( {ins} ), outputs = ( {outs} ) )\n"

    def compile(self, cc: CompileContext) -> Step:
        run = self.segment.run
        ins = [cc.slot(v) for v in self.inputs]
        outs = [cc.slot(v) for v in self.outputs]

        def step(frame: Frame) -> None:
            values = frame.values
            for o, r in zip(outs, run(frame.ctx, *[values[i] for i in ins]), strict=True):
                values[o] = r

        return step


@dataclass(eq=False)
class ForLoop(HostNode):
    """``FOR index in iter_domain:``; iterations whose chunk is empty (non-divisible split) are skipped."""

    index: LoopIndex
    iter_domain: IterDomain
    start: SymExpr
    stop: SymExpr
    body: list[HostNode] = field(default_factory=list)

    @property
    def inputs(self) -> list[HostVal]:  # type: ignore[override]
        return [v for node in self.body for v in node.inputs]

    @property
    def outputs(self) -> list[HostVal]:  # type: ignore[override]
        return [v for node in self.body for v in node.outputs]

    def to_string(self, indent: int = 0) -> str:
        body = "".join(node.to_string(indent + 1) for node in self.body)
        return f"{indent_str(indent)}FOR {self.index} in {self.iter_domain}:\n{body}"

    def compile(self, cc: CompileContext) -> Step | None:
        # Selects only create views of buffers that exist before the loop, so each iteration makes
        # all of them up front in one pass instead of one step each (same result, less overhead).
        selects = [n for n in self.body if isinstance(n, HirAliasSelect) and n.index is self.index]
        body = cc.compile_body([n for n in self.body if not any(n is s for s in selects)])
        if not body:
            return None  # e.g. a join loop of stream syncs on CPU
        index = self.index
        views = [(cc.slot(n.src), cc.slot(n.out), n.dim, n.ring) for n in selects]
        idx, begin, length, chunk, slots = (cc.slot(index), cc.slot(_ChunkSlot(index, "begin")),
                                            cc.slot(_ChunkSlot(index, "length")),
                                            cc.slot(_ChunkSlot(index, "chunk")), cc.slot(NUMBER_OF_STREAMS_SLOT))
        start, stop, extent, chunk_expr = self.start, self.stop, index.extent, index.chunk

        def step(frame: Frame) -> None:
            env, values = frame.ctx.env, frame.values
            n, size, ring_slots = extent.evaluate(env), chunk_expr.evaluate(env), values[slots]
            values[chunk] = size
            for i in range(start.evaluate(env), stop.evaluate(env)):
                first = i * size
                count = min(size, n - first)
                if count <= 0:
                    continue
                values[idx], values[begin], values[length] = i, first, count
                ring_first = (i % ring_slots) * size
                for src, out, dim, ring in views:
                    values[out] = values[src].narrow(dim, ring_first if ring else first, count)
                for s in body:
                    s(frame)

        return step


@dataclass(frozen=True)
class _ChunkSlot:
    """Key of a per-iteration integer a loop keeps for its selects (chunk begin / length / size)."""

    index: LoopIndex
    what: str


@dataclass(frozen=True)
class RuntimeSlot:
    """Key of a value the evaluator binds per execution rather than a node computing it."""

    name: str


#: Slot holding the bound ``numberOfStreams`` (the worker-pool size).
NUMBER_OF_STREAMS_SLOT = RuntimeSlot("numberOfStreams")


class HirAliasSelect(HostNode):
    """``out`` = the chunk of ``src`` at the loop's current iteration along logical dim ``dim`` (a view).

    ``ring``: ``src`` is a ring buffer of ``numberOfStreams`` chunks, indexed by
    ``StreamIdx % numberOfStreams``. At run time the selected dim is kept (with the chunk's
    length, 1 for a plain stream ID) so every op's positional attributes stay valid; the printed
    type drops a dim of length one, like nvFuser's select.
    """

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
        index = f"( {self.index} % {NUMBER_OF_STREAMS} )" if self.ring else str(self.index)
        return (f"{pad}{self.out}\n{pad}   = HirAliasSelect( {self.src}, axis = {self.axis}, "
                f"index = {index} )\n")

    def compile(self, cc: CompileContext) -> Step:
        src, out, dim = cc.slot(self.src), cc.slot(self.out), self.dim
        begin, length = cc.slot(_ChunkSlot(self.index, "begin")), cc.slot(_ChunkSlot(self.index, "length"))
        if not self.ring:
            def step(frame: Frame) -> None:
                values = frame.values
                values[out] = values[src].narrow(dim, values[begin], values[length])

            return step
        idx, chunk = cc.slot(self.index), cc.slot(_ChunkSlot(self.index, "chunk"))
        slots = cc.slot(NUMBER_OF_STREAMS_SLOT)

        def ring_step(frame: Frame) -> None:
            values = frame.values
            first = (values[idx] % values[slots]) * values[chunk]
            values[out] = values[src].narrow(dim, first, values[length])

        return ring_step



# --- container ---------------------------------------------------------------------------------------
class HostIrContainer:
    """A host program: ``inputs`` -> ``outputs`` computed by ``nodes`` in order."""

    def __init__(self, inputs: Sequence[Val], outputs: Sequence[Val], nodes: Sequence[HostNode] = ()) -> None:
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.nodes: list[HostNode] = list(nodes)
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
            if isinstance(node, ForLoop):
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
    "NUMBER_OF_STREAMS", "NUMBER_OF_STREAMS_SLOT", "Allocate", "AtenCall", "CompileContext", "Deallocate",
    "ForLoop", "Frame", "HirAliasSelect", "HostIrContainer", "HostNode", "HostStream", "KernelSegment",
    "LaunchKernel", "LoopIndex", "RuntimeSlot", "Step",
]
