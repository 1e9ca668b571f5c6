"""What the pointwise and transpose schedulers ask of a segment: which output is the reference,
whether every tensor iterates inside the reference's iteration space, and which axis each global
tensor has innermost in memory."""

from __future__ import annotations

from collections import Counter

from pyfuser.codegen.support import unsupported_in_pointwise_kernel, unsupported_indexed_reads
from pyfuser.ir.analysis.id_graph import IdGraph
from pyfuser.ir.analysis.resize import readable_classes
from pyfuser.ir.domain_replay import logical_order
from pyfuser.ir.iter_domain import IterDomain
from pyfuser.ir.ops.indexing import read_by_index_only
from pyfuser.ir.tensor_view import TensorView
from pyfuser.scheduler.registry import FusionLike, once_per_view


def reference_output(fusion: FusionLike) -> TensorView:
    """The output with the most iterating (non-broadcast) axes; ties: the first."""
    outputs = [o for o in fusion.outputs() if isinstance(o, TensorView)]
    return max(outputs, key=lambda o: sum(not i.is_broadcast() for i in o.get_logical_domain()))


def innermost(tv: TensorView) -> IterDomain | None:
    """``tv``'s innermost logical axis in memory that is not a broadcast (None: no such axis)."""
    order = [i for i in logical_order(tv) if not i.is_broadcast() and not i.is_reduction()]
    return order[-1] if order else None


@once_per_view
def check_pointwise(fusion: FusionLike) -> tuple[bool, str, IdGraph | None]:
    """Whether one kernel over the reference output's iteration space computes the segment:
    every expr is one a pointwise kernel computes, every tensor's iterating axes are axes of the
    reference, and every output iterates over all of them."""
    exprs = fusion.exprs()
    if not exprs:
        return False, "the segment computes nothing (its outputs are inputs)", None
    for expr in exprs:
        reason = unsupported_in_pointwise_kernel(expr)
        if reason is not None:
            return False, reason, None
    reason = unsupported_indexed_reads(exprs)
    if reason is not None:
        return False, reason, None
    outputs = [o for o in fusion.outputs() if isinstance(o, TensorView)]
    if not outputs:
        return False, "the segment has no tensor output", None
    exact = IdGraph(fusion.tensors(), exprs, map_broadcast=False, through_transforms=False, through_reshapes=False)
    ref = reference_output(fusion)
    ref_axes = _iterating_classes(ref, exact)
    ref_classes = set(ref_axes)
    # A producer's axis a slice, pad or cat shifts into one of the reference's is read at shifted indices,
    # the axes of a reshape's operand at indices computed from its result's.
    readable = readable_classes(exprs, exact.class_of, ref_classes)
    for tv in fusion.tensors():
        if read_by_index_only(tv, exprs):  # addressed at indexed positions, not iterated
            continue
        for pos, i in enumerate(tv.get_logical_domain()):
            if not i.is_broadcast() and not i.is_reduction() and exact.class_of(i) not in readable:
                return False, (f"{tv.short_name} axis {pos} ({i}) is not an axis of {ref.short_name}, the reference "
                               "output: one pointwise kernel iterates over one output's axes"), None
    for out in outputs:
        # Counted: two axes of one class (``a[:, None] <= a[None, :]``) are two loops, and an output
        # broadcast along one of them has no loop nest of its own in the reference's.
        if _iterating_classes(out, exact) != ref_axes:
            return False, (f"outputs {ref.short_name} and {out.short_name} iterate over different axes; one "
                           "pointwise kernel writes outputs of one shape"), None
    return True, "", exact


def _iterating_classes(tv: TensorView, exact: IdGraph) -> Counter[int]:
    """Exact classes of ``tv``'s iterating logical axes, each as often as ``tv`` has an axis of it."""
    return Counter(exact.class_of(i) for i in tv.get_logical_domain() if not i.is_broadcast() and not i.is_reduction())


def innermost_classes(fusion: FusionLike, exact: IdGraph) -> dict[int, TensorView]:
    """Exact class of the innermost memory axis -> a global tensor (input or output) that has it,
    among the tensors that iterate over at least two of the reference's axes and disagree with the
    reference on the memory order of those (its innermost among them is not theirs). A bias (one
    axis) is read along whatever axis it has and decides no layout, nor do ids ``[B, S]`` beside their
    embeddings ``[B, S, D]``; an attention mask shared by the batch ([1, S, T] beside [B, S, T] scores
    stored transposed) read across its rows by a 1-D schedule over the scores' memory order touches a
    line per element (H200, bf16 4 x 8192 x 1000: 225 us against Inductor's tiled 52)."""
    ref = reference_output(fusion)
    ref_order = [exact.class_of(i) for i in logical_order(ref) if not i.is_broadcast() and not i.is_reduction()]
    ref_classes = set(ref_order)
    classes: dict[int, TensorView] = {}
    for tv in (*fusion.inputs(), *fusion.outputs()):
        if not isinstance(tv, TensorView):
            continue
        own = {exact.class_of(i) for i in tv.get_logical_domain() if not i.is_broadcast() and not i.is_reduction()}
        inner = innermost(tv)
        if inner is None or len(own) < 2 or not own <= ref_classes:
            continue
        shared_innermost = [c for c in ref_order if c in own][-1]
        if own == ref_classes or exact.class_of(inner) != shared_innermost:
            classes.setdefault(exact.class_of(inner), tv)
    return classes


#: The shortest axis the transpose scheduler tiles (its tiles are 64 wide): on a shorter one most of
#: each tile is masked, and the pointwise scheduler's 1-D tiles over the output's memory order take the
#: segment. ConvNeXt's 3-channel image and its 2x2 convolution weights converted to channels-last ran as
#: five tiled transposes taking 90 us a step on an H200, where Inductor's 1-D kernel for the image took 30.
MIN_TILED_EXTENT = 32


def transposed_axes(fusion: FusionLike, exact: IdGraph) -> tuple[IterDomain, IterDomain]:
    """The reference's logical axes a transpose tiles: the innermost in memory of an input (or output)
    whose innermost is not the reference's, and the reference's innermost (the segment's tensors must
    disagree on it: ``innermost_classes`` has two classes or more)."""
    ref = reference_output(fusion)
    out_axis = innermost(ref)
    assert out_axis is not None
    out_class = exact.class_of(out_axis)
    in_class = next(c for c in innermost_classes(fusion, exact) if c != out_class)
    in_axis = next(i for i in ref.get_logical_domain() if not i.is_broadcast() and exact.class_of(i) == in_class)
    return in_axis, out_axis


def short_transposed_axis(fusion: FusionLike, exact: IdGraph) -> str | None:
    """Why a segment whose tensors disagree on the innermost axis is not the transpose scheduler's (an
    axis it would tile has a static extent under ``MIN_TILED_EXTENT``), or None: it is."""
    for axis in transposed_axes(fusion, exact):
        extent = axis.extent.value
        if extent is not None and extent < MIN_TILED_EXTENT:
            return (f"axis {axis} of the transpose has {extent} < {MIN_TILED_EXTENT} elements: its tiles would be "
                    "mostly masked (the pointwise scheduler's 1-D tiles take it)")
    return None
