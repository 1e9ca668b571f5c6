"""HostIrEvaluator: runs a Host IR program with torch.

The evaluator visits the program once, when it is built: a step builder per node type (a table it
is given, ``runtime/backends.py``) turns every node into a closure over integer value slots, so an
execution is a walk over a flat list of closures doing little more than the torch calls. On CUDA,
stream nodes drive a pool of worker streams shared by all programs on a device
(``numberOfStreams`` of them); on CPU they build no step and the same program runs sequentially.

Memory safety across streams: buffers (outputs, ring buffers) are allocated on the user's stream
before a loop, views of them are written on worker streams, and the user's stream waits for each
worker before anything after the loop runs (``Synchronize Stream ( StreamIdx % numberOfStreams )``
in every iteration, or once per worker after the loop with ``stream_overlap``; after a failed
execution, for every worker). Tensors created inside an iteration are allocated on, used on and
freed to the worker stream that runs it. So every free the caching allocator sees is
stream-ordered after the last use, without ``record_stream``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import torch

from pyfuser.codegen.python_writer import PythonWriter
from pyfuser.host_ir.cuda_graph import GraphStep
from pyfuser.host_ir.frame import NUMBER_OF_STREAMS_SLOT, CudaStreams, Frame, Step, StepBuilder
from pyfuser.host_ir.nodes import (
    NUMBER_OF_STREAMS,
    Allocate,
    AtenCall,
    CaptureGraph,
    HostIrContainer,
    HostNode,
    HostVal,
    LaunchKernel,
)
from pyfuser.host_ir.outputs import OutputLayout
from pyfuser.host_ir.specialization import Recording, Specializations
from pyfuser.host_ir.steps import CORE_STEP_BUILDERS, BoundLaunches
from pyfuser.host_ir.straight_line import STRAIGHT_LINE_NODES, InlinedBody, StraightLine, StraightLineFunction
from pyfuser.host_ir.stream_nodes import GetCurrentStream, SetCurrentStream, SlotWait, Synchronize
from pyfuser.ir.base import Scalar, Val
from pyfuser.ir.eval_context import EvalContext, NoPrograms
from pyfuser.ir.tensor_view import TensorView
from pyfuser.options import DEFAULT_NUM_STREAMS

_POOLS: dict[tuple[int, int], list[torch.cuda.Stream]] = {}
#: The current CUDA device's index (torch's own call, without ``torch.cuda.current_device``'s checks).
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)


def stream_pool(device: torch.device, count: int) -> list[torch.cuda.Stream]:
    """``count`` worker streams of ``device``, created once and reused by every execution."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    pool = _POOLS.get((index, count))
    if pool is None:
        pool = [torch.cuda.Stream(device=index) for _ in range(count)]
        _POOLS[(index, count)] = pool
    return pool


def _run_once(container: HostIrContainer) -> list[HostNode]:
    """The nodes that run once per program run, in order: the top-level nodes, a ``CaptureGraph``'s
    body in its place (a replay hands on what its body's run computed, the same tensors' memory)."""
    nodes: list[HostNode] = []
    for node in container.nodes:
        nodes += node.body if isinstance(node, CaptureGraph) else [node]
    return nodes


def _allocations(node: HostNode) -> dict[Val, tuple[int, ...]]:
    """Tensors ``node`` allocates itself, with their layout: an ``Allocate``, or a kernel launch that
    allocates its outputs densely in a known order."""
    if isinstance(node, Allocate):
        return {node.tv: node.perm}
    if isinstance(node, LaunchKernel) and not node.into and (perms := node.segment.output_perms) is not None:
        return {v: tuple(p) for v, p in zip(node.outputs, perms, strict=True)}
    return {}


def _fresh_buffers(container: HostIrContainer) -> dict[Val, tuple[int, ...]]:
    """Tensors the program allocates itself and no other top-level node rebinds, with their layout:
    as outputs they need no check for aliasing or layout."""
    fresh: dict[Val, tuple[int, ...]] = {}
    written: dict[HostVal, int] = {}
    for node in _run_once(container):
        for v in node.outputs:
            written[v] = written.get(v, 0) + 1
        fresh.update(_allocations(node))
    return {tv: perm for tv, perm in fresh.items() if written.get(tv) == 1}


_UNKNOWN = object()  # a root standing for memory the analysis cannot follow


def _outputs_with_own_memory(container: HostIrContainer) -> set[int]:
    """Positions of outputs whose memory neither an input nor another output can share: each derives,
    through the program's top-level nodes (views included), only from memory the program obtained
    itself (an allocation, a kernel's results, an op that returns new memory), and no other output
    derives from the same memory. Their per-call aliasing check is skipped."""
    unknown = frozenset([_UNKNOWN])
    roots: dict[HostVal, frozenset[object]] = {v: frozenset([v]) for v in container.inputs}
    for node in _run_once(container):
        call = node if isinstance(node, AtenCall) and not node.into else None  # computes new values
        if _allocations(node) or (call is not None and call.expr.returns_new_memory):
            derived = None  # each output is new memory of its own
        elif call is not None:  # may return a view of a tensor operand
            operands = [roots.get(v, unknown) for v in node.inputs if isinstance(v, TensorView)]
            # Without tensor operands (iota, full): memory the analysis has no name for.
            derived = frozenset().union(*operands) if operands else unknown
        else:  # writes into given buffers, loops, communications: not followed
            derived = unknown
        for v in node.outputs:
            roots[v] = frozenset([v]) if derived is None else derived
    inputs = set(container.inputs)
    outputs = [roots.get(v, unknown) for v in container.outputs]
    own = set()
    for pos, mine in enumerate(outputs):
        if _UNKNOWN in mine or mine & inputs:
            continue
        if all(not (mine & other) and _UNKNOWN not in other for q, other in enumerate(outputs) if q != pos):
            own.add(pos)
    return own


class HostIrEvaluator:
    """A compiled Host IR program; ``run(args, ctx)`` returns the fusion outputs."""

    def __init__(self, container: HostIrContainer, layouts: Sequence[OutputLayout], device: torch.device,
                 num_streams: int = DEFAULT_NUM_STREAMS,
                 step_builders: Mapping[type, StepBuilder] = CORE_STEP_BUILDERS) -> None:
        if isinstance(num_streams, bool) or not isinstance(num_streams, int) or num_streams < 1:
            raise ValueError(f"numberOfStreams must be a positive int, got {num_streams!r}")
        self.container = container
        #: the compiled fusion's output tensors, in order (their shardings are final)
        self.output_tvs = [v for v in container.outputs if isinstance(v, TensorView)]
        self.device = device
        self._on_cuda = device.type == "cuda"
        self.num_streams = num_streams
        self._streams_symbol = NUMBER_OF_STREAMS.name
        self.layouts = list(layouts)
        #: the program's segments (``SegmentInfo``: name and scheduler), set by the compile driver for profiles
        self.segments: list[Any] = []
        self._builders = step_builders
        self._slots: dict[object, int] = {}
        self._initial: list[Any] = []
        #: how many bodies are being compiled, one in another (1: the program's own nodes)
        self._nesting = 0
        self._initial[self.slot(NUMBER_OF_STREAMS_SLOT)] = num_streams
        self._input_slots = [self.slot(v) for v in container.inputs]
        #: the inputs take the slots right after the first one (distinct inputs): a run's slots are
        #: built in one list display, not stored one by one
        self._inputs_in_order = self._input_slots == list(range(1, len(self._input_slots) + 1))
        #: the bound launches of each top-level launch (``bound_launches``)
        self._bound_launches: dict[LaunchKernel, BoundLaunches] = {}
        steps = self._compile_nodes(container.nodes)
        self._steps = [step for _, step in steps]
        #: the node of each top-level step (what the first run under a binding records the results of)
        self._step_nodes = [node for node, _ in steps]
        self._output_slots = [self.slot(v) for v in container.outputs]
        fresh = _fresh_buffers(container)
        #: (position, layout) of outputs that may alias an input or another output, or have another
        #: layout (conformed per run); a value returned twice (``add_output(y)`` twice) is copied
        #: the second time
        self._conform: list[tuple[int, OutputLayout, bool]] = []
        #: outputs written into buffers allocated by this program: they own their memory
        self._fresh_output_slots: list[int] = []
        self._fresh_output_positions: list[int] = []
        self._repeated_outputs: set[int] = set()
        seen: set[int] = set()
        own_memory = _outputs_with_own_memory(container)
        for pos, (v, slot, layout) in enumerate(zip(container.outputs, self._output_slots, self.layouts, strict=True)):
            if slot in seen:
                self._repeated_outputs.add(pos)
                self._conform.append((pos, layout, True))
            elif fresh.get(v) != layout.perm:
                self._conform.append((pos, layout, pos not in own_memory))  # (position, layout, may share memory)
            else:
                self._fresh_output_slots.append(slot)
                self._fresh_output_positions.append(pos)
            seen.add(slot)
        #: whether any conformed output may share memory with an input or another output (then each
        #: run collects the storages of the inputs and outputs)
        self._check_sharing = any(shared for _, _, shared in self._conform)
        #: bindings (``EvalContext.binding``) whose runs return outputs that already have their layouts
        self._conforming: Specializations[object, bool] = Specializations()
        self._slot_events: dict[tuple[int, int], torch.cuda.Event] = {}
        #: a program without stream nodes runs on the caller's stream: no stream state to set up
        self._uses_streams = any(isinstance(n, GetCurrentStream | SetCurrentStream | Synchronize | SlotWait)
                                 for n in container.walk())
        self._direct = self._direct_launch(container)
        self._graph = self._graph_replay()
        #: per binding, the program's run as one generated function (``straight_line.py``; None: the
        #: binding's run could not be written so); None for programs that keep their steps. A program of
        #: one launch has one too: a compiled graph writes its regions' straight-line bodies into its own
        #: function, never running their programs (``integrations/torch_compile/bound_graph.py``)
        self._straight: Specializations[object, StraightLineFunction | None] | None = None
        if not self._uses_streams and all(isinstance(n, STRAIGHT_LINE_NODES) for n in container.nodes):
            self._straight = Specializations()

    def _direct_launch(self, container: HostIrContainer) -> tuple[Any, list[int], list[int], BoundLaunches] | None:
        """(the kernel's run, input position of each of its arguments, kernel result of each output,
        its bound launches: the launch step's, which a binding's first run records)
        for a program that is one kernel launch on the caller's stream returning its fresh results
        (every single-kernel fusion): run directly, without value slots and steps (a third of a
        cached call's host time on the H200's host)."""
        nodes = container.nodes
        if len(nodes) != 1 or not isinstance(nodes[0], LaunchKernel) or nodes[0].into or self._conform \
                or self._uses_streams:
            return None
        node = nodes[0]
        inputs = list(container.inputs)
        pick = [next((k for k, v in enumerate(inputs) if v is u), -1) for u in node.inputs]
        results = [next((k for k, v in enumerate(node.outputs) if v is o), -1) for o in container.outputs]
        if -1 in pick or -1 in results:
            return None
        return node.segment.run, pick, results, self.bound_launches(node)

    def _graph_replay(self) -> tuple[GraphStep, list[int], list[int]] | None:
        """(the step, input position of each value it reads, its result of each output) for a program that
        is one ``CaptureGraph`` reading inputs only (``cuda_graph``): a call that replays the last call's
        graph hands it the inputs without value slots, a frame or stream state (``GraphStep.replay``)."""
        if len(self._steps) != 1 or not isinstance(step := self._steps[0], GraphStep):
            return None
        inputs = {slot: k for k, slot in reversed(list(enumerate(self._input_slots)))}
        pick = [inputs.get(slot, -1) for slot in step.reads]
        results = [step.writes.index(slot) if slot in step.writes else -1 for slot in self._output_slots]
        if -1 in pick or -1 in results:
            return None
        return step, pick, results

    def on_device(self, device: torch.device) -> HostIrEvaluator:
        """The same program with its steps built for ``device`` (a rehearsal on meta tensors: every
        tensor it allocates is a meta tensor too, and no stream or CUDA graph step is built)."""
        program = HostIrEvaluator(self.container, self.layouts, device, self.num_streams, self._builders)
        program.segments = self.segments
        return program

    # --- CompileContext ------------------------------------------------------------------------
    def slot(self, val: HostVal | Hashable) -> int:
        slot = self._slots.get(val)
        if slot is None:
            slot = self._slots[val] = len(self._initial)
            self._initial.append(val.value if isinstance(val, Scalar) and val.is_const else None)
        return slot

    @property
    def top_level(self) -> bool:
        return self._nesting == 1

    def compile_body(self, nodes: Sequence[HostNode], *, once_per_run: bool = False) -> list[Step]:
        return [step for _, step in self._compile_nodes(nodes, nested=not once_per_run)]

    def bound_launches(self, node: LaunchKernel) -> BoundLaunches:
        bound = self._bound_launches.get(node)
        if bound is None:
            bound = self._bound_launches[node] = BoundLaunches(node.segment)
        return bound

    def _compile_nodes(self, nodes: Sequence[HostNode], nested: bool = True) -> list[tuple[HostNode, Step]]:
        """Each node with its step (nodes without one, e.g. stream nodes on CPU, left out); ``nested``:
        the nodes are a level below the ones being compiled (the program's own nodes, a loop's body)."""
        self._nesting += nested
        try:
            steps = [(node, self._builder(node)(node, self)) for node in nodes]
        finally:
            self._nesting -= nested
        return [(node, step) for node, step in steps if step is not None]

    def _builder(self, node: HostNode) -> StepBuilder:
        for cls in type(node).__mro__:
            builder = self._builders.get(cls)
            if builder is not None:
                return builder
        raise TypeError(f"the Host IR evaluator has no step builder for {type(node).__name__} nodes "
                        f"({node.to_string().strip()}); register one in pyfuser.runtime.backends")

    # --- execution -------------------------------------------------------------------------------
    def run(self, args: Sequence[Any], ctx: EvalContext) -> list[torch.Tensor]:
        graph = self._graph
        if graph is not None and (not self._on_cuda or _current_device() == self.device.index):
            step, reads, writes = graph
            replayed = step.replay([args[k] for k in reads])
            if replayed is not None:
                results = [replayed[k] for k in writes]
                self._conform_outputs(args, results, ctx, None)
                return results
        direct = self._direct
        # A binding's first run takes the steps, which record it for its straight-line function.
        first_bound = ctx.binding is not None and self._straight is not None and ctx.binding not in self._straight
        if direct is not None and not first_bound and (not self._on_cuda or _current_device() == self.device.index):
            launch, pick, results, bound = direct
            ctx.env[self._streams_symbol] = self.num_streams
            try:
                picked = [args[k] for k in pick]
                outputs = bound.run(ctx, picked) if ctx.binding is not None else None
                if outputs is None:
                    outputs = launch(ctx, *picked)
            except NoPrograms:  # the steps know the ATen fallback
                pass
            else:
                return [outputs[k] for k in results]
        # A binding's first run is recorded and written as a straight-line function, which the bound
        # program calls from then on (``BoundProgram.run``); its later runs come here only when the
        # function declines (another current device).
        recorded = None
        if self._straight is not None and ctx.binding is not None and ctx.binding not in self._straight:
            recorded = Recording()
            for k, a in enumerate(args):
                recorded.note(("input", k), a)
        if self._inputs_in_order and len(args) == len(self._input_slots):
            initial = self._initial
            values = [initial[0], *args, *initial[len(args) + 1:]]
        else:
            values = self._initial.copy()
            for slot, arg in zip(self._input_slots, args, strict=True):
                values[slot] = arg
        ctx.env[self._streams_symbol] = self.num_streams
        if self._on_cuda and not self._uses_streams:
            if _current_device() == self.device.index:
                self._execute(Frame(values, ctx, None), recorded)
            else:
                with torch.cuda.device(self.device):
                    self._execute(Frame(values, ctx, None), recorded)
        elif self._on_cuda:
            # torch.cuda.set_stream also makes the stream's device current: keep the caller's device.
            with torch.cuda.device(self.device):
                user = torch.cuda.current_stream(self.device)
                streams = CudaStreams(stream_pool(self.device, self.num_streams), user, self._slot_events)
                streams.run(lambda: self._execute(Frame(values, ctx, streams)))
        else:
            self._execute(Frame(values, ctx, None), recorded)
        outputs = [values[s] for s in self._output_slots]
        fixes = self._conform_outputs(args, outputs, ctx, recorded)
        if recorded is not None:
            self._write_straight_line(ctx, recorded, fixes)
        return outputs

    def _conform_outputs(self, args: Sequence[Any], outputs: list[Any], ctx: EvalContext,
                         recorded: Recording | None) -> list[tuple[int, Callable[[torch.Tensor], torch.Tensor]]]:
        """Give ``outputs`` (in place) their layouts, each owning memory no input or other output shares;
        returns what conforming did to each output it changed (with ``recorded``: for the binding's
        straight-line function)."""
        fixes: list[tuple[int, Callable[[torch.Tensor], torch.Tensor]]] = []
        if self._conform and ctx.binding not in self._conforming:
            # An output never shares memory with an input or with another output (``b`` and ``set(b)``
            # both returned, or one tensor returned twice): the caller may write to any of them.
            taken: set[int] | None = None
            if self._check_sharing:
                taken = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
                taken.update(outputs[p].untyped_storage().data_ptr() for p in self._fresh_output_positions)
            unchanged = taken is None and not self._repeated_outputs
            for pos, layout, shared in self._conform:
                result = given = outputs[pos]
                if pos in self._repeated_outputs:
                    result = layout.copy(result)
                else:
                    result = layout.conform(result, taken if shared else None)
                unchanged = unchanged and result is given
                if recorded is not None and result is not given:
                    fixes.append((pos, _conformed_again(layout, given, result)))
                outputs[pos] = result
                if taken is not None:
                    taken.add(result.untyped_storage().data_ptr())
            if unchanged and ctx.binding is not None:
                # A bound program's outputs have the layouts of its first run: these need nothing.
                self._conforming.record(ctx.binding, True)
        return fixes

    def _execute(self, frame: Frame, recorded: Recording | None = None) -> None:
        if recorded is None:
            for step in self._steps:
                step(frame)
            return
        values, slot = frame.values, self._slots
        for k, (step, node) in enumerate(zip(self._steps, self._step_nodes, strict=True)):
            step(frame)
            for j, v in enumerate(node.outputs):
                recorded.note((k, j), values[slot[v]])

    def _write_straight_line(self, ctx: EvalContext, recorded: Recording,
                             fixes: Sequence[tuple[int, Callable[[torch.Tensor], torch.Tensor]]] = ()) -> None:
        """After the first run under ``ctx.binding``: its later runs as one generated function. Outputs
        conforming changed on that run (``fixes``: a copy where an output shares memory with an input
        or another output, a restride) are changed the same way on each: under a binding, which
        output is a view of what, and its strides, are the same on every run."""
        straight = self._straight
        assert straight is not None
        container, nodes = self.container, self._step_nodes
        inputs = [recorded[("input", k)] for k in range(len(container.inputs))]
        results = [[recorded[(k, j)] for j in range(len(node.outputs))] for k, node in enumerate(nodes)]
        conforming = tuple(fixes)

        def inline(writer: PythonWriter, given: Sequence[str], prefix: str, fixed: Sequence[bool]) -> InlinedBody | None:
            body = StraightLine(self.slot, self._initial, self.device, self._bound_launches.get, writer, prefix).inline(
                container.inputs, inputs, nodes, results, container.outputs, ctx, given, fixed)
            if body is not None:
                for pos, fix in conforming:
                    name = writer.fresh(f"{prefix}out")
                    body.lines.append(f"{name} = {writer.constant(fix, '_conform')}({body.outputs[pos]})")
                    body.outputs[pos] = name
            return body

        run = StraightLine(self.slot, self._initial, self.device, self._bound_launches.get).build(
            container.inputs, inputs, nodes, results, container.outputs, ctx, inline)
        if run is not None and conforming:
            run = _with_fixes(run, conforming)
        straight.record(ctx.binding, run)

    def step_of(self, node: HostNode) -> Step:
        """The step built for a top-level node: a tool reads a step's state off it (the captures of a
        ``CaptureGraph``'s ``cuda_graph.GraphStep``)."""
        for n, step in zip(self._step_nodes, self._steps, strict=True):
            if n is node:
                return step
        raise ValueError(f"no step was built for {node.to_string().strip().splitlines()[0]} among the program's "
                         "top-level nodes (a node of a block, or one that does nothing on this device)")

    @property
    def writes_straight_line(self) -> bool:
        """Whether a binding's runs after its first are one generated function (a program of launches,
        ATen calls and allocations on the caller's stream)."""
        return self._straight is not None

    def straight_line(self, binding: object) -> StraightLineFunction | None:
        """The function runs under ``binding`` take after the first (None: they take the steps)."""
        straight = self._straight
        return straight.get(binding) if straight is not None else None

    def __str__(self) -> str:
        return str(self.container)


def _conformed_again(layout: OutputLayout, given: torch.Tensor,
                     result: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """What conforming did to ``given`` (giving ``result``), as a function doing it to a later run's
    output: a restride of the same memory, else a copy in the layout."""
    if result.untyped_storage().data_ptr() == given.untyped_storage().data_ptr():
        strides = result.stride()
        return lambda t: t.as_strided(t.shape, strides, t.storage_offset())
    return layout.copy


def _with_fixes(function: StraightLineFunction,
                fixes: tuple[tuple[int, Callable[[torch.Tensor], torch.Tensor]], ...]) -> StraightLineFunction:
    """``function`` with each output at a fix's position changed by it."""
    run = function.run

    def conformed(args: Sequence[Any]) -> list[Any] | None:
        outputs = run(args)
        if outputs is not None:
            for pos, fix in fixes:
                outputs[pos] = fix(outputs[pos])
        return outputs

    return StraightLineFunction(conformed, function.source, function.inline)
