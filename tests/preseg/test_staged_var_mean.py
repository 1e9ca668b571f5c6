"""``var_mean`` over axes a kernel cannot read in one well-shaped pass (batch-norm statistics over N, H, W of
NCHW or channels-last activations) runs in two stages, two kernels: H, W first (contiguous rows, or an outer
reduction with N*C columns), then N (one normalization kernel over the partials). Through generated kernels
(Triton's interpreter on CPU) against torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition
from pyfuser.scheduler import reduction
from pyfuser.scheduler.reduction_schedule import MIN_OUTER_TILE, WAVES
from pyfuser.scheduler.registry import Machine, SizeHints
from tests.codegen.conftest import execute_with_kernels

H200 = Machine(132, 16384, 2048)


def _stats(x: torch.Tensor, dims: list[int], correction: int = 0, cast: bool = True) -> FusionDefinition:
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        var, mean = fd.ops.var_mean(fd.ops.cast(t, DataType.Float) if cast else t, dims, correction=correction)
        fd.add_output(mean)
        fd.add_output(var)
    return fd


def _first_stage_dims(fd: FusionDefinition) -> list[str]:
    """The ``dims`` of every var_mean the kernels ran, in order."""
    ir = fd.last_scheduled_fusion_ir()
    return [line.split("dims = ")[1].split("}")[0] + "}" for line in ir.splitlines() if "var_mean(" in line]


def _kernels(fd: FusionDefinition) -> int:
    """The kernels the latest execute ran (one ``Inputs:`` block per scheduled segment)."""
    return sum(line == "Inputs:" for line in fd.last_scheduled_fusion_ir().splitlines())


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("shape", [(3, 5, 7, 9), (1, 4, 3, 5), (4, 1, 2, 3), (2, 3, 1, 1), (5, 2, 11, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_batchnorm_statistics_run_in_two_stages(layout: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """Mean and biased variance per channel, with large offsets (the stages must not lose the spread):
    the first kernel's var_mean reduces H and W only, a second kernel N (plain means of the partials)."""
    x = (torch.randn(*shape) * 3 + 100).to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    fd = _stats(x, [0, 2, 3])
    mean, var = execute_with_kernels(fd, [x])
    ref_var, ref_mean = torch.var_mean(x.double(), (0, 2, 3), correction=0)
    torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(var.double(), ref_var, rtol=1e-4, atol=1e-5)
    # Size-1 axes are no reduction; NCHW stages when a channel lies between N and H, W in memory,
    # channels-last whenever two axes are reduced (the channels are innermost: an outer reduction).
    real = [a for a in (0, 2, 3) if shape[a] > 1]
    staged = shape[1] > 1 and len(real) >= 2 and (layout == "channels_last" or 0 in real)
    first = "{" + ", ".join(str(a) for a in (0, 2, 3) if a != real[0]) + "}" if staged else ""
    expected = [first] if staged else ["{0, 2, 3}"]
    assert _first_stage_dims(fd) == expected, fd.last_scheduled_fusion_ir()
    assert _kernels(fd) == (2 if staged else 1), fd.last_scheduled_fusion_ir()


def test_batchnorm_forward_through_the_stages_matches_torch() -> None:
    """The statistics read back over N, H, W (keepdim, a normalization after them), on a permuted view."""
    x = torch.randn(3, 13, 6, 4, 5).permute(0, 1, 4, 2, 3)[:, :, 1]  # [3, 13, 6, 4], not contiguous
    w, b = torch.randn(13), torch.randn(13)
    with FusionDefinition() as fd:
        tx, tw, tb = fd.from_pytorch(x), fd.from_pytorch(w), fd.from_pytorch(b)
        var, mean = fd.ops.var_mean(tx, [0, 2, 3], correction=0, keepdim=True)
        y = fd.ops.mul(fd.ops.sub(tx, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
        flags = [True, False, True, True]
        fd.add_output(fd.ops.add(fd.ops.mul(y, fd.ops.broadcast(tw, flags)), fd.ops.broadcast(tb, flags)))
    (out,) = execute_with_kernels(fd, [x, w, b])
    torch.testing.assert_close(out, F.batch_norm(x, None, None, w, b, training=True, eps=1e-5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("shape", "dims", "correction", "cast", "staged"), [
    ((4, 6, 8), [0, 1], 0, True, True),  # [B, T, D] over B and T: an outer reduction
    ((4, 6, 8), [1, 2], 0, True, False),  # a layer norm over the last two axes: whole rows
    ((4, 6, 8), [2], 0, True, False),  # one axis
    ((3, 5, 7, 9), [0, 2, 3], 1, True, False),  # unbiased: the stages combine biased variances
    ((3, 5, 7, 9), [0, 2, 3], 0, False, False),  # bf16 data: each stage would round
    ((3, 5), [0, 1], 0, True, False),  # every axis
])
def test_only_var_means_a_kernel_reads_badly_are_staged(shape: tuple[int, ...], dims: list[int], correction: int,
                                                      cast: bool, staged: bool) -> None:
    x = torch.randn(*shape).to(torch.float32 if cast else torch.bfloat16)
    fd = _stats(x, dims, correction, cast=cast)
    mean, var = execute_with_kernels(fd, [x])
    ref_var, ref_mean = torch.var_mean(x.float(), dims, correction=correction)
    tol = {} if cast else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(mean.float(), ref_mean, **tol)
    torch.testing.assert_close(var.float(), ref_var, **tol)
    assert _kernels(fd) == (2 if staged else 1), fd.last_scheduled_fusion_ir()


def _outer_var_mean() -> FusionDefinition:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        var, mean = fd.ops.var_mean(fd.ops.cast(x, DataType.Float), [0], correction=0)
        fd.add_output(mean)
        fd.add_output(var)
    return fd


@pytest.mark.parametrize("kept", [8192, 1000, 256, 33, 1])
def test_outer_var_mean_narrows_its_column_blocks_for_programs(kept: int) -> None:
    """var_mean is not split across programs, so an outer one takes its programs from the kept axis:
    the first stage of channels-last batch-norm statistics on an H200 (N*C = 32*256 columns of 56*56
    rows) gets at least two programs per SM, not 64 column blocks of 128."""
    params = reduction.compute_heuristics(_outer_var_mean().fusion, SizeHints(3136, kept, H200))
    assert params.split == 1
    programs = -(-kept // params.tile)
    assert programs >= WAVES * H200.sm_count or params.tile <= MIN_OUTER_TILE, params
    assert params.tile >= min(MIN_OUTER_TILE, kept), params
    x = torch.randn(37, max(kept // 64, 1)).to(torch.bfloat16)  # the schedule on odd sizes, through the kernels
    fd = FusionDefinition()
    with fd:
        t = fd.from_pytorch(x)
        var, mean = fd.ops.var_mean(fd.ops.cast(t, DataType.Float), [0], correction=0)
        fd.add_output(mean)
        fd.add_output(var)
    mean_out, var_out = execute_with_kernels(fd, [x])
    ref_var, ref_mean = torch.var_mean(x.float(), 0, correction=0)
    torch.testing.assert_close(mean_out, ref_mean)
    torch.testing.assert_close(var_out, ref_var)


@pytest.mark.parametrize("kernels", [False, True])
def test_a_var_mean_of_a_staged_var_mean(kernels: bool) -> None:
    """The stages' outputs replace the first var_mean's in its consumers: a second var_mean reading it
    is judged on the new tensor's memory order (a KeyError while compiling, CPU fuzz seed 2000530)."""
    x = torch.randn(5, 3, 7)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        per_channel = fd.ops.var(t, [0, 2], 0, keepdim=False)
        var, mean = fd.ops.var_mean(per_channel, [0], 1, keepdim=False)
        fd.add_output(var)
        fd.add_output(mean)
    var, mean = execute_with_kernels(fd, [x]) if kernels else fd.execute([x])
    want_var, want_mean = torch.var_mean(torch.var(x, [0, 2], correction=0), [0], correction=1)
    torch.testing.assert_close(var, want_var)
    torch.testing.assert_close(mean, want_mean)
