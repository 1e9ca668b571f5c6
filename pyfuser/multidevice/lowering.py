"""Host IR lowering of multi-device fusions, registered with ``pyfuser.host_ir.lowering``.

Each rank lowers the same fusion to its own program (MPMD): an expr runs only on the ranks of its
output's mesh, a resharding ``set`` becomes this rank's ``Communication`` + ``Wait`` (or a
``LocalSlice``), and ranks outside a mesh get nothing -- no node and no buffer -- except an empty
placeholder (every dim of size 0) for a fusion output they do not hold, so every rank returns one tensor
per output.
"""

from __future__ import annotations

import torch

from pyfuser.host_ir.lowering import LoweringContext, register_lowering
from pyfuser.host_ir.nodes import AtenCall, CompileContext, Frame, HostNode, Step
from pyfuser.ir.base import Expr, indent_str
from pyfuser.ir.ops import LoadStoreOp
from pyfuser.ir.tensor_view import TensorView
from pyfuser.multidevice.comm_plan import plan_communication
from pyfuser.multidevice.communication import Communication, LocalSlice, Wait
from pyfuser.multidevice.communicator import Communicator


class NotOnThisRank(HostNode):
    """A fusion output whose mesh does not include this rank: an empty tensor stands in for it."""

    def __init__(self, tv: TensorView) -> None:
        self.tv = tv
        self.inputs = []
        self.outputs = [tv]

    def to_string(self, indent: int = 0) -> str:
        return f"{indent_str(indent)}{self.tv} = NotOnThisRank()\n"

    def compile(self, cc: CompileContext) -> Step:
        slot, dtype, device, shape = cc.slot(self.tv), self.tv.dtype.torch_dtype, cc.device, [0] * self.tv.ndim

        def step(frame: Frame) -> None:
            frame.values[slot] = torch.empty(shape, dtype=dtype, device=device)

        return step


def _on_this_rank(tv: TensorView, rank: int) -> bool:
    return tv.device_mesh is None or rank in tv.device_mesh


def _elsewhere(expr: Expr) -> list[HostNode]:
    return [NotOnThisRank(o) for o in expr.tensor_outputs if o.is_fusion_output]


def lower_local_expr(expr: Expr, lctx: LoweringContext) -> list[HostNode]:
    """Compute on the ranks of the output's mesh (every rank when the fusion has no meshes)."""
    outs = expr.tensor_outputs
    mesh = outs[0].device_mesh if outs else None
    if mesh is not None and Communicator.instance().rank() not in mesh:
        return _elsewhere(expr)
    return [AtenCall(expr)]


def lower_set(expr: LoadStoreOp, lctx: LoweringContext) -> list[HostNode]:
    """A resharding set is this rank's part of a communication; any other set is a local copy."""
    src, dst = expr.inputs[0], expr.output
    if not isinstance(src, TensorView) or src.device_mesh is None or dst.device_mesh is None:
        return [AtenCall(expr)]
    comm = Communicator.instance()
    rank = comm.rank()
    plan = plan_communication(expr, rank)
    if plan is None:
        return [AtenCall(expr)] if _on_this_rank(dst, rank) and _on_this_rank(src, rank) else _elsewhere(expr)
    if plan.is_local:
        return [LocalSlice(expr, plan, rank)]
    communication = Communication(expr, plan, comm)
    nodes: list[HostNode] = [communication, Wait(communication)]
    if not communication.outputs:
        nodes.extend(_elsewhere(expr))
    return nodes


register_lowering(Expr, lower_local_expr)
register_lowering(LoadStoreOp, lower_set)  # type: ignore[arg-type]
