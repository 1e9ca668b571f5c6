"""Kernels compiled per alignment of their integer arguments (``kernel_source.alignment_param``): each
stride and size enters the kernel as a multiple of its alignment class, so a launch that passed the
wrong class would index the wrong elements. Every class, on views whose strides and sizes differ in it."""

from __future__ import annotations

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.codegen.kernel_source import ALIGNMENTS


def test_alignment_classes() -> None:
    assert [ALIGNMENTS[x & 15] for x in (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 1000, 1500, 4097, 32)] == \
        [16, 1, 2, 1, 4, 2, 8, 4, 16, 8, 8, 4, 1, 16]


@pytest.mark.parametrize("cols", [40, 41, 42, 44, 48])
@pytest.mark.parametrize("pad", [0, 1, 2, 4, 8])
def test_rows_of_every_alignment_normalize_and_sum(cols: int, pad: int, device: str, run_kernels) -> None:
    """A layer norm of bf16 rows (inner) and the column sums of the same view (outer), where the row
    stride (``cols + pad``) and the row length fall in different classes."""
    base = torch.randn(7, cols + pad, generator=torch.Generator().manual_seed(cols * 16 + pad))
    x = base.bfloat16().to(device)[:, :cols]
    with FusionDefinition() as fd:
        tx = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        var, mean = fd.ops.var_mean(tx, [1], correction=0, keepdim=True)
        y = fd.ops.mul(fd.ops.sub(tx, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
        fd.add_output(fd.ops.cast(y, DataType.BFloat16))
    (got,) = run_kernels(fd, [x])
    torch.testing.assert_close(got, torch.nn.functional.layer_norm(x.float(), (cols,)).bfloat16(), rtol=2e-2, atol=2e-2)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.sum(fd.ops.cast(fd.from_pytorch(x), DataType.Float), [0]))
    (got,) = run_kernels(fd, [x])
    torch.testing.assert_close(got, x.float().sum(0))
