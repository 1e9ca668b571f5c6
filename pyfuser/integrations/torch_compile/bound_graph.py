"""A compiled graph, after its first calls, as one generated function per input signature.

Once every region of a graph runs a straight-line function (``host_ir/straight_line.py``), what is
left around the kernels and GEMMs on each call is the graph's own Python: each region's call (picking
its inputs, comparing their strides with the bound ones, the bound program's dispatch) and each view
left in eager (a call into torch per view or chain). Given the graph's input strides, every value in
the graph has the same sizes, strides and storage offset relative to its base on every call: dynamo's
guards fix the inputs' sizes (autograd an incoming gradient's), and the regions' programs and the
eager ops compute the rest the same way. So after its warm-up calls the graph records one call (each
node's result's geometry), rewrites a copy of itself (``specialize``: an FX graph of what the call
does, which a test reads) and writes that as one function (``write_function``, through the one writer
of generated Python, ``codegen/python_writer.py``), Inductor's wrapper code per graph:

* a region's call becomes its straight-line body, written in place (``StraightLineFunction.inline``:
  the region's kernel launches, GEMMs and ATen calls on the graph's values; their strides were
  compared once, at the graph's entry, as the graph's inputs'), with no call, argument list, device
  check or stream read per region;
* a view left in eager (a tensor method, a ``ViewChain``, a view op, a piece of a ``split``), other
  than an output whose aliasing AOTAutograd tracks, becomes one ``reinterpret_tensor`` of the nearest
  value that is not such a view: chains collapse, a view only other views read is dropped, and so is
  a split all of whose pieces are reinterpreted;
* any other ATen op left in eager whose torch function means that one op (``direct_function``) is
  called through that function, as Inductor's ``extern_kernels.convolution`` is ``torch.convolution``:
  an ``OpOverload`` parses its arguments against the schema in Python-facing C++ that costs several
  microseconds more per call (a convolution: 27 against 20 us of host time on an H200's host);
* every value is dropped after its last use, as the graph's own code drops it.

Each input signature (``BoundGraph``: the inputs' strides, on CUDA the current device) is warmed up,
recorded and specialized on its own, at most ``SPECIALIZATION_LIMIT`` of them: an incoming gradient
of other strides gets its own copy (its regions bind those strides too). A graph of dynamic shapes
(dynamo marks sizes symbolic once a frame is called with other sizes; the size symbols are inputs)
is specialized the same way per concrete call: its signature adds the tensors' sizes and the
numbers' values, which then fix every value's geometry as guards fix a static graph's. A signature
with a region that has no straight-line function for it, or whose recorded call left anything
unexpected, keeps running as compiled.
"""

from __future__ import annotations

import copy
import functools
import math
import operator
import warnings
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Interpreter, Node
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from pyfuser.codegen.launcher import reinterpret_tensor
from pyfuser.codegen.python_writer import PythonWriter, dropped_after_last_use
from pyfuser.host_ir.specialization import Recording, Specializations
from pyfuser.integrations.torch_compile.eager_methods import METHODS
from pyfuser.integrations.torch_compile.region import FusionRegion, RegionFunction, dynamic_signature, static_tensor
from pyfuser.integrations.torch_compile.view_chains import CHAIN_OPS, ViewChain, viewed_operand

_cuda_get_device = getattr(torch._C, "_cuda_getDevice", None)
#: The current CUDA device's index (torch's own call, without ``torch.cuda.current_device``'s checks);
#: read only where the graph runs on CUDA with that call.
_current_device: Callable[[], int] = _cuda_get_device or torch.cuda.current_device

#: Calls of a signature the graph runs as compiled before it records one: a region binds the signature on
#: its first call and writes its straight-line function during its second.
WARM_CALLS = 2

#: Tensor methods that view their operand (``reshape`` too: the recorded storage tells whether it copied).
VIEW_METHODS = frozenset(METHODS.values())


class _Recorder(Interpreter):
    """Runs the graph once, node by node, into a ``Recording`` (each strided tensor result's
    geometry), keeping which results require grad (views autograd must see) and each number's value
    (a size symbol's, in a graph of dynamic shapes)."""

    def __init__(self, gm: GraphModule) -> None:
        super().__init__(gm)
        self.recording = Recording()
        self.requires_grad: set[Node] = set()
        self.numbers: dict[Node, int | float | bool] = {}

    def run_node(self, n: Node) -> Any:
        value = super().run_node(n)
        if self.recording.note(n, value) is not None and value.requires_grad:
            self.requires_grad.add(n)
        elif isinstance(value, (int, float, bool)):
            self.numbers[n] = value
        return value


def _number(value: Any) -> bool:
    """Whether an FX value is a number (a size symbol of a graph of dynamic shapes, or a constant)."""
    return isinstance(value, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool))


def _fixed_by_inputs(value: Any) -> bool:
    """Whether an FX value is a tensor whose sizes and strides follow from the graph's inputs (plain
    ints, or symbols the inputs carry: not sizes of data-dependent results)."""
    if not isinstance(value, torch.Tensor):
        return False
    if static_tensor(value):
        return True
    return not any(free_unbacked_symbols(s) for s in (*value.shape, *value.stride()))


def _follows_inputs(value: Any) -> bool:
    """Whether an FX value is the same on every call of one signature: a tensor's geometry fixed by the
    inputs (``_fixed_by_inputs``), or a number that is not a data-dependent size."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return not free_unbacked_symbols(value)
    return _number(value) or _fixed_by_inputs(value)


@functools.cache
def direct_function(target: Any) -> Callable[..., Any] | None:
    """torch's own Python function of an ATen op's default overload (``torch.convolution`` for
    ``aten.convolution.default``), where that function can mean no other overload: every other overload
    of the op is an ``out=`` variant, which a call without ``out`` never picks. None otherwise (an op
    of several overloads, like ``add``; an op torch exposes no function of, like most backward ops)."""
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten" or target._overloadname != "default":
        return None
    packet = target.overloadpacket
    function: Callable[..., Any] | None = getattr(torch._C._VariableFunctions, packet.__name__, None)
    if function is None:
        return None
    for name in packet.overloads():
        if name != "default" and not any(a.is_out for a in getattr(packet, name)._schema.arguments):
            return None
    return function


#: Views of several outputs (each taken by a ``getitem``): a fused projection's split into q, k, v
_SPLITS = frozenset({torch.ops.aten.split.Tensor, torch.ops.aten.split_with_sizes.default})


def _view_operand(node: Node) -> Node | None:
    """The tensor a node views, for a view left in eager whose other arguments are constants (a piece
    of a split: the split's operand)."""
    split = _split_taken_from(node)
    if split is not None:
        return viewed_operand(split)
    if node.op == "call_method":
        is_view = node.target in VIEW_METHODS
    else:
        is_view = node.op == "call_function" and (node.target in CHAIN_OPS or isinstance(node.target, ViewChain))
    return viewed_operand(node) if is_view else None


def _split_taken_from(node: Node) -> Node | None:
    """The split whose piece ``node`` takes by index (None: it is no such piece)."""
    split = node.args[0] if node.op == "call_function" and node.target is operator.getitem else None
    return split if isinstance(split, Node) and split.op == "call_function" and split.target in _SPLITS else None



@dataclass(frozen=True)
class Specialized:
    """A graph specialized to a recorded call: ``graph_module`` (each region's call a call of its
    straight-line function on the fusion's inputs, taken apart by index into the fusion's outputs),
    and each such call's ``RegionFunction``, whose body ``write_function`` writes in its place."""

    graph_module: GraphModule
    regions: dict[Node, RegionFunction]
    #: per region call, per fusion input: whether the graph obtains its memory itself (a result of the
    #: graph's ops at a recorded offset, not on an input's memory): aligned alike on every call
    fixed: dict[Node, list[bool]]


def specialize(gm: GraphModule, seen: Recording, protected: Collection[Node],
               requires_grad: Collection[Node] = (), numbers: Mapping[Node, Any] | None = None) -> Specialized | str:
    """A copy of ``gm`` specialized to the geometry of a recorded call (see the module's docstring), or
    why it cannot be."""
    graph = Graph()
    graph._codegen = copy.deepcopy(gm.graph._codegen)
    env: dict[Node, Node] = {}
    for node in gm.graph.nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
    #: a view rewritten as a reinterpretation -> the value it reinterprets
    base_of: dict[Node, Node] = {}
    reinterpreted: list[Node] = []
    #: each region's call -> the region's straight-line function
    functions: dict[Node, RegionFunction] = {}
    fixed: dict[Node, list[bool]] = {}
    placeholders = [seen.get(n) for n in gm.graph.nodes if n.op == "placeholder"]
    input_storages = {p.storage for p in placeholders if p is not None}
    for node in gm.graph.nodes:
        new = env[node]
        if node.op == "call_function" and isinstance(node.target, FusionRegion):
            if not all(_follows_inputs(a.meta.get("val")) for a in node.args if isinstance(a, Node)):
                return f"{node.target.name} reads a value of data-dependent sizes"
            recorded = [(seen.get(a) or (numbers or {}).get(a)) if isinstance(a, Node) else a for a in node.args]
            function = node.target.straight_line(recorded)
            if function is None:
                return f"{node.target.name} has no straight-line function for the recorded call"
            if node.kwargs or any(u.op != "call_function" or u.target is not operator.getitem for u in node.users):
                return f"{node.name}'s outputs are read other than by index"
            new.target = function.run
            new.args = ([new.args[k] for k in function.positions],)
            for user in node.users:
                env[user].args = (new, function.slots[user.args[1]])
            functions[new] = function
            fixed[new] = [isinstance(a, Node) and (s := seen.get(a)) is not None and s.storage not in input_storages
                          for a in (node.args[k] for k in function.positions)]
            continue
        operand = _view_operand(node)
        if operand is None and node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            new.target = direct_function(node.target) or node.target
        if operand is None or node in protected or not _fixed_by_inputs(node.meta.get("val")):
            continue  # (sizes the graph does not fix: a view of a data-dependent result)
        result, source = seen.get(node), seen.get(operand)
        if result is None or source is None or result.numel == 0 or node in requires_grad or operand in requires_grad \
                or result.storage != source.storage or result.dtype != source.dtype:
            continue  # not a view after all (a reshape that copied), or one autograd must see
        base = base_of.get(operand, operand)
        base_seen = seen[base]
        assert base_seen is not None  # a reinterpreted view's base was recorded as a tensor
        with graph.inserting_before(new):
            view = graph.call_function(reinterpret_tensor, (env[base], result.sizes, result.strides,
                                                            result.offset - base_seen.offset))
        view.meta.update(new.meta)
        new.replace_all_uses_with(view)
        graph.erase_node(new)
        env[node] = view
        base_of[node] = base
        reinterpreted.append(view)
    if not functions:
        return "no regions"
    for view in reversed(reinterpreted):  # views only other (now rewritten) views read
        if not view.users:
            graph.erase_node(view)
    for node in reversed(list(graph.nodes)):  # splits whose pieces are all reinterpretations now
        if node.op == "call_function" and node.target in _SPLITS and not node.users:
            graph.erase_node(node)
    graph.lint()
    return Specialized(GraphModule(gm, graph), functions, fixed)


@dataclass(frozen=True, slots=True)
class GraphFunction:
    """A specialized graph as one generated function: ``run(args)`` (the graph's inputs, in order) -> what
    the graph returns; ``source`` its text."""

    run: Callable[[Sequence[Any]], Any]
    source: str


#: a statement of a generated graph function: its text, the local names it reads and those it defines
_Statement = tuple[str, list[str], list[str]]


def _callable_name(target: Any) -> str:
    """A readable global name for a function a generated graph calls (``aten_mm_default``, ``torch_convolution``)."""
    if isinstance(target, torch._ops.OpOverload):
        text = f"{target.namespace}_{target._opname}_{target._overloadname}"
    else:
        module = getattr(target, "__module__", None) or ""
        name = getattr(target, "__name__", None) or type(target).__name__
        text = f"torch_{name}" if module.startswith("torch") and target is getattr(torch, name, None) else name
    text = "".join(c if c.isalnum() or c == "_" else "_" for c in text)
    return text if text.startswith(("_", "aten_", "torch_")) else f"_{text}"


class _GraphWriter:
    """Writes a specialized graph (``Specialized``) as one function with ``PythonWriter``: each region's
    straight-line body in place of its call (``RegionFunction.inline``), every other node one statement,
    each value dropped after its last use (a training step's activations are freed as the graph goes)."""

    def __init__(self, specialized: Specialized, what: str) -> None:
        self._graph_module = specialized.graph_module
        self._regions = specialized.regions
        self._fixed = specialized.fixed
        self._writer = PythonWriter(what)
        #: FX node -> the expression of its value (a local name, or a region body's output)
        self._names: dict[Node, str] = {}
        #: a region's call -> the expressions of the fusion's outputs its body computes
        self._outputs: dict[Node, list[str]] = {}
        #: the function's local names (what may be dropped after its last use)
        self._locals: set[str] = set()
        self._statements: list[_Statement] = []
        #: each function the graph calls (by ``id``) -> its global name
        self._functions: dict[int, str] = {}
        self._head: dict[str, str] = {}
        self._uses: list[str] = []

    def write(self) -> GraphFunction | str:
        parameters: list[str] = []
        returned, kept = "None", []
        for node in self._graph_module.graph.nodes:
            if node.op == "placeholder":
                parameters.append(self._local(node))
            elif node.op == "output":
                self._uses = []
                returned, kept = self._render(node.args[0]), self._uses
            elif node in self._regions:
                why = self._region(node, self._regions[node])
                if why is not None:
                    return why
            elif node.op == "call_function" and node.target is operator.getitem \
                    and node.args[0] in self._regions:
                self._names[node] = self._outputs[node.args[0]][node.args[1]]
            else:
                self._statement(node)
        unpack = f"{', '.join(parameters)}, = args" if parameters else "del args"
        body = dropped_after_last_use(self._statements, kept, self._locals.__contains__)
        writer = self._writer
        writer.function("def graph(args):", [unpack, *self._head.values(), *body, f"return {returned}"])
        return GraphFunction(writer.define("graph"), writer.source)

    def _local(self, node: Node) -> str:
        name = self._writer.fresh(f"g_{node.name}")
        self._names[node] = name
        self._locals.add(name)
        return name

    def _region(self, node: Node, function: RegionFunction) -> str | None:
        self._uses = []
        (arguments,) = node.args
        assert isinstance(arguments, list)  # (``specialize`` passes the fusion's inputs as one list)
        given = [self._render(a) for a in arguments]
        prefix = f"r{len(self._outputs)}_"
        body = function.inline(self._writer, given, prefix, self._fixed[node])
        if body is None:
            return f"{node.name}'s body could not be written into the graph's function"
        for name, line in body.head.items():
            self._head.setdefault(name, line)
        outputs = [o for o in body.outputs if o.startswith(prefix)]
        self._locals.update(outputs)
        self._outputs[node] = body.outputs
        self._statements.append(("\n".join(body.lines), self._uses, outputs))
        return None

    def _statement(self, node: Node) -> None:
        self._uses = []
        if node.op == "get_attr":
            value: Any = self._graph_module
            for part in str(node.target).split("."):
                value = getattr(value, part)
            expression = self._writer.constant(value, "_attr")
        elif node.op == "call_method":
            this, *rest = node.args
            expression = f"{self._render(this)}.{node.target}({self._arguments(rest, node.kwargs)})"
        elif node.target is operator.getitem:
            expression = f"{self._render(node.args[0])}[{self._render(node.args[1])}]"
        else:
            function = self._functions.get(id(node.target))
            if function is None:  # (by identity: a target need not be hashable; the graph keeps it alive)
                function = self._functions[id(node.target)] = self._writer.constant(node.target,
                                                                                    _callable_name(node.target))
            expression = f"{function}({self._arguments(node.args, node.kwargs)})"
        uses = self._uses
        if node.users:
            name = self._local(node)
            self._statements.append((f"{name} = {expression}", uses, [name]))
        else:  # (run for its effect: an input's update)
            self._statements.append((expression, uses, []))

    def _arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        return ", ".join([*(self._render(a) for a in args), *(f"{k}={self._render(v)}" for k, v in kwargs.items())])

    def _render(self, value: Any) -> str:
        """``value`` (an FX argument) as an expression, noting the local names it reads."""
        if isinstance(value, Node):
            name = self._names[value]
            if name in self._locals:
                self._uses.append(name)
            return name
        if isinstance(value, list | tuple) and not hasattr(value, "_fields"):  # (not a named tuple)
            inner = ", ".join(self._render(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{self._render(k)}: {self._render(v)}" for k, v in value.items()) + "}"
        if value is None or type(value) in (bool, int, str) or (type(value) is float and math.isfinite(value)):
            return repr(value)
        return self._writer.constant(value, "_k")

def write_function(specialized: Specialized, what: str) -> GraphFunction | str:
    """``specialized`` as one generated function (``_GraphWriter``), or why it cannot be written."""
    return _GraphWriter(specialized, what).write()


def _strides(args: list[Any]) -> list[Any]:
    """The signature of a call of a graph of static shapes: its tensors' strides."""
    return [a.stride() for a in args]


@dataclass(slots=True)
class Signature:
    """One input signature's state in a ``BoundGraph``: its calls run as compiled so far, then its
    specialized copy (``graph``: what the copy does, as an FX graph; ``function``: that, written as one
    function, which its calls run) or why it has none (its calls run as compiled)."""

    calls: int = 0
    function: GraphFunction | None = None
    graph: GraphModule | None = None
    why: str | None = None


class BoundGraph:
    """The compiled graph as the backend hands it to AOTAutograd (a boxed callable: ``bound(args)``),
    run through the specialized copy of the call's input signature once that exists.

    A signature is the inputs' strides (in a graph of dynamic shapes also their sizes and the numbers'
    values) and, on a CUDA device, the current device: dynamo's guards fix the rest (sizes, dtypes, the
    inputs' devices) for a graph of static shapes, and autograd the sizes of an incoming gradient, whose
    strides may differ from call to call. Each signature gets its own
    warm-up calls, recording and copy, at most ``SPECIALIZATION_LIMIT`` of them (``Specializations``)."""

    def __init__(self, graph_module: GraphModule, regions: Sequence[FusionRegion], protected: Collection[Node],
                 name: str) -> None:
        # On the instance: wrappers AOTAutograd puts around the backward copy the instance's __dict__.
        self._boxed_call = True
        self.graph_module = graph_module
        self.name = name
        self._forward = graph_module.forward
        self._regions = list(regions)
        self._protected = frozenset(protected)
        devices = {r.device for r in self._regions}
        cuda = {d for d in devices if d.type == "cuda"}
        #: the regions' CUDA device (else the CPU; regions on the CPU beside it, say of index arithmetic on
        #: CPU tensors, do not depend on the current device): a call's current device is part of its signature
        self._device = next(iter(cuda)) if len(cuda) == 1 else next(iter(devices)) if len(devices) == 1 else None
        self._on_cuda = self._device is not None and self._device.type == "cuda" and _cuda_get_device is not None
        values = [n.meta.get("val") for n in graph_module.graph.nodes if n.op == "placeholder"]
        #: a graph of dynamic shapes (size symbols among its inputs, symbolic sizes): a signature holds the
        #: tensors' sizes and the numbers' values besides the strides (dynamo's guards do not fix them)
        self._dynamic = not all(static_tensor(v) for v in values)
        #: the call's arguments -> the list its signature is made of
        self._signature_of: Callable[[list[Any]], list[Any]] = dynamic_signature if self._dynamic else _strides
        #: per input signature: its warm-up calls, then its specialized copy or why it has none
        self.signatures: Specializations[Hashable, Signature] = Specializations()
        #: the latest call's signature, when it has a specialized copy: that copy's forward, the inputs'
        #: strides and (on CUDA) the current device
        self._run: Callable[..., Any] | None = None
        self._strides: list[Any] = []
        self._current: int | None = None
        #: why the graph runs as compiled for good (None while its signatures may be specialized)
        self.declined: str | None = None
        if not self._regions:
            self.declined = "no regions"
        elif self._device is None:
            self.declined = f"regions on {len(devices)} devices"
        elif not all(isinstance(v, torch.Tensor) or _number(v) for v in values):
            self.declined = "an input that is neither a tensor nor a number"

    def __call__(self, args: list[Any]) -> Any:
        run = self._run
        if run is not None and self._signature_of(args) == self._strides and (
                self._current is None or _current_device() == self._current):
            try:
                return run(args)
            except Exception as e:  # the graph as compiled reports it, naming the region and its FX nodes
                self._decline(f"the specialized graph failed ({type(e).__name__}: {e})")
                return self._forward(*args)
        return self._lookup(args)

    def _lookup(self, args: list[Any]) -> Any:
        """A call of another signature than the latest call's: its specialized copy (then the latest
        signature's, which ``__call__`` compares with a list, cheaper than hashing a key), its warm-up,
        or the graph as compiled."""
        if self.declined is not None:
            return self._forward(*args)
        strides = self._signature_of(args)
        key: Hashable = tuple(strides)
        current = None
        if self._on_cuda:
            current = _current_device()
            key = (key, current)
        signature = self.signatures.get(key)
        if signature is None or signature.function is None:
            return self._warm_up(key, signature, args, strides, current)
        self._run, self._strides, self._current = signature.function.run, strides, current
        return self(args)

    def _warm_up(self, key: Hashable, signature: Signature | None, args: list[Any],
                 strides: list[tuple[int, ...]], current: int | None) -> Any:
        """A call of a signature without a specialized copy: one of its warm-up calls, its recorded
        call, or (declined) a call of the graph as compiled."""
        if signature is None:  # (may forget the others: so the latest call's copy too)
            self._run = None
            signature = self.signatures.record(key, Signature())
        if signature.why is not None or signature.calls < WARM_CALLS:
            signature.calls += 1
            return self._forward(*args)
        recorder = _Recorder(self.graph_module)
        outputs = recorder.run(*args)
        specialized = self._specialize(recorder, current)
        if isinstance(specialized, str):
            signature.why = specialized
            return outputs
        function = write_function(specialized, f"graph of {self.name}")
        if isinstance(function, str):
            signature.why = function
        else:
            signature.graph, signature.function = specialized.graph_module, function
            self._run, self._strides, self._current = function.run, strides, current
        return outputs

    def _specialize(self, recorder: _Recorder, current: int | None) -> Specialized | str:
        device = self._device
        if device is not None and device.type == "cuda" and (current is None or current != device.index):
            return "a call on another device than the regions'"
        return specialize(self.graph_module, recorder.recording, self._protected, recorder.requires_grad,
                          recorder.numbers)

    def _decline(self, why: str) -> None:
        warnings.warn(f"{self.name}: {why}; it runs as compiled from now on", stacklevel=3)
        self.declined = why
        self._run = None
        self.signatures.clear()

    @property
    def specialized(self) -> GraphModule | None:
        """The latest specialized copy (None before the first, or once the graph is declined)."""
        graphs = [s.graph for s in self.signatures.values() if s.graph is not None]
        return graphs[-1] if graphs else None

    @property
    def code(self) -> str:
        """The latest specialized copy's generated function (empty before it exists)."""
        functions = [s.function for s in self.signatures.values() if s.function is not None]
        return functions[-1].source if functions else ""
