"""Activation layouts chosen before partitioning: channels-last for graphs of convolutions (the layout
choice Inductor's ``layout_opt`` makes), and row-major streams under layer norms in a training forward.

cuDNN runs its fast convolutions on channels-last (NHWC) tensors; handed NCHW ones it transposes the
input and weight in and the result back out around every convolution, and the fused regions between
convolutions then read and write NCHW too. So in a graph whose convolutions make channels-last pay,
every 2-D or 3-D convolution (forward, and ``convolution_backward`` in a backward graph) is fed its
tensor operands channels-last (``torch.channels_last`` / ``channels_last_3d``: one copy where an
operand is not already so), the graph's example values are propagated again from there (a
convolution of channels-last operands returns channels-last; pointwise ops and reductions follow their
operands' layout, views view it), and the regions then read and write what the new example values say
(the translator requires each output in its example value's layout). Activations so stay channels-last
from one convolution to the next.

What stays as eager gives it (the user-visible contract): a value the graph returns to the user (an
inference graph's or a backward's outputs, a forward's before those it saves for its backward) is
converted back to its traced layout where it changed. A training forward's saved values keep their new
layout; their strides are reported to AOTAutograd (``TracingContext.output_strides``, as Inductor
reports them), which compiles the backward graph for example inputs of those strides: the backward's
inputs take them, and its example values are propagated again from there. An op that
depends on its operand's strides (``as_strided``) or refuses the new ones (a ``view`` the layout does
not allow) reads its operand converted back to the traced layout.

The rule (``layout_refusal``), Inductor's training heuristics (``GraphLowering.decide_layout_opt``):
static sizes; at least one 2-D or 3-D convolution; no grouped convolution with more than one input
channel per group (channels-last slows those many times over; depthwise ones gain in inference); no
convolution with a spatial kernel whose output channels are at most half its input channels
(UNet-style decoders measured slower); and not every convolution at most 64 channels in and out (too
small to gain). A training step's graphs also keep their layouts when a convolution is grouped
(depthwise included): ConvNeXt's training step ran 55% longer channels-last on one H100 for the same
GPU time (host time around its depthwise convolutions and their backwards), where ResNet's ran 35% less
GPU time (cuDNN's NCHW convolutions transpose in and out; ``benchmarks/results/models_notes.md``).
``channels_last=True`` applies the layout to any graph of static sizes with convolutions; ``False``
never.

In a training forward, a value normalized over its trailing axes is read row-major from the first
pointwise op that laid it out otherwise (``normalized_rows``; Whisper's encoder, where ``permute(conv) +
positions`` makes the residual stream transposed and each layer norm over it an outer normalization):
its readers, and the backward through its saved copy, read a row-major copy that the region computing
the value writes instead, and the values computed from it follow. In an inference graph,
``boundary_layouts.py`` makes that choice for the values only regions read (there nothing is saved).

A conversion back to a traced layout is a ``_to_copy`` to its memory format or, for a dense layout no
format gives (a permuted one), a permute to its memory order, a row-major copy and the inverse permute.

Whatever the layout, a forward CUDA convolution's bias is split off (``split_convolution_biases``): ATen
adds it in a kernel of its own there; as a pointwise op of the graph it fuses into the region that reads
the convolution.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._guards import TracingContext, detect_fake_mode
from torch.fx import GraphModule, Node
from torch.fx.node import map_aggregate, map_arg

from pyfuser.integrations.torch_compile.boundary_layouts import REDUCTIONS, SAME_AXES, reduces_trailing_axes
from pyfuser.integrations.torch_compile.region import static_tensor
from pyfuser.ir.layout import is_dense, memory_order

aten = torch.ops.aten

#: convolution ops -> positions of the tensor operands fed channels-last, of the weight, of ``transposed``
#: and of ``groups``
_CONVOLUTIONS: dict[Any, tuple[tuple[int, ...], int, int, int]] = {
    aten.convolution.default: ((0, 1), 1, 6, 8),
    aten.convolution_backward.default: ((0, 1, 2), 2, 7, 9),
}

#: ops whose result depends on their operand's strides, not only its values
_STRIDE_DEPENDENT = frozenset((aten.as_strided.default, aten.as_strided_.default, aten.as_strided_scatter.default,
                               aten._reshape_alias.default))

#: channels at or below which a convolution gains too little from channels-last (Inductor's bound)
SMALL_CHANNELS = 64


def channels_last_format(rank: int) -> torch.memory_format | None:
    """The channels-last memory format of a convolution operand of ``rank`` dims (None: a 1-D convolution's)."""
    return {4: torch.channels_last, 5: torch.channels_last_3d}.get(rank)


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, Node) else None


def _convolutions(gm: GraphModule) -> list[Node]:
    """The graph's 2-D and 3-D convolutions (forward and backward)."""
    found = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _CONVOLUTIONS:
            weight = _val(node.args[_CONVOLUTIONS[node.target][1]])
            if isinstance(weight, torch.Tensor) and channels_last_format(weight.dim()) is not None:
                found.append(node)
    return found


def _groups(node: Node) -> int:
    """A convolution's ``groups`` (an ``int`` in ATen's schemas)."""
    groups = node.args[_CONVOLUTIONS[node.target][3]]
    if not isinstance(groups, int | torch.SymInt):
        raise TypeError(f"{node.name}: a convolution's groups is an int, got {type(groups).__name__}")
    return int(groups)


def _channels(node: Node) -> tuple[int, int, bool]:
    """A convolution's input and output channels, and whether it has a spatial kernel larger than 1."""
    _, w, t, _ = _CONVOLUTIONS[node.target]
    weight, transposed, groups = _val(node.args[w]), bool(node.args[t]), _groups(node)
    first, second = int(weight.shape[0]), int(weight.shape[1])
    inputs, outputs = (first, second * groups) if transposed else (second * groups, first)
    return inputs, outputs, any(int(k) > 1 for k in weight.shape[2:])


def layout_refusal(gm: GraphModule, force: bool | None = None, training: bool = False) -> str | None:
    """Why ``gm``'s activations stay in their traced layouts (None: they go channels-last); ``force``:
    True applies channels-last to any graph with convolutions of static sizes, False refuses every graph;
    ``training``: a graph of a training step (forward or backward), refused with a grouped convolution
    unless forced."""
    if force is False:
        return "channels_last=False"
    convolutions = _convolutions(gm)
    if not convolutions:
        return "no 2-D or 3-D convolutions"
    placeholders = [_val(n) for n in gm.graph.nodes if n.op == "placeholder"]
    if not all(static_tensor(v) for v in placeholders if isinstance(v, torch.Tensor)) or any(
            isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool) for v in placeholders):
        return "dynamic shapes"
    if force:
        return None
    channels = [_channels(n) for n in convolutions]
    for node, (inputs, _, _) in zip(convolutions, channels, strict=True):
        groups = _groups(node)
        if groups > 1 and inputs // groups > 1:
            return f"{node.name} is a grouped convolution of {inputs // groups} input channels per group"
        if groups > 1 and training:
            return (f"{node.name} is a grouped convolution in a training step's graph "
                    "(channels_last=True to apply it there)")
    for node, (inputs, outputs, spatial) in zip(convolutions, channels, strict=True):
        if spatial and outputs * 2 <= inputs:
            return f"{node.name} narrows {inputs} channels to {outputs}"
    if all(i <= SMALL_CHANNELS and o <= SMALL_CHANNELS for i, o, _ in channels):
        return f"every convolution has at most {SMALL_CHANNELS} channels"
    return None


def _layout(value: Any) -> Any:
    """What of an example value the layout is: its tensors' strides."""
    if isinstance(value, torch.Tensor):
        return tuple(value.stride())
    if isinstance(value, list | tuple):
        return tuple(_layout(v) for v in value)
    return None


def _format_of(value: torch.Tensor) -> torch.memory_format | None:
    """The memory format a conversion back to ``value``'s layout is made with (None: a layout no
    format gives)."""
    if value.is_contiguous():
        return torch.contiguous_format
    fmt = channels_last_format(value.dim())
    return fmt if fmt is not None and value.is_contiguous(memory_format=fmt) else None


@dataclass
class _Plan:
    """What the rewrite does, decided before the graph changes (a refusal then leaves it as it was)."""

    #: node -> its example value in the new layouts (only nodes whose layout changes)
    values: dict[Node, Any] = field(default_factory=dict)
    #: (reader, operand, target): the operand converted for that reader to a memory format, or to the
    #: layout of an example value (a layout no memory format gives)
    conversions: list[tuple[Node, Node, torch.memory_format | torch.Tensor]] = field(default_factory=list)


def _rerun(node: Node, values: dict[Node, Any], overrides: dict[Node, Any], mode: Any) -> Any:
    """``node``'s example value with its operands in their new layouts."""
    def value(a: Any) -> Any:
        if not isinstance(a, Node):
            return a
        return overrides[a] if a in overrides else values.get(a, a.meta.get("val"))
    args: Any = map_aggregate(node.args, value)
    kwargs: Any = map_aggregate(dict(node.kwargs), value)
    if node.target is operator.getitem:
        return args[0][args[1]]
    if not isinstance(node.target, torch._ops.OpOverload) or node.target in _STRIDE_DEPENDENT:
        raise TypeError(f"{node.target} may depend on its operands' strides")
    with mode:
        return node.target(*args, **kwargs)


def _plan(gm: GraphModule, convolutions: set[Node], mode: Any, inputs: dict[Node, Any],
          rows: frozenset[Node] = frozenset()) -> _Plan | str:
    """The new layouts of ``gm``'s values (``inputs``: the inputs' where they changed; ``rows``: values
    every reader reads row-major) and the conversions that give them (or why there are none)."""
    plan = _Plan(dict(inputs))
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        overrides: dict[Node, tuple[torch.Tensor, torch.memory_format]] = {}
        if node in convolutions:
            for position in _CONVOLUTIONS[node.target][0]:
                operand = node.args[position]
                if not isinstance(operand, Node):
                    continue
                current = plan.values.get(operand, _val(operand))
                fmt = channels_last_format(current.dim()) if isinstance(current, torch.Tensor) else None
                if fmt is not None and not current.is_contiguous(memory_format=fmt):
                    with mode:
                        overrides[operand] = (current.contiguous(memory_format=fmt), fmt)
        for operand in [a for a in node.all_input_nodes if a in rows and a not in overrides]:
            current = plan.values.get(operand, _val(operand))
            if not current.is_contiguous():
                with mode:
                    overrides[operand] = (current.contiguous(), torch.contiguous_format)
        changed = [a for a in node.all_input_nodes if a in plan.values]
        if not overrides and not changed:
            continue
        try:
            value = _rerun(node, plan.values, {k: v for k, (v, _) in overrides.items()}, mode)
        except Exception:  # the op needs its operands' traced layouts (a view the new strides do not allow)
            for operand in changed:
                traced = _val(operand)
                back = _format_of(traced)
                if back is None and not _dense(traced):
                    return f"{node.name} needs {operand.name} in its traced layout, which is not dense"
                plan.conversions.append((node, operand, traced if back is None else back))
            continue
        for operand, (_, fmt) in overrides.items():
            plan.conversions.append((node, operand, fmt))
        if _layout(value) != _layout(node.meta.get("val")):
            plan.values[node] = value
    return plan


def _dense(value: Any) -> bool:
    """Whether ``value`` is a tensor of static sizes whose elements fill its storage once (a permutation
    of a row-major layout)."""
    return (isinstance(value, torch.Tensor) and static_tensor(value)
            and is_dense([int(n) for n in value.shape], [int(t) for t in value.stride()]))


def _returned(gm: GraphModule) -> tuple[Node, list[Any]]:
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    returned = output.args[0]
    return output, list(returned) if isinstance(returned, list | tuple) else [returned]


def _restrided_inputs(gm: GraphModule, example_inputs: Sequence[Any], mode: Any) -> dict[Node, Any]:
    """The graph's inputs whose example value AOTAutograd gave other strides than the traced ones (a
    backward's saved values, in the layouts the forward reported), as such example values."""
    restrided: dict[Node, Any] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, example in zip(placeholders, example_inputs, strict=False):
        traced = _val(node)
        if (isinstance(example, torch.Tensor) and isinstance(traced, torch.Tensor) and static_tensor(traced)
                and all(isinstance(s, int) for s in example.stride()) and _layout(example) != _layout(traced)):
            with mode:
                restrided[node] = traced.as_strided(traced.shape, example.stride())
    return restrided


def relayout_activations(gm: GraphModule, visible: int | None = None, force: bool | None = None,
                         example_inputs: Sequence[Any] = (), training: bool = False) -> str | None:
    """Rewrite ``gm`` (an ATen graph, in place) to channels-last activations when ``layout_refusal``
    has no objection, and, in a training forward, to row-major streams under layer norms
    (``normalized_rows``); ``visible``: how many leading outputs are returned to the user (None: all, an
    inference graph or a backward), whose traced layouts are kept; ``example_inputs``: what AOTAutograd
    compiles the graph for, whose strides the inputs take where they differ from the traced ones (a
    backward's saved values, in the layouts its forward gave them). Returns why the graph's convolutions
    were left as they were (None: they read channels-last operands)."""
    placeholders = [_val(n) for n in gm.graph.nodes if n.op == "placeholder"]
    mode = detect_fake_mode([v for v in placeholders if isinstance(v, torch.Tensor)])
    if mode is None:
        return "no fake mode to propagate example values in"
    why = layout_refusal(gm, force, training)
    restrided = _restrided_inputs(gm, example_inputs, mode)
    rows: frozenset[Node] = frozenset()
    if visible is not None:  # (a value returned to the user stays in its layout: not one to convert)
        rows = normalized_rows(gm) - {v for v in _returned(gm)[1][:visible] if isinstance(v, Node)}
    if why is not None and not restrided and not rows:
        return why
    plan = _plan(gm, set(_convolutions(gm)) if why is None else set(), mode, restrided, rows)
    if isinstance(plan, str):
        if restrided:
            raise RuntimeError(f"the graph's inputs come in other layouts than traced, and {plan}")
        return plan
    output, returned = _returned(gm)
    end = len(returned) if visible is None else visible
    restored: list[tuple[int, Node, torch.memory_format | torch.Tensor]] = []
    for k, value in enumerate(returned[:end]):
        if isinstance(value, Node) and value in plan.values:
            traced = _val(value)
            back = _format_of(traced)
            if back is None and not _dense(traced):
                why = f"output {k} ({value.name}) has a traced layout that is not dense"
                if restrided:
                    raise RuntimeError(f"the graph's inputs come in other layouts than traced, and {why}")
                return why
            restored.append((k, value, traced if back is None else back))
    graph = gm.graph
    for node, value in plan.values.items():
        node.meta["val"] = value
    made: dict[tuple[Node, Any], Node] = {}  # (operand, memory format or strides) -> its conversion

    def converted(operand: Node, target: torch.memory_format | torch.Tensor, before: Node) -> Node:
        key = (operand, target if isinstance(target, torch.memory_format) else _layout(target))
        if key not in made:
            with graph.inserting_before(before):
                made[key] = _converted(graph, operand, target, mode)
        return made[key]

    for reader, operand, target in plan.conversions:
        reader.replace_input_with(operand, converted(operand, target, reader))
    saved = [(k, value) for k, value in enumerate(returned) if k >= end and value in rows
             and isinstance(_val(value), torch.Tensor) and not _val(value).is_contiguous()]
    if restored or saved:
        values = list(returned)
        for k, value, target in restored:
            values[k] = converted(value, target, output)
        for k, value in saved:  # the backward reads it row-major too
            values[k] = converted(value, torch.contiguous_format, output)
        output.args = (tuple(values) if isinstance(output.args[0], tuple | list) else values[0],)
    gm.graph.lint()
    gm.recompile()
    context = TracingContext.try_get()
    if context is not None and context.output_strides is not None:  # a forward: its saved values' strides
        context.output_strides.extend(_layout(_val(v)) if isinstance(_val(v), torch.Tensor) else None
                                      for v in _returned(gm)[1])
    return why


def _converted(graph: Any, operand: Node, target: torch.memory_format | torch.Tensor, mode: Any) -> Node:
    """A node of ``operand`` copied to ``target``: a memory format (one ``_to_copy``), or the dense layout
    of an example value (a permute to its memory order, a row-major copy, the inverse permute)."""
    value = operand.meta["val"]
    if isinstance(target, torch.memory_format):
        node = graph.call_function(aten._to_copy.default, (operand,), {"memory_format": target})
        with mode:
            node.meta["val"] = aten._to_copy.default(value, memory_format=target)
        return node
    order = memory_order([int(n) for n in target.shape], [int(t) for t in target.stride()])
    inverse = [order.index(d) for d in range(len(order))]
    first = graph.call_function(aten.permute.default, (operand, order))
    copy = graph.call_function(aten.clone.default, (first,), {"memory_format": torch.contiguous_format})
    last = graph.call_function(aten.permute.default, (copy, inverse))
    with mode:
        first.meta["val"] = aten.permute.default(value, order)
        copy.meta["val"] = aten.clone.default(first.meta["val"], memory_format=torch.contiguous_format)
        last.meta["val"] = aten.permute.default(copy.meta["val"], inverse)
    return last


def normalized_rows(gm: GraphModule) -> frozenset[Node]:
    """The values of ``gm`` (static sizes) to be read row-major: each reduction over the trailing axes of
    a value (a layer norm's statistics) followed back through the pointwise ops, casts and clones of its
    shape that compute it (its layer norm's row-major ``clone`` of the input included) to the first of
    them not laid out row-major. Whisper's encoder: ``permute(conv) + positions`` makes the whole
    residual stream transposed (torch's TensorIterator gives ``a + b`` its first operand's layout), and
    the region computing a layer norm over it writes the stream in that layout beside the normalized
    rows (an outer normalization). Read row-major from that first add on, every value of the stream is
    row-major. The caller leaves out values the graph returns to the user, which keep their traced
    layout (Whisper's training step breaks its graph at each encoder layer, whose input and output are the
    transposed stream: converting it would add a copy back to eager's layout and gain nothing)."""
    found: set[Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in REDUCTIONS or not isinstance(node.args[0], Node):
            continue
        value, seed = node.args[0], None
        rank = _val(value).dim() if isinstance(_val(value), torch.Tensor) else 0
        if rank < 2 or not reduces_trailing_axes(node, rank):
            continue
        while value.op == "call_function" and value.target in SAME_AXES and _dense(_val(value)):
            traced = _val(value)
            if not traced.is_contiguous():
                seed = value
            sources = [a for a in value.all_input_nodes if a.op == "call_function" and a.target in SAME_AXES
                       and _dense(_val(a)) and tuple(_val(a).shape) == tuple(traced.shape)]
            alike = [a for a in sources if _layout(_val(a)) == _layout(traced)]
            if not traced.is_contiguous() and alike:
                sources = alike
            if not sources:
                break
            value = sources[0]
        if seed is not None:
            found.add(seed)
    return frozenset(found)


def split_convolution_biases(gm: GraphModule) -> int:
    """Each forward 2-D or 3-D convolution on CUDA with a bias becomes the convolution without it and an
    add of the bias broadcast over its output channels (in place; returns how many). 1-D convolutions
    keep theirs: wav2vec2's and Whisper's steps were slower in the run that split them (not isolated). On CUDA ATen adds a
    convolution's bias in a kernel of its own after cuDNN's (channels-last depthwise ones included),
    rounding the convolution's output first; as a pointwise op of the graph the add computes the same
    (ATen's native NCHW depthwise kernel, which adds it inside, rounds once less) and fuses into
    the region that reads the convolution (ConvNeXt's permute and layer norm), as Inductor fuses it. On
    the CPU oneDNN adds the bias inside the convolution: split, its output would be rounded twice."""
    placeholders = [_val(n) for n in gm.graph.nodes if n.op == "placeholder"]
    mode = detect_fake_mode([v for v in placeholders if isinstance(v, torch.Tensor)])
    split = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.convolution.default:
            continue
        bias, output = node.args[2], _val(node)
        if not isinstance(bias, Node) or not isinstance(output, torch.Tensor) or mode is None \
                or output.device.type != "cuda" or channels_last_format(output.dim()) is None:
            continue
        shape = [int(_val(bias).shape[0]), *[1] * (output.dim() - 2)]
        with gm.graph.inserting_after(node):
            unbiased = gm.graph.call_function(aten.convolution.default, (node.args[0], node.args[1], None,
                                                                         *node.args[3:]), dict(node.kwargs))
        with gm.graph.inserting_after(unbiased):
            broadcast = gm.graph.call_function(aten.view.default, (bias, shape))
        with gm.graph.inserting_after(broadcast):
            added = gm.graph.call_function(aten.add.Tensor, (unbiased, broadcast))
        with mode:
            unbiased.meta["val"] = aten.convolution.default(*map_arg(unbiased.args, _val))
            broadcast.meta["val"] = aten.view.default(_val(bias), shape)
            added.meta["val"] = aten.add.Tensor(unbiased.meta["val"], broadcast.meta["val"])
        if added.meta["val"].stride() != output.stride():
            gm.graph.erase_node(added)
            gm.graph.erase_node(broadcast)
            gm.graph.erase_node(unbiased)
            continue
        node.replace_all_uses_with(added)
        gm.graph.erase_node(node)
        split += 1
    if split:
        gm.graph.lint()
        gm.recompile()
    return split
