"""Helpers shared by op nodes: printing in nvFuser's kernel-math style and positional ID maps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyfuser.ir.base import indent_str
from pyfuser.ir.dtypes import INT64_MAX

if TYPE_CHECKING:
    from pyfuser.ir.iter_domain import IterDomain
    from pyfuser.ir.tensor_view import TensorView


def checked_sizes(what: str, sizes: Sequence[int], itemsize: int = 1) -> Sequence[int]:
    """``sizes`` of a tensor about to be created, checked for what torch would report as a raw error:
    each size non-negative, and the element count (times ``itemsize`` bytes when memory is
    allocated; 1 for a view) within int64. ``what`` names the op and tensor (``full T2``)."""
    total = itemsize
    for d, size in enumerate(sizes):
        if size < 0:
            raise ValueError(f"{what}: axis {d} would have size {size} (sizes {list(sizes)}); sizes must be >= 0")
        if size > INT64_MAX:
            raise ValueError(f"{what}: axis {d} would have size {size}, more than 2**63 - 1")
        total *= size
    if total > INT64_MAX:
        raise ValueError(f"{what}: sizes {list(sizes)} overflow: {'the element count' if itemsize == 1 else 'the byte size'} "
                         f"exceeds 2**63 - 1")
    return sizes


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
