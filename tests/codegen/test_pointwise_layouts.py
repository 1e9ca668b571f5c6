"""Generated pointwise kernels on every layout a user hands in: broadcast, permuted, channels-last,
expanded, strided, offset, empty, size-1 and non-divisible shapes."""

from __future__ import annotations

import re

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.codegen import compiled_kernel


def _bias_gelu(fd: FusionDefinition, x: torch.Tensor, b: torch.Tensor) -> None:
    tx, tb = fd.from_pytorch(x), fd.from_pytorch(b)
    fd.add_output(fd.ops.gelu(fd.ops.add(tx, tb), approximate="tanh"))


@pytest.mark.parametrize("shape", [(37, 19), (1, 5), (3, 1), (0, 7), (1025,), (2, 3, 4, 5)])
def test_broadcast_bias_any_shape(shape: tuple[int, ...], device: str, run_kernels) -> None:
    x = torch.randn(shape, device=device)
    b = torch.randn(shape[-1:], device=device)
    with FusionDefinition() as fd:
        _bias_gelu(fd, x, b)
    (got,) = run_kernels(fd, [x, b])
    torch.testing.assert_close(got, torch.nn.functional.gelu(x + b, approximate="tanh"), atol=1e-5, rtol=1e-5)


def test_outer_product_of_broadcasts(device: str, run_kernels) -> None:
    a, b = torch.randn(9, 1, device=device), torch.randn(1, 13, device=device)
    s = torch.tensor(2.5, device=device)
    with FusionDefinition() as fd:
        ta, tb, ts = fd.from_pytorch(a), fd.from_pytorch(b), fd.from_pytorch(s)
        fd.add_output(fd.ops.mul(fd.ops.sub(ta, tb), ts))
    (got,) = run_kernels(fd, [a, b, s])
    torch.testing.assert_close(got, (a - b) * s)


@pytest.mark.parametrize("layout", ["transposed", "channels_last", "expanded", "strided", "offset"])
def test_input_layouts(layout: str, device: str, run_kernels) -> None:
    base = torch.randn(2, 3, 6, 5, device=device)
    x = {"transposed": base.transpose(1, 3), "channels_last": base.contiguous(memory_format=torch.channels_last),
         "expanded": torch.randn(2, 3, 6, 1, device=device).expand(2, 3, 6, 5),
         "strided": torch.randn(2, 3, 6, 10, device=device)[..., ::2],
         "offset": torch.randn(2 * 3 * 6 * 5 + 1, device=device)[1:].view(2, 3, 6, 5)}[layout]
    y = torch.randn(x.shape, device=device)
    with FusionDefinition() as fd:  # no stride order declared: one definition, a program per layout
        tx, ty = fd.define_tensor([-1] * 4), fd.define_tensor([-1] * 4)
        fd.add_output(fd.ops.add(fd.ops.exp(tx), ty))
    (got,) = run_kernels(fd, [x, y])
    torch.testing.assert_close(got, torch.exp(x) + y)
    (again,) = run_kernels(fd, [x.contiguous(), y])  # another layout: another program, same answer
    torch.testing.assert_close(again, got)


def test_channels_last_with_channel_bias_keeps_the_layout(device: str, run_kernels) -> None:
    x = torch.randn(2, 8, 5, 5, device=device).contiguous(memory_format=torch.channels_last)
    bias = torch.randn(8, 1, 1, device=device)
    with FusionDefinition() as fd:
        tx, tb = fd.from_pytorch(x), fd.from_pytorch(bias)
        fd.add_output(fd.ops.relu(fd.ops.add(tx, tb)))
    (got,) = run_kernels(fd, [x, bias])
    torch.testing.assert_close(got, torch.relu(x + bias))
    assert got.is_contiguous(memory_format=torch.channels_last)


def test_required_output_stride_order(device: str, run_kernels) -> None:
    x = torch.randn(6, 7, device=device)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.neg(t), stride_order=[0, 1])
    (got,) = run_kernels(fd, [x])
    assert got.stride() == (1, 6)
    torch.testing.assert_close(got, -x)


def test_shape_ops_inside_one_kernel(device: str, run_kernels) -> None:
    x = torch.randn(4, 1, 6, device=device)
    b = torch.randn(6, device=device)
    with FusionDefinition() as fd:
        tx, tb = fd.from_pytorch(x), fd.from_pytorch(b)
        sq = fd.ops.squeeze(tx, [1])
        perm = fd.ops.permute(sq, [1, 0])
        bb = fd.ops.broadcast_in_dim(tb, [6, 4], [0])
        out = fd.ops.add(perm, bb)
        fd.add_output(out)
        fd.add_output(fd.ops.mul(out, 2.0))
    got = run_kernels(fd, [x, b])
    expected = x.squeeze(1).t() + b[:, None]
    torch.testing.assert_close(got[0], expected)
    torch.testing.assert_close(got[1], expected * 2)
    assert len(re.findall(r"def pointwise_\w*kernel\(", fd.last_kernel_code())) == 1, "one kernel"


def test_creation_ops_and_scalar_inputs(device: str, run_kernels) -> None:
    x = torch.randn(5, 7, device=device)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        s = fd.define_scalar(dtype=DataType.Float)
        n = fd.define_scalar(dtype=DataType.Int)
        ones = fd.ops.full([5, 7], s, DataType.Float)
        idx = fd.ops.broadcast_in_dim(fd.ops.iota(7, 1, 2, DataType.Int), [5, 7], [1])
        fd.add_output(fd.ops.add(fd.ops.mul(tx, ones), fd.ops.mul(idx, n)))
    (got,) = run_kernels(fd, [x, 1.5, 3])
    torch.testing.assert_close(got, x * 1.5 + (torch.arange(7, device=device) * 2 + 1) * 3)


def test_new_sizes_reuse_the_kernel(device: str, run_kernels) -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=True)
        b = fd.define_tensor([-1], contiguity=True)
        fd.add_output(fd.ops.sigmoid(fd.ops.add(x, b)))
    run_kernels(fd, [torch.randn(3, 5, device=device), torch.randn(5, device=device)])
    kernels, programs = compiled_kernel.compile_count, fd.fec.compile_count
    for m, n in [(7, 11), (1000, 3), (0, 9), (2, 13)]:  # (size-1 axes are part of the layout key)
        xx, bb = torch.randn(m, n, device=device), torch.randn(n, device=device)
        (got,) = run_kernels(fd, [xx, bb])
        torch.testing.assert_close(got, torch.sigmoid(xx + bb))
    assert compiled_kernel.compile_count == kernels, "a new size compiled a new kernel"
    assert fd.fec.compile_count == programs


def test_mismatched_sizes_are_an_error_before_launch(device: str, run_kernels) -> None:
    with FusionDefinition() as fd:
        x, y = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.add(x, y))
    with pytest.raises(ValueError, match=r"T0 axis 1 has size 4 but T1 axis 1 has size 5; they must be equal"):
        run_kernels(fd, [torch.randn(3, 4, device=device), torch.randn(3, 5, device=device)])
