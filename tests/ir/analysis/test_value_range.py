"""Bounds of integer values (``ir/analysis/value_range.py``): derived where constants fix them, unknown
elsewhere; every derived bound holds on the values the ATen evaluator computes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyfuser import DataType, FusionDefinition
from pyfuser.ir.analysis.value_range import integer_bounds
from pyfuser.ir.tensor_view import TensorView


def _bounds_and_values(build: Callable[..., TensorView],
                       inputs: tuple[torch.Tensor, ...] = ()) -> tuple[tuple[int, int] | None, torch.Tensor]:
    with FusionDefinition() as fd:
        tvs = [fd.from_pytorch(t) for t in inputs]
        out = build(fd, *tvs)
        fd.add_output(out)
    (value,) = fd.execute(list(inputs))
    return integer_bounds(out), value


CASES = {
    "iota": (lambda fd: fd.ops.iota(7, 2, 3, DataType.Int), (2, 20)),
    "descending iota": (lambda fd: fd.ops.iota(4, 10, -2, DataType.Int), (4, 10)),
    "clamp": (lambda fd, x: fd.ops.clamp(x, 0, 5), (0, 5)),
    "clamp of an iota sum": (lambda fd: fd.ops.clamp(fd.ops.add(fd.ops.iota(9, -4, 1, DataType.Int), 3), 0, 6),
                             (0, 6)),
    "where of two constants": (lambda fd, x: fd.ops.where(fd.ops.gt(x, 0), fd.ops.full([5], 3, DataType.Int),
                                                          fd.ops.full([5], -1, DataType.Int)), (-1, 3)),
    "difference of iotas": (lambda fd: fd.ops.sub(fd.ops.broadcast(fd.ops.iota(4, 0, 1, DataType.Int), [False, True]),
                                                  fd.ops.broadcast(fd.ops.iota(6, 0, 1, DataType.Int), [True, False])),
                            (-5, 3)),
    "negated, maximum, minimum": (lambda fd: fd.ops.minimum(fd.ops.maximum(fd.ops.neg(fd.ops.iota(5, 0, 1, DataType.Int)),
                                                                         -3), 1), (-3, 0)),
    "a loaded value": (lambda fd, x: fd.ops.add(x, 1), None),
    "clamped by a loaded value": (lambda fd, x: fd.ops.clamp(x, 0, x), None),
    "float math cast back": (lambda fd: fd.ops.cast(fd.ops.ceil(fd.ops.cast(fd.ops.iota(5, 0, 1, DataType.Int),
                                                                            DataType.Float)), DataType.Int), None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bounds_hold_on_the_evaluated_values(name: str) -> None:
    build, want = CASES[name]
    inputs = (torch.tensor([-9, 0, 4, 12, 3]),) if build.__code__.co_argcount == 2 else ()
    bounds, value = _bounds_and_values(build, inputs)
    assert bounds == want
    if bounds is not None:
        assert bounds[0] <= int(value.min()) and int(value.max()) <= bounds[1]


def test_a_sum_that_would_wrap_its_dtype_is_unknown() -> None:
    with FusionDefinition() as fd:
        big = fd.ops.iota(3, 2**30, 2**30, DataType.Int32)
        fd.add_output(fd.ops.add(big, big))
    assert integer_bounds(fd.fusion.outputs()[0]) is None


_LEAVES = ("iota", "full", "input")
_OPS = ("add", "sub", "maximum", "minimum", "neg", "clamp", "where", "cast32")


@st.composite
def _expressions(draw: st.DrawFn, depth: int = 0) -> tuple:
    """A random integer expression over a 6-element axis: iotas, constants and a loaded input at the
    leaves, the ops the analysis follows (and a loaded value it must not trust) above them."""
    if depth >= 4 or draw(st.integers(0, 3)) == 0:
        leaf = draw(st.sampled_from(_LEAVES))
        if leaf == "iota":
            return ("iota", draw(st.integers(-20, 20)), draw(st.integers(-5, 5)))
        if leaf == "full":
            return ("full", draw(st.integers(-50, 50)))
        return ("input",)
    op = draw(st.sampled_from(_OPS))
    if op in ("neg", "cast32"):
        return (op, draw(_expressions(depth + 1)))
    if op == "clamp":
        lo, hi = draw(st.integers(-30, 30)), draw(st.integers(-30, 30))
        return (op, draw(_expressions(depth + 1)), lo, hi)
    if op == "where":
        return (op, draw(_expressions(depth + 1)), draw(_expressions(depth + 1)))
    return (op, draw(_expressions(depth + 1)), draw(_expressions(depth + 1)))


def _build(fd: FusionDefinition, tree: tuple, x: TensorView) -> TensorView:
    kind = tree[0]
    if kind == "iota":
        return fd.ops.iota(6, tree[1], tree[2], DataType.Int)
    if kind == "full":
        return fd.ops.full([6], tree[1], DataType.Int)
    if kind == "input":
        return x
    if kind == "neg":
        return fd.ops.neg(_build(fd, tree[1], x))
    if kind == "cast32":
        return fd.ops.cast(_build(fd, tree[1], x), DataType.Int32)
    if kind == "clamp":
        return fd.ops.clamp(_build(fd, tree[1], x), tree[2], tree[3])
    if kind == "where":
        return fd.ops.where(fd.ops.gt(x, 0), _build(fd, tree[1], x), _build(fd, tree[2], x))
    return getattr(fd.ops, kind)(_build(fd, tree[1], x), _build(fd, tree[2], x))


@settings(max_examples=200, deadline=None)
@given(_expressions(), st.lists(st.integers(-100, 100), min_size=6, max_size=6))
def test_derived_bounds_hold_for_random_expressions(tree: tuple, data: list[int]) -> None:
    """Whatever bounds are derived, every value the ATen evaluator computes lies inside them."""
    x = torch.tensor(data)
    with FusionDefinition() as fd:
        out = _build(fd, tree, fd.from_pytorch(x))
        fd.add_output(fd.ops.cast(out, DataType.Int))
    bounds = integer_bounds(out)
    (value,) = fd.execute([x])
    if bounds is not None:
        assert bounds[0] <= int(value.min()) and int(value.max()) <= bounds[1], (tree, bounds, value)


def test_a_value_read_twice_at_every_level_is_bounded_once() -> None:
    """``v = v + v`` forty times: each level reads the one below twice, so bounding each read anew would
    take 2**40 steps; every value is bounded once per query."""
    with FusionDefinition() as fd:
        value = fd.ops.iota(5, 0, 1, DataType.Int)
        for _ in range(40):
            value = fd.ops.add(value, value)
        fd.add_output(value)
    assert integer_bounds(value) == (0, 4 << 40)
