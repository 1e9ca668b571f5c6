"""Bad schedules fail at compile time with a message naming the tensor and the axis; nothing is
launched."""

from __future__ import annotations

import pytest
import torch

from pyfuser import FusionDefinition, ParallelType


def _pointwise() -> tuple[FusionDefinition, object, object]:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=True)
        mid = fd.ops.exp(x)
        out = fd.ops.neg(mid)
        fd.add_output(out)
    return fd, mid, out


def test_two_ids_on_one_parallel_axis() -> None:
    _, _, out = _pointwise()
    out.axis(0).parallelize(ParallelType.block_x)
    with pytest.raises(ValueError, match=r"T2 axis 1 cannot be parallelized on block_x: axis 0 .* already is"):
        out.axis(1).parallelize(ParallelType.block_x)


def test_tile_over_the_triton_limit() -> None:
    fd, _, out = _pointwise()
    out.merge(0, 1)
    out.split(0, 1 << 21)
    out.axis(1).parallelize(ParallelType.block_x)
    with pytest.raises(ValueError, match=r"T2 axis 1 .* block_x with extent 2097152, over Triton's tile limit"):
        fd.manual_execute([torch.randn(4, 4)])


def test_tile_of_symbolic_extent() -> None:
    fd, _, out = _pointwise()
    out.axis(1).parallelize(ParallelType.block_x)
    with pytest.raises(ValueError, match=r"T2 axis 1 \(ithreadIdx.x\d+\{i1\}\) is parallelized on block_x but its extent "
                                         r"i1 is not a constant"):
        fd.manual_execute([torch.randn(4, 4)])


def test_vectorize_an_axis_that_is_not_innermost() -> None:
    fd, _, out = _pointwise()
    out.split(0, 4)
    out.axis(1).parallelize(ParallelType.vectorize)
    with pytest.raises(ValueError, match=r"T2 axis 1 .* is vectorized along iS\d+\{i0\}, but T0 axis 0 is not innermost"):
        fd.manual_execute([torch.randn(8, 4)])


def test_vectorize_by_a_factor_that_does_not_divide() -> None:
    fd, _, out = _pointwise()
    out.split(1, 4)
    out.axis(2).parallelize(ParallelType.vectorize)
    with pytest.raises(ValueError, match=r"T2 axis 2 .* is vectorized by 4, which must divide the extent of .*, but "
                                         r"it is 6"):
        fd.manual_execute([torch.randn(3, 6)])
    torch.testing.assert_close(fd.manual_execute([torch.ones(3, 8)])[0], -torch.exp(torch.ones(3, 8)))


def test_producer_parallelized_unlike_its_consumer() -> None:
    fd, mid, out = _pointwise()
    out.split(1, 4)
    out.axis(2).parallelize(ParallelType.block_x)
    mid.split(1, 4)
    mid.axis(2).parallelize(ParallelType.block_y)
    with pytest.raises(ValueError, match=r"T1 axis 2 .* is parallelized on block_y, but it is computed inside T2's loop "
                                         r"nest, which maps it to ithreadIdx.x\S+ on block_x"):
        fd.manual_execute([torch.randn(3, 8)])


def test_stream_axis_in_a_manual_kernel() -> None:
    fd, _, out = _pointwise()
    out.axis(0).parallelize(ParallelType.stream)
    with pytest.raises(ValueError, match=r"T2 axis 0 .* is parallelized on stream: host loops and devices never reach"):
        fd.manual_execute([torch.randn(3, 8)])
