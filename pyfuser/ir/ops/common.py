"""Helpers shared by op nodes: printing in nvFuser's kernel-math style and ID maps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyfuser.ir.base import indent_str

if TYPE_CHECKING:
    from pyfuser.ir.iter_domain import IterDomain
    from pyfuser.ir.tensor_view import TensorView


def header(out: Any, indent: int) -> str:
    """``T1_l_float[...]\\n   = `` with nvFuser's indentation."""
    pad = indent_str(indent)
    return f"{pad}{out}\n{pad}   = "


def call_string(out: Any, name: str, args: Sequence[Any], attrs: str = "", indent: int = 0) -> str:
    inner = ", ".join(str(a) for a in args)
    if attrs:
        inner += f", {attrs}"
    return f"{header(out, indent)}{name}( {inner} )\n"


def bool_flags(flags: Sequence[bool]) -> str:
    return "{" + ", ".join("true" if f else "false" for f in flags) + "}"


def int_list(values: Sequence[Any]) -> str:
    return "{" + ", ".join(str(v) for v in values) + "}"


def describe_axis(val: Any, axis: int) -> str:
    """``T1 axis 0`` for axis ``axis`` of ``val``, seen through broadcasts that fd.ops inserted
    (so a runtime error names the tensor the user defined, not an internal one)."""
    from pyfuser.ir.ops.shape import BroadcastOp

    while isinstance(val.definition, BroadcastOp) and not val.is_fusion_input:
        flags = val.definition.flags
        if flags[axis]:
            break
        axis -= sum(flags[:axis])
        val = val.definition.inputs[0]
    return f"{val.short_name} axis {axis}"


#: ``(operand, axis, other operand, other axis)``: two operand axes whose runtime sizes must agree.
SizeCheck = tuple[int, int, int, int]


def unproven_equal(operands: Sequence[Any], ka: int, da: int, kb: int, db: int) -> list[SizeCheck]:
    """``[(ka, da, kb, db)]`` when those operand axes must match but their extents are not provably
    equal at definition (so the sizes are compared at execution)."""
    ia = operands[ka].get_logical_domain(no_reductions=True)[da]
    ib = operands[kb].get_logical_domain(no_reductions=True)[db]
    if ia.is_broadcast or ib.is_broadcast or ia.extent == ib.extent:
        return []
    return [(ka, da, kb, db)]


def check_same_sizes(op: str, checks: Sequence[SizeCheck], operands: Sequence[Any], args: Sequence[Any]) -> None:
    """Raise ValueError naming both tensors and axes when runtime sizes of a check differ.
    Index-based, so it costs a few tuple lookups per execution."""
    for ka, da, kb, db in checks:
        sa, sb = args[ka].shape[da], args[kb].shape[db]
        if sa != sb:
            raise ValueError(f"{op}: {describe_axis(operands[ka], da)} has size {sa} but "
                             f"{describe_axis(operands[kb], db)} has size {sb}; they must be equal "
                             "(declare an axis with size 1 to broadcast it)")


def positional_map(producer: TensorView, consumer: TensorView,
                   skip_consumer: Sequence[int] = ()) -> dict[IterDomain, IterDomain]:
    """Map producer logical IDs to consumer logical IDs in order, skipping some consumer dims."""
    p_ids = producer.get_logical_domain(no_reductions=True)
    c_ids = [i for pos, i in enumerate(consumer.get_logical_domain()) if pos not in set(skip_consumer)]
    return {p: c for p, c in zip(p_ids, c_ids, strict=False)}
