"""Every executor and lowering the runtime uses, registered explicitly in this one place.

* step builders: what each Host IR node does at run time (core nodes, multi-device collectives, P2P);
* the lowering of communication segments (the ``comm`` layer's);
* the host passes, with the ``comm`` layer's rewrite of all-gather + GEMM and GEMM + reduce-scatter into
  P2P pipelines slotted in after stream lowering;
* expr lowerings: an extension point for an Expr type lowered to something other than an ATen
  call (a test's custom kernel, say), registered with ``register_lowering``.
"""

from __future__ import annotations

from pyfuser.comm.lowering import lower_communication
from pyfuser.comm.p2p_pipelines import lower_p2p_pipelines
from pyfuser.comm.p2p_steps import P2P_STEP_BUILDERS
from pyfuser.comm.steps import COMM_STEP_BUILDERS
from pyfuser.host_ir.frame import StepBuilder
from pyfuser.host_ir.lowering import ExprLowering
from pyfuser.host_ir.nodes import HostNode
from pyfuser.host_ir.passes.pipeline import HostPass, host_passes
from pyfuser.host_ir.steps import CORE_STEP_BUILDERS
from pyfuser.ir.base import Expr
from pyfuser.ir.pass_manager import Pass

STEP_BUILDERS: dict[type, StepBuilder] = {**CORE_STEP_BUILDERS, **COMM_STEP_BUILDERS, **P2P_STEP_BUILDERS}

COMMUNICATION_LOWERING: ExprLowering = lower_communication

#: Runs only with ``CommunicatorBackend.cuda`` (``MultiDeviceExecutorParams.backend_type``).
HOST_PASSES: list[HostPass] = host_passes([Pass("p2p_pipelines", lower_p2p_pipelines)])

EXPR_LOWERINGS: dict[type[Expr], ExprLowering] = {}


def register_lowering(expr_type: type[Expr], fn: ExprLowering) -> None:
    """Lower exprs of ``expr_type`` (and subclasses without their own entry) with ``fn`` instead of
    an ATen call."""
    if not (isinstance(expr_type, type) and issubclass(expr_type, Expr)):
        raise TypeError(f"register_lowering expects an Expr subclass, got {expr_type!r}")
    EXPR_LOWERINGS[expr_type] = fn


def register_step_builder(node_type: type[HostNode], fn: StepBuilder) -> None:
    """Run Host IR nodes of ``node_type`` (a custom node an expr lowering emits) with ``fn``."""
    if not (isinstance(node_type, type) and issubclass(node_type, HostNode)):
        raise TypeError(f"register_step_builder expects a HostNode subclass, got {node_type!r}")
    STEP_BUILDERS[node_type] = fn
