"""The softmax shift: a sum of ``exp(y - max(y))`` over the axes the max reduces.

A kernel that reads its rows in a loop can compute such a sum in the max's own pass (an *online*
softmax: each lane keeps its running max and its sum relative to it, rescaled by
``exp(m_old - m_new)`` when the max grows), so the row is read once for both. This module only
recognizes the pattern in the IR: the code generator decides whether a kernel's loops allow it.
"""

from __future__ import annotations

from pyfuser.ir.base import Val
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.iter_domain import IterDomain
from pyfuser.ir.ops import (
    BinaryOp,
    BinaryOpType,
    BroadcastOp,
    ExpandOp,
    LoadStoreOp,
    ReductionOp,
    ReductionOpType,
    TernaryOp,
    UnaryOp,
    UnaryOpType,
)
from pyfuser.ir.tensor_view import TensorView

#: Ops between a max's result and its broadcast back along the row that only re-index it.
_REINDEXING = (BroadcastOp, ExpandOp, LoadStoreOp)
#: Ops whose result is a function of their operands and attributes alone.
_SAME_VALUE_OPS = (UnaryOp, BinaryOp, TernaryOp, BroadcastOp, ExpandOp, LoadStoreOp)
#: Dtypes computed as stored: ``y - m`` rounds the same whichever max ``m`` is subtracted (half and
#: bfloat16 results round to their dtype, where a lane's shift would change that rounding).
_EXACT = (DataType.Float, DataType.Double)


def _defined_by(val: Val, op: UnaryOpType | BinaryOpType) -> bool:
    """Whether ``val`` is a tensor computed by the unary or binary op ``op``."""
    d = val.definition
    return isinstance(val, TensorView) and isinstance(d, UnaryOp | BinaryOp) and d.kind is op


def same_value(a: Val, b: Val) -> bool:
    """Whether ``a`` and ``b`` hold the same values: one tensor, or the same deterministic pointwise or
    re-indexing op of operands that hold the same values (``forward_input_broadcasts`` gives each
    reader of an input's cast its own copy)."""
    if a is b:
        return True
    da, db = a.definition, b.definition
    if (not isinstance(a, TensorView) or not isinstance(b, TensorView) or da is None or db is None
            or type(da) is not type(db) or not isinstance(da, _SAME_VALUE_OPS) or a.dtype is not b.dtype
            or len(a.get_logical_domain()) != len(b.get_logical_domain())
            or (isinstance(da, BinaryOp | TernaryOp) and isinstance(db, BinaryOp | TernaryOp)
                and da.number_like != db.number_like)):
        return False
    ca, cb = da.python_call(), db.python_call()
    if ca.op != cb.op or ca.kwargs != cb.kwargs or len(ca.args) != len(cb.args) or len(da.inputs) != len(db.inputs):
        return False
    return all(x is y or (isinstance(x, Val) and isinstance(y, Val) and same_value(x, y)) or
               (not isinstance(x, Val) and not isinstance(y, Val) and x == y)
               for x, y in zip((*ca.args, *da.inputs), (*cb.args, *db.inputs), strict=True))


def softmax_shift(expr: ReductionOp) -> ReductionOp | None:
    """The max reduction ``m = max(y)`` when ``expr`` is ``sum(exp(y - b))`` (or a mean), ``b`` the
    result of ``m`` read back along exactly the axes ``m`` reduces and ``expr`` reduces the same
    axes; None otherwise. ``y`` is the same tensor both read, every value float32 or float64."""
    if expr.kind not in (ReductionOpType.sum, ReductionOpType.mean):
        return None
    e = expr.inputs[0]
    if not _defined_by(e, UnaryOpType.exp):
        return None
    assert isinstance(e, TensorView) and e.definition is not None
    d = e.definition.inputs[0]
    if not _defined_by(d, BinaryOpType.sub):
        return None
    assert isinstance(d, TensorView) and d.definition is not None
    sub = d.definition
    y, b = sub.inputs
    if not isinstance(y, TensorView) or not isinstance(b, TensorView) or y is b:
        return None
    # b back to the max's result through re-indexing ops: each of the result's IDs to b's
    to_b: dict[IterDomain, IterDomain] | None = None
    source: Val = b
    while isinstance(source.definition, _REINDEXING):
        op = source.definition
        producer = op.inputs[0]
        if not isinstance(producer, TensorView):
            return None
        step = op.logical_map(producer)
        to_b = step if to_b is None else {p: to_b[c] for p, c in step.items() if c in to_b}
        source = producer
    m = source.definition
    if to_b is None or not isinstance(m, ReductionOp) or m.kind is not ReductionOpType.max:
        return None
    x = m.inputs[0]  # the max's y: the sub's, or a copy of the same values
    if not isinstance(x, TensorView) or not same_value(x, y):
        return None
    assert isinstance(source, TensorView)
    if any(v.dtype not in _EXACT or v.dtype is not y.dtype for v in (y, source, b, d, e)):
        return None
    # Position by position: a row of y (an ID the max keeps) meets the max of that row in the sub,
    # and the sum reduces exactly the axes the max reduces.
    y_to_d, b_to_d = sub.logical_map(y), sub.logical_map(b)
    if len(y_to_d) != len(d.get_logical_domain()):  # y iterates every axis of y - b
        return None
    d_to_e, e_to_out = e.definition.logical_map(d), expr.logical_map(e)
    x_ids, y_ids = x.get_logical_domain(no_reductions=True), y.get_logical_domain(no_reductions=True)
    if len(x_ids) != len(y_ids):
        return None
    x_to_y = dict(zip(x_ids, y_ids, strict=True))
    for x_id, m_id in m.logical_map(x).items():
        d_id = y_to_d.get(x_to_y[x_id])
        e_id = d_to_e.get(d_id) if d_id is not None else None
        out_id = e_to_out.get(e_id) if e_id is not None else None
        if out_id is None or out_id.is_reduction() is not m_id.is_reduction():
            return None
        b_id = to_b.get(m_id)
        if not m_id.is_reduction() and (b_id is None or b_to_d.get(b_id) is not d_id):
            return None
    return m
