"""The scatter scheduler: ``index_put_accumulate`` (an embedding's backward, ``index_put_`` with
``accumulate=True``) as atomic adds in a generated kernel, instead of ATen's sort of the indices; and
``index_put`` without accumulation (an MoE's inverse permutation) as stores at the indexed rows.

A segment is the accumulating op, the pointwise ops that compute its ``value`` rows (a cast of a
bfloat16 gradient to float32) and those that compute its ``acc`` (a ``full`` of zeros). It runs as
two launches (``codegen/scatter.py``): the first writes ``acc`` into the output buffer (zeros: a fill;
a segment input: a copy), the second iterates ``value``'s elements, reads each row's index and adds
the element into the output at that row with ``tl.atomic_add``, as Inductor's ``scatter_add``
lowering does. Two schedules, one per launch: ``acc`` (and what computes it) flattened in memory order
and split into programs, as the pointwise scheduler does, and the same for ``value``.

Atomic adds in float make the order of additions, and so the last bits, vary between runs: what
torch and Inductor accept for this op unless ``torch.use_deterministic_algorithms(True)`` is on, in
which case the segment stays ATen's (sorted, deterministic). Accumulation is in ``acc``'s dtype:
float32 and float64 (and int32) only; a half or bfloat16 ``acc`` stays ATen's, which sums each row in
float32 and rounds once (a fusion that wants that speed accumulates into a float32 ``full`` and
casts, as the embedding backward of ``benchmarks/kernel_cases.py`` does). Stores take any dtype; a row
indexed twice gets one of its values, as ATen's (the segment stays ATen's under deterministic
algorithms, whose index_put writes the last).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pyfuser.codegen.scatter import scatter_op
from pyfuser.codegen.support import unsupported_in_pointwise_kernel
from pyfuser.codegen.values import L2Hint
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import ParallelType
from pyfuser.ir.ops import ReshapeOp
from pyfuser.ir.ops.indexing import IndexedRead
from pyfuser.ir.tensor_view import TensorView
from pyfuser.scheduler.pointwise import flatten_in_memory_order, merge_range
from pyfuser.scheduler.registry import FusionLike, Scheduler, SchedulerType, SizeHints
from pyfuser.scheduler.tools import inline_most, parallelize_like, transform_like

#: dtypes ``tl.atomic_add`` adds in exactly the arithmetic of ATen's accumulation
ATOMIC_DTYPES = frozenset({DataType.Float, DataType.Double, DataType.Int32})


@dataclass(frozen=True)
class ScatterParams:
    """``reference``: the ``value`` tensor, whose elements the scatter launch iterates (``block`` per
    program); ``init_reference``: ``acc`` where the segment computes it (its fill or copy launch,
    ``init_block`` per program), else -1 (a segment input, copied on the host)."""

    reference: int
    init_reference: int
    block: int = 1024
    init_block: int = 1024
    num_warps: int = 4
    scheduler_type: SchedulerType = SchedulerType.scatter
    #: no serial loops; each value is read once and the output's lines are written by atomics
    narrow_warps = 0
    num_stages = 0
    l2 = L2Hint.none

    def __str__(self) -> str:
        init = f"T{self.init_reference}" if self.init_reference >= 0 else "copied from the segment input"
        return (f"===== Scatter Parameters ========\nreference: T{self.reference}\ntile: {self.block}\n"
                f"initial value: {init} (tile {self.init_block})\nnum_warps: {self.num_warps}\n"
                "====================================\n")


def _producers(tv: TensorView, fusion: FusionLike) -> list[TensorView]:
    """Tensors of the segment that ``tv`` is computed from (itself included), stopping at its inputs."""
    inputs = {id(v) for v in fusion.inputs()}
    exprs = {id(e) for e in fusion.exprs()}
    found: dict[int, TensorView] = {}
    stack = [tv]
    while stack:
        v = stack.pop()
        if id(v) in found:
            continue
        found[id(v)] = v
        if id(v) in inputs or v.definition is None or id(v.definition) not in exprs:
            continue
        stack.extend(i for i in v.definition.inputs if isinstance(i, TensorView))
    return list(found.values())


def can_schedule(fusion: FusionLike) -> tuple[bool, str]:
    op = scatter_op(fusion.exprs())
    if op is None:
        return False, "the segment has no index_put_accumulate / index_put (or more than one)"
    if torch.are_deterministic_algorithms_enabled():
        return False, ("torch.use_deterministic_algorithms(True) is on: atomic adds sum (and stores to one row "
                       "land) in a varying order, ATen's sorted index_put does not")
    out = op.output
    assert isinstance(out, TensorView)
    outputs = fusion.outputs()
    if len(outputs) != 1 or outputs[0] is not out:
        return False, (f"{op.op_name}'s output {out.short_name} must be the segment's only output: its "
                       "rows are complete only after every row is written")
    if op.accumulate and out.dtype not in ATOMIC_DTYPES:
        return False, (f"index_put_accumulate into {out.dtype}: ATen sums each row in float32 and rounds once, "
                       "atomic adds would round at each addition (accumulate into a float32 tensor and cast)")
    acc, index, value = op.inputs
    assert isinstance(acc, TensorView) and isinstance(index, TensorView) and isinstance(value, TensorView)
    # Size-1 axes (broadcast IDs) index nothing: a single row of value, a table of one row, rows of
    # one element, where value's and acc's agree.
    rows = zip(acc.get_logical_domain(no_reductions=True)[1:], value.get_logical_domain(no_reductions=True)[1:],
               strict=True)
    if any(a.is_broadcast() != v.is_broadcast() for a, v in rows):
        return False, f"{value.short_name}'s rows and {acc.short_name}'s differ in which axes have size 1"
    exprs = fusion.exprs()
    if any(isinstance(i, TensorView) and i.definition is not None and i.definition in exprs for i in (index,)):
        return False, f"the index {index.short_name} must be read as it is (a segment input)"
    computed = {id(t) for t in (*_producers(acc, fusion), *_producers(value, fusion))}
    for expr in exprs:
        if expr is op:
            continue
        reason = unsupported_in_pointwise_kernel(expr)
        if reason is not None:
            return False, reason
        if isinstance(expr, ReshapeOp):
            return False, f"{expr.op_description} producing {expr.outputs[0]}: reshapes are pointwise kernels"
        if isinstance(expr, IndexedRead):
            return False, (f"{expr.op_description} producing {expr.outputs[0]}: a scatter segment's launches read "
                           "their inputs where they iterate them, not at indexed positions")
        if not all(id(t) in computed for t in expr.tensor_outputs):
            return False, (f"{expr.op_description} producing {expr.outputs[0]} computes neither the rows added "
                           "nor the tensor they are added into")
    inputs = {id(v) for v in fusion.inputs()}
    shared = {id(t) for t in _producers(acc, fusion) if id(t) not in inputs} & \
        {id(t) for t in _producers(value, fusion) if id(t) not in inputs}
    if shared:
        return False, "acc and value are computed from a common tensor of the segment: two launches would compute it"
    for tv, role in ((acc, "acc"), (value, "value")):
        for t in _producers(tv, fusion):  # (a segment input is read as it lies, whatever computed it)
            if id(t) not in inputs and any(i.is_reduction() for i in t.get_logical_domain()):
                return False, f"{t.short_name} (computing {role}) has reduction axes"
    return True, ""


def compute_heuristics(fusion: FusionLike, inputs: Sequence[Any] | SizeHints = ()) -> ScatterParams:
    ok, reason = can_schedule(fusion)
    if not ok:
        raise ValueError(f"the scatter scheduler cannot schedule this fusion: {reason}")
    op = scatter_op(fusion.exprs())
    assert op is not None
    acc, _, value = op.inputs
    assert isinstance(acc, TensorView) and isinstance(value, TensorView)
    computed = acc.definition is not None and acc.definition in fusion.exprs()
    # A thread's share of the fill is one 16-byte access; of the scatter, 4 elements (atomics are
    # per element: a wider share only lengthens each thread's chain of them).
    vec = max(1, 16 // acc.dtype.torch_dtype.itemsize)
    return ScatterParams(value.name, acc.name if computed else -1, 1024, 256 * vec)


def _schedule_flat(ref: TensorView, block: int, tvs: list[TensorView]) -> None:
    """``ref`` flattened in memory order and split into programs of ``block`` elements; ``tvs`` (the
    tensors it is computed from) follow it."""
    n = flatten_in_memory_order(ref)
    merge_range(ref, 0, max(n, 1))
    ref.split(0, block)
    ref.axis(0).parallelize(ParallelType.grid_x)
    ref.axis(1).parallelize(ParallelType.block_x)
    others = [t for t in tvs if t is not ref]
    if others:
        transform_like(ref, others)
        parallelize_like(ref, others)


def schedule(fusion: Fusion, params: ScatterParams) -> None:
    op = scatter_op(fusion.exprs())
    assert op is not None
    acc, _, value = op.inputs
    assert isinstance(acc, TensorView) and isinstance(value, TensorView)
    _schedule_flat(value, params.block, [t for t in _producers(value, fusion) if not t.is_fusion_input])
    if params.init_reference >= 0:
        _schedule_flat(acc, params.init_block, [t for t in _producers(acc, fusion) if not t.is_fusion_input])
    computed = [t for t in (*_producers(value, fusion), *_producers(acc, fusion))
                if not t.is_fusion_input and not t.is_fusion_output and t is not value and t is not acc]
    if computed:
        inline_most(computed, fusion)


SCATTER = Scheduler(SchedulerType.scatter, can_schedule, compute_heuristics, schedule, size_dependent=False)
