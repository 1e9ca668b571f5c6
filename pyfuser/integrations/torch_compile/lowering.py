"""What one ATen op becomes in a FusionDefinition: the ``Lowering`` record and the context a
lowering builds with.

A lowering is a function ``translate(ctx, *args, **kwargs)`` called with the FX node's own
arguments, where every FX node is replaced by its pyfuser value (a TensorView, or a Scalar for a
symbolic size); it returns what the ATen op returns (a value, or a list for ops with several
outputs). ``check(node)`` runs before partitioning and returns why the node must stay in eager
(None when it can be translated): argument combinations a lowering does not cover are refused
there, never discovered while translating.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
from torch.fx import Node
from torch.fx.node import Argument

from pyfuser.frontend.fusion_definition import FusionDefinition
from pyfuser.frontend.ops import Ops
from pyfuser.ir.tensor_view import TensorView


class OpClass(Enum):
    """What an op contributes to a region, which decides whether a region is worth compiling."""

    #: computes values (pointwise, reductions, creation): what fusion saves memory traffic on
    compute = "compute"
    #: changes shape or layout only; free in eager (a view), so a region of only these stays eager
    view = "view"
    #: runs as an ATen call inside pyfuser too (matmul): worth a region only next to compute ops
    aten = "aten"
    #: copies its operand (``clone``): a kernel in eager but free inside a region, which writes the copy
    #: as it computes the value, so it is kept at a region's edge; a region of only views and copies
    #: stays eager (one copy kernel either way)
    copy = "copy"


class LoweringContext:
    """What a lowering may use: the definition's ops and the FX node being translated."""

    def __init__(self, fd: FusionDefinition, node: Node, env: dict[Node, Any]) -> None:
        self.fd = fd
        self.ops: Ops = fd.ops
        self.node = node
        self._env = env

    def value_of(self, node: Node) -> Any:
        """The pyfuser value already translated for an FX node of the region (for lowerings that
        look through their operand's producer, as ``mm(x, t(w))`` becoming ``linear(x, w)``)."""
        return self._env[node]

    def tensor(self, value: object) -> TensorView:
        """``value`` as the tensor it is: an op of ``fd.ops`` (a pointwise op, a cast) returns a tensor
        or a scalar by its operands, and a lowering that gave it a tensor reads its result as one."""
        if not isinstance(value, TensorView):
            raise TypeError(f"{self.node.target}: expected a tensor result, got {value}")
        return value

    @property
    def meta(self) -> Any:
        """The node's example value (a FakeTensor, or a list of them) recorded while tracing."""
        return self.node.meta["val"]


Translate = Callable[..., Any]
Check = Callable[[Node], str | None]


@dataclass(frozen=True)
class Lowering:
    translate: Translate
    op_class: OpClass = OpClass.compute
    check: Check | None = None


def arg(node: Node, position: int, name: str, default: Any = None) -> Any:
    """An argument of ``node`` given either positionally or by keyword."""
    if position < len(node.args):
        return node.args[position]
    return node.kwargs.get(name, default)


def meta_of(value: Any) -> Any:
    """The example value of an FX argument (a node's ``meta['val']``), or the constant itself."""
    return value.meta.get("val") if isinstance(value, Node) else value


def device_arg(value: object) -> torch.device:
    """A ``device=`` argument of an ATen call (FX records a device, its name or its index)."""
    if not isinstance(value, torch.device | str | int):
        raise TypeError(f"expected a device argument, got {value!r}")
    return torch.device(value)


#: the ATen ops that reshape a tensor (a view where its strides allow)
RESHAPES = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.reshape.default)


def swapped_dims(node: Any) -> tuple[int, int] | None:
    """The two dims a transposing node exchanges, smaller first: ``t``, ``transpose``, or a
    ``permute`` that moves exactly two dims; None for any other value."""
    if not isinstance(node, Node) or node.op != "call_function" or node.kwargs or not node.args:
        return None
    ops = torch.ops.aten
    if node.target is ops.t.default:
        return (0, 1)
    value = meta_of(node)
    rank = value.dim() if isinstance(value, torch.Tensor) else 0
    if node.target is ops.transpose.int and rank:
        dims = _int_items(node.args[1:])
        if dims is not None:
            a, b = sorted(d % rank for d in dims[:2])
            return (a, b)
    if node.target is ops.permute.default and rank:
        perm = _int_items(list_arg(node, 1))
        if perm is not None:
            moved = [k for k, d in enumerate(perm) if d % rank != k]
            return (moved[0], moved[1]) if len(moved) == 2 else None
    return None


def _int_items(values: Sequence[Argument]) -> list[int] | None:
    """``values`` when all are ints (constant dims), else None."""
    ints = [v for v in values if isinstance(v, int)]
    return ints if len(ints) == len(values) else None


def list_arg(node: Node, position: int) -> Sequence[Argument]:
    """A list argument of an ATen call (``cat``'s tensors, ``permute``'s dims)."""
    value = node.args[position]
    if not isinstance(value, list | tuple):
        raise TypeError(f"{node.target}: argument {position} must be a list, got {value!r}")
    return value


def is_tensor_meta(value: Any) -> bool:
    return isinstance(value, torch.Tensor)
