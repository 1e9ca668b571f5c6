"""Property tests: random split / merge / reorder sequences keep loop domains consistent with logical
domains, and never change what a fusion computes."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pyfuser import FusionDefinition, ParallelType, TensorView
from pyfuser.ir.iter_domain import Merge, Split
from pyfuser.ir.tensor_domain import check_covers, transforms_between


@dataclass(frozen=True)
class Step:
    kind: str  # "split" | "merge" | "reorder"
    axis: int  # taken modulo the loop rank when applied
    factor: int = 1
    inner: bool = True
    perm_seed: int = 0


steps = st.lists(st.one_of(
    st.builds(Step, st.just("split"), st.integers(0, 7), st.integers(1, 5), st.booleans()),
    st.builds(Step, st.just("merge"), st.integers(0, 7)),
    st.builds(Step, st.just("reorder"), st.integers(0, 7), perm_seed=st.integers(0, 10_000)),
), max_size=6)


def apply(tv: TensorView, schedule: list[Step]) -> None:
    """Apply ``schedule`` to ``tv``'s loop domain; merges of a reduction with an iteration ID must be
    rejected (and change nothing)."""
    for step in schedule:
        loop = tv.get_loop_domain()
        n = len(loop)
        if n == 0:  # a 0-dim tensor has nothing to schedule
            return
        axis = step.axis % n
        if step.kind == "split":
            tv.split(axis, step.factor, inner_split=step.inner)
        elif step.kind == "merge" and n > 1:
            axis = min(axis, n - 2)
            outer, inner = loop[axis], loop[axis + 1]
            mixed = outer.is_reduction() != inner.is_reduction() and not (outer.is_broadcast() or inner.is_broadcast())
            try:
                tv.merge(axis)
            except ValueError as e:
                assert mixed, e
                assert tv.get_loop_domain() == loop
            else:
                assert not mixed
        elif step.kind == "reorder":
            perm = sorted(range(n), key=lambda k: hash((k, step.perm_seed)) % 1009)
            tv.reorder(dict(enumerate(perm)))


def check_extents(tv: TensorView, env: dict[str, int]) -> None:
    logical = tv.get_logical_domain()
    loop = tv.get_loop_domain()
    check_covers(loop, logical, f"{tv.short_name} loop domain")
    logical_product = math.prod(i.extent.evaluate(env) for i in logical)
    loop_product = math.prod(i.extent.evaluate(env) for i in loop)
    all_divisible = True
    for t in transforms_between(logical, loop):
        if isinstance(t, Split):
            size, outer, inner = (i.extent.evaluate(env) for i in (t.in_id, t.outer, t.inner))
            factor = t.factor.evaluate(env)
            assert (inner if t.inner_split else outer) == factor
            divisible = t.is_divisible(env)
            assert divisible == (size % factor == 0)
            assert outer * inner >= size and (outer * inner == size) == divisible
            assert outer * inner - size < factor, "ceilDiv pads by less than one chunk"
            all_divisible &= divisible
        else:
            assert isinstance(t, Merge)
            assert t.out.extent.evaluate(env) == t.outer.extent.evaluate(env) * t.inner.extent.evaluate(env)
    assert loop_product >= logical_product
    if all_divisible:
        assert loop_product == logical_product


sizes_strategy = st.lists(st.integers(1, 7), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(sizes=sizes_strategy, schedule=steps, static=st.booleans())
def test_loop_extents_multiply_back_to_logical(sizes: list[int], schedule: list[Step], static: bool) -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(sizes if static else [-1] * len(sizes))
        t1 = fd.ops.sum(t0, [0]) if len(sizes) > 1 else fd.ops.neg(t0)
        fd.add_output(t1)
    apply(t1, schedule)
    env = {str(i.extent): s for i, s in zip(t0.get_logical_domain(), sizes, strict=True) if not i.extent.is_const}
    check_extents(t1, env)
    # Bind other sizes: the same symbolic loop domain stays consistent.
    check_extents(t1, {name: size + 3 for name, size in env.items()})


KERNEL_TYPES = [ParallelType.grid_x, ParallelType.block_x, ParallelType.unroll, ParallelType.vectorize]


def parallelize_some(tv: TensorView, picks: list[int]) -> None:
    loop = tv.get_loop_domain()
    for parallel_type, pick in zip(KERNEL_TYPES, picks, strict=False):
        target = loop[pick % len(loop)]
        if target.parallel_type is ParallelType.serial:  # each ID, and each type, used at most once
            target.parallelize(parallel_type)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=4), s1=steps, s2=steps, s3=steps,
       picks=st.lists(st.integers(0, 7), max_size=3), data=st.data())
def test_results_do_not_depend_on_the_loop_schedule(sizes: list[int], s1: list[Step], s2: list[Step],
                                                   s3: list[Step], picks: list[int], data: st.DataObject) -> None:
    rank = len(sizes)
    bias_shape = [sizes[-1]]
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1] * rank)
        t1 = fd.define_tensor([-1])
        t2 = fd.ops.mul(fd.ops.exp(t0), t1)
        t3 = fd.ops.sum(t2, [rank - 1])
        t4 = fd.ops.add(t3, 1.0)
        fd.add_output(t2)
        fd.add_output(t4)
    for tv, schedule in ((t2, s1), (t3, s2), (t4, s3)):
        apply(tv, schedule)
    parallelize_some(t2, picks)
    if data.draw(st.booleans(), "cache"):
        t0.cache_after().split(0, data.draw(st.integers(1, 4), "cache factor"))
    x, y = torch.randn(sizes), torch.randn(bias_shape)
    out2, out4 = fd.execute([x, y])
    ref2 = x.exp() * y
    torch.testing.assert_close(out2, ref2)
    torch.testing.assert_close(out4, ref2.sum(rank - 1) + 1)


# --- property: fd.ops follow torch's broadcasting and type promotion --------------------------------------
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool]
BINARY_NAMES = ["add", "sub", "mul", "truediv", "maximum", "minimum", "eq", "lt", "ge", "logical_and"]


def operand_values(dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    if dtype is torch.bool:
        return torch.rand(shape) > 0.5
    return (torch.rand(shape) * 8 + 1).to(dtype)  # positive: no division by zero, no NaN


@st.composite
def broadcast_shapes(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    full = draw(st.lists(st.integers(2, 4), min_size=1, max_size=3))
    rank_b = draw(st.integers(1, len(full)))
    a = [1 if draw(st.booleans()) and draw(st.booleans()) else s for s in full]
    b = [1 if draw(st.booleans()) and draw(st.booleans()) else s for s in full[len(full) - rank_b:]]
    return a, b


@settings(max_examples=80, deadline=None)
@given(name=st.sampled_from(BINARY_NAMES), dtype_a=st.sampled_from(DTYPES), dtype_b=st.sampled_from(DTYPES),
       shapes=broadcast_shapes(), scalar=st.sampled_from([None, 2, 2.5, True]), swap=st.booleans())
def test_binary_ops_promote_and_broadcast_like_torch(name: str, dtype_a: torch.dtype, dtype_b: torch.dtype,
                                                     shapes: tuple[list[int], list[int]], scalar: object,
                                                     swap: bool) -> None:
    shape_a, shape_b = shapes
    a = operand_values(dtype_a, shape_a)
    b: object = operand_values(dtype_b, shape_b) if scalar is None else scalar
    torch_fn = getattr(operator, name, None) or getattr(torch, name)  # operators take a number on either side
    lhs, rhs = (b, a) if swap else (a, b)
    if name in ("maximum", "minimum", "logical_and"):  # no number overloads: a 0-dim tensor promotes alike
        lhs, rhs = (x if isinstance(x, torch.Tensor) else torch.as_tensor(x) for x in (lhs, rhs))
    try:
        want = torch_fn(lhs, rhs)
    except RuntimeError:
        want = None  # torch rejects the combination (e.g. bool - bool): so must fd.ops, at definition
    with FusionDefinition() as fd:
        ta = fd.define_tensor([1 if s == 1 else -1 for s in shape_a], dtype=dtype_a)
        other = fd.define_tensor([1 if s == 1 else -1 for s in shape_b], dtype=dtype_b) if scalar is None else scalar
        op = getattr(fd.ops, name)
        if want is None:
            with pytest.raises(TypeError, match="not valid for this op"):
                op(*((other, ta) if swap else (ta, other)))
            return
        fd.add_output(op(*((other, ta) if swap else (ta, other))))
    (out,) = fd.execute([a] + ([b] if scalar is None else []))
    assert out.dtype == want.dtype, (name, dtype_a, dtype_b, scalar, out.dtype, want.dtype)
    torch.testing.assert_close(out, want, equal_nan=True)  # bool operands may divide 0 by 0


@settings(max_examples=60, deadline=None)
@given(op=st.sampled_from(["where", "clamp"]), dtypes=st.lists(st.sampled_from(DTYPES), min_size=3, max_size=3),
       numbers=st.lists(st.sampled_from([None, 2, 0.5, True]), min_size=3, max_size=3))
@example(op="where", dtypes=[torch.float32] * 3, numbers=[None, 2, 0.5])
def test_ternary_ops_promote_like_torch(op: str, dtypes: list[torch.dtype], numbers: list[object]) -> None:
    """``where`` / ``clamp`` with any mix of tensor dtypes and Python numbers (at least one tensor); a
    ``where`` whose branches are both numbers follows nvFuser (see ``FusionDefinition.ops.where``)."""
    if all(n is not None for n in numbers):
        numbers[1] = None
    if op == "where":
        dtypes[0] = torch.bool
    values = [operand_values(d, [3]) if n is None else n for d, n in zip(dtypes, numbers, strict=True)]
    # nvFuser's ``where`` with two number branches promotes them as its scalars (a float is Double).
    nvfuser_scalars = op == "where" and numbers[1] is not None and numbers[2] is not None
    args = [v if isinstance(v, torch.Tensor)
            else torch.as_tensor(v, dtype=torch.float64 if nvfuser_scalars and isinstance(v, float) else None)
            for v in values]
    try:
        want = torch.where(*args) if op == "where" else torch.clamp(*args)
    except RuntimeError:
        want = None
    with FusionDefinition() as fd:
        operands = [fd.define_tensor([-1], dtype=d) if n is None else n for d, n in zip(dtypes, numbers, strict=True)]
        if want is None:
            with pytest.raises(TypeError, match="not valid for this op"):
                getattr(fd.ops, op)(*operands)
            return
        fd.add_output(getattr(fd.ops, op)(*operands))
    (out,) = fd.execute([v for v in values if isinstance(v, torch.Tensor)])
    assert out.dtype == want.dtype, (op, dtypes, numbers, out.dtype, want.dtype)
    torch.testing.assert_close(out, want)


UNARY_NAMES = ["neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "sigmoid", "relu",
               "erf", "logical_not"]


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(UNARY_NAMES), dtype=st.sampled_from(DTYPES))
def test_unary_ops_promote_like_torch(name: str, dtype: torch.dtype) -> None:
    x = operand_values(dtype, [2, 3])
    try:
        want = getattr(torch, name)(x)
    except RuntimeError:
        want = None
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=dtype)
        if want is None:
            with pytest.raises(TypeError, match="not valid for this op"):
                getattr(fd.ops, name)(t)
            return
        fd.add_output(getattr(fd.ops, name)(t))
    (out,) = fd.execute([x])
    assert out.dtype == want.dtype
    torch.testing.assert_close(out, want, equal_nan=True)
