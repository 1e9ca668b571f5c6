"""Inner vs outer reduction by memory order: a permuted allocation can turn a logically inner
reduction into an outer one (seed 003)."""

from __future__ import annotations

import pytest
import torch

from pyfuser import FusionDefinition
from pyfuser.ir.ops import ReductionOp
from pyfuser.scheduler.reduction_kind import ReductionKind, reduction_kind, reduction_kinds

INNER, OUTER = ReductionKind.inner, ReductionKind.outer


@pytest.mark.parametrize(("stride_order", "dims", "kind"), [
    ([1, 0], [1], INNER),       # row-major, sum over columns
    ([1, 0], [0], OUTER),
    ([0, 1], [1], OUTER),       # column-major: the logically inner reduction is outer in memory
    ([0, 1], [0], INNER),
    ([2, 1, 0], [0, 2], INNER),
    ([0, 2, 1], [1], OUTER),    # axis 0 innermost, kept
    ([0, 2, 1], [0, 1], INNER),
])
def test_kind_follows_the_input_allocation(stride_order: list[int], dims: list[int], kind: ReductionKind) -> None:
    rank = len(stride_order)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1] * rank, contiguity=True, stride_order=stride_order)
        t1 = fd.ops.sum(t0, dims)
        fd.add_output(t1)
    assert reduction_kind(t1.definition) is kind
    shape = (3, 4, 5)[:rank]
    # the result is the same whatever the kind: only the schedule differs
    order = sorted(range(rank), key=lambda d: -stride_order[d])
    x = torch.randn([shape[d] for d in order]).permute([order.index(d) for d in range(rank)])
    torch.testing.assert_close(fd.execute([x])[0], x.sum(dims))


def test_broadcast_axes_do_not_count() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1, 1], contiguity=[True, True, None])
        t1 = fd.ops.sum(t0, [1])
        fd.add_output(t1)
    assert reduction_kind(t1.definition) is INNER


def test_intermediates_inherit_the_order_of_the_fusion_inputs() -> None:
    """Seed 003's fusion with a column-major T0: both reductions flip kind."""
    def build(stride_order: list[int]) -> dict[str, ReductionKind]:
        with FusionDefinition() as fd:
            t0 = fd.define_tensor([1, -1, -1], contiguity=[None, True, True], stride_order=stride_order)
            t2 = fd.ops.sum(fd.ops.squeeze(t0, [0]), [1])
            t4 = fd.ops.add(t0, fd.ops.broadcast(t2, [True, False, True]))
            t6 = fd.ops.sum(fd.ops.squeeze(t4, [0]), [0])
            fd.add_output(t4)
            fd.add_output(t6)
        return {e.output.short_name: kind for e, kind in reduction_kinds(fd.fusion).items()}

    assert build([1, 2, 0]) == {"T2": INNER, "T6": OUTER}  # the seed's layout: logical order in memory
    assert build([1, 0, 2]) == {"T2": OUTER, "T6": INNER}  # (iS2, bS0, iS1)


def test_explicit_order_and_errors() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        t1 = fd.ops.sum(t0, [0])
        t2 = fd.ops.exp(t0)
        fd.add_output(t1)
        fd.add_output(t2)
    expr = t1.definition
    assert isinstance(expr, ReductionOp)
    rows, cols = t0.get_logical_domain()
    assert reduction_kind(expr) is OUTER
    assert reduction_kind(expr, [cols, rows]) is INNER
    with pytest.raises(TypeError, match=r"reduction_kind expects a reduction, got UnaryOp producing T2"):
        reduction_kind(t2.definition)
    with FusionDefinition() as fd2:  # a var_mean of broadcasts (a sum of them is a squeeze)
        b = fd2.define_tensor([1, 1])
        s, _ = fd2.ops.var_mean(b, [0])
        fd2.add_output(s)
    with pytest.raises(ValueError, match=r"T1: T0 has no axis that occupies memory"):
        reduction_kind(s.definition)
