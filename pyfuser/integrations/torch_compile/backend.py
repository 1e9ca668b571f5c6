"""The ``pyfuser`` dynamo backend: ``torch.compile(model, backend="pyfuser")``.

Dynamo hands the backend a Torch-level graph, whose attention masks that depend on no input are folded
first (``attention_masks.py``: SDPA then gets the arguments eager passes); AOTAutograd (``aot_autograd``) traces it to ATen
with the decomposition table of ``decompositions.py``, splits training graphs into a forward and a
backward (``min_cut_rematerialization_partition`` of the joint graph without its no-op detaches, as
Inductor's joint-graph passes leave it: cheap pointwise values are recomputed in the backward rather
than saved) and hands each ATen graph to ``compile_aten_graph``,
which folds the one-element values that depend on no input (``constant_folding.py``), drops the
transposes that undo each other and the detaches (``view_pairs.py``), turns all-gather ->
matmul and matmul -> reduce-scatter into pyfuser's multi-device pipelines (``collective_matmul.py``; other
collectives stay torch's, region boundaries), partitions it into pyfuser
regions and eager ops, collapses the chains of views left in eager (``view_chains.py``) and calls the other
views as tensor methods (``eager_methods.py``). Each region's program is compiled then, from the traced
sizes, its kernels in compile threads (``FusionExecutorCache.compile_ahead``). After its first calls a graph
runs as one generated function per input signature: the regions' straight-line bodies in place of their calls,
eager views as reinterpretations (``bound_graph.py``).

Options (``torch.compile(..., options={...})``, or ``PyfuserBackend(...)`` directly):

* ``cuda_graph`` (bool): replay each compiled graph (its regions and the eager ops between them)
  from CUDA graphs, one per input signature, with the model's parameters read in place; a graph
  that cannot be captured replays each region from graphs of its own (``graph_replay.py``);
  ``mode="reduce-overhead"`` turns it on too;
* ``triton_interpreter`` (bool): run generated kernels through Triton's interpreter, so regions on
  CPU tensors run fused kernels (slow: for tests);
* ``enable_options`` / ``disable_options`` (lists of names): any ``fd.execute`` option, for every region;
* ``channels_last`` (bool or None): activations of graphs of convolutions channels-last (``conv_layout.py``):
  None (the default) where its rule finds it pays (a training step's graphs not with a grouped
  convolution), True wherever the graph's sizes are static, False never.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._guards import TracingContext
from torch.fx import GraphModule, Node

from pyfuser.integrations.torch_compile.attention_masks import fold_constant_attention_masks
from pyfuser.integrations.torch_compile.bound_graph import BoundGraph
from pyfuser.integrations.torch_compile.collective_matmul import CollectiveMatmul, lower_collective_matmuls
from pyfuser.integrations.torch_compile.constant_folding import fold_scalar_constants
from pyfuser.integrations.torch_compile.constructor_device import move_constructors_to_device
from pyfuser.integrations.torch_compile.conv_layout import relayout_activations, split_convolution_biases
from pyfuser.integrations.torch_compile.decompositions import decomposition_table
from pyfuser.integrations.torch_compile.dump import format_plan
from pyfuser.integrations.torch_compile.eager_methods import call_views_as_methods
from pyfuser.integrations.torch_compile.graph_replay import GraphReplay, capturable
from pyfuser.integrations.torch_compile.partition import finish, plan_regions, splice_region
from pyfuser.integrations.torch_compile.region import FusionRegion
from pyfuser.integrations.torch_compile.view_chains import collapse_view_chains
from pyfuser.integrations.torch_compile.view_pairs import (
    conversions_beside_their_computation,
    drop_detaches,
    drop_transpose_pairs,
)
from pyfuser.options import DumpOption, check_options, dump
from pyfuser.runtime.fusion_cache import LRUCache

_OPTION_NAMES = ("cuda_graph", "triton_interpreter", "enable_options", "disable_options", "channels_last")


@dataclass
class CompiledGraph:
    """One ATen graph the backend compiled: what a test or the example inspects."""

    kind: str  # "forward", "backward" or "inference"
    graph_module: GraphModule
    regions: list[FusionRegion]
    #: FX node name -> why it stays in eager
    eager: dict[str, str] = field(default_factory=dict)
    #: the all-gather + matmul and matmul + reduce-scatter patterns run as pyfuser pipelines
    collective_matmuls: list[CollectiveMatmul] = field(default_factory=list)
    #: the whole graph replayed from CUDA graphs (the ``cuda_graph`` option, when it can be captured)
    replay: GraphReplay | None = None
    #: what the backend hands AOTAutograd otherwise: the graph, specialized after its first calls
    bound: BoundGraph | None = None
    #: why its activations kept their traced layouts (None: convolutions read them channels-last)
    layout: str | None = None


class PyfuserBackend:
    """A dynamo backend; every graph it compiles is kept in ``graphs`` (in compilation order)."""

    def __init__(self, *, cuda_graph: bool = False, triton_interpreter: bool = False,
                 enable_options: Sequence[str] = (), disable_options: Sequence[str] = (),
                 channels_last: bool | None = None) -> None:
        enable = [*enable_options] + (["triton_interpreter"] if triton_interpreter else [])
        check_options(enable, disable_options)  # unknown names fail here, not in the first region
        if "cuda_graph" in enable:  # the backend's own option reads the parameters in place
            enable.remove("cuda_graph")
            cuda_graph = True
        self.cuda_graph = bool(cuda_graph)
        self.enable_options = tuple(enable)
        self.disable_options = tuple(disable_options)
        self.channels_last = channels_last
        self.graphs: list[CompiledGraph] = []
        #: the compiled programs of the regions, one per distinct fusion: a model's repeated blocks (ResNet's
        #: and ConvNeXt's stages, an encoder's layers, a forward region its backward repeats) make equal
        #: regions, which share one executor cache and so are segmented, scheduled and compiled once
        self.fusions = LRUCache()

    @staticmethod
    def from_options(options: dict[str, Any] | None = None, mode: str | None = None) -> PyfuserBackend:
        """The backend for ``torch.compile(backend="pyfuser", options=..., mode=...)``."""
        options = dict(options or {})
        unknown = sorted(set(options) - set(_OPTION_NAMES))
        if unknown:
            raise ValueError(f"torch.compile(backend='pyfuser'): unknown option(s) {unknown}; known: {list(_OPTION_NAMES)}")
        if mode not in (None, "default", "reduce-overhead", "max-autotune-no-cudagraphs"):
            raise ValueError(f"torch.compile(backend='pyfuser'): mode {mode!r} is not supported (use 'default' or "
                             "'reduce-overhead', which replays regions from CUDA graphs)")
        if mode == "reduce-overhead":
            options.setdefault("cuda_graph", True)
        return PyfuserBackend(**options)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        fold_constant_attention_masks(gm)
        compiler = aot_autograd(
            fw_compiler=self._compiler("forward"),
            bw_compiler=self._compiler("backward"),
            inference_compiler=self._compiler("inference"),
            decompositions=decomposition_table(),
            partition_fn=_partition,
        )
        return compiler(gm, example_inputs)

    def _compiler(self, kind: str) -> Callable[[GraphModule, Sequence[Any]], Callable[..., Any]]:
        def compile_graph(gm: GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
            static = _static_input_indices() if kind != "backward" else []
            compiled = self.compile_aten_graph(gm, kind, static, _saved_outputs_start() if kind == "forward" else None,
                                               example_inputs)
            if compiled.replay is not None:
                return compiled.replay
            assert compiled.bound is not None  # compile_aten_graph binds every graph it does not replay
            return compiled.bound
        return compile_graph

    def compile_aten_graph(self, gm: GraphModule, kind: str, static_input_indices: Sequence[int] = (),
                           saved_from: int | None = None, example_inputs: Sequence[Any] = ()) -> CompiledGraph:
        """Partition ``gm`` (an ATen graph) in place into regions and eager ops; ``saved_from``: the first
        output a forward saves for its backward; ``example_inputs``: what AOTAutograd compiles it for (a
        backward's saved values in the layouts its forward reported)."""
        title = f"{kind} graph {sum(g.kind == kind for g in self.graphs)}"
        layout = relayout_activations(gm, saved_from if kind == "forward" else None, self.channels_last,
                                      example_inputs, training=kind != "inference")
        split_convolution_biases(gm)
        fold_scalar_constants(gm)
        move_constructors_to_device(gm)
        drop_transpose_pairs(gm, outputs=kind == "backward")  # first: a region reads the untransposed tensor
        drop_detaches(gm, outputs=kind == "backward")
        pipelines = lower_collective_matmuls(gm, f"pyfuser_{kind}{sum(g.kind == kind for g in self.graphs)}")
        conversions_beside_their_computation(gm, outputs=kind == "backward")
        plan = plan_regions(gm)
        dump(DumpOption.fx_graph, lambda: format_plan(gm, plan, title))
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        static_nodes = frozenset(placeholders[k] for k in static_input_indices if k < len(placeholders))
        regions = []
        eager = {n.name: why for n, why in plan.eager.items()}
        replaced: dict[Node, Node] = {}
        for k, (nodes, translated) in enumerate(plan.regions):
            translated.fd.fec = self.fusions.cache_compile(translated.fd.fusion)
            region = FusionRegion(f"pyfuser_region_{k}", translated, nodes, enable_options=self.enable_options,
                                  disable_options=self.disable_options, cuda_graph=self.cuda_graph,
                                  static_inputs=static_nodes)
            splice_region(gm, nodes, translated, region, replaced)
            regions.append(region)
        aliasing = _aliasing_outputs(gm, kind, saved_from)
        collapse_view_chains(gm, aliasing)
        call_views_as_methods(gm, aliasing)
        compiled = CompiledGraph(kind, finish(gm), regions, eager, pipelines, layout=layout)
        for region in regions:
            region.compile_ahead()
        if self.cuda_graph and any(r.device.type == "cuda" for r in regions):
            why = capturable(compiled.graph_module)
            if why is None:
                compiled.replay = GraphReplay(compiled.graph_module.forward, regions, f"pyfuser {title}",
                                              static_input_indices, saved_from)
            else:
                dump(DumpOption.fx_graph, lambda: f"{title}: each region replays its own CUDA graphs ({why})\n")
        if compiled.replay is None:  # (``finish`` made new nodes: the aliasing outputs are found again)
            compiled.bound = BoundGraph(compiled.graph_module, regions,
                                        _aliasing_outputs(compiled.graph_module, kind, saved_from), f"pyfuser {title}")
        self.graphs.append(compiled)
        return compiled


def _partition(joint: GraphModule, joint_inputs: Sequence[Any], **kwargs: Any) -> tuple[GraphModule, GraphModule]:
    """``min_cut_rematerialization_partition`` of the joint graph without its ``detach`` nodes (no-ops once
    autograd has traced it, as Inductor's joint-graph passes find them): a detach between a forward value
    and its backward use would make the partitioner save that value rather than recompute it from cheaper
    ones (a log-softmax's logits-sized result instead of its per-row max and log-sum-exp)."""
    graph = joint.graph
    for node in list(graph.nodes):
        # (a returned detach stays: the outputs' aliasing was recorded with it)
        if (node.op == "call_function" and node.target is torch.ops.aten.detach.default
                and all(u.op != "output" for u in node.users)):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    joint.recompile()
    return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)


def _aliasing_outputs(gm: GraphModule, kind: str, saved_from: int | None) -> set[Node]:
    """The values ``gm`` returns whose aliasing AOTAutograd tracks: a forward's or an inference graph's
    outputs before those a training forward saves for its backward (a backward's: none)."""
    if kind == "backward":
        return set()
    (returned,) = [n.args[0] for n in gm.graph.nodes if n.op == "output"]
    returned = list(returned) if isinstance(returned, list | tuple) else [returned]
    end = len(returned) if saved_from is None else saved_from
    return {v for v in returned[:end] if isinstance(v, Node)}


def _saved_outputs_start() -> int | None:
    """Where the outputs a training forward saves for its backward start (after its effect tokens,
    mutated inputs, outputs and their bases, and the RNG offset), as AOTAutograd lays them out."""
    context = TracingContext.try_get()
    meta = context.fw_metadata if context is not None else None
    if meta is None:
        return None
    return len(getattr(meta, "tokens", None) or ()) + meta.num_forward


def _static_input_indices() -> list[int]:
    """Inputs of the graph being compiled that keep their address from call to call (parameters and
    buffers), as AOTAutograd records them."""
    context = TracingContext.try_get()
    if context is None or context.fw_metadata is None:
        return []
    return list(context.fw_metadata.static_input_indices)


def pyfuser_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, options: dict[str, Any] | None = None,
                    mode: str | None = None) -> Callable[..., Any]:
    """The ``torch_dynamo_backends`` entry point: ``torch.compile(model, backend="pyfuser")``."""
    return PyfuserBackend.from_options(options, mode)(gm, example_inputs)
