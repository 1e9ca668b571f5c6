"""Slice, pad and cat inside generated kernels: a consumer's indices shifted into each producer, reads
masked to the producer's part, against torch on shapes with symbolic sizes, steps, negative pads,
other dtypes and empty parts; the rotary embedding forward and backward as one kernel each."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pyfuser import DataType, FusionDefinition
from tests.codegen.conftest import execute_with_aten, execute_with_kernels, kernel_schedulers, kernel_segments


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


def test_rotary_embedding_is_one_kernel(device: str, run_kernels) -> None:
    """``x * cos + cat(-x2, x1) * sin`` on a permuted input (heads moved out of a projection's output)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1, -1], stride_order=[3, 1, 2, 0])
        cos = fd.define_tensor([-1, -1], contiguity=True)
        sin = fd.define_tensor([-1, -1], contiguity=True)
        half = fd.ops.div(fd.ops.size(x, 3), 2)
        b, h, s, d = (fd.ops.size(x, k) for k in range(4))
        upper = fd.ops.slice(x, [0, 0, 0, half], [b, h, s, d])
        lower = fd.ops.slice(x, [0, 0, 0, 0], [b, h, s, half])
        rotated = fd.ops.cat([fd.ops.neg(upper), lower], 3)
        fd.add_output(fd.ops.add(fd.ops.mul(x, cos), fd.ops.mul(rotated, sin)))
    for seq in (5, 9):
        x = torch.randn(2, seq, 3, 16, device=device).transpose(1, 2)
        cos, sin = torch.randn(seq, 16, device=device), torch.randn(seq, 16, device=device)
        (out,) = run_kernels(fd, [x, cos, sin])
        torch.testing.assert_close(out, x * cos + rotate_half(x) * sin)
        assert kernel_schedulers(fd) == ["pointwise"]
    assert fd.fec.compile_count == 1  # a new sequence length: the same kernel


def test_rotary_backward_pads_are_one_kernel(device: str, run_kernels) -> None:
    """The gradient of ``rotate_half``: two slices, a negation and two pads, added (slice_backward)."""
    with FusionDefinition() as fd:
        g = fd.define_tensor([-1, -1, 16], contiguity=True)
        sin = fd.define_tensor([-1, 16], contiguity=True)
        gs = fd.ops.mul(g, sin)
        b, s = fd.ops.size(g, 0), fd.ops.size(g, 1)
        first = fd.ops.pad(fd.ops.neg(fd.ops.slice(gs, [0, 0, 0], [b, s, 8])), [8, 0])
        second = fd.ops.pad(fd.ops.slice(gs, [0, 0, 8], [b, s, 16]), [0, 8])
        fd.add_output(fd.ops.add(first, second))
    g, sin = torch.randn(3, 7, 16, device=device), torch.randn(7, 16, device=device)
    (out,) = run_kernels(fd, [g, sin])
    gs = g * sin
    torch.testing.assert_close(out, F.pad(-gs[..., :8], [8, 0]) + F.pad(gs[..., 8:], [0, 8]))
    assert kernel_schedulers(fd) == ["pointwise"]


@pytest.mark.parametrize("ranges", [
    ((0, 4, 1), (1, 9, 3)),  # a step
    ((1, 3, 1), (0, 9, 1)),  # the outer axis
    ((2, 2, 1), (0, 9, 1)),  # empty
], ids=["step", "outer", "empty"])
def test_slice_of_a_computed_value(device: str, run_kernels, ranges: tuple[tuple[int, int, int], ...]) -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=True)
        y = fd.ops.exp(x)
        sliced = fd.ops.slice(y, [r[0] for r in ranges], [r[1] for r in ranges], [r[2] for r in ranges])
        fd.add_output(fd.ops.mul(sliced, 2.0))
    x = torch.randn(4, 9, device=device)
    (out,) = run_kernels(fd, [x])
    index = tuple(slice(*r) for r in ranges)
    torch.testing.assert_close(out, x.exp()[index] * 2)


@pytest.mark.parametrize("widths", [[2, 3], [0, 0, 1, 2], [-2, 1], [3, -4, 1, 0]], ids=["last", "outer", "crop",
                                                                                       "both"])
def test_pad_of_a_computed_value(device: str, run_kernels, widths: list[int]) -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=True)
        fd.add_output(fd.ops.pad(fd.ops.sin(x), widths, value=0.5))
    x = torch.randn(5, 6, device=device)
    (out,) = run_kernels(fd, [x])
    torch.testing.assert_close(out, F.pad(x.sin(), widths, value=0.5))


def test_pad_value_is_rounded_to_bfloat16(device: str, run_kernels) -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], contiguity=True, dtype=DataType.BFloat16)
        fd.add_output(fd.ops.mul(fd.ops.pad(fd.ops.abs(x), [1, 1], value=0.1), 3.0))
    x = torch.randn(6, device=device, dtype=torch.bfloat16)
    (out,) = run_kernels(fd, [x])
    assert torch.equal(out, F.pad(x.abs(), [1, 1], value=0.1) * 3.0)


@pytest.mark.parametrize("dim", [0, 1])
def test_cat_of_three_with_broadcast_and_int_operands(device: str, run_kernels, dim: int) -> None:
    """Operands of other sizes along the axis, one of them a broadcast row, one of integers (promoted)."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], contiguity=True)
        b = fd.define_tensor([-1, -1], contiguity=True)
        c = fd.define_tensor([-1], contiguity=True, dtype=DataType.Int32)
        row = fd.ops.broadcast(fd.ops.cast(c, DataType.Float), [True, False] if dim == 0 else [False, True])
        fd.add_output(fd.ops.relu(fd.ops.cat([fd.ops.exp(a), row, fd.ops.neg(b)], dim)))
    if dim == 0:
        a, b, c = torch.randn(2, 5), torch.randn(3, 5), torch.arange(-2, 3, dtype=torch.int32)
    else:
        a, b, c = torch.randn(4, 2), torch.randn(4, 3), torch.arange(-2, 2, dtype=torch.int32)
    a, b, c = a.to(device), b.to(device), c.to(device)
    (out,) = run_kernels(fd, [a, b, c])
    row = c.float().unsqueeze(dim)
    torch.testing.assert_close(out, torch.relu(torch.cat([a.exp(), row, -b], dim)))
    assert kernel_schedulers(fd) == ["pointwise"]


def test_cat_with_an_empty_operand(device: str, run_kernels) -> None:
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], contiguity=True)
        b = fd.define_tensor([-1, -1], contiguity=True)
        fd.add_output(fd.ops.mul(fd.ops.cat([a, fd.ops.abs(b)], 1), 2.0))
    for width in (0, 3):
        a, b = torch.randn(4, width, device=device), torch.randn(4, 5, device=device)
        (out,) = run_kernels(fd, [a, b])
        torch.testing.assert_close(out, torch.cat([a, b.abs()], 1) * 2)


def test_slice_of_an_input_read_only_by_aten_stays_a_view(device: str) -> None:
    """A slice of an input that nothing fuses with is an ATen view, not a copy kernel."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=True)
        fd.add_output(fd.ops.slice(x, [0, 2], [4, 6]))
    x = torch.randn(4, 8, device=device)
    (out,) = fd.execute([x], _enable_options=["triton_interpreter"] if device == "cpu" else [])
    assert torch.equal(out, x[:, 2:6])
    assert kernel_schedulers(fd) == []


def test_kernels_match_aten_on_random_resizes(device: str, run_kernels) -> None:
    """Slices feeding pads feeding a cat, at several sizes: kernels against the ATen evaluator."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=True)
        y = fd.define_tensor([-1, -1], contiguity=True)
        n = fd.ops.size(x, 1)
        left = fd.ops.pad(fd.ops.slice(fd.ops.tanh(x), [0, 1], [fd.ops.size(x, 0), n]), [1, 0], value=-1.0)
        fd.add_output(fd.ops.cat([left, fd.ops.mul(y, 3.0)], 0))
    generator = torch.Generator().manual_seed(0)
    for rows, cols, extra in ((1, 2, 1), (3, 5, 2), (6, 1, 4)):
        x = torch.randn(rows, cols, generator=generator).to(device)
        y = torch.randn(extra, cols, generator=generator).to(device)
        (got,) = run_kernels(fd, [x, y])
        (want,) = execute_with_aten(fd, [x, y])
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got, torch.cat([F.pad(x.tanh()[:, 1:], [1, 0], value=-1.0), y * 3], 0))


def test_pad_of_zero_widths_and_an_empty_slice(device: str, run_kernels) -> None:
    """Fuzz seed 209: a pad that moves nothing needs no condition (an empty one was emitted)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], contiguity=True)
        padded = fd.ops.pad(x, [0, 0], 1.5)
        fd.add_output(fd.ops.slice(fd.ops.sin(padded), [6], [9], [1]))
        fd.add_output(padded)
    x = torch.randn(8, device=device)
    tail, padded = run_kernels(fd, [x])
    torch.testing.assert_close(tail, x.sin()[6:9])
    torch.testing.assert_close(padded, x)


def test_cat_of_size_one_parts_in_a_loop(device: str, run_kernels) -> None:
    """Fuzz seed 959: a cat along a size-1 axis whose consumer the kernel computes in a serial loop
    (its index a 0-dim value there): the part's condition masks each read."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([1, -1], dtype=DataType.Double)
        both = fd.ops.cat([t0, fd.ops.mul(t0, 2.0)], 0)
        fd.add_output(fd.ops.eq(fd.ops.neg(fd.ops.broadcast(both, [True, False, False])), both))
        fd.add_output(fd.ops.neg(both))
    x = torch.randn(1, 7, dtype=torch.float64, device=device)
    flags, negated = run_kernels(fd, [x])
    both = torch.cat([x, x * 2], 0)
    assert torch.equal(flags, -both[None] == both) and torch.equal(negated, -both)


def test_pad_cropping_more_than_an_axis_has_is_a_clear_error(device: str, run_kernels) -> None:
    """Fuzz seed 1206: the kernel's launch refuses it as ATen does, before allocating a negative size."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([1, 1, -1], contiguity=True)
        fd.add_output(fd.ops.mul(fd.ops.pad(x, [-1, 0, 0, 0, -1, 1], 1.5), 2.0))
    with pytest.raises(ValueError, match=r"pad T\d+ \(of T\d+\): T\d+ axis 2 is cropped by 1 \(widths -1, 0\), more "
                                         r"than its size \(-1 left\)"):
        run_kernels(fd, [torch.randn(1, 1, 0, device=device)])
    (out,) = run_kernels(fd, [torch.ones(1, 1, 3, device=device)])
    torch.testing.assert_close(out, F.pad(torch.ones(1, 1, 3, device=device), [-1, 0, 0, 0, -1, 1], value=1.5) * 2)
    with FusionDefinition() as fd:  # fuzz case 5520: cropped by 1 and padded by 1, a size of 0: still refused
        x = fd.define_tensor([-1, -1], contiguity=True)
        fd.add_output(fd.ops.pad(fd.ops.tanh(x), [-1, 1, 2, 2], value=0.5))
    with pytest.raises(ValueError, match=r"axis 1 is cropped by 1 \(widths -1, 1\)"):
        run_kernels(fd, [torch.randn(3, 0, device=device)])


def test_slices_and_pads_to_one_element_broadcast(device: str, run_kernels) -> None:
    """An axis sliced or padded to the constant extent 1 is a broadcast (nvFuser's resize): it
    broadcasts against a full operand as torch's size-1 axes do, and summing it is a squeeze."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 9], contiguity=[False, True], dtype=DataType.BFloat16)
        y = fd.define_tensor([4, 9], contiguity=True)
        column = fd.ops.slice(fd.ops.exp(x), [0, 5], [4, 6])  # [4, 1]
        row = fd.ops.pad(fd.ops.sin(y), [0, 0, -3, 0], 2.0)  # the last row: [1, 9]
        fd.add_output(fd.ops.mul(fd.ops.add(column, y), row))
        fd.add_output(fd.ops.sum(column, [1]))
    assert "ReductionOp" not in [type(e).__name__ for e in fd.fusion.exprs()]
    x = torch.randn(8, 9, device=device, dtype=torch.bfloat16)[::2]  # rows strided
    y = torch.randn(4, 9, device=device)
    product, summed = run_kernels(fd, [x, y])
    column = x.exp()[:, 5:6]
    torch.testing.assert_close(product, (column + y) * y.sin()[3:])
    torch.testing.assert_close(summed, column.sum(1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_a_slice_to_one_element_of_a_computed_value_stays_in_its_kernel(device: str, run_kernels,
                                                                       dtype: torch.dtype) -> None:
    """``torch.diff(p, prepend=p[:, :1] - 1)`` of a computed ``p`` (Hugging Face's packed-sequence check
    of position ids): the first column, sliced to a broadcast, is read at one index by the kernel that
    computes ``p`` rather than splitting it into a slice and a kernel that writes ``p`` out."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([3, 8], contiguity=[False, True], dtype=DataType.from_torch(dtype))
        bias = fd.define_tensor([8], contiguity=True)
        p = fd.ops.mul(fd.ops.cast(x, DataType.Float), 2.0)
        first = fd.ops.sub(fd.ops.slice(p, [0, 0], [3, 1]), 1.0)
        prepended = fd.ops.cat([first, p], 1)
        diff = fd.ops.sub(fd.ops.slice(prepended, [0, 1], [3, 9]), fd.ops.slice(prepended, [0, 0], [3, 8]))
        fd.add_output(fd.ops.add(diff, bias))
    x = torch.randn(6, 8, device=device).to(dtype)[::2]
    bias = torch.randn(8, device=device)
    (out,) = run_kernels(fd, [x, bias])
    p = x.float() * 2
    torch.testing.assert_close(out, torch.diff(p, prepend=p[:, :1] - 1, dim=-1) + bias)
    assert kernel_schedulers(fd) == ["pointwise"]


@pytest.mark.parametrize("crop", ["pad", "slice", "slice_2d"])
def test_a_slice_or_pad_to_one_element_of_a_reshape_is_computed(crop: str, device: str, run_kernels) -> None:
    """A reshaped value cropped to one element (fuzz seed 5500: a reshape, an add, ``pad(..., [0, -1])``;
    a [6, 4] reshape sliced to [1, 1]): the kernel writes the element torch gives, not the pad value or
    an unread zero (no axis of the result is left a broadcast with nothing to iterate)."""
    x = torch.randn(2, 3, 4, device=device)
    shape = [6, 4] if crop == "slice_2d" else [24]
    with FusionDefinition() as fd:
        t = fd.ops.add(fd.ops.reshape(fd.from_pytorch(x), shape), 0.5)
        if crop == "pad":
            fd.add_output(fd.ops.pad(t, [0, -23], -2.0))
        elif crop == "slice":
            fd.add_output(fd.ops.slice(t, [5], [6]))
        else:
            fd.add_output(fd.ops.slice(t, [5, 1], [6, 2]))
    (got,) = run_kernels(fd, [x])
    want = x.reshape(shape) + 0.5
    torch.testing.assert_close(got, want[:1] if crop == "pad" else want[5:6] if crop == "slice" else want[5:6, 1:2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("resize", ["cat", "pad", "slice"])
def test_a_resize_of_a_reshape_reads_the_operand_at_its_own_extent(resize: str, dtype: torch.dtype, device: str,
                                                                   run_kernels) -> None:
    """A reshape that merges permuted axes into the axis a cat, pad or slice resizes (heads merged back
    into the hidden axis, then concatenated with the key and value gradients: a multi-query attention's
    backward). The kernel's index of the resized axis wraps at the result's extent; the operand's axes
    are taken from it as an index of the operand's extent, not from the result's flat index (13 is no
    multiple of 5 * 2: the flat index's division would read other rows)."""
    x = torch.randn(3, 5, 7, 2, device=device).to(dtype)  # [batch, heads, seq, head_dim]
    y = torch.randn(3, 7, 3, device=device).to(dtype)
    with FusionDefinition() as fd:  # static sizes: the reshape is computed in the kernel
        tx, ty = (fd.define_tensor(list(t.shape), contiguity=True, dtype=DataType.from_torch(dtype)) for t in (x, y))
        merged = fd.ops.reshape(fd.ops.permute(tx, [0, 2, 1, 3]), [3, 7, 10])
        if resize == "cat":
            out = fd.ops.cat([merged, fd.ops.mul(ty, 2.0)], 2)
        elif resize == "pad":
            out = fd.ops.pad(merged, [0, 3], 0.5)
        else:
            out = fd.ops.slice(merged, [0, 0, 0], [3, 7, 4])
        fd.add_output(fd.ops.mul(out, 3.0))
    (got,) = run_kernels(fd, [x, y])
    merged = x.transpose(1, 2).reshape(3, 7, 10)
    want = {"cat": lambda: torch.cat([merged, y * 2.0], 2), "pad": lambda: F.pad(merged, [0, 3], value=0.5),
            "slice": lambda: merged[..., :4]}[resize]() * 3.0
    torch.testing.assert_close(got, want)
    assert kernel_schedulers(fd) == ["pointwise"]


def _fused_qkv_rotary_backward(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, angles: torch.Tensor,
                               ) -> FusionDefinition:
    """The gradient of a fused q / k / v projection's output through rotary embeddings, as AOTAutograd traces
    it (slice_backward: each head group's gradient padded to the projection's width, added): ``dq`` / ``dk``
    ``[T, H * D]`` and ``dv`` ``[T, KV * D]`` (tokens by columns), cosines and sines computed from ``angles``
    ``[T, D / 2]`` (the rotary embedding's recomputed forward), repeated along the columns."""
    width = dq.shape[1] + dk.shape[1] + dv.shape[1]
    with FusionDefinition() as fd:
        tq, tk, tv = (fd.define_tensor(list(t.shape), contiguity=[True, True], dtype=DataType.BFloat16)
                      for t in (dq, dk, dv))
        ang = fd.define_tensor(list(angles.shape), contiguity=[True, True])
        tokens, half = angles.shape
        # angles repeated to each part's columns: [T, D/2] -> [T, cols / D, 2, D/2] -> [T, cols]
        def rope_backward(g: object, columns: int) -> object:
            a = fd.ops.broadcast_in_dim(ang, [tokens, columns // (2 * half), 2, half], [0, 3])
            a = fd.ops.reshape(a, [tokens, columns])
            gf = fd.ops.cast(g, DataType.Float)
            return fd.ops.add(fd.ops.mul(gf, fd.ops.cos(a)), fd.ops.mul(gf, fd.ops.sin(a)))

        q = rope_backward(tq, dq.shape[1])
        k = rope_backward(tk, dk.shape[1])
        v = fd.ops.cast(tv, DataType.Float)
        padded_q = fd.ops.pad(q, [0, width - dq.shape[1]])
        padded_k = fd.ops.pad(k, [dq.shape[1], dv.shape[1]])
        padded_v = fd.ops.pad(v, [dq.shape[1] + dk.shape[1], 0])
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.add(padded_q, padded_k), padded_v), DataType.BFloat16))
    return fd


@pytest.mark.parametrize(("columns", "tile"), [((512, 256, 256), 256), ((1024, 256, 256), 256), ((96, 32, 32), None)])
def test_costly_parts_run_under_branches_on_aligned_tiles(device: str, run_kernels, columns: tuple[int, ...],
                                                          tile: int | None) -> None:
    """Each part of the fused gradient computes cosines and sines; where every part spans 256 columns or more
    the pointwise tile divides the parts' bounds (one part a tile) and each costly part is computed under a
    branch on its tile having a lane in it; finer parts keep the usual tile and no branch. Against torch."""
    tokens, half = 3, 16
    dq, dk, dv = (torch.randn(tokens, c, device=device).to(torch.bfloat16) for c in columns)
    angles = torch.randn(tokens, half, device=device) * 40
    fd = _fused_qkv_rotary_backward(dq, dk, dv, angles)
    (out,) = run_kernels(fd, [dq, dk, dv, angles])
    a = {c: angles.repeat(1, c // half) for c in columns}

    def rope(g: torch.Tensor) -> torch.Tensor:
        return g.float() * a[g.shape[1]].cos() + g.float() * a[g.shape[1]].sin()

    want = torch.cat([rope(dq), rope(dk), dv.float()], 1).to(torch.bfloat16)
    torch.testing.assert_close(out, want, rtol=1e-2, atol=1e-2)
    (segment,) = kernel_segments(fd)
    branches = segment.code.count("tl.reduce(tl.where(")
    if tile is None:
        assert branches == 0 and segment.scheduler_params.block != (256,), segment.scheduler_params
    else:
        assert segment.scheduler_params.block == (tile,), segment.scheduler_params
        assert branches == 2, segment.code  # the q and k parts; v has nothing costly


_COSTLY = {"sin": ("sin", torch.sin), "exp": ("exp", torch.exp), "tanh": ("tanh", torch.tanh), "none": (None, None)}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(widths=st.lists(st.sampled_from([128, 256, 384, 512, 768]), min_size=2, max_size=4),
       ops=st.lists(st.sampled_from(sorted(_COSTLY)), min_size=4, max_size=4), rows=st.integers(1, 3),
       bf16=st.booleans(), pad=st.booleans())
@example(widths=[512, 256, 768], ops=["sin", "none", "exp", "none"], rows=2, bf16=True, pad=True)  # branched, aligned
@example(widths=[384, 256], ops=["tanh", "exp", "none", "none"], rows=3, bf16=False, pad=False)  # branched, not aligned
def test_cats_and_pads_of_costly_parts_against_aten(widths: list[int], ops: list[str], rows: int, bf16: bool,
                                                    pad: bool) -> None:
    """Cats of parts computed with or without transcendental ops (branched where every part is 256+ long and
    costly, on tiles aligned with them or not), and a pad of a costly part, against the ATen evaluator:
    static shapes, bf16 or float32 inputs."""
    dtype = torch.bfloat16 if bf16 else torch.float32
    xs = [torch.randn(rows, w).to(dtype) for w in widths]
    with FusionDefinition() as fd:
        parts = []
        for x, op in zip(xs, ops, strict=False):
            t = fd.ops.cast(fd.define_tensor(list(x.shape), contiguity=[True, True],
                                             dtype=DataType.BFloat16 if bf16 else DataType.Float), DataType.Float)
            name = _COSTLY[op][0]
            parts.append(getattr(fd.ops, name)(t) if name else t)
        out = fd.ops.cat(parts, 1)
        if pad:
            out = fd.ops.pad(out, [256, 512])
        fd.add_output(fd.ops.mul(out, 0.5))
    (got,) = execute_with_kernels(fd, xs)
    assert kernel_schedulers(fd) == ["pointwise"]
    (want,) = execute_with_aten(fd, xs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
