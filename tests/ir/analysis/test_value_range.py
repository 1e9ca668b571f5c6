"""Bounds of integer values (``ir/analysis/value_range.py``): derived where constants fix them, unknown
elsewhere; every derived bound holds on the values the ATen evaluator computes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

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
