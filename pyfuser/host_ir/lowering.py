"""Segmented fusion -> Host IR: a straight-line program, segment by segment.

A kernel segment becomes one ``LaunchKernel`` of its compiled kernel; an ATen segment becomes one
``AtenCall`` per expr (or what a lowering registered for the expr's
type returns); a communication segment becomes what the communication lowering returns (the
``comm`` layer provides it: ``Communication`` + ``Wait``); on a rank outside a segment's mesh a
segment computes nothing and a fusion output it would produce gets an empty stand-in. Host passes
then rewrite the program (stream loops, ring buffers).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pyfuser.host_ir.nodes import AtenCall, HostIrContainer, HostNode, KernelSegment, LaunchKernel, NotOnThisRank
from pyfuser.ir.analysis.fused_exprs import FusedExprs
from pyfuser.ir.base import Expr
from pyfuser.ir.fusion import Fusion
from pyfuser.options import CompileOptions
from pyfuser.scheduler.registry import SchedulerType
from pyfuser.scheduler.schedulers import is_kernel
from pyfuser.segmentation.segmented_fusion import SegmentedFusion


@dataclass
class LoweringContext:
    """What an expr lowering may read or extend: the fusion, the program being built, the options."""

    fusion: Fusion
    container: HostIrContainer
    options: CompileOptions


ExprLowering = Callable[[Expr, LoweringContext], list[HostNode]]


def not_on_this_rank(expr: Expr) -> list[HostNode]:
    """Stand-ins for the fusion outputs ``expr`` produces, on a rank that does not compute it."""
    return [NotOnThisRank(o) for o in expr.tensor_outputs if o.is_fusion_output]


def _computes_here(expr: Expr, rank: int) -> bool:
    outs = expr.tensor_outputs
    mesh = outs[0].device_mesh if outs else None
    return mesh is None or rank in mesh


def _lookup(lowerings: Mapping[type[Expr], ExprLowering], expr: Expr) -> ExprLowering | None:
    for cls in type(expr).__mro__:
        fn = lowerings.get(cls)
        if fn is not None:
            return fn
    return None


def lower_segmented_fusion(segmented: SegmentedFusion, options: CompileOptions,
                           expr_lowerings: Mapping[type[Expr], ExprLowering],
                           communication: ExprLowering | None,
                           kernels: Mapping[int, KernelSegment]) -> HostIrContainer:
    """``kernels``: the compiled kernel of each kernel segment, by ``id(group)``."""
    fusion = segmented.fusion
    container = HostIrContainer(fusion.inputs(), fusion.outputs(), fusion=fusion)
    lctx = LoweringContext(fusion, container, options)
    for group in segmented.groups:
        if is_kernel(group.scheduler):
            if _computes_here(group.exprs[-1], options.rank):
                source = FusedExprs(group.exprs, group.inputs, group.outputs)
                container.nodes.append(LaunchKernel(kernels[id(group)], group.inputs, group.outputs, source))
            else:
                container.nodes.extend(n for e in group.exprs for n in not_on_this_rank(e))
            continue
        for expr in group.exprs:
            if group.scheduler is SchedulerType.communication:
                if communication is None:
                    raise ValueError(f"{expr.output.short_name} is produced by a communication, but this program "
                                     "was compiled without a communication backend")
                container.nodes.extend(communication(expr, lctx))
            elif not _computes_here(expr, options.rank):
                container.nodes.extend(not_on_this_rank(expr))
            else:
                custom = _lookup(expr_lowerings, expr)
                container.nodes.extend(custom(expr, lctx) if custom is not None else [AtenCall(expr)])
    return container
