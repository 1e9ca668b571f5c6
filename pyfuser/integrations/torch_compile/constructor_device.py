"""Tensors a graph builds on the CPU only to move them to its device, built on the device instead.

Model code often builds an index table with factories that default to the CPU and moves the result
(WavLM's relative-position buckets: ``arange(q)[:, None]``, ``arange(k)[None, :]``, a dozen pointwise
ops, then ``.to(device)``). Left so, every call runs those ops as ATen calls on the CPU and copies the
table to the device, and a host-to-device copy from pageable memory waits for the device's queue to
drain: the host stops feeding the GPU in the middle of the step (WavLM inference: 8.0 ms a step
where the same kernels queued back to back take 2.9). Inductor moves such constructors in its
post-grad passes (``ConstructorMoverPass``); this is the same idea for pyfuser's graphs: a CPU factory
moves to the graph's device when everything computed from it can move too, so its ops join the
device's regions and the copy becomes a same-device one.

A CPU value moves when it is made by an ATen op of tensors that all move (or 0-dim CPU tensors,
which ATen and pyfuser's kernels read as scalars on any device), and each of its readers either
moves too or computes on the target device already (the ``_to_copy`` onto it, an index of a device
tensor). Not moved: random factories (eager draws them from the CPU generator), ops with
data-dependent output shapes or host reads (``nonzero``, ``item``: on the device they would
synchronize), and anything the graph returns or an eager op outside ATen reads on the CPU.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch._subclasses.fake_tensor import _is_tensor_constructor
from torch.fx import GraphModule, Node
from torch.utils._pytree import tree_flatten

#: tags of ops that stay where they are: random draws, data-dependent shapes and host reads
_PINNED_TAGS = frozenset({torch.Tag.nondeterministic_seeded, torch.Tag.dynamic_output_shape,
                          torch.Tag.data_dependent_output})


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def _devices(node: Node) -> set[torch.device]:
    return {t.device for t in _tensors(node.meta.get("val"))}


def _on_cpu(node: Node) -> bool:
    devices = _devices(node)
    return bool(devices) and devices == {torch.device("cpu")}


def _cpu_scalar(node: Node) -> bool:
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dim() == 0


def _movable_op(node: Node) -> bool:
    """Whether ``node`` computes the same on any device (an ATen or prims op that is not pinned, or an
    item of a moved op's result)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    target = node.target
    return (isinstance(target, torch._ops.OpOverload) and target.namespace in ("aten", "prims")
            and not _PINNED_TAGS & set(target.tags))


def target_device(gm: GraphModule) -> torch.device | None:
    """The one device other than the CPU that ``gm``'s values live on (None: none, or several)."""
    devices = {d for n in gm.graph.nodes for d in _devices(n) if d.type != "cpu"}
    return next(iter(devices)) if len(devices) == 1 else None


def move_constructors_to_device(gm: GraphModule) -> list[Node]:
    """Move ``gm``'s CPU constructors, and what is computed from them, to the graph's device where
    everything they reach can move (see the module's docstring); returns the moved nodes in graph order."""
    device = target_device(gm)
    if device is None:
        return []
    factories = {n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                 and _is_tensor_constructor(n.target) and n.kwargs.get("device") == torch.device("cpu")
                 and _movable_op(n)}
    if not factories:
        return []
    candidates: set[Node] = set()
    frontier = list(factories)
    while frontier:  # every CPU value computed from a factory
        node = frontier.pop()
        if node in candidates:
            continue
        candidates.add(node)
        frontier.extend(u for u in node.users if _on_cpu(u))
    changed = True
    while changed:  # drop what cannot move, and what depends on it or feeds it, until nothing changes
        changed = False
        for node in list(candidates):
            if not _movable(node, candidates, device):
                candidates.discard(node)
                changed = True
    moved = [n for n in gm.graph.nodes if n in candidates]
    for node in moved:
        if node in factories:
            node.kwargs = {**node.kwargs, "device": device}
        node.meta["val"] = _on_device(node.meta["val"], device)
        node.meta.pop("tensor_meta", None)
    returned = {n for out in gm.graph.nodes if out.op == "output" for n in out.all_input_nodes}
    for node in moved:
        for user in list(node.users):
            if user not in candidates and user not in returned and _same_device_copy(user, node):
                user.replace_all_uses_with(node)
                gm.graph.erase_node(user)
    if moved:
        gm.recompile()
    return moved


def _same_device_copy(node: Node, source: Node) -> bool:
    """Whether ``node`` is now a copy of ``source`` onto its own device and dtype, nothing else (the
    ``.to(device)`` the moved value was made for)."""
    if node.target is torch.ops.prims.device_put.default:
        return node.args[0] is source and len(node.args) == 2
    if node.target is not torch.ops.aten._to_copy.default or node.args != (source,):
        return False
    value = source.meta["val"]
    kwargs = dict(node.kwargs)
    return (set(kwargs) <= {"device", "dtype", "layout"} and kwargs.get("dtype", value.dtype) == value.dtype
            and kwargs.get("layout", torch.strided) == torch.strided)


def _movable(node: Node, candidates: set[Node], device: torch.device) -> bool:
    if not _movable_op(node) or not _on_cpu(node):
        return False
    for source in node.all_input_nodes:
        if source not in candidates and _on_cpu(source) and not _cpu_scalar(source):
            return False  # (a CPU input that stays: the op would mix devices)
    for user in node.users:
        if user not in candidates and not (user.op == "call_function" and device in _devices(user)):
            return False  # (read on the CPU: by the output, an op that stays, a host read)
    return True


def _on_device(value: Any, device: torch.device) -> Any:
    """A fake value of the same geometry on ``device`` (each tensor of a tuple or list)."""
    if isinstance(value, torch.Tensor):
        fake_mode = getattr(value, "fake_mode", None)
        if fake_mode is None:
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=device)
        with fake_mode:
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=device)
    if isinstance(value, (list, tuple)):
        return type(value)(_on_device(v, device) for v in value)
    return value
