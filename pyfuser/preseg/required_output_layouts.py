"""Write each required output stride order into the output's allocation domain, as a requirement.

The fusion's map (``Fusion.set_output_stride_order``, docs/layout_requirements.md) stays the ground truth; mirroring
it into the allocation domain lets every later stage read one thing, the allocation domain, and
tell from ``allocation_is_required`` that it must not touch it. A user's own allocation domain on
the same output must agree with the map, else the two requirements contradict each other.
"""

from __future__ import annotations

from pyfuser.ir.domain_replay import logical_order, same_memory_order
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.layout import allocation_permutation
from pyfuser.ir.tensor_view import TensorView
from pyfuser.options import CompileOptions


def apply_required_output_layouts(fusion: Fusion, options: CompileOptions) -> None:
    for out in fusion.outputs():
        if not isinstance(out, TensorView):
            continue
        stride_order = fusion.get_output_stride_order(out)
        if stride_order is None or out.is_fusion_input:
            continue  # an input's domain describes the input; the copy to the output reads the map
        kept = out.get_logical_domain(no_reductions=True)
        ids = [kept[d] for d in allocation_permutation(stride_order)]
        ids += [i for i in out.get_logical_domain() if i.is_reduction()]
        if out.allocation_is_required:
            if not same_memory_order(logical_order(out), ids):
                names = ", ".join(map(str, out.get_allocation_domain()))
                raise ValueError(f"{out.short_name}: required output stride order {stride_order} contradicts its "
                                 f"required allocation domain ({names})")
            continue
        out.set_allocation_domain(ids, True)
