"""Bind the concrete layout of inputs declared without one, so later passes read it from IR.

A compiled program is keyed by the memory order of its inputs (``runtime/executor.py``
``_layout_key``), so the order this compile was made for is a fact about every execution that
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
    for tv, order in zip(inputs, options.input_orders, strict=True):
        if not isinstance(tv, TensorView) or order is None or tv.has_allocation_domain():
            continue  # a declared layout is a requirement, validated against the strides at execution
        logical = tv.get_logical_domain(no_reductions=True)
        if sorted(order) != list(range(len(logical))):
            raise ValueError(f"{tv.short_name}: input layout {list(order)} is not a permutation of its "
                             f"{len(logical)} axes")
        ids = [logical[d] for d in order]
        if not same_memory_order(ids, logical):
            tv.set_allocation_domain(ids, False)
