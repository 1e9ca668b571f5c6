"""Which FX nodes pyfuser takes, and why it leaves the others in eager.

``LOWERINGS`` is the one table of translated ATen ops. ``refusal`` says why a call stays in eager
(None: pyfuser takes it); the partitioner keeps each reason, which the ``fx_graph`` dump prints next
to the node.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import torch
from torch.fx import Node

from pyfuser.integrations.torch_compile.collective_matmul import WHY_KEPT, CollectiveMatmul, is_collective
from pyfuser.integrations.torch_compile.lowering import Lowering, OpClass, is_tensor_meta, meta_of
from pyfuser.integrations.torch_compile.pointwise_lowerings import POINTWISE_LOWERINGS
from pyfuser.integrations.torch_compile.shape_lowerings import SHAPE_LOWERINGS
from pyfuser.integrations.torch_compile.tensor_lowerings import TENSOR_LOWERINGS

LOWERINGS: dict[Any, Lowering] = {**POINTWISE_LOWERINGS, **SHAPE_LOWERINGS, **TENSOR_LOWERINGS}

#: dtypes a region's tensors may have (what pyfuser's ops and kernels compute with torch's semantics)
SUPPORTED_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                              torch.bool})


def op_name(node: Node) -> str:
    """``aten.mul.Tensor`` for an OpOverload target, the function's name otherwise."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._opname}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def op_class(node: Node) -> OpClass | None:
    lowering = LOWERINGS.get(node.target)
    return lowering.op_class if lowering is not None else None


def _tensors(value: Any) -> list[torch.Tensor]:
    if is_tensor_meta(value):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _input_tensors(node: Node) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for a in node.all_input_nodes:
        found.extend(_tensors(meta_of(a)))
    return found


def refusal(node: Node, rejected: Mapping[Node, str] | None = None) -> str | None:
    """Why ``node`` stays in eager, or None when pyfuser translates it."""
    if rejected is not None and node in rejected:
        return rejected[node]
    if node.target is operator.getitem:
        source = node.args[0]
        if isinstance(source, Node) and refusal(source, rejected) is None:
            return None
        return "picks an output of an op left in eager"
    if is_collective(node):  # a region boundary: torch runs it between the regions before and after it
        why = node.meta.get(WHY_KEPT)
        return f"{op_name(node)} is a collective, run by torch between regions" + (f" ({why})" if why else "")
    if isinstance(node.target, CollectiveMatmul):  # a pipeline's call: one multi-device program, never a region's
        return node.target.eager_reason
    lowering = LOWERINGS.get(node.target)
    if lowering is None:
        return f"{op_name(node)} is not in the backend's op table"
    if "val" not in node.meta:
        return "no traced example value (meta['val'])"
    outputs = _tensors(node.meta["val"])
    tensors = outputs + _input_tensors(node)
    for t in tensors:
        if t.dtype not in SUPPORTED_DTYPES:
            return f"dtype {t.dtype} is not supported"
        if t.layout is not torch.strided:
            return f"layout {t.layout} is not supported"
    devices = {t.device for t in outputs} | {t.device for t in _input_tensors(node) if t.dim() > 0}
    if len(devices) > 1:
        return f"mixes devices {sorted(str(d) for d in devices)}"
    if lowering.check is not None:
        try:
            return lowering.check(node)
        except Exception as e:  # a check that does not foresee these arguments: eager, with why
            return f"its check failed: {type(e).__name__}: {e}"
    return None

