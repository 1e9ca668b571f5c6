"""Schedules stream lowering cannot honour: a ValueError naming the tensor, the axis and what was expected."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.ir.iter_domain import ParallelType
from pyfuser.ir.tensor_view import TensorView

STREAM = ParallelType.stream


def _pointwise() -> tuple[FusionDefinition, object, object]:
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1, -1])
    t1 = fd.ops.relu(t0)
    fd.add_output(t1)
    return fd, t0, t1


def test_two_stream_ids_in_one_loop_domain():
    fd, _, t1 = _pointwise()
    t1.axis(0).parallelize(STREAM)
    with pytest.raises(ValueError, match=r"T1 axis 1 cannot be parallelized on stream: axis 0"):
        t1.axis(1).parallelize(STREAM)
    # Bypassing the schedule API (e.g. a loop domain built elsewhere) is caught at lowering.
    t1.axis(1).parallel_type = STREAM
    with pytest.raises(ValueError, match=r"T1 has 2 stream-parallel loop IDs \(axis 0 .*, axis 1 .*\)"):
        fd.execute([torch.randn(2, 3)])


def test_stream_on_reduction_id():
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1, -1])
    t1 = fd.ops.sum(t0, [1])
    fd.add_output(t1)
    with pytest.raises(ValueError, match=r"T1 axis 1 \(rS\d+\{i1\}\) is a reduction ID"):
        t1.axis(1).parallelize(STREAM)
    t1.axis(1).parallel_type = STREAM
    with pytest.raises(ValueError, match=r"T1 axis 1 \(rStreamIdx\d+\{i1\}\) is a reduction ID parallelized on stream"):
        fd.execute([torch.randn(2, 3)])


def test_stream_ids_that_neither_map_nor_nest():
    fd, t0, t1 = _pointwise()
    t0.axis(0).parallelize(STREAM)  # the input asks for row chunks of relu's loop ...
    t1.axis(1).parallelize(STREAM)  # ... its output for column chunks
    with pytest.raises(ValueError, match=r"neither map nor nest: T1 axis 1 .* but T0 axis 0"):
        fd.execute([torch.randn(2, 3)])


def test_stream_split_differently_on_input_and_output():
    fd, t0, t1 = _pointwise()
    t0.outer_split(0, 2)
    t0.axis(0).parallelize(STREAM)
    t1.outer_split(0, 3)
    t1.axis(0).parallelize(STREAM)
    with pytest.raises(ValueError, match=r"neither map nor nest: T1 axis 0 \(iStreamIdx\d+\{3\}\) iterates 3 chunks"):
        fd.execute([torch.randn(6, 3)])


def test_stream_input_axis_reduced_by_consumer():
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1, -1])
    t1 = fd.ops.sum(t0, [0])
    fd.add_output(t1)
    t0.axis(0).parallelize(STREAM)
    with pytest.raises(ValueError, match=r"T0 axis 0 .* its consumer T1 \(ReductionOp\) maps it to the reduction ID"):
        fd.execute([torch.randn(4, 3)])


def test_stream_on_merged_or_inner_split_id():
    fd, _, t1 = _pointwise()
    t1.merge(0)
    t1.axis(0).parallelize(STREAM)
    with pytest.raises(ValueError, match=r"T1 axis 0 \(iStreamIdx\d+\{\( i0 \* i1 \)\}\) is produced by a merge"):
        fd.execute([torch.randn(2, 3)])
    fd, _, t1 = _pointwise()
    t1.split(0, 2)
    t1.axis(1).parallelize(STREAM)
    with pytest.raises(ValueError, match=r"T1 axis 1 \(iStreamIdx\d+\{2\}\) is the inner output of a split"):
        fd.execute([torch.randn(4, 3)])


@pytest.mark.parametrize("op", ["reshape", "cat", "pad", "slice"])
def test_op_that_cannot_run_chunk_wise(op):
    fd = FusionDefinition()
    t0 = fd.define_tensor([4, 6])
    if op == "reshape":
        out = fd.ops.reshape(t0, [6, 4])
    elif op == "cat":
        out = fd.ops.cat([t0, t0], 0)
    elif op == "pad":
        out = fd.ops.pad(t0, [1, 1])
    else:
        out = fd.ops.slice(t0, [0, 0], [2, 6])
    fd.add_output(out)
    out.axis(0).parallelize(STREAM)
    with pytest.raises(ValueError, match=r"T1 axis 0 .* is computed by \w+Op, which cannot run chunk-wise"):
        fd.execute([torch.randn(4, 6)])


def test_bad_number_of_streams(monkeypatch):
    fd, _, _t1 = _pointwise()
    monkeypatch.setenv("PYFUSER_NUM_STREAMS", "zero")
    with pytest.raises(ValueError, match="PYFUSER_NUM_STREAMS must be a positive integer, got 'zero'"):
        fd.execute([torch.randn(2, 3)])
    monkeypatch.setenv("PYFUSER_NUM_STREAMS", "0")
    with pytest.raises(ValueError, match="numberOfStreams must be a positive int, got 0"):
        fd.execute([torch.randn(2, 3)])


def _stream_loop_where(flag: Callable[[FusionDefinition, TensorView], TensorView]) -> FusionDefinition:
    """``where(flag, maximum(x, y), y)`` with a one-element ``flag``, chunked by one stream loop."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], contiguity=True, dtype=DataType.Int)
        y = fd.define_tensor([1], contiguity=True, dtype=DataType.Float)
        t = fd.ops.maximum(x, y)
        out = fd.ops.where(flag(fd, x), t, y)
        fd.add_output(out)
        out.axis(0).parallelize(ParallelType.stream)
        t.axis(0).parallelize(ParallelType.stream)
    return fd


@pytest.mark.parametrize("size", [0, 3])
def test_stream_loop_over_extents_that_differ_at_run_time(size):
    """A pad's or cat's static extent 1 (an iteration axis: a result of one element keeps one) maps to
    an input's symbolic one through a where, both chunked by one stream loop: sizes other than 1 are
    an error naming the tensor, not an output the loop leaves unwritten (found by the fuzzer: seed
    247057, with a pad, returned shape (1,) where torch gives (0,))."""
    y = torch.ones(1)
    for one_element in (lambda fd, x: fd.ops.pad(fd.ops.slice(fd.ops.lt(2, x), [-1], [-1], [2]), [0, 1], 1.5),
                        lambda fd, x: fd.ops.cat([fd.ops.full([1], True, DataType.Bool),
                                                  fd.ops.full([0], False, DataType.Bool)], 0)):
        fd = _stream_loop_where(one_element)
        with pytest.raises(ValueError, match=r"axis 0 has size 1, but the stream loop over iStreamIdx\d+\{i0\} that "
                                             rf"chunks it runs over {size}; they must be equal"):
            fd.execute([torch.arange(size), y])
        x = torch.tensor([5])  # sizes agree
        (result,) = fd.execute([x, y])
        torch.testing.assert_close(result, torch.where(torch.tensor([True]), torch.maximum(x, y), y))
