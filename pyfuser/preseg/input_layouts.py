"""Bind the concrete layout of inputs declared without one, so later passes read it from IR.

A compiled program is keyed by the memory order of its inputs and whether each is dense in that
order (``runtime/executor.py`` ``_layout_key``), so both are facts about every execution that
reaches it. An input defined without ``stride_order`` but executed channels-last gets that order
as its allocation domain on the compiled copy (the user's definition is untouched), with no
contiguity promise: the program is reused for any strides of the same order. It is a requirement,
not a hint: no later stage may pretend the input is laid out otherwise.
"""

from __future__ import annotations

from pyfuser.ir.domain_replay import same_memory_order
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.tensor_view import TensorView
from pyfuser.options import CompileOptions


def bind_input_layouts(fusion: Fusion, options: CompileOptions) -> None:
    if not options.input_orders:
        return
    inputs = fusion.inputs()
    if len(options.input_orders) != len(inputs):
        raise ValueError(f"compile options carry {len(options.input_orders)} input layouts for a fusion of "
                         f"{len(inputs)} inputs")
    dense = options.input_dense or (False,) * len(inputs)
    for tv, order, is_dense in zip(inputs, options.input_orders, dense, strict=True):
        if not isinstance(tv, TensorView) or order is None:
            continue
        logical = tv.get_logical_domain(no_reductions=True)
        if sorted(order) != list(range(len(logical))):
            raise ValueError(f"{tv.short_name}: input layout {list(order)} is not a permutation of its "
                             f"{len(logical)} axes")
        ids = [logical[d] for d in order]
        if tv.has_allocation_domain():
            # A declared layout is a requirement, validated against the strides at execution; a dense
            # input laid out as declared is contiguous along it.
            if is_dense and same_memory_order(ids, tv.get_allocation_domain()):
                tv.domain().contiguity = [None if c is None else True for c in tv.contiguity]
        elif not same_memory_order(ids, logical):
            tv.set_allocation_domain(ids, True if is_dense else False)
        elif is_dense:
            tv.domain().contiguity = [None if c is None else True for c in tv.contiguity]
