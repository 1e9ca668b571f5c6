"""Step builders of the core Host IR nodes: what each does at run time, on torch.

Each builder precomputes everything it can (slots, shapes, functions) and returns a closure
``step(frame)`` that the evaluator calls per execution (per iteration inside a loop), or None when
the node does nothing on ``cc.device`` (stream nodes on CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

import torch

from pyfuser.host_ir.cuda_graph import GraphStep
from pyfuser.host_ir.frame import NUMBER_OF_STREAMS_SLOT, CompileContext, Frame, Step, StepBuilder
from pyfuser.host_ir.nodes import (
    Allocate,
    AtenCall,
    BoundSegment,
    CaptureGraph,
    Deallocate,
    ForLoop,
    HirAliasSelect,
    HostStream,
    KernelSegment,
    LaunchKernel,
    LoopIndex,
    NotOnThisRank,
)
from pyfuser.host_ir.specialization import Specializations
from pyfuser.host_ir.stream_nodes import GetCurrentStream, SetCurrentStream, SlotRelease, SlotWait, Synchronize
from pyfuser.ir.analysis.fused_exprs import FusedExprs
from pyfuser.ir.base import Expr, evaluate_exprs, operand_value
from pyfuser.ir.eval_context import EvalContext, NoPrograms
from pyfuser.ir.layout import dense_strides
from pyfuser.ir.ops.common import checked_sizes


@dataclass(frozen=True)
class _ChunkSlot:
    """Key of a per-iteration integer a loop keeps for its selects (chunk begin / length / size)."""

    index: LoopIndex
    what: str


def build_allocate(node: Allocate, cc: CompileContext) -> Step:
    out, shape, perm = cc.slot(node.tv), node.shape, node.perm
    dtype, device, zero_init = node.tv.dtype.torch_dtype, cc.device, node.zero_init
    what, itemsize = f"allocating {node.tv.short_name}", dtype.itemsize

    def step(frame: Frame) -> None:
        sizes = checked_sizes(what, [e.evaluate(frame.ctx.env) for e in shape], itemsize)
        buffer = torch.empty_strided(sizes, dense_strides(sizes, perm), dtype=dtype, device=device)
        frame.values[out] = buffer.zero_() if zero_init else buffer

    return step


def build_deallocate(node: Deallocate, cc: CompileContext) -> Step:
    slot = cc.slot(node.tv)

    def step(frame: Frame) -> None:
        frame.values[slot] = None

    return step


def build_aten_call(node: AtenCall, cc: CompileContext) -> Step:
    expr = node.expr
    ins = [cc.slot(v) for v in node.inputs]
    outs = [cc.slot(v) for v in node.outputs]
    if node.into and len(outs) == 1:
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
    evaluate, into = expr.evaluate, node.into
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


def _aten_fallback(node: LaunchKernel) -> Callable[[EvalContext, list[Any], list[Any] | None], list[Any]]:
    """The segment's exprs evaluated by ATen, results written like the kernel's (dense in its output
    orders, or into the given buffers): for sizes where the kernel has no program (``NoPrograms``)."""
    source = node.source_expr
    exprs: list[Expr] = list(source.exprs) if isinstance(source, FusedExprs) else []  # a kernel segment lowered
    perms = node.segment.output_perms

    def evaluate(ctx: EvalContext, args: list[Any], out: list[Any] | None) -> list[Any]:
        env: dict[int, Any] = {id(v): a for v, a in zip(node.inputs, args, strict=True)}
        evaluate_exprs(exprs, ctx, env)
        results = [operand_value(v, env) for v in node.outputs]
        if out is not None:
            for buffer, r in zip(out, results, strict=True):
                buffer.copy_(r)
            return out
        if perms is None:
            return results
        return [torch.empty_strided(r.shape, dense_strides(list(r.shape), perm), dtype=r.dtype, device=r.device).copy_(r)
                for r, perm in zip(results, perms, strict=True)]

    return evaluate


class _Unbound(Enum):
    """No bound launches recorded for a binding yet (None is recorded: nothing to bind)."""

    token = 0


#: The token as a global: reading an enum member off its class costs a descriptor call per launch.
_UNBOUND: Final = _Unbound.token


class BoundLaunches:
    """A launch's bound launches, one per binding (``EvalContext.binding``: a bound program's input
    signature), ``Specializations`` of the launch: the first run under a binding binds the segment
    (``bind(ctx, args) -> (outputs, bound run or None)``), later runs replay what it recorded. Only
    for launches that run once per program run (not in a loop's body, whose chunks differ from one
    iteration to the next)."""

    __slots__ = ("by_binding", "segment")

    def __init__(self, segment: KernelSegment) -> None:
        self.segment = segment
        self.by_binding: Specializations[object, BoundSegment | None] = Specializations()

    def run(self, ctx: EvalContext, args: list[Any]) -> list[Any] | None:
        """The outputs, or None where the caller runs the segment itself (nothing bound for this
        binding, or an argument whose alignment changed)."""
        bound = self.by_binding.get(ctx.binding, _UNBOUND)
        if bound is _UNBOUND:
            outputs, made = self.segment.bind(ctx, args)
            self.by_binding.record(ctx.binding, made)
            return outputs
        return bound.run(args) if bound is not None else None


def launch_with_fallback(node: LaunchKernel) -> Callable[[EvalContext, list[Any], list[Any] | None], list[Any]]:
    """``launch(ctx, args, out)``: the segment's launcher (allocating its outputs, or writing into
    ``out``), with the ATen evaluation of its exprs where its grid has no program (``NoPrograms``)."""
    run = node.segment.run
    fallback = _aten_fallback(node)

    def launch(ctx: EvalContext, args: list[Any], out: list[Any] | None) -> list[Any]:
        try:
            return run(ctx, *args, out=out) if out is not None else run(ctx, *args)
        except NoPrograms:
            return fallback(ctx, args, out)

    return launch


def build_launch_kernel(node: LaunchKernel, cc: CompileContext) -> Step:
    launch = launch_with_fallback(node)
    ins = [cc.slot(v) for v in node.inputs]
    outs = [cc.slot(v) for v in node.outputs]
    if node.into:
        def step_into(frame: Frame) -> None:
            values = frame.values
            launch(frame.ctx, [values[i] for i in ins], [values[o] for o in outs])

        return step_into
    bound = cc.bound_launches(node) if cc.top_level else None

    def step(frame: Frame) -> None:
        values, ctx = frame.values, frame.ctx
        args = [values[i] for i in ins]
        try:
            results = bound.run(ctx, args) if bound is not None and ctx.binding is not None else None
        except NoPrograms:
            results = None
        if results is None:
            results = launch(ctx, args, None)
        for o, r in zip(outs, results, strict=True):
            values[o] = r

    return step


def build_not_on_this_rank(node: NotOnThisRank, cc: CompileContext) -> Step:
    slot, dtype, device, shape = cc.slot(node.tv), node.tv.dtype.torch_dtype, cc.device, [0] * node.tv.ndim

    def step(frame: Frame) -> None:
        frame.values[slot] = torch.empty(shape, dtype=dtype, device=device)

    return step


#: Nodes that only move work between streams: a loop that runs one iteration skips them (see below).
_STREAM_SWITCHES = (GetCurrentStream, SetCurrentStream, Synchronize)


def build_for_loop(node: ForLoop, cc: CompileContext) -> Step | None:
    # Selects only create views of buffers that exist before the loop, so each iteration makes
    # all of them up front in one pass instead of one step each (same result, less overhead).
    selects = [n for n in node.body if isinstance(n, HirAliasSelect) and n.index is node.index]
    nodes = [n for n in node.body if not any(n is s for s in selects)]
    body = cc.compile_body(nodes)
    if not body:
        return None  # e.g. a join loop of stream syncs on CPU
    # A stream loop that runs one iteration has nothing to overlap with: it runs on the current stream,
    # without the switch to a worker and the joins (host time the GPU would wait for). Only loops that
    # switch streams themselves: a join loop's syncs always run.
    alone = body
    if cc.device.type == "cuda" and any(isinstance(n, SetCurrentStream) for n in nodes):
        alone = cc.compile_body([n for n in nodes if not isinstance(n, _STREAM_SWITCHES)])
    index = node.index
    views = [(cc.slot(n.src), cc.slot(n.out), n.dim, n.ring) for n in selects]
    # Every tensor the loop chunks spans its extent along the chunked axis: extents that map but are
    # not provably equal (a pad's static 1 beside an input's i0) are compared before the loop, so a
    # mismatch is an error, not a buffer the loop leaves partly unwritten.
    spans = [(cc.slot(n.src), n.dim, f"{n.src.short_name} axis {n.dim}") for n in selects if not n.ring]
    loop_name = str(node.iter_domain)
    idx, begin, length, chunk, slots = (cc.slot(index), cc.slot(_ChunkSlot(index, "begin")),
                                        cc.slot(_ChunkSlot(index, "length")),
                                        cc.slot(_ChunkSlot(index, "chunk")), cc.slot(NUMBER_OF_STREAMS_SLOT))
    start, stop, extent, chunk_expr = node.start, node.stop, index.extent, index.chunk

    def step(frame: Frame) -> None:
        env, values = frame.ctx.env, frame.values
        n, size, ring_slots = extent.evaluate(env), chunk_expr.evaluate(env), values[slots]
        for src, dim, name in spans:
            if values[src].shape[dim] != n:
                raise ValueError(f"{name} has size {values[src].shape[dim]}, but the stream loop over {loop_name} "
                                 f"that chunks it runs over {n}; they must be equal (declare an axis with size 1 to "
                                 "broadcast it)")
        values[chunk] = size
        first_i, stop_i = start.evaluate(env), stop.evaluate(env)
        steps = alone if stop_i - first_i == 1 else body
        for i in range(first_i, stop_i):
            first = index.chunk_index(i) * size
            count = min(size, n - first)
            if count <= 0:
                continue
            values[idx], values[begin], values[length] = i, first, count
            ring_first = (i % ring_slots) * size
            for src, out, dim, ring in views:
                values[out] = values[src].narrow(dim, ring_first if ring else first, count)
            for s in steps:
                s(frame)

    return step


def build_alias_select(node: HirAliasSelect, cc: CompileContext) -> Step:
    """A select outside its loop's own body (a loop fuses the selects of its index itself)."""
    src, out, dim = cc.slot(node.src), cc.slot(node.out), node.dim
    begin, length = cc.slot(_ChunkSlot(node.index, "begin")), cc.slot(_ChunkSlot(node.index, "length"))
    if not node.ring:
        def step(frame: Frame) -> None:
            values = frame.values
            values[out] = values[src].narrow(dim, values[begin], values[length])

        return step
    idx, chunk = cc.slot(node.index), cc.slot(_ChunkSlot(node.index, "chunk"))
    slots = cc.slot(NUMBER_OF_STREAMS_SLOT)

    def ring_step(frame: Frame) -> None:
        values = frame.values
        first = (values[idx] % values[slots]) * values[chunk]
        values[out] = values[src].narrow(dim, first, values[length])

    return ring_step


def build_capture_graph(node: CaptureGraph, cc: CompileContext) -> Step | None:
    """On CUDA, the body captured and replayed per key of what it reads (``cuda_graph.GraphStep``); on
    another device (a program built by hand: the ``capture_graph`` pass wraps CUDA programs only) the
    body's steps. Its body runs once per program run, as the program's own nodes do."""
    body = cc.compile_body(node.body, once_per_run=True)
    if cc.device.type == "cuda" and body:
        return GraphStep(body, [cc.slot(v) for v in node.inputs], [cc.slot(v) for v in node.outputs],
                         f"the program of {len(node.outputs)} outputs", collective=node.collective)
    if not body:
        return None

    def step(frame: Frame) -> None:
        for s in body:
            s(frame)

    return step


# --- streams -------------------------------------------------------------------------------------------
def _stream_resolver(cc: CompileContext, stream: HostStream) -> Callable[[Frame], Any]:
    if stream.index is None:
        slot = cc.slot(stream)
        return lambda frame: frame.values[slot]
    idx = cc.slot(stream.index)
    return lambda frame: frame.cuda_streams.worker(frame.values[idx])


def build_get_current_stream(node: GetCurrentStream, cc: CompileContext) -> Step | None:
    if cc.device.type != "cuda":
        return None
    slot = cc.slot(node.stream)

    def step(frame: Frame) -> None:
        frame.values[slot] = frame.cuda_streams.current

    return step


def build_set_current_stream(node: SetCurrentStream, cc: CompileContext) -> Step | None:
    if cc.device.type != "cuda":
        return None
    resolve = _stream_resolver(cc, node.stream)

    def step(frame: Frame) -> None:
        frame.cuda_streams.set(resolve(frame))

    return step


def build_synchronize(node: Synchronize, cc: CompileContext) -> Step | None:
    if cc.device.type != "cuda":
        return None
    resolve = _stream_resolver(cc, node.stream)
    event = torch.cuda.Event()  # one per node: a wait is enqueued before the next record

    def step(frame: Frame) -> None:
        frame.cuda_streams.wait_for(resolve(frame), event)

    return step


def build_slot_wait(node: SlotWait, cc: CompileContext) -> Step | None:
    if cc.device.type != "cuda":
        return None
    idx, key = cc.slot(node.index), node.tv

    def step(frame: Frame) -> None:
        frame.cuda_streams.wait_slot(key, frame.values[idx])

    return step


def build_slot_release(node: SlotRelease, cc: CompileContext) -> Step | None:
    if cc.device.type != "cuda":
        return None
    idx, key = cc.slot(node.index), node.tv

    def step(frame: Frame) -> None:
        frame.cuda_streams.release_slot(key, frame.values[idx])

    return step


#: The step builder of every core node type (looked up along the node class's MRO).
CORE_STEP_BUILDERS: dict[type, StepBuilder] = {
    Allocate: build_allocate,
    Deallocate: build_deallocate,
    AtenCall: build_aten_call,
    LaunchKernel: build_launch_kernel,
    NotOnThisRank: build_not_on_this_rank,
    ForLoop: build_for_loop,
    CaptureGraph: build_capture_graph,
    HirAliasSelect: build_alias_select,
    GetCurrentStream: build_get_current_stream,
    SetCurrentStream: build_set_current_stream,
    Synchronize: build_synchronize,
    SlotRelease: build_slot_release,
    SlotWait: build_slot_wait,
}
