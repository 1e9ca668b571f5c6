"""Slice, pad and cat inside reduction and normalization kernels: a resize reads its operand at shifted
indices, which a reduction kernel computes again where the operand is a reduced value read along the
axes every reduction reduced (its loads again, the row's statistics it holds). Per-head norms followed
by rotary embedding (Qwen3, Gemma3) are one kernel; a shift along a kept axis (another program's row), a
resize of values no reduction computes, one of a reshape of a reduced value and one beside two sets of
reductions stay kernels of their own, each still equal to torch. fp32 and bf16 (against float64 beside
torch's own error where bf16 cancels), symbolic sizes, head dims that fill the tile and ones that do not.
A property: random row or column normalizations read back shifted along the reduced axis (rotate-half,
roll) match the ATen evaluator. The training step of such an attention input:
``test_torch_compile_generated_kernels.py``."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyfuser import DataType, FusionDefinition
from pyfuser.ir.tensor_view import TensorView
from pyfuser.scheduler.reduction_analysis import analyze
from tests.codegen.conftest import execute_with_aten, execute_with_kernels, kernel_schedulers


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


def _dtype(dtype: torch.dtype) -> DataType:
    return DataType.BFloat16 if dtype == torch.bfloat16 else DataType.Float


def _softmax(fd: FusionDefinition, x: TensorView, dim: int) -> TensorView:
    shifted = fd.ops.exp(fd.ops.sub(x, fd.ops.max(x, [dim], keepdim=True)))
    return fd.ops.div(shifted, fd.ops.sum(shifted, [dim], keepdim=True))


def _norm_rotary(dtype: torch.dtype) -> FusionDefinition:
    """Qwen3's attention input: RMS norm of each head of a projection ``[b, s, h, d]`` (fp32 math), the
    heads moved before the sequence, then ``x * cos + rotate_half(x) * sin``."""
    with FusionDefinition() as fd:
        q = fd.define_tensor([-1, -1, -1, -1], contiguity=True, dtype=_dtype(dtype))
        w = fd.define_tensor([-1], contiguity=True, dtype=_dtype(dtype))
        cos = fd.define_tensor([-1, -1, -1], contiguity=True, dtype=_dtype(dtype))
        sin = fd.define_tensor([-1, -1, -1], contiguity=True, dtype=_dtype(dtype))
        qf = fd.ops.cast(q, DataType.Float)
        mean_square = fd.ops.mean(fd.ops.mul(qf, qf), [3], keepdim=True)
        normed = fd.ops.mul(qf, fd.ops.rsqrt(fd.ops.add(mean_square, 1e-6)))
        normed = fd.ops.mul(fd.ops.broadcast(fd.ops.cast(w, DataType.Float), [True, True, True, False]), normed)
        x = fd.ops.permute(fd.ops.cast(normed, _dtype(dtype)), [0, 2, 1, 3])
        b, h, s, d = (fd.ops.size(x, k) for k in range(4))
        half = fd.ops.div(d, 2)
        upper = fd.ops.slice(x, [0, 0, 0, half], [b, h, s, d])
        lower = fd.ops.slice(x, [0, 0, 0, 0], [b, h, s, half])
        rotated = fd.ops.cat([fd.ops.neg(upper), lower], 3)
        cb, sb = (fd.ops.broadcast(t, [False, True, False, False]) for t in (cos, sin))
        fd.add_output(fd.ops.add(fd.ops.mul(x, cb), fd.ops.mul(rotated, sb)))
    return fd


def _torch_norm_rotary(q: torch.Tensor, w: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    qf = q.float()
    normed = w.float() * (qf * torch.rsqrt(qf.pow(2).mean(-1, keepdim=True) + 1e-6))
    x = normed.to(q.dtype).transpose(1, 2)
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("head_dim", [16, 80], ids=["d16", "d80"])
def test_per_head_norm_then_rotary_is_one_kernel(device: str, run_kernels, dtype: torch.dtype,
                                                 head_dim: int) -> None:
    """The rotated half re-reads the projection at the shifted column and scales it by the row's
    statistics, which the kernel holds (80: a tile of 128 columns, partly masked)."""
    fd = _norm_rotary(dtype)
    for batch, seq in ((2, 5), (3, 7)):
        q = torch.randn(batch, seq, 4, head_dim, device=device, dtype=dtype)
        w = torch.randn(head_dim, device=device, dtype=dtype)
        cos, sin = (torch.randn(batch, seq, head_dim, device=device, dtype=dtype) for _ in range(2))
        (out,) = run_kernels(fd, [q, w, cos, sin])
        assert kernel_schedulers(fd) == ["inner_persistent"]
        want = _torch_norm_rotary(q, w, cos, sin)
        if dtype == torch.float32:
            torch.testing.assert_close(out, want)
            continue
        # bf16: the sum of two rounded products cancels near zero, where a different rounding of the
        # normalized value (another rsqrt on the GPU) moves the result by an ulp of the products; so
        # against float64, no further off than torch's own bf16 result
        truth = _torch_norm_rotary(*(t.double() for t in (q, w, cos, sin)))
        ours, torchs = ((r.double() - truth).abs().max().item() for r in (out, want))
        assert ours <= 2 * torchs + 1e-3, (ours, torchs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_softmax_plus_its_rotated_row_is_one_kernel(device: str, run_kernels, dtype: torch.dtype) -> None:
    """``s + cat(s[:, 1:], s[:, :1])`` of a softmax: the shifted read recomputes the exponential at the
    other column from the row's max and sum."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=True, dtype=_dtype(dtype))
        s = _softmax(fd, fd.ops.cast(x, DataType.Float), 1)
        rows, cols = fd.ops.size(s, 0), fd.ops.size(s, 1)
        rolled = fd.ops.cat([fd.ops.slice(s, [0, 1], [rows, cols]), fd.ops.slice(s, [0, 0], [rows, 1])], 1)
        fd.add_output(fd.ops.cast(fd.ops.add(s, rolled), _dtype(dtype)))
    for shape in ((6, 37), (1, 64)):
        x = torch.randn(shape, device=device, dtype=dtype)
        (out,) = run_kernels(fd, [x])
        s = torch.softmax(x.float(), 1)
        torch.testing.assert_close(out, (s + torch.roll(s, -1, 1)).to(dtype))
        assert kernel_schedulers(fd) == ["inner_persistent"]


@pytest.mark.parametrize("dim", [0, 1], ids=["kept", "reduced"])
def test_a_cat_before_a_sum_is_a_pointwise_kernels(device: str, run_kernels, dim: int) -> None:
    """A cat of inputs feeding the reduction: the reduction's schedule replays its tiling onto the cat's
    operands, which the cat does not map; the cat is written by a pointwise kernel first."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], contiguity=True)
        b = fd.define_tensor([-1, -1], contiguity=True)
        fd.add_output(fd.ops.sum(fd.ops.cat([a, fd.ops.mul(b, 2.0)], dim), [1]))
    assert "which no reduction of the segment computes" in analyze(fd.fusion)[1]
    a = torch.randn(9, 20, device=device)
    b = torch.randn(4, 20, device=device) if dim == 0 else torch.randn(9, 13, device=device)
    (out,) = run_kernels(fd, [a, b])
    torch.testing.assert_close(out, torch.cat([a, b * 2], dim).sum(1))
    assert kernel_schedulers(fd) == ["pointwise", "reduction"]


def test_a_reduced_value_shifted_along_a_kept_axis_is_another_kernels(device: str, run_kernels) -> None:
    """``s + roll(s, -1, 0)`` of a softmax over rows: no program of the normalization holds the next row's
    statistics, so the shifted rows are read from memory in a kernel of their own."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=True)
        s = _softmax(fd, x, 1)
        rows, cols = fd.ops.size(s, 0), fd.ops.size(s, 1)
        rolled = fd.ops.cat([fd.ops.slice(s, [1, 0], [rows, cols]), fd.ops.slice(s, [0, 0], [1, cols])], 0)
        fd.add_output(fd.ops.add(s, rolled))
    reason = analyze(fd.fusion)[1]
    assert "shifted along its axis 0, which the reductions keep" in reason, reason
    x = torch.randn(7, 33, device=device)
    (out,) = run_kernels(fd, [x])
    s = torch.softmax(x, 1)
    torch.testing.assert_close(out, s + torch.roll(s, -1, 0))
    assert sorted(kernel_schedulers(fd)) == ["inner_persistent", "pointwise"]


def test_a_column_sum_shifted_along_the_rows_axis_is_another_kernels(device: str, run_kernels) -> None:
    """Per row and across rows (layer-norm backward's shape): the across-rows sum keeps the columns, so
    a neighbour column's value is not this program's; the per-row sum alone would allow the shift."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=True)
        row = fd.ops.sum(x, [1], keepdim=True)
        column = fd.ops.sum(x, [0], keepdim=True)
        cols = fd.ops.size(x, 1)
        shifted = fd.ops.cat([fd.ops.slice(column, [0, 1], [1, cols]), fd.ops.slice(column, [0, 0], [1, 1])], 1)
        fd.add_output(fd.ops.add(fd.ops.mul(x, row), shifted))
    assert "which the reductions keep" in analyze(fd.fusion)[1]
    x = torch.randn(6, 10, device=device)
    (out,) = run_kernels(fd, [x])
    torch.testing.assert_close(out, x * x.sum(1, keepdim=True) + torch.roll(x.sum(0, keepdim=True), -1, 1))


@pytest.mark.parametrize("widths", [[0, 0, 0, 1, 0, 2], [0, 0, 0, 0, 0, 0]], ids=["padded", "zero-width"])
def test_a_pad_of_a_reshaped_normalization_is_another_kernels(device: str, run_kernels, widths: list[int]) -> None:
    """Swin's window padding: a layer norm over the channels of ``[B, H * W, C]``, viewed as ``[B, H, W, C]``
    and padded along H and W (by nothing where the windows divide the image): the pad reads the reduced
    value through the view at indices that are not the loop nest's, so it is a kernel of its own."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([2, 12, 8], contiguity=True)
        mean = fd.ops.mean(x, [2], keepdim=True)
        centered = fd.ops.sub(x, mean)
        normed = fd.ops.div(centered, fd.ops.sqrt(fd.ops.add(fd.ops.mean(fd.ops.mul(centered, centered), [2],
                                                                          keepdim=True), 1e-5)))
        fd.add_output(fd.ops.mul(fd.ops.pad(fd.ops.reshape(normed, [2, 3, 4, 8]), widths), 2.0))
    analysis, reason = analyze(fd.fusion)
    assert analysis is None and reason, reason
    x = torch.randn(2, 12, 8, device=device)
    (out,) = run_kernels(fd, [x])
    want = torch.nn.functional.pad(torch.nn.functional.layer_norm(x, (8,)).view(2, 3, 4, 8), widths) * 2
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("rows", [37, 300], ids=["rows37", "rows300"])
def test_a_column_normalization_plus_its_rolled_rows_is_one_kernel(device: str, run_kernels, rows: int) -> None:
    """An outer normalization (over the rows, per column) read back at the next row: the shift is along the
    axis the reduction reduced, so the column's sum is the program's own."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=True)
        s = fd.ops.div(x, fd.ops.sum(x, [0], keepdim=True))
        n, cols = fd.ops.size(s, 0), fd.ops.size(s, 1)
        rolled = fd.ops.cat([fd.ops.slice(s, [1, 0], [n, cols]), fd.ops.slice(s, [0, 0], [1, cols])], 0)
        fd.add_output(fd.ops.add(s, rolled))
    x = torch.rand(rows, 6, device=device) + 1
    (out,) = run_kernels(fd, [x])
    s = x / x.sum(0, keepdim=True)
    torch.testing.assert_close(out, s + torch.roll(s, -1, 0))
    assert len(kernel_schedulers(fd)) == 1, kernel_schedulers(fd)


@dataclass
class ShiftedNormalization:
    rows: int
    cols: int
    inner: bool  # normalized over the inner (contiguous) axis, else over the outer one
    norm: str
    shift: str  # how the normalized rows are read back shifted along the reduced axis
    amount: int
    dtype: torch.dtype


@st.composite
def shifted_normalizations(draw: st.DrawFn) -> ShiftedNormalization:
    cols = draw(st.one_of(st.integers(1, 20).map(lambda n: 2 * n), st.just(130)))
    return ShiftedNormalization(draw(st.integers(1, 7)), cols, draw(st.booleans()),
                                draw(st.sampled_from(["softmax", "rms", "center"])),
                                draw(st.sampled_from(["rotate_half", "roll"])), draw(st.integers(1, cols - 1)),
                                draw(st.sampled_from([torch.float32, torch.bfloat16])))


def _normalized(fd: FusionDefinition, x: TensorView, p: ShiftedNormalization, axis: int) -> TensorView:
    xf = fd.ops.cast(x, DataType.Float)
    if p.norm == "softmax":
        return _softmax(fd, xf, axis)
    if p.norm == "rms":
        return fd.ops.mul(xf, fd.ops.rsqrt(fd.ops.add(fd.ops.mean(fd.ops.mul(xf, xf), [axis], keepdim=True), 1e-6)))
    return fd.ops.sub(xf, fd.ops.mean(xf, [axis], keepdim=True))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shifted_normalizations())
def test_normalizations_read_back_shifted_match_the_oracle(p: ShiftedNormalization) -> None:
    """A row (or column) normalization plus the same values read at a shift along the reduced axis is one
    kernel, equal to the ATen evaluator, over sizes that fill the tile or not."""
    axis = 1 if p.inner else 0
    shape = [p.rows, p.cols] if p.inner else [p.cols, p.rows]
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=True, dtype=_dtype(p.dtype))
        n = _normalized(fd, x, p, axis)
        sizes = [fd.ops.size(n, 0), fd.ops.size(n, 1)]

        def part(start: int, stop: int) -> TensorView:
            starts, stops = [0, 0], list(sizes)
            starts[axis], stops[axis] = start, stop
            return fd.ops.slice(n, starts, stops)

        split = p.cols // 2 if p.shift == "rotate_half" else p.amount
        first, second = part(split, p.cols), part(0, split)
        shifted = fd.ops.cat([fd.ops.neg(first) if p.shift == "rotate_half" else first, second], axis)
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.mul(n, 0.5), shifted), _dtype(p.dtype)))
    x = torch.randn(shape, dtype=p.dtype)
    (got,) = execute_with_kernels(fd, [x])
    (want,) = execute_with_aten(fd, [x])
    torch.testing.assert_close(got, want, **({"atol": 2e-2, "rtol": 2e-2} if p.dtype == torch.bfloat16 else {}))
    assert len(kernel_schedulers(fd)) <= 1, kernel_schedulers(fd)  # (a launch sequence for a split column)


def test_a_pad_beside_sums_per_row_and_across_rows_is_another_kernels(device: str, run_kernels) -> None:
    """A pad of the per-row sum's broadcast axis next to a sum across rows (an inner-outer segment's shape):
    that scheduler keeps no resize, so the pad is written by a kernel of its own."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([6, 10], contiguity=True)
        row = fd.ops.sum(x, [1], keepdim=True)
        column = fd.ops.sum(x, [0], keepdim=True)
        fd.add_output(fd.ops.add(fd.ops.mul(x, column), fd.ops.pad(row, [0, 9])))
    assert "not generated by the inner-outer persistent scheduler" in analyze(fd.fusion)[1], analyze(fd.fusion)[1]
    x = torch.randn(6, 10, device=device)
    (out,) = run_kernels(fd, [x])
    torch.testing.assert_close(out, x * x.sum(0, keepdim=True) + torch.nn.functional.pad(x.sum(1, keepdim=True), [0, 9]))


@pytest.mark.parametrize(("shape", "stop"), [
    ((2, 8, 3, 3), (2, 8, 1, 1)),  # one pixel of each image: the slice iterates N alone
    ((3, 5, 4, 3), (3, 5, 4, 1)),  # a column of pixels: N and H, not W
    ((2, 8, 3, 3), (1, 8, 3, 3)),  # the first image: H and W, not N
])
def test_nchw_statistics_read_back_at_one_pixel_are_one_kernel(device: str, run_kernels, shape: tuple[int, ...],
                                                               stop: tuple[int, ...]) -> None:
    """Batch-norm statistics of NCHW data in one stage (an unbiased var_mean: never staged) tile each
    channel's N * H * W elements; the normalized values sliced along some of those axes are recomputed at
    the slice's own positions. The broadcast statistics merged under the row tile's ``(N, (H, W))`` map to
    that merge, not to N alone, so a slice iterating N (and not H, W) gets a loop of its own instead of
    the tile's parallel type (which failed the code generator)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(list(shape), contiguity=True)
        var, mean = fd.ops.var_mean(x, [0, 2, 3], correction=1)
        normed = fd.ops.mul(fd.ops.sub(x, fd.ops.broadcast(mean, [True, False, True, True])),
                            fd.ops.rsqrt(fd.ops.add(fd.ops.broadcast(var, [True, False, True, True]), 1e-5)))
        fd.add_output(normed)
        fd.add_output(fd.ops.slice(normed, [0, 0, 0, 0], list(stop)))
    x = torch.randn(shape, device=device)
    normed, part = run_kernels(fd, [x])
    var, mean = torch.var_mean(x, (0, 2, 3), keepdim=True, correction=1)
    want = (x - mean) * torch.rsqrt(var + 1e-5)
    torch.testing.assert_close(normed, want)
    torch.testing.assert_close(part, want[tuple(slice(0, s) for s in stop)])
    assert len(kernel_schedulers(fd)) == 1, kernel_schedulers(fd)


@pytest.mark.parametrize("shape", [(2, 8, 2, 2), (3, 6, 2, 3), (1, 4, 1, 2)], ids=str)
def test_batch_norm_then_an_unrolled_squeeze_excite_mean(device: str, run_kernels, shape: tuple[int, ...]) -> None:
    """EfficientNet's training step at its smallest feature maps: a batch norm (running statistics updated),
    SiLU, then the squeeze-excite mean over H and W of at most ``UNROLL_LIMIT`` pixels, which preseg unrolls
    into slices of one pixel each: generated kernels equal to torch."""
    c = shape[1]
    with FusionDefinition() as fd:
        x = fd.define_tensor(list(shape), contiguity=True)
        running = fd.define_tensor([c], contiguity=True)
        var, mean = fd.ops.var_mean(x, [0, 2, 3], correction=0)
        fd.add_output(fd.ops.add(fd.ops.mul(mean, 0.9), fd.ops.mul(running, 0.1)))
        normed = fd.ops.mul(fd.ops.sub(x, fd.ops.broadcast(mean, [True, False, True, True])),
                            fd.ops.rsqrt(fd.ops.add(fd.ops.broadcast(var, [True, False, True, True]), 1e-3)))
        act = fd.ops.silu(normed)
        fd.add_output(act)
        fd.add_output(fd.ops.broadcast(fd.ops.mean(act, [2, 3]), [False, False, True, True]))
    x, running = torch.randn(shape, device=device), torch.randn(c, device=device)
    new_running, act, squeezed = run_kernels(fd, [x, running])
    var, mean = torch.var_mean(x, (0, 2, 3), keepdim=True, correction=0)
    want = torch.nn.functional.silu((x - mean) * torch.rsqrt(var + 1e-3))
    torch.testing.assert_close(new_running, mean.flatten() * 0.9 + running * 0.1)
    torch.testing.assert_close(act, want)
    torch.testing.assert_close(squeezed, want.mean((2, 3), keepdim=True))
