"""Shape and creation ops against torch: broadcast, expand, squeeze, permute, reshape, slice, cat, pad,
full, iota."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(actual.cpu(), expected.cpu())


def test_broadcast_and_broadcast_in_dim(device: str) -> None:
    x, y = torch.randn(3), torch.randn(2, 3, 4)
    with FusionDefinition() as fd:
        tx, ty = fd.define_tensor([-1]), fd.define_tensor([-1, -1, -1])
        fd.add_output(fd.ops.add(fd.ops.broadcast(tx, [True, False, True]), ty))
        fd.add_output(fd.ops.broadcast_in_dim(tx, [2, 3, 4], [1]))
        fd.add_output(fd.ops.broadcast_in_dim(ty, [2, 3, 4], [0, 1, 2]))
    added, expanded, same = fd.execute([x.to(device), y.to(device)])
    assert_close(added, x[None, :, None] + y)
    assert_close(expanded, x[None, :, None].expand(2, 3, 4))
    assert_close(same, y)


def test_broadcast_in_dim_with_symbolic_target_shape() -> None:
    """Expand a [1, n] tensor to the rows of another input (sizes from ``shape`` scalars)."""
    x, y = torch.randn(1, 5), torch.randn(4, 5)
    with FusionDefinition() as fd:
        tx, ty = fd.define_tensor([1, -1]), fd.define_tensor([-1, -1])
        rows = fd.define_scalar(dtype=DataType.Int)
        e = fd.ops.broadcast_in_dim(tx, [rows, 5], [0, 1])
        fd.add_output(fd.ops.mul(e, ty))
    (out,) = fd.execute([x, y, 4])
    assert_close(out, x.expand(4, 5) * y)


def test_expand(device: str) -> None:
    x = torch.randn(1, 3, 1)
    with FusionDefinition() as fd:
        t = fd.define_tensor([1, -1, 1])
        fd.add_output(fd.ops.expand(t, [4, -1, 2]))
    (out,) = fd.execute([x.to(device)])
    assert_close(out, x.expand(4, 3, 2))
    assert out.is_contiguous()


@pytest.mark.parametrize("dims", [[0], [2], [0, 2], [-1], 0])
def test_squeeze(dims: list[int] | int, device: str) -> None:
    x = torch.randn(1, 4, 1)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.squeeze(fd.define_tensor([1, -1, 1]), dims))
    (out,) = fd.execute([x.to(device)])
    assert_close(out, x.squeeze(dims if isinstance(dims, int) else tuple(dims)))


@pytest.mark.parametrize("dims", [[0, 1, 2], [2, 0, 1], [1, 2, 0], [-1, 0, 1]])
def test_permute(dims: list[int], device: str) -> None:
    x = torch.randn(2, 3, 4)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1, -1])
        p = fd.ops.permute(t, dims)
        fd.add_output(p)
        fd.add_output(fd.ops.add(p, 1.0))
    permuted, plus_one = fd.execute([x.to(device)])
    assert_close(permuted, x.permute(dims))
    assert_close(plus_one, x.permute(dims) + 1)
    assert permuted.stride() == x.permute(dims).stride(), "no requirement: the input's memory order (a hint), as torch"


@pytest.mark.parametrize(("shape", "new_shape"), [
    ((2, 3, 4), (6, 4)),
    ((2, 3, 4), (-1,)),
    ((2, 3, 4), (4, -1)),
    ((2, 3, 4), (2, 1, 12)),
    ((6,), (2, 3)),
    ((1, 6), (3, -1, 1)),
])
def test_reshape(shape: tuple[int, ...], new_shape: tuple[int, ...], device: str) -> None:
    x = torch.randn(shape)
    with FusionDefinition() as fd:
        t = fd.define_tensor([1 if s == 1 else -1 for s in shape])
        fd.add_output(fd.ops.reshape(t, list(new_shape)))
    (out,) = fd.execute([x.to(device)])
    assert_close(out, x.reshape(new_shape))


def test_reshape_of_transposed_input_reexecuted() -> None:
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], contiguity=True, stride_order=[0, 1])
        fd.add_output(fd.ops.reshape(fd.ops.neg(t), [-1]))
    for rows, cols in [(3, 4), (2, 5)]:
        x = torch.randn(cols, rows).t()
        (out,) = fd.execute([x])
        assert_close(out, (-x).reshape(-1))


@pytest.mark.parametrize(("starts", "ends", "steps"), [
    ([0, 0], [2, 3], None),
    ([1, -3], [3, 5], None),  # negative start counts from the end
    ([0, 1], [100, -1], None),  # out-of-range end clamps; negative end
    ([-100, 2], [2, 2], None),  # empty axis
    ([0, 0], [4, 5], [2, 3]),  # strided
    ([3, 4], [1, 5], None),  # start past end: empty
])
def test_slice(starts: list[int], ends: list[int], steps: list[int] | None, device: str) -> None:
    x = torch.randn(4, 5)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.slice(t, starts, ends, steps))
    (out,) = fd.execute([x.to(device)])
    steps = steps or [1, 1]
    index = tuple(slice(s, e, st) for s, e, st in zip(starts, ends, steps, strict=True))
    assert_close(out, x[index])


def test_slice_reexecuted_with_new_sizes() -> None:
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.slice(fd.define_tensor([-1]), [1], [-1]))
    for n in (5, 9, 1):
        x = torch.randn(n)
        (out,) = fd.execute([x])
        assert_close(out, x[1:-1])


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat(dim: int, device: str) -> None:
    shapes = {0: [(2, 3), (4, 3), (1, 3)], 1: [(2, 3), (2, 1), (2, 4)], -1: [(2, 3), (2, 1), (2, 4)]}[dim]
    xs = [torch.randn(s) for s in shapes]
    with FusionDefinition() as fd:
        ts = [fd.define_tensor([-1, -1]) for _ in xs]
        fd.add_output(fd.ops.cat(ts, dim))
    (out,) = fd.execute([x.to(device) for x in xs])
    assert_close(out, torch.cat(xs, dim))


def test_cat_promotes_dtypes() -> None:
    a, b = torch.randn(2, 3).half(), torch.randn(1, 3)
    with FusionDefinition() as fd:
        ta, tb = fd.define_tensor([-1, -1], dtype=DataType.Half), fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.cat([ta, tb], 0))
    (out,) = fd.execute([a, b])
    assert_close(out, torch.cat([a, b], 0))


@pytest.mark.parametrize(("widths", "value"), [([1, 2], None), ([0, 0, 2, 1], 1.5), ([3, 0], -2.0), ([1, 1, 0, 0], 7),
                                               ([-1, 2], None), ([-1, -1, 1, -2], 3.0), ([0, -4], None)])
def test_pad(widths: list[int], value: float | None, device: str) -> None:
    x = torch.randn(3, 4)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.pad(fd.define_tensor([-1, -1]), widths, value))
    (out,) = fd.execute([x.to(device)])
    assert_close(out, F.pad(x, widths, value=0.0 if value is None else value))


@pytest.mark.parametrize(("dtype", "value"), [(DataType.Float, 1.5), (DataType.Int, 3), (DataType.Bool, True),
                                              (DataType.Half, -0.5)])
def test_full(dtype: DataType, value: float | int | bool, device: str) -> None:
    x = torch.randn(2, 3)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.full([2, 3], value, dtype))
        fd.add_output(fd.ops.add(t, fd.ops.full([2, 3], value, dtype)))
    filled, added = fd.execute([x.to(device)])
    ref = torch.full((2, 3), value, dtype=dtype.torch_dtype)
    assert_close(filled, ref)
    assert_close(added, x + ref)


def test_full_with_symbolic_size_from_scalar_input() -> None:
    with FusionDefinition() as fd:
        n = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.full([n, 2], 0.25, DataType.Float))
    for size in (3, 5):
        (out,) = fd.execute([size])
        assert_close(out, torch.full((size, 2), 0.25))


@pytest.mark.parametrize(("length", "start", "step", "dtype"), [
    (5, None, None, DataType.Int),
    (4, 2, 3, DataType.Int),
    (6, 0.5, 0.25, DataType.Float),
    (3, -1, -2, DataType.Int32),
])
def test_iota(length: int, start: float | None, step: float | None, dtype: DataType, device: str) -> None:
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.iota(length, start, step, dtype))
    (out,) = fd.execute([], device=device)
    s, st = (0 if start is None else start), (1 if step is None else step)
    assert_close(out, (torch.arange(length) * st + s).to(dtype.torch_dtype))


def test_iota_with_scalar_length_input() -> None:
    with FusionDefinition() as fd:
        n = fd.define_scalar(dtype=DataType.Int)
        x = fd.define_tensor([-1])
        fd.add_output(fd.ops.mul(fd.ops.iota(n, dtype=DataType.Float), x))
    (out,) = fd.execute([4, torch.ones(4)])
    assert_close(out, torch.arange(4.0))


def test_reshape_slice_and_pad_with_scalar_input_sizes() -> None:
    """Sizes, indices and pad widths given as integer input scalars are bound at execution."""
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1])
        rows, start, width = (fd.define_scalar(dtype=DataType.Int) for _ in range(3))
        fd.add_output(fd.ops.reshape(t, [rows, -1]))
        fd.add_output(fd.ops.slice(t, [start, 0], [-1, 100]))
        fd.add_output(fd.ops.pad(t, [width, 0]))
    for shape, args in [((4, 6), (3, 1, 2)), ((6, 2), (4, 2, 0))]:
        x = torch.randn(shape)
        reshaped, sliced, padded = fd.execute([x, *args])
        assert_close(reshaped, x.reshape(args[0], -1))
        assert_close(sliced, x[args[1]:-1, 0:100])
        assert_close(padded, F.pad(x, [args[2], 0]))


def test_pad_with_negative_widths_crops_like_torch() -> None:
    """Negative widths crop (torch's constant ``F.pad``), also from input scalars; cropping past
    the extent is rejected at definition."""
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, 5])
        width = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.pad(t, [width, -2]))
    x = torch.randn(2, 5)
    for w in (-1, 0, 2):
        (out,) = fd.execute([x, w])
        assert_close(out, F.pad(x, [w, -2]))
    with FusionDefinition() as fd, pytest.raises(ValueError, match=r"pad: T0 axis 1 has extent 5; .* would crop 1 elements more"):
        fd.ops.pad(fd.define_tensor([-1, 5]), [-3, -3])
    with FusionDefinition() as fd, pytest.raises(ValueError, match=r"pad: T0 axis 1 has extent 5; pad widths -6, 3 "
                                                                   r"would crop 1 elements more"):
        fd.ops.pad(fd.define_tensor([-1, 5]), [-6, 3])  # torch crops before it pads, though 5 - 6 + 3 >= 0


@pytest.mark.parametrize("build", [
    lambda fd, t, n: fd.ops.full([n, 2], 1.0, DataType.Float),
    lambda fd, t, n: fd.ops.iota(n),
    lambda fd, t, n: fd.ops.reshape(t, [n, -1]),
    lambda fd, t, n: fd.ops.slice(t, [n], [6]),
])
def test_negative_input_scalar_used_as_size_is_a_clear_error(build: Any) -> None:
    """Scalar values are not part of the cached signature: the check runs on every execute."""
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1])
        n = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(build(fd, t, n))
    fd.execute([torch.randn(6), 2])
    with pytest.raises(ValueError, match=r"input 1 \(i1\) is used as .* must be at least 0, got -2"):
        fd.execute([torch.randn(6), -2])
