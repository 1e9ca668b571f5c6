"""Property: random reduction programs (a pointwise prologue, a reduction over random axes, maybe a
normalization reading it back), on random layouts and sizes that take every schedule shape
(tile, loop, split, outer), scheduled automatically or by a random manual schedule with rfactor,
compute what the ATen evaluator (the oracle) computes."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyfuser import FusionDefinition, ParallelType

UNARY = ["neg", "exp", "sin", "tanh", "abs"]
REDUCTIONS = ["sum", "max", "min", "mean"]


@dataclass
class ReductionProgram:
    shape: tuple[int, ...]
    order: tuple[int, ...]  # the input's memory order, outermost first
    prologue: list[str]
    reduction: str
    dims: tuple[int, ...]
    keepdim: bool
    normalize: bool  # x - broadcast(reduce(x)): the reduced value read back over the reduced axes


@st.composite
def reduction_programs(draw: st.DrawFn) -> ReductionProgram:
    rank = draw(st.integers(1, 3))
    sizes = st.one_of(st.integers(1, 12), st.sampled_from([0, 33, 130, 1500]))
    shape = tuple(draw(st.lists(sizes, min_size=rank, max_size=rank)))
    if sum(s > 100 for s in shape) > 1:  # one long axis at most: keep the interpreter fast
        shape = tuple(min(s, 12) if k else s for k, s in enumerate(shape))
    dims = tuple(sorted(draw(st.sets(st.integers(0, rank - 1), min_size=1, max_size=rank))))
    return ReductionProgram(shape, tuple(draw(st.permutations(range(rank)))),
                            draw(st.lists(st.sampled_from(UNARY), max_size=2)), draw(st.sampled_from(REDUCTIONS)),
                            dims, draw(st.booleans()), draw(st.booleans()))


def _build(p: ReductionProgram) -> tuple[FusionDefinition, torch.Tensor]:
    base = torch.randn([p.shape[d] for d in p.order])
    x = base.permute([p.order.index(d) for d in range(len(p.shape))])
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        for op in p.prologue:
            t = getattr(fd.ops, op)(t)
        r = getattr(fd.ops, p.reduction)(t, list(p.dims), keepdim=p.keepdim or p.normalize)
        fd.add_output(fd.ops.sub(t, r) if p.normalize else r)
    return fd, x


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reduction_programs())
def test_automatic_reduction_schedules_match_the_oracle(program: ReductionProgram) -> None:
    if 0 in [program.shape[d] for d in program.dims] and program.reduction in ("max", "min"):
        return  # a max over nothing is an error in torch too
    fd, x = _build(program)
    (oracle,) = fd.execute([x], _disable_options=["kernel_codegen"])
    (got,) = fd.execute([x], _enable_options=["triton_interpreter"])
    torch.testing.assert_close(got, oracle, rtol=1e-4, atol=1e-4 * _magnitude(program, x), equal_nan=True)


def _magnitude(p: ReductionProgram, x: torch.Tensor) -> float:
    """How large the values an output is computed from are: ``t - sum(t)`` cancels where one value
    of ``t`` dominates its sum (``exp(exp(x))``), leaving the rounding of the sum in any order."""
    if not p.normalize or x.numel() == 0:
        return 1.0
    t = x
    for op in p.prologue:
        t = getattr(torch, op)(t)
    return max(1.0, float(t.abs().sum(p.dims).max()))


@st.composite
def manual_reductions(draw: st.DrawFn) -> tuple[tuple[int, int], str, int, str, bool]:
    shape = (draw(st.integers(1, 9)), draw(st.sampled_from([1, 7, 64, 300, 1000])))
    return (shape, draw(st.sampled_from(["sum", "max", "mean"])), draw(st.sampled_from([1, 4, 32, 128])),
            draw(st.sampled_from(["outer_block", "inner_block", "grid"])), draw(st.booleans()))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manual_reductions())
def test_random_manual_reduction_schedules_match_the_oracle(case: tuple[tuple[int, int], str, int, str, bool]) -> None:
    """``[i, r] -> [i, r/f, f]``: the rows on the grid or in a loop; one part of the reduction on the
    block (or on the grid: a grid reduction), the other a loop; maybe rfactored first."""
    shape, op, factor, where, rows_on_grid = case
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        t1 = getattr(fd.ops, op)(t0, [1])
        fd.add_output(t1)
        t1.split(1, factor)
        if rows_on_grid:
            t1.axis(0).parallelize(ParallelType.grid_x)
        if where == "grid":
            t1.axis(1).parallelize(ParallelType.grid_y)  # each program a share of the row: two launches
        else:
            block = 2 if where == "inner_block" else 1  # r/f (a tile as wide as the extent) or f
            t1.axis(block).parallelize(ParallelType.block_x)
            partial = t1.rfactor([3 - block])
            partial.axis(block).parallelize(ParallelType.block_x)
            if rows_on_grid:
                partial.axis(0).parallelize(ParallelType.grid_x)
    x = torch.randn(shape)
    ref = {"sum": x.sum(1), "max": x.amax(1), "mean": x.mean(1)}[op]
    fd.manual_validate([x], [ref])
