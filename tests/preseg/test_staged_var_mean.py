"""``var_mean`` over reduced axes a kept axis separates in memory (batch-norm statistics over N, H, W of NCHW
activations) runs in two stages, two kernels: H, W first (contiguous rows), then N (one normalization kernel
over the partials). Channels-last statistics are one outer reduction, split across programs, unless a
normalization reads them back (batch-norm's forward: staged). Through generated kernels (Triton's
interpreter on CPU) against torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition
from pyfuser.preseg import staged_var_mean
from pyfuser.preseg.staged_var_mean import stage_outer_var_means
from pyfuser.scheduler import reduction
from pyfuser.scheduler.reduction_schedule import OuterHeuristic
from pyfuser.scheduler.registry import Machine, SizeHints
from tests.codegen.conftest import execute_with_kernels
from tests.codegen.test_var_mean_split import _var_mean

H200 = Machine(132, 16384, 2048)


@pytest.fixture
def staged_at_any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stage var_means of any size (no channel fits ``ONE_STAGE_ELEMENTS``): the stages on small tensors."""
    monkeypatch.setattr(staged_var_mean, "ONE_STAGE_ELEMENTS", 0)


def _batchnorm_forward(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> FusionDefinition:
    """Training batch norm over N, H, W of a 4-D input: statistics read back by the normalization."""
    with FusionDefinition() as fd:
        tx, tw, tb = fd.from_pytorch(x), fd.from_pytorch(w), fd.from_pytorch(b)
        var, mean = fd.ops.var_mean(tx, [0, 2, 3], correction=0, keepdim=True)
        y = fd.ops.mul(fd.ops.sub(tx, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
        flags = [True, False, True, True]
        fd.add_output(fd.ops.add(fd.ops.mul(y, fd.ops.broadcast(tw, flags)), fd.ops.broadcast(tb, flags)))
    return fd


def _first_stage_dims(fd: FusionDefinition) -> list[str]:
    """The ``dims`` of every var_mean the kernels ran, in order."""
    ir = fd.last_scheduled_fusion_ir()
    return [line.split("dims = ")[1].split("}")[0] + "}" for line in ir.splitlines() if "var_mean(" in line]


def _kernels(fd: FusionDefinition) -> int:
    """The kernels the latest execute ran (one ``Inputs:`` block per scheduled segment)."""
    return sum(line == "Inputs:" for line in fd.last_scheduled_fusion_ir().splitlines())


@pytest.mark.usefixtures("staged_at_any_size")
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("shape", [(3, 5, 7, 9), (1, 4, 3, 5), (4, 1, 2, 3), (2, 3, 1, 1), (5, 2, 11, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_batchnorm_statistics_run_in_two_stages(layout: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """Mean and biased variance per channel, with large offsets (the stages must not lose the spread):
    for NCHW the first kernel's var_mean reduces H and W only, a second kernel N (plain means of the
    partials); channels-last is one var_mean (an outer reduction)."""
    x = (torch.randn(*shape) * 3 + 100).to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    fd = _var_mean(x, [0, 2, 3])
    mean, var = execute_with_kernels(fd, [x])
    ref_var, ref_mean = torch.var_mean(x.double(), (0, 2, 3), correction=0)
    torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(var.double(), ref_var, rtol=1e-4, atol=1e-5)
    # Size-1 axes are no reduction; NCHW stages when a channel lies between N and H, W in memory.
    real = [a for a in (0, 2, 3) if shape[a] > 1]
    staged = shape[1] > 1 and len(real) >= 2 and layout == "nchw" and 0 in real
    first = "{" + ", ".join(str(a) for a in (0, 2, 3) if a != real[0]) + "}" if staged else ""
    expected = [first] if staged else ["{0, 2, 3}"]
    assert _first_stage_dims(fd) == expected, fd.last_scheduled_fusion_ir()
    assert _kernels(fd) == (2 if staged else 1), fd.last_scheduled_fusion_ir()


@pytest.mark.usefixtures("staged_at_any_size")
def test_batchnorm_forward_through_the_stages_matches_torch() -> None:
    """The statistics read back over N, H, W (keepdim, a normalization after them), on a permuted view."""
    x = torch.randn(3, 13, 6, 4, 5).permute(0, 1, 4, 2, 3)[:, :, 1]  # [3, 13, 6, 4], not contiguous
    w, b = torch.randn(13), torch.randn(13)
    fd = _batchnorm_forward(x, w, b)
    (out,) = execute_with_kernels(fd, [x, w, b])
    torch.testing.assert_close(out, F.batch_norm(x, None, None, w, b, training=True, eps=1e-5), rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("staged_at_any_size")
@pytest.mark.parametrize(("shape", "dims", "correction", "cast", "staged"), [
    ((4, 6, 8), [0, 1], 0, True, False),  # [B, T, D] over B and T: an outer reduction, split instead
    ((4, 6, 8), [0, 2], 0, True, True),  # T between the reduced axes in memory
    ((4, 6, 8), [1, 2], 0, True, False),  # a layer norm over the last two axes: whole rows
    ((4, 6, 8), [2], 0, True, False),  # one axis
    ((3, 5, 7, 9), [0, 2, 3], 1, True, False),  # unbiased: the stages combine biased variances
    ((3, 5, 7, 9), [0, 2, 3], 0, False, False),  # bf16 data: each stage would round
    ((3, 5), [0, 1], 0, True, False),  # every axis
])
def test_only_var_means_a_kernel_reads_badly_are_staged(shape: tuple[int, ...], dims: list[int], correction: int,
                                                      cast: bool, staged: bool) -> None:
    x = torch.randn(*shape).to(torch.float32 if cast else torch.bfloat16)
    fd = _var_mean(x, dims, correction, cast=cast)
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


@pytest.mark.parametrize(("rows", "kept"), [(100352, 256), (100352, 64), (3136, 8192), (401408, 2048),
                                            (3267, 127), (65536, 1)])
def test_outer_var_mean_splits_across_programs(rows: int, kept: int) -> None:
    """An outer var_mean (channels-last batch-norm statistics: N*H*W rows of C channels on an H200) keeps
    column blocks of ``welford_column_bytes`` and splits its rows across programs where the channels give
    too few programs (Welford's partial results, combined by a second launch), into ``welford_waves``
    programs per SM of ``welford_elements`` per thread; fewer elements than ``small_welford_elements`` in
    shorter steps, one a program allowed."""
    h = OuterHeuristic()
    params = reduction.compute_heuristics(_outer_var_mean().fusion, SizeHints(rows, kept, H200))
    widest = h.welford_column_bytes // 2  # bfloat16 elements
    assert params.shape == "outer" and params.tile == min(widest, 1 << (kept - 1).bit_length()), params
    small = rows * kept < h.small_welford_elements  # shorter steps, one a program allowed
    assert params.tile * params.tile_reduced <= (h.small_welford_step_elements if small else h.welford_step_elements)
    assert params.num_warps * 32 * h.welford_elements in (params.tile * params.tile_reduced, 256 * h.welford_elements)
    programs = -(-kept // params.tile)
    target = h.welford_waves * H200.sm_count
    if programs >= target:
        assert params.split == 1, params
    else:
        # at most ``target`` programs in all, the loop steps divided evenly (none left without steps)
        steps = -(-rows // params.tile_reduced)
        most = max(1, min(target // programs, rows // ((1 if small else h.min_steps) * params.tile_reduced)))
        assert params.split == -(-steps // -(-steps // most)), params
        assert programs * params.split <= target, params
        # a split wherever two programs a column block fit the target and the rows have steps for them
        assert params.split >= 2 or 2 * programs > target or rows < 8 * params.tile_reduced, params


def test_channels_last_batchnorm_forward_is_staged() -> None:
    """A normalization reading channels-last statistics back is not split across programs: its var_mean
    is staged (H, W first: N*C columns), then the partials' kernel, then the normalization."""
    x = (torch.randn(3, 7, 5, 4) * 2 + 30).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(7), torch.randn(7)
    fd = _batchnorm_forward(x, w, b)
    (out,) = execute_with_kernels(fd, [x, w, b])
    torch.testing.assert_close(out, F.batch_norm(x, None, None, w, b, training=True, eps=1e-5), rtol=1e-5, atol=1e-5)
    assert _first_stage_dims(fd) == ["{2, 3}"] and _kernels(fd) == 3, fd.last_scheduled_fusion_ir()


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(3, 5, 7, 9), (1, 4, 3, 5), (6, 3, 1, 1)], ids=["odd", "N=1", "H=W=1"])
def test_channels_last_statistics_staged_on_request(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """``stage_outer_var_means`` (a ``--sweep`` variant): channels-last statistics in two stages (H, W
    first, then N), not one var_mean split across programs; both match torch."""
    x = (torch.randn(*shape) * 3 + 20).to(dtype).contiguous(memory_format=torch.channels_last)
    counts = []
    for staged in (False, True):
        fd = _var_mean(x, [0, 2, 3])
        with stage_outer_var_means(staged):
            mean, var = execute_with_kernels(fd, [x])
        ref_var, ref_mean = torch.var_mean(x.double(), [0, 2, 3], correction=0)
        torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(var.double(), ref_var, rtol=1e-5, atol=1e-4)
        counts.append(_kernels(fd))
    several = sum(shape[d] > 1 for d in (0, 2, 3)) >= 2  # one reduced axis of size > 1: nothing to stage
    assert counts == ([1, 2] if several else [1, 1]), counts

@pytest.mark.parametrize(("shape", "staged"), [
    ((4, 6, 7, 7), False),  # 196 elements a channel: one tile, one stage
    ((2, 3, 64, 64), False),  # 8192: the most one stage takes
    ((3, 2, 65, 43), True),  # 8385: staged
])
def test_static_statistics_that_fit_a_tile_keep_one_stage(shape: tuple[int, ...], staged: bool) -> None:
    """NCHW statistics declared with static sizes (as torch.compile's graphs give them): a channel's
    elements up to ``ONE_STAGE_ELEMENTS`` are one var_mean in one kernel (a tile of every pixel of every
    image), more are staged. The same fusion with symbolic sizes decides the same for each call's sizes."""
    x = torch.randn(*shape) * 3 + 100
    for static in (True, False):
        with FusionDefinition() as fd:
            tx = fd.define_tensor(list(shape) if static else [-1] * 4, contiguity=[True] * 4, dtype=DataType.Float)
            var, mean = fd.ops.var_mean(tx, [0, 2, 3], correction=0)
            fd.add_output(mean)
            fd.add_output(var)
        mean_, var_ = execute_with_kernels(fd, [x])
        ref_var, ref_mean = torch.var_mean(x.double(), (0, 2, 3), correction=0)
        torch.testing.assert_close(mean_.double(), ref_mean, rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(var_.double(), ref_var, rtol=1e-4, atol=1e-5)
        assert _kernels(fd) == (2 if staged else 1), fd.last_scheduled_fusion_ir()


def test_symbolic_statistics_take_one_stage_for_the_calls_whose_channels_fit_a_tile() -> None:
    """One definition of symbolic sizes: a call whose channels fit one tile runs one kernel, one past it
    two (staged); the program is keyed on that size class only, so another size of the same class reuses
    its program and a new class compiles once."""
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1] * 4, contiguity=[True] * 4, dtype=DataType.Float)
        var, mean = fd.ops.var_mean(tx, [0, 2, 3], correction=0)
        fd.add_output(mean)
        fd.add_output(var)
    runs = [((4, 6, 7, 7), 1, 1), ((3, 2, 65, 43), 2, 2), ((2, 5, 9, 9), 1, 2), ((2, 2, 80, 80), 2, 2)]
    for shape, kernels, compiled in runs:
        x = torch.randn(*shape) * 3 + 100
        mean_, var_ = execute_with_kernels(fd, [x])
        ref_var, ref_mean = torch.var_mean(x.double(), (0, 2, 3), correction=0)
        torch.testing.assert_close(mean_.double(), ref_mean, rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(var_.double(), ref_var, rtol=1e-4, atol=1e-5)
        assert _kernels(fd) == kernels, (shape, fd.last_scheduled_fusion_ir())
        assert fd.fec.compile_count == compiled, shape
