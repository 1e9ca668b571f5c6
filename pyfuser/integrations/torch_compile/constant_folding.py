"""One-element values of an ATen graph that depend on no input, computed once when the graph compiles.

Dynamo records a tensor literal of the model's code (DeBERTa's attention scale
``sqrt(tensor(head_dim) * factor)``, its log-bucket ``log(tensor(mid))``) as a constant that the ATen
graph reads with ``get_attr`` and ``lift_fresh_copy``; what is computed from such constants alone is the
same on every call. Left in the graph, every call recomputes it as ATen calls on 0-dim CPU tensors
(DeBERTa-v2: 37 a step) whose results the regions then read back one by one. Inductor folds these in
its joint-graph passes; so does this pass: each such value that holds one element and that something
else reads (a computation of the inputs, or of a larger constant) is evaluated on real tensors and
replaced by a constant attribute, which a region reads as a literal of its kernels (``translator``).
Values of more elements (a relative-position table built from ``arange``s) stay computed where they
are read: inside a kernel that costs nothing, stored it would cost memory and bandwidth; so does a
factory of one value (``scalar_tensor``), which a kernel computes as a literal already. A value the
graph returns is never folded (its caller may write into it), nor one a random, uninitialized or
mutating op reaches.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx import GraphModule, Node

#: The attribute names of folded values: ``_pyfuser_folded_<k>``
FOLDED_PREFIX = "_pyfuser_folded_"
#: The most elements a value computed on the way to a folded one may hold: folding runs at compile
#: time, and a one-element result of a large input-free computation (``arange(n).sum()``) is left
#: to the kernels rather than computed whole here.
EVALUATED_LIMIT = 1 << 16

aten = torch.ops.aten

#: ATen ops whose values are not the same on every call.
_NOT_CONSTANT = frozenset({
    aten.rand.default, aten.randn.default, aten.randint.default, aten.randint.low, aten.rand_like.default,
    aten.randn_like.default, aten.randint_like.default, aten.bernoulli.default, aten.bernoulli.p,
    aten.native_dropout.default, aten.normal.Tensor_Tensor, aten.normal.float_Tensor, aten.normal.Tensor_float,
    aten.multinomial.default, aten.randperm.default, aten.poisson.default, aten.empty.memory_format,
    aten.empty_strided.default, aten.empty_like.default, aten.new_empty.default, aten.new_empty_strided.default,
})


def fold_scalar_constants(gm: GraphModule) -> int:
    """Replace the one-element input-free values ``gm`` computes and reads by constant attributes;
    returns how many were folded."""
    constant = _input_free(gm)
    graph_outputs = {n for out in gm.graph.nodes if out.op == "output" for n in out.all_input_nodes}
    scalars = {n for n in constant if n.op == "call_function" and _one_element(n)}
    wanted = [n for n in gm.graph.nodes if n in scalars and n not in graph_outputs and n.all_input_nodes
              and any(u not in scalars for u in n.users)]
    if not wanted:
        return 0
    values = _evaluate(gm, constant, wanted)
    for node, value in values.items():
        name = _fresh_name(gm)
        gm.register_buffer(name, value, persistent=False)
        with gm.graph.inserting_before(node):
            folded = gm.graph.get_attr(name)
        folded.meta = dict(node.meta)
        node.replace_all_uses_with(folded)
    for node in reversed(list(gm.graph.nodes)):  # the producers only the folded values read
        if node in constant and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()
    return len(values)


def constant_value(node: Node) -> torch.Tensor | None:
    """The tensor a ``get_attr`` node of a graph module reads (None for any other node)."""
    module = node.graph.owning_module
    if node.op != "get_attr" or module is None:
        return None
    try:
        value = operator.attrgetter(str(node.target))(module)
    except AttributeError:
        return None
    return value if isinstance(value, torch.Tensor) else None


def _input_free(gm: GraphModule) -> set[Node]:
    """The constant tensors ``gm`` reads and the calls that read nothing else (an AOTAutograd graph's
    parameters and buffers are placeholders: its ``get_attr``s are constants)."""
    free: set[Node] = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr" and constant_value(node) is not None:
            free.add(node)
        elif node.op == "call_function" and _pure(node) and all(n in free for n in node.all_input_nodes):
            free.add(node)
    return free


def _pure(node: Node) -> bool:
    target = node.target
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload) or target in _NOT_CONSTANT:
        return False
    schema = target._schema
    return not schema.is_mutable and not any(tag is torch.Tag.nondeterministic_seeded for tag in target.tags)


def ancestors(nodes: Iterable[Node]) -> set[Node]:
    """``nodes`` and every node they read, directly or not."""
    seen: set[Node] = set()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(node.all_input_nodes)
    return seen


def _one_element(node: Node) -> bool:
    return isinstance(node.meta.get("val"), torch.Tensor) and _elements(node) == 1


def _evaluate(gm: GraphModule, constant: set[Node], wanted: list[Node]) -> dict[Node, torch.Tensor]:
    """The wanted values, computed in graph order on real tensors; one whose computation fails, or
    whose result differs from the traced dtype, shape or device, is left out."""
    needed = ancestors(wanted)
    env: dict[Node, Any] = {}
    with unset_fake_temporarily(), torch.no_grad():
        for node in gm.graph.nodes:
            if node not in needed:
                continue
            if node.op == "get_attr":
                env[node] = constant_value(node)
                continue
            if any(n not in env for n in node.all_input_nodes) or _elements(node) > EVALUATED_LIMIT:
                continue
            args = torch.fx.node.map_arg(node.args, env.__getitem__)
            kwargs = torch.fx.node.map_arg(node.kwargs, env.__getitem__)
            try:
                env[node] = node.target(*args, **kwargs)
            except Exception:  # an optimization: a value that does not evaluate stays computed
                continue
    values = {}
    for node in wanted:
        value, traced = env.get(node), node.meta["val"]
        if (isinstance(value, torch.Tensor) and value.dtype == traced.dtype and value.shape == traced.shape
                and value.device == traced.device):
            values[node] = value
    return values


def _elements(node: Node) -> int:
    """How many elements ``node``'s traced tensor values hold together (0 for none; a symbolic count is
    unbounded)."""
    values = node.meta.get("val")
    total = 0
    for value in values if isinstance(values, (list, tuple)) else (values,):
        if isinstance(value, torch.Tensor):
            numel = value.numel()
            total += numel if isinstance(numel, int) else EVALUATED_LIMIT + 1
    return total


def _fresh_name(gm: GraphModule) -> str:
    k = 0
    while hasattr(gm, f"{FOLDED_PREFIX}{k}"):
        k += 1
    return f"{FOLDED_PREFIX}{k}"
