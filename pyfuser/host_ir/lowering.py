"""Fusion -> Host IR: a straight-line program with one node per fusion expr.

Every expr is its own segment for now, evaluated with ATen (``AtenCall``); other lowerings
(communications, compiled kernels) plug in with ``register_lowering``. Host passes then rewrite
the program (stream loops, ring buffers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyfuser.host_ir.nodes import AtenCall, HostIrContainer, HostNode
from pyfuser.ir.base import Expr
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.tensor_view import MemoryType

if TYPE_CHECKING:
    from pyfuser.runtime.executor import CompileOptions


@dataclass
class LoweringContext:
    """What an expr lowering may read or extend: the fusion, the program being built, the options."""

    fusion: Fusion
    container: HostIrContainer
    options: CompileOptions | None


LoweringFn = Callable[[Expr, LoweringContext], list[HostNode]]

_LOWERINGS: dict[type[Expr], LoweringFn] = {}


def register_lowering(expr_type: type[Expr], fn: LoweringFn) -> None:
    """Lower exprs of ``expr_type`` (and subclasses without their own entry) with ``fn``."""
    if not (isinstance(expr_type, type) and issubclass(expr_type, Expr)):
        raise TypeError(f"register_lowering expects an Expr subclass, got {expr_type!r}")
    _LOWERINGS[expr_type] = fn


def lower_expr(expr: Expr, lctx: LoweringContext) -> list[HostNode]:
    for cls in type(expr).__mro__:
        fn = _LOWERINGS.get(cls)
        if fn is not None:
            return fn(expr, lctx)
    return [AtenCall(expr)]


def lower_fusion(fusion: Fusion, options: CompileOptions | None = None) -> HostIrContainer:
    """Each expr's outputs become global buffers (segment boundaries) computed in program order."""
    container = HostIrContainer(fusion.inputs(), fusion.outputs())
    lctx = LoweringContext(fusion, container, options)
    for expr in fusion.exprs():
        for out in expr.tensor_outputs:
            out.memory_type = MemoryType.Global
        container.nodes.extend(lower_expr(expr, lctx))
    return container
