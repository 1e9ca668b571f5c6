"""Helpers shared by op nodes: printing in nvFuser's kernel-math style and positional ID maps."""

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


def positional_map(producer: TensorView, consumer: TensorView,
                   skip_consumer: Sequence[int] = ()) -> dict[IterDomain, IterDomain]:
    """Map producer logical IDs to consumer logical IDs in order, skipping some consumer dims."""
    p_ids = producer.get_logical_domain(no_reductions=True)
    c_ids = [i for pos, i in enumerate(consumer.get_logical_domain()) if pos not in set(skip_consumer)]
    return {p: c for p, c in zip(p_ids, c_ids, strict=False)}
