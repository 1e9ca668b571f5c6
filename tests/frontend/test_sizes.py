"""Sizes as values: ``tv.shape()`` / ``tv.size(d)``, ``fd.ops.shape`` / ``fd.ops.size``,
``define_vector``, and size arithmetic as the argument of reshape, pad, slice, full and expand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition


def test_reshape_to_a_computed_shape(device: str) -> None:
    x = torch.randn(2, 3, 4, device=device)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1, -1])
        b, s, h = t.shape()
        fd.add_output(fd.ops.reshape(t, [fd.ops.mul(b, s), h]))
        fd.add_output(fd.ops.reshape(t, [b, fd.ops.mul(s, fd.ops.div(h, 2)), 2]))
        fd.add_output(fd.ops.mul(t, fd.ops.size(t, -1)))  # a size as a value
    a, c, scaled = fd.execute([x])
    torch.testing.assert_close(a, x.reshape(6, 4))
    torch.testing.assert_close(c, x.reshape(2, 6, 2))
    torch.testing.assert_close(scaled, x * 4)
    y = torch.randn(3, 5, 2, device=device)  # other sizes: the same fusion computes new shapes
    a, c, scaled = fd.execute([y])
    assert a.shape == (15, 2) and c.shape == (3, 5, 2)
    torch.testing.assert_close(scaled, y * 2)


def test_dynamic_pad_widths_and_slice_bounds(device: str) -> None:
    x = torch.randn(4, 10, device=device)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1])
        n = fd.ops.size(t, 1)
        half = fd.ops.div(n, 2)
        fd.add_output(fd.ops.slice(t, [0, half], [fd.ops.sub(fd.ops.size(t, 0), 1), n]))
        fd.add_output(fd.ops.pad(t, [fd.ops.sub(half, 3), 1]))  # 2 on the left for n = 10
        fd.add_output(fd.ops.full(fd.ops.shape(t), 2.0, DataType.Float))
    sliced, padded, full = fd.execute([x])
    torch.testing.assert_close(sliced, x[0:3, 5:10])
    torch.testing.assert_close(padded, F.pad(x, [2, 1]))
    torch.testing.assert_close(full, torch.full((4, 10), 2.0, device=device))


def test_define_vector_passes_a_shape_as_one_input(device: str) -> None:
    x = torch.randn(2, 3, 4, device=device)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1, -1])
        shape = fd.define_vector(2)
        fd.add_output(fd.ops.reshape(t, shape))
    (out,) = fd.execute([x, [6, 4]])
    torch.testing.assert_close(out, x.reshape(6, 4))
    (out,) = fd.execute([x, (4, 6)])
    assert out.shape == (4, 6)
    with pytest.raises(ValueError, match=r"input 2 \(i\d+\) is used as reshape T0 new_shape\[1\] and must be at least 0"):
        fd.execute([x, [4, -1]])


def test_size_arithmetic_folds_and_keeps_cs_integer_division() -> None:
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1])
        n = fd.ops.size(t, 0)
        assert fd.ops.mul(2, 3).as_extent().value == 6
        assert str(fd.ops.add(fd.ops.add(n, 1), 2).as_extent()) == "( i0 + 3 )"
        negative = fd.ops.div(fd.ops.sub(0, n), 2)  # -n / 2 truncates toward zero
        fd.add_output(fd.ops.full([1], negative, DataType.Int))
    (out,) = fd.execute([torch.randn(5)])
    assert out.item() == -2


def test_bad_size_queries() -> None:
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1])
        with pytest.raises(ValueError, match="T0: size dim 2 is out of range for rank 2"):
            fd.ops.size(t, 2)
        with pytest.raises(TypeError, match="T0: size dim must be an int, got str"):
            t.size("0")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"define_vector: size must be a non-negative int, got -1"):
            fd.define_vector(-1)
        with pytest.raises(ValueError, match="T1: size dim 0 is out of range for rank 0"):
            fd.define_tensor([]).size(0)


def test_a_computed_size_that_is_negative_at_run_time() -> None:
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1])
        fd.add_output(fd.ops.reshape(t, [fd.ops.sub(fd.ops.size(t, 0), 8), -1]))
    with pytest.raises(ValueError, match=r"reshape: T0 cannot be reshaped to \[-4, -1\]: new_shape\[0\] is negative"):
        fd.execute([torch.randn(4)])


def test_computed_sizes_in_generated_kernels() -> None:
    """A kernel whose output extent no input of it holds (an expand to another tensor's size, a full
    of a computed shape) reads the extent from the bound sizes."""
    x, row = torch.randn(3, 5), torch.randn(1, 5)
    with FusionDefinition() as fd:
        t, r = fd.define_tensor([-1, -1]), fd.define_tensor([1, -1], contiguity=[None, True])
        fd.add_output(fd.ops.exp(t))
        fd.add_output(fd.ops.expand(fd.ops.sin(r), [fd.ops.size(t, 0), -1]))
        fd.add_output(fd.ops.full([fd.ops.mul(fd.ops.size(t, 1), 2)], 1.5, DataType.Float))
    e, expanded, full = fd.execute([x, row], _enable_options=["triton_interpreter"])
    assert fd.last_kernel_code()
    torch.testing.assert_close(e, x.exp())
    torch.testing.assert_close(expanded, row.sin().expand(3, 5))
    torch.testing.assert_close(full, torch.full((10,), 1.5))
