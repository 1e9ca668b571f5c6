"""User schedules compiled as written (``manual_execute``): nvFuser's tutorial schedules, the
schedule tools, and the scheduler API (``pyfuser.schedule``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pyfuser import FusionDefinition, ParallelType, schedule
from pyfuser.schedule import SchedulerType


def _memcpy() -> tuple[FusionDefinition, object]:
    with FusionDefinition() as fd:
        tv0 = fd.define_tensor(shape=[-1, -1])
        tv1 = fd.ops.set(tv0)
        fd.add_output(tv1)
    return fd, tv1


def test_unscheduled_fusion_is_a_sequential_kernel(device: str) -> None:
    fd, _ = _memcpy()
    t0 = torch.randn(6, 5, device=device)
    assert fd.manual_execute([t0])[0].equal(t0)
    code = fd.last_kernel_code()
    assert "for i" in code and "tl.program_id" not in code, "serial loops, one program"


def test_memcpy_merged_split_grid_and_block(device: str) -> None:
    fd, tv1 = _memcpy()
    tv1.merge(0, 1)
    tv1.split(0, 256)
    tv1.axis(1).parallelize(ParallelType.block_x)
    tv1.axis(0).parallelize(ParallelType.grid_x)
    t0 = torch.randn(32, 33, device=device)
    assert fd.manual_execute([t0])[0].equal(t0)
    code = fd.last_kernel_code()
    assert "tl.program_id(0)" in code and "tl.arange(0, 256)" in code
    assert "iblockIdx.x" in str(tv1) and "ithreadIdx.x" in str(tv1)
    assert "manual_kernel" in fd.fusion.print_kernel()


def test_vectorized_and_unrolled_schedule(device: str) -> None:
    with FusionDefinition() as fd:
        a, b = fd.define_tensor([-1, -1], contiguity=True), fd.define_tensor([-1, -1], contiguity=True)
        out = fd.ops.add(fd.ops.exp(a), b)
        fd.add_output(out)
        out.merge(0, 1)
        out.split(0, 4)                # [X/4, 4]
        out.split(0, 2)                # [X/8, 2, 4]
        out.split(0, 32)               # [X/256, 32, 2, 4]
        out.axis(0).parallelize(ParallelType.grid_x)
        out.axis(1).parallelize(ParallelType.block_x)
        out.axis(2).parallelize(ParallelType.unroll)
        out.axis(3).parallelize(ParallelType.vectorize)
        fd.sched.transform_like(out)
        fd.sched.parallelize_like(out)
        fd.sched.inline_most()
    x, y = torch.randn(16, 20, device=device), torch.randn(16, 20, device=device)
    torch.testing.assert_close(fd.manual_execute([x, y])[0], torch.exp(x) + y)
    misaligned = torch.randn(16 * 20 + 1, device=device)[1:].view(16, 20)  # a 4-byte offset: never read out of bounds
    torch.testing.assert_close(fd.manual_execute([misaligned, y])[0], torch.exp(misaligned) + y)
    assert "ca_pos( 4 )" in fd.fusion.math_string()


def test_2d_block_schedule(device: str) -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=True)
        bias = fd.define_tensor([-1], contiguity=True)
        out = fd.ops.relu(fd.ops.add(x, bias))
        fd.add_output(out)
        out.split(1, 16)
        out.split(0, 4)                # [M/4, 4, N/16, 16]
        out.reorder({1: 2, 2: 1})      # [M/4, N/16, 4, 16]
        out.axis(0).parallelize(ParallelType.grid_y)
        out.axis(1).parallelize(ParallelType.grid_x)
        out.axis(2).parallelize(ParallelType.block_y)
        out.axis(3).parallelize(ParallelType.block_x)
    xx, bb = torch.randn(10, 37, device=device), torch.randn(37, device=device)
    torch.testing.assert_close(fd.manual_execute([xx, bb])[0], torch.relu(xx + bb))
    code = fd.last_kernel_code()
    assert "tl.program_id(1)" in code and "tl.arange(0, 4)[:, None]" in code and "tl.arange(0, 16)[None, :]" in code


def test_pointwise_auto_scheduler_through_the_schedule_module(device: str) -> None:
    inputs = [torch.randn(4, 4, device=device), torch.randn(4, 4, device=device)]
    with FusionDefinition() as fd:
        t0, t1 = fd.from_pytorch(inputs[0]), fd.from_pytorch(inputs[1])
        fd.add_output(fd.ops.exp(fd.ops.add(t0, t1)))
        assert schedule.find_compatible_schedulers(fd.fusion, inputs) == [SchedulerType.pointwise]
        ok, _ = schedule.can_schedule(fd.fusion, SchedulerType.pointwise, inputs)
        assert ok
        assert not schedule.can_schedule(fd.fusion, SchedulerType.transpose, inputs)[0]
        params = schedule.compute_heuristics(fd.fusion, SchedulerType.pointwise, inputs)
        params = dataclasses.replace(params, block=(128,))
        schedule.schedule(fd.fusion, SchedulerType.pointwise, params)
    assert "tile: 128" in str(params)
    out = fd.manual_execute(inputs, params)
    torch.testing.assert_close(out[0], torch.exp(inputs[0] + inputs[1]))
    assert "iblockIdx.x" in fd.fusion.math_string() and "ithreadIdx.x" in fd.fusion.math_string()


def test_transpose_scheduler_is_found_for_a_transpose(device: str) -> None:
    inputs = [torch.randn(8, 6, device=device), torch.randn(6, 8, device=device)]
    with FusionDefinition() as fd:
        a, b = fd.from_pytorch(inputs[0]), fd.from_pytorch(inputs[1])
        fd.add_output(fd.ops.add(fd.ops.permute(a, [1, 0]), b))
        assert schedule.find_compatible_schedulers(fd.fusion, inputs) == [SchedulerType.transpose]
        params = schedule.schedule(fd.fusion, SchedulerType.transpose, inputs)
    torch.testing.assert_close(fd.manual_execute(inputs, params)[0], inputs[0].t() + inputs[1])


@pytest.mark.parametrize("shape", [(2, 3, 9, 40), (6, 5, 2, 2), (2, 40, 5, 33)], ids=["image", "weight", "wide"])
def test_a_transpose_with_a_short_static_axis_is_a_pointwise_kernel(device: str, shape: tuple[int, ...]) -> None:
    """A permuted copy (NCHW to NHWC) of static sizes whose transposed axes are at least 32 long is the
    transpose scheduler's; with a shorter one (an image of 3 channels, a 2x2 convolution weight: a 64-wide tile would
    be mostly masked) the pointwise scheduler's 1-D kernel over the output. Values and strides as torch's."""
    x = torch.randn(*shape, device=device)
    with FusionDefinition() as fd:
        t = fd.define_tensor(list(shape), contiguity=True)
        fd.add_output(fd.ops.mul(fd.ops.permute(t, [0, 2, 3, 1]), 2.0), stride_order=[3, 2, 1, 0])
        expected = [SchedulerType.transpose] if min(shape[1], shape[3]) >= 32 else [SchedulerType.pointwise]
        assert schedule.find_compatible_schedulers(fd.fusion, [x]) == expected
    (out,) = fd.execute([x], _enable_options=["triton_interpreter"] if device == "cpu" else [])
    want = (x * 2).permute(0, 2, 3, 1).contiguous()
    torch.testing.assert_close(out, want)
    assert out.stride() == want.stride()


def test_caches_are_staging_values_of_the_kernel(device: str) -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=True)
        out = fd.ops.mul(fd.ops.sin(x), 3.0)
        fd.add_output(out)
        cache_in = x.cache_after()
        cache_out = out.cache_before()
        out.merge(0, 1)
        out.split(0, 64)
        out.axis(0).parallelize(ParallelType.grid_x)
        out.axis(1).parallelize(ParallelType.block_x)
        fd.sched.transform_like(out)
        fd.sched.parallelize_like(out)
        fd.sched.inline_most()
    assert "threadIdx.x" in str(cache_in) and "threadIdx.x" in str(cache_out)
    xx = torch.randn(9, 13, device=device)
    fd.manual_validate([xx], [torch.sin(xx) * 3.0])
    fd.manual_validate([xx])  # reference: the fusion evaluated by ATen


def test_manual_validate_reports_a_wrong_reference(device: str) -> None:
    fd, _ = _memcpy()
    t0 = torch.randn(3, 3, device=device)
    with pytest.raises(AssertionError, match="output 0"):
        fd.manual_validate([t0], [t0 + 1])


@pytest.mark.parametrize("block", [(2, 8), (1, 16), (4, 4)])
def test_pointwise_2d_schedule_of_a_row_broadcast(device: str, block: tuple[int, int]) -> None:
    """The pointwise scheduler's 2-D schedule (``break_point``), which its heuristics leave to manual
    parameters: outer x inner axes, a bias read along the inner tile, non-divisible extents masked."""
    inputs = [torch.randn(3, 5, 7, device=device), torch.randn(7, device=device)]
    with FusionDefinition() as fd:
        x, b = fd.from_pytorch(inputs[0]), fd.from_pytorch(inputs[1])
        fd.add_output(fd.ops.mul(fd.ops.add(x, fd.ops.broadcast(b, [True, True, False])), 2.0))
        params = schedule.compute_heuristics(fd.fusion, SchedulerType.pointwise, inputs)
        assert params.break_point == 0  # the heuristics' choice: 1-D, the bias read modulo its extent
        params = dataclasses.replace(params, break_point=2, block=block)
        schedule.schedule(fd.fusion, SchedulerType.pointwise, params)
    torch.testing.assert_close(fd.manual_execute(inputs, params)[0], (inputs[0] + inputs[1]) * 2)
    assert "tl.program_id(1)" in fd.last_kernel_code()
