"""A compiled graph of static shapes, after its first calls, as one specialized FX graph.

Once every region of a graph runs a straight-line function (``host_ir/straight_line.py``), what is
left around the kernels and GEMMs on each call is the graph's own Python: each region's call (picking
its inputs, comparing their strides with the bound ones, the bound program's dispatch) and each view
left in eager (a call into torch per view or chain). Given the graph's input strides, every value in
the graph has the same sizes, strides and storage offset relative to its base on every call: dynamo's
guards fix the inputs' sizes (autograd an incoming gradient's), and the regions' programs and the
eager ops compute the rest the same way. So after its warm-up calls the graph records one call (each
node's result's geometry) and rewrites a copy of itself, Inductor's wrapper code per graph:

* a region's call becomes a call of its straight-line function on its inputs (their strides were
  compared once, at the graph's entry, as the graph's inputs');
* a view left in eager (a tensor method, a ``ViewChain``, a view op), other than an output whose
  aliasing AOTAutograd tracks, becomes one ``reinterpret_tensor`` of the nearest value that is not
  such a view: chains collapse, and a view only other views read is dropped.

A call whose inputs' strides differ from the recorded call's, or on another current CUDA device,
runs the graph as compiled (its regions then decide, as before). A graph with a region that has no
straight-line function, or whose recorded call left anything unexpected, keeps running as compiled.
"""

from __future__ import annotations

import copy
import operator
import warnings
from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Interpreter, Node

from pyfuser.codegen.launcher import reinterpret_tensor
from pyfuser.host_ir.specialization import Recording, Seen
from pyfuser.integrations.torch_compile.eager_methods import METHODS
from pyfuser.integrations.torch_compile.region import FusionRegion, static_tensor
from pyfuser.integrations.torch_compile.view_chains import CHAIN_OPS, ViewChain, viewed_operand

_current_device = getattr(torch._C, "_cuda_getDevice", None)

#: Calls the graph runs as compiled before it records one: a region binds on its first call and writes
#: its straight-line function during its second.
WARM_CALLS = 2

#: Tensor methods that view their operand (``reshape`` too: the recorded storage tells whether it copied).
VIEW_METHODS = frozenset(METHODS.values())


class _Recorder(Interpreter):
    """Runs the graph once, node by node, into a ``Recording`` (each strided tensor result's
    geometry), keeping which results require grad (views autograd must see)."""

    def __init__(self, gm: GraphModule) -> None:
        super().__init__(gm)
        self.recording = Recording()
        self.requires_grad: set[Node] = set()

    def run_node(self, n: Node) -> Any:
        value = super().run_node(n)
        if self.recording.note(n, value) is not None and value.requires_grad:
            self.requires_grad.add(n)
        return value


def _view_operand(node: Node) -> Node | None:
    """The tensor a node views, for a view left in eager whose other arguments are constants."""
    if node.op == "call_method":
        is_view = node.target in VIEW_METHODS
    else:
        is_view = node.op == "call_function" and (node.target in CHAIN_OPS or isinstance(node.target, ViewChain))
    return viewed_operand(node) if is_view else None


def _strides(seen: Seen | None) -> tuple[int, ...] | None:
    return seen.strides if seen is not None else None


def specialize(gm: GraphModule, seen: Recording, protected: Collection[Node],
               requires_grad: Collection[Node] = ()) -> GraphModule | str:
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
    regions = 0
    for node in gm.graph.nodes:
        new = env[node]
        if node.op == "call_function" and isinstance(node.target, FusionRegion):
            arg_strides = [_strides(seen.get(a)) if isinstance(a, Node) else None for a in node.args]
            function = node.target.straight_line(arg_strides)
            if function is None:
                return f"{node.target.name} has no straight-line function for the recorded call"
            run, positions, slots = function
            if node.kwargs or any(u.op != "call_function" or u.target is not operator.getitem for u in node.users):
                return f"{node.name}'s outputs are read other than by index"
            new.target = run
            new.args = ([new.args[k] for k in positions],)
            for user in node.users:
                env[user].args = (new, slots[user.args[1]])
            regions += 1
            continue
        operand = _view_operand(node)
        if operand is None or node in protected or not static_tensor(node.meta.get("val")):
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
    if not regions:
        return "no regions"
    for view in reversed(reinterpreted):  # views only other (now rewritten) views read
        if not view.users:
            graph.erase_node(view)
    graph.lint()
    return GraphModule(gm, graph)


class BoundGraph:
    """The compiled graph as the backend hands it to AOTAutograd (a boxed callable: ``bound(args)``),
    run through its specialized copy once that exists and the call's input strides are the recorded
    ones."""

    def __init__(self, graph_module: GraphModule, regions: Sequence[FusionRegion], protected: Collection[Node],
                 name: str) -> None:
        # On the instance: wrappers AOTAutograd puts around the backward copy the instance's __dict__.
        self._boxed_call = True
        self.graph_module = graph_module
        self.name = name
        self._forward = graph_module.forward
        self._regions = list(regions)
        self._protected = frozenset(protected)
        self._calls = 0
        #: the graph specialized to the recorded call (None before it, or where it was declined)
        self.specialized: GraphModule | None = None
        #: why the graph runs as compiled for good (None while it may still be specialized, or once it is)
        self.declined: str | None = None if self._regions else "no regions"
        self._run: Callable[..., Any] | None = None
        self._strides: list[tuple[int, ...]] = []
        self._device: int | None = None

    def __call__(self, args: list[Any]) -> Any:
        run = self._run
        if run is not None:
            if [a.stride() for a in args] != self._strides or (
                    self._device is not None and _current_device() != self._device):  # type: ignore[misc]
                return self._forward(*args)
            try:
                return run(*args)
            except Exception as e:  # the graph as compiled reports it, naming the region and its FX nodes
                self._decline(f"the specialized graph failed ({type(e).__name__}: {e})")
                return self._forward(*args)
        if self.declined is not None:
            return self._forward(*args)
        if self._calls < WARM_CALLS:
            self._calls += 1
            return self._forward(*args)
        return self._record(args)

    def _record(self, args: list[Any]) -> Any:
        recorder = _Recorder(self.graph_module)
        outputs = recorder.run(*args)
        why = self._specialize(recorder, args)
        if why is not None:
            self.declined = why
        return outputs

    def _specialize(self, recorder: _Recorder, args: list[Any]) -> str | None:
        if not all(isinstance(a, torch.Tensor) for a in args):
            return "an input that is not a tensor"
        devices = {r.device for r in self._regions}
        if len(devices) != 1:
            return f"regions on {len(devices)} devices"
        (device,) = devices
        if device.type == "cuda":
            if _current_device is None or device.index is None or _current_device() != device.index:
                return "a call on another device than the regions'"
            self._device = device.index
        specialized = specialize(self.graph_module, recorder.recording, self._protected, recorder.requires_grad)
        if isinstance(specialized, str):
            return specialized
        self.specialized = specialized
        self._strides = [a.stride() for a in args]
        self._run = specialized.forward
        return None

    def _decline(self, why: str) -> None:
        warnings.warn(f"{self.name}: {why}; it runs as compiled from now on", stacklevel=3)
        self.declined = why
        self._run = None
        self.specialized = None

    @property
    def code(self) -> str:
        """The specialized graph's Python code (empty before it exists)."""
        return self.specialized.code if self.specialized is not None else ""
