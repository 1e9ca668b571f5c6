"""An intermediate a permute only reads to reshape it is allocated in the permuted order, so the
reshape is a view of the kernel's output (a backward pass's head merge), not an ATen copy."""

from __future__ import annotations

import copy

import torch

from pyfuser import FusionDefinition
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.ops import PermuteOp
from pyfuser.ir.tensor_view import TensorView
from pyfuser.options import CompileOptions
from pyfuser.preseg.pipeline import run_preseg_passes


def preseg(fusion: Fusion) -> Fusion:
    copied = copy.deepcopy(fusion)
    run_preseg_passes(copied, CompileOptions())
    return copied


def head_merge(fd: FusionDefinition, x: torch.Tensor, y: torch.Tensor, reshape: bool = True) -> None:
    """``[b, h, s, d]`` gradient -> ``[b, s, h, d]`` -> ``[b * s, h * d]``."""
    b, h, s, d = x.shape
    grad = fd.ops.add(fd.ops.mul(fd.from_pytorch(x), 2.0), fd.from_pytorch(y))
    merged = fd.ops.permute(grad, [0, 2, 1, 3])
    fd.add_output(fd.ops.reshape(merged, [b * s, h * d]) if reshape else fd.ops.exp(merged))


def allocation_order(tv: TensorView) -> list[int]:
    logical = tv.get_logical_domain()
    return [logical.index(i) for i in tv.get_allocation_domain()]


def permuted(fusion: Fusion) -> TensorView:
    """The tensor the fusion's permute reads."""
    return next(e for e in fusion.exprs() if isinstance(e, PermuteOp)).inputs[0]


def test_the_permuted_order_is_the_intermediates_layout() -> None:
    x, y = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    with FusionDefinition() as fd:
        head_merge(fd, x, y)
    grad = permuted(preseg(fd.fusion))
    assert allocation_order(grad) == [0, 2, 1, 3]


def test_no_layout_when_a_kernel_reads_the_permute_or_the_tensor_is_returned() -> None:
    x, y = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    with FusionDefinition() as fd:
        head_merge(fd, x, y, reshape=False)  # the permute feeds a kernel: its layout is the kernel's affair
    assert allocation_order(permuted(preseg(fd.fusion))) == [0, 1, 2, 3]
    with FusionDefinition() as fd:
        head_merge(fd, x, y)
        fd.add_output(permuted(fd.fusion))  # the gradient itself is an output too: its layout is given
    grad = permuted(preseg(fd.fusion))
    assert not grad.has_allocation_domain() or allocation_order(grad) == [0, 1, 2, 3]
