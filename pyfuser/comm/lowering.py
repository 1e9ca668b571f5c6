"""Host IR lowering of a communication segment (a resharding ``set``), on this rank.

Each rank lowers the same fusion to its own program (MPMD): a resharding ``set`` becomes this rank's
``Communication`` + ``Wait`` (or a ``LocalSlice``), and a rank that takes no part gets nothing but an
empty placeholder for a fusion output it does not hold.
"""

from __future__ import annotations

from pyfuser.comm.comm_plan import plan_communication
from pyfuser.comm.communicator import Communicator
from pyfuser.comm.nodes import Communication, LocalSlice, Wait
from pyfuser.host_ir.lowering import LoweringContext, not_on_this_rank
from pyfuser.host_ir.nodes import HostNode
from pyfuser.ir.base import Expr
from pyfuser.ir.ops import LoadStoreOp


def lower_communication(expr: Expr, lctx: LoweringContext) -> list[HostNode]:
    if not isinstance(expr, LoadStoreOp):
        raise TypeError(f"{expr.output.short_name}: only a set between shardings is a communication, got "
                        f"{type(expr).__name__}")
    rank = lctx.options.rank
    plan = plan_communication(expr, rank)
    if plan is None:
        return not_on_this_rank(expr)
    if plan.is_local:
        return [LocalSlice(expr, plan, rank)]
    communication = Communication(expr, plan, rank, Communicator.instance().backend)
    nodes: list[HostNode] = [communication, Wait(communication)]
    if not communication.outputs:
        nodes.extend(not_on_this_rank(expr))
    return nodes
