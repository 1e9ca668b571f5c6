"""Attention masks that depend on no input, folded before AOTAutograd traces the graph.

Hugging Face models build their attention mask inside ``forward``. In eager they look at it first
and pass none to ``scaled_dot_product_attention`` when nothing is masked (or pass ``is_causal``); a
traced model cannot look at data, so the graph dynamo hands a backend computes the full mask from
``arange``s and comparisons and passes it on. ATen then picks SDPA's math path on CUDA (a broadcast
mask's last axis has stride 0, which every fused kernel refuses): float32 batched GEMMs and a
softmax instead of one flash / cuDNN kernel, so both compilers ran ViT and BERT slower than eager.

A mask none of whose producers reads a graph input is a constant of the graph's (static) sizes.
This pass computes it once, on real tensors, and where it allows every position passes no mask,
where it is the top-left causal pattern ``is_causal=True``; any other mask stays as it is. SDPA
then chooses its kernel from the same arguments eager passes. Runs on the Torch-level graph,
before AOTAutograd dispatches ``scaled_dot_product_attention`` to an implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx import GraphModule, Node

from pyfuser.integrations.torch_compile.constant_folding import ancestors

#: The Torch-level calls of scaled dot-product attention in a dynamo graph, and the positions of their
#: ``attn_mask`` and ``is_causal`` arguments.
_SDPA = (torch._C._nn.scaled_dot_product_attention, F.scaled_dot_product_attention)
_MASK_POSITION = 3
_CAUSAL_POSITION = 5

#: Functorch's transform levels in a dynamo graph (a ``vmap`` is recorded as calls of these, its levels
#: as constants): each level entry (+1) and exit (-1), by name, and what unwinds a level left entered.
_LEVELS = {"_vmap_increment_nesting": 1, "_vmap_decrement_nesting": -1, "_jvp_increment_nesting": 1,
           "_jvp_decrement_nesting": -1}
_UNWIND: dict[str, Callable[[], Any]] = {
    "_vmap_increment_nesting": torch._C._functorch._vmap_decrement_nesting,
    "_jvp_increment_nesting": torch._C._functorch._jvp_decrement_nesting,
}
#: Producers whose values are not the same on every call: a mask they reach is not folded.
_NOT_CONSTANT = {torch.rand, torch.randn, torch.randint, torch.rand_like, torch.randn_like, torch.randint_like,
                 torch.bernoulli, torch.multinomial, torch.normal, torch.randperm, torch.poisson, F.dropout,
                 torch.empty, torch.empty_like, torch.empty_strided}


def fold_constant_attention_masks(gm: GraphModule) -> int:
    """Drop (or turn into ``is_causal``) the attention masks of ``gm`` that depend on no input;
    returns how many SDPA calls changed. A mask that cannot be evaluated stays."""
    calls = [(n, mask) for n in gm.graph.nodes if n.op == "call_function" and n.target in _SDPA
             if isinstance(mask := _mask_of(n), Node)]
    if not calls:
        return 0
    constant = _input_free_nodes(gm)
    wanted = {mask for _, mask in calls if mask in constant}
    if not wanted:
        return 0
    try:
        values = _evaluate(gm, constant, wanted)
    except Exception:  # an optimization: a mask that does not evaluate stays in the graph
        return 0
    changed = 0
    for call, mask in calls:
        if mask not in values:
            continue
        form = _mask_form(values[mask], call)
        if form == "none":
            _set_mask(call, None, causal=False)
        elif form == "causal" and not _causal_arg(call):
            _set_mask(call, None, causal=True)
        else:
            continue
        changed += 1
    if changed:
        gm.recompile()
    return changed


def _mask_of(call: Node) -> Any:
    if "attn_mask" in call.kwargs:
        return call.kwargs["attn_mask"]
    return call.args[_MASK_POSITION] if len(call.args) > _MASK_POSITION else None


def _causal_arg(call: Node) -> bool:
    causal = call.kwargs.get("is_causal", call.args[_CAUSAL_POSITION] if len(call.args) > _CAUSAL_POSITION else False)
    return causal is True


def _set_mask(call: Node, mask: None, *, causal: bool) -> None:
    args = list(call.args)
    kwargs = dict(call.kwargs)
    if len(args) > _MASK_POSITION:
        args[_MASK_POSITION] = mask
    else:
        kwargs["attn_mask"] = mask
    if causal:
        if len(args) > _CAUSAL_POSITION:
            args[_CAUSAL_POSITION] = True
        else:
            kwargs["is_causal"] = True
    call.args, call.kwargs = tuple(args), kwargs


def _input_free_nodes(gm: GraphModule) -> set[Node]:
    """The function and method calls no input of the graph reaches (placeholders, modules and
    attributes excluded: their values may change between calls)."""
    free: set[Node] = set()
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method") and all(n in free for n in node.all_input_nodes):
            free.add(node)
    return free


def _evaluate(gm: GraphModule, constant: set[Node], wanted: set[Node]) -> dict[Node, torch.Tensor]:
    """The wanted masks' values: their producers run in graph order on real tensors, and so do the
    functorch calls among the input-free nodes (a ``vmap``'s levels entered and left, its batch
    dimensions added and removed) up to where the levels balance. A mask drawn from a random or
    uninitialized tensor is no constant and is left out."""
    nodes = list(gm.graph.nodes)
    needed: set[Node] = set()
    masks = set()
    for mask in wanted:
        producers = ancestors([mask])
        if not any(p.target in _NOT_CONSTANT for p in producers):
            needed |= producers
            masks.add(mask)
    if not masks:
        return {}
    env: dict[Node, Any] = {}
    entered: list[str] = []
    last = max(nodes.index(m) for m in masks)
    with unset_fake_temporarily(), torch.no_grad():
        try:
            for index, node in enumerate(nodes):
                if index > last and not entered:
                    break
                functorch = node in constant and _is_functorch(node)
                if node not in needed and not functorch:
                    continue
                args = torch.fx.node.map_arg(node.args, env.__getitem__)
                kwargs = torch.fx.node.map_arg(node.kwargs, env.__getitem__)
                env[node] = _call(node, args, kwargs)
                name = getattr(node.target, "__name__", "")
                if _LEVELS.get(name) == 1:
                    entered.append(name)
                elif _LEVELS.get(name) == -1 and entered:
                    entered.pop()
        finally:
            while entered:
                _UNWIND[entered.pop()]()
    return {n: env[n] for n in masks if isinstance(env.get(n), torch.Tensor)}


def _is_functorch(node: Node) -> bool:
    return node.op == "call_function" and getattr(node.target, "__module__", "").startswith("torch._functorch")


def _call(node: Node, args: Any, kwargs: Any) -> Any:
    if node.op == "call_method":
        return getattr(args[0], str(node.target))(*args[1:], **kwargs)
    return node.target(*args, **kwargs)  # type: ignore[operator]  # a call_function's target is a callable


def _mask_form(mask: torch.Tensor, call: Node) -> str:
    """``"none"`` where the mask allows every position, ``"causal"`` where it is SDPA's top-left
    causal pattern (broadcast over its leading axes), else ``"other"``."""
    if mask.dim() < 2 or mask.numel() == 0:
        return "other"
    if mask.dtype == torch.bool:
        allowed, blocked = mask, ~mask
    elif mask.is_floating_point():
        allowed = mask == 0
        blocked = mask <= torch.finfo(mask.dtype).min
    else:
        return "other"
    if bool(allowed.all()):
        return "none"
    if not bool((allowed | blocked).all()):
        return "other"
    rows, columns = mask.shape[-2:]
    query = _example(call.args[0] if call.args else call.kwargs.get("query"))
    key = _example(call.args[1] if len(call.args) > 1 else call.kwargs.get("key"))
    if query is None or key is None or (query.shape[-2], key.shape[-2]) != (rows, columns):
        return "other"
    causal = torch.ones(rows, columns, dtype=torch.bool, device=mask.device).tril()
    return "causal" if bool((allowed == causal).all()) else "other"


def _example(node: Any) -> torch.Tensor | None:
    value = node.meta.get("example_value") if isinstance(node, Node) else None
    return value if isinstance(value, torch.Tensor) else None
