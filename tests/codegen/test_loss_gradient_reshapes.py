"""A language model's loss gradient of the logits, computed over ``[batch * tokens, vocab]``, reshaped to
``[batch, tokens, vocab]``, plus the logits' own gradient and reshaped back: the softmax's normalization kernel
computes both reshapes (``ir/analysis/reshape.py``: they regroup kept axes only), so the add is in it, whatever
the other operand's layout (permuted, broadcast). Through generated kernels (Triton's interpreter on CPU)
against torch."""

from __future__ import annotations

import pytest
import torch

from pyfuser import FusionDefinition
from tests.codegen.conftest import execute_with_kernels, kernel_schedulers


def _loss_gradient(logits: torch.Tensor, tangent: torch.Tensor, output_sum: bool = False) -> FusionDefinition:
    """softmax(logits) over [batch * tokens, vocab], reshaped to ``tangent``'s shape, plus ``tangent``, reshaped
    back (``output_sum``: the [batch, tokens, vocab] sum is an output too)."""
    with FusionDefinition() as fd:
        x, t = fd.from_pytorch(logits, static_sizes=True), fd.from_pytorch(tangent, static_sizes=True)
        shifted = fd.ops.exp(fd.ops.sub(x, fd.ops.max(x, [1], True)))
        probs = fd.ops.div(shifted, fd.ops.sum(shifted, [1], True))
        total = fd.ops.add(t, fd.ops.reshape(probs, list(tangent.shape)))
        fd.add_output(fd.ops.reshape(total, list(logits.shape)))
        if output_sum:
            fd.add_output(total)
    return fd


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_reshaped_gradient_sum_is_computed_in_the_softmax_kernel(dtype: torch.dtype, device: str) -> None:
    logits = torch.randn(6, 40, device=device).to(dtype)
    tangent = torch.randn(2, 3, 40, device=device).to(dtype)
    fd = _loss_gradient(logits, tangent)
    (out,) = execute_with_kernels(fd, [logits, tangent])

    def reference(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        shifted = (x - x.amax(1, True)).exp()
        return (t + (shifted / shifted.sum(1, True)).view(2, 3, 40)).view(6, 40)

    exact = reference(logits.double(), tangent.double())
    torch_error = (reference(logits, tangent).double() - exact).abs().max().item()
    assert out.dtype == dtype and (out.double() - exact).abs().max().item() <= 2 * torch_error + 1e-6
    assert kernel_schedulers(fd) == ["inner_persistent"]


def test_a_permuted_input_is_read_through_the_reshape(device: str) -> None:
    """The input's reshape would be a copy as an ATen call: the softmax's kernel reads it at computed
    indices instead, and computes the add."""
    logits = torch.randn(6, 40, device=device)
    tangent = torch.randn(2, 40, 3, device=device).transpose(1, 2)
    fd = _loss_gradient(logits, tangent)
    (out,) = execute_with_kernels(fd, [logits, tangent])
    torch.testing.assert_close(out, (tangent + torch.softmax(logits, 1).view(2, 3, 40)).reshape(6, 40))
    assert kernel_schedulers(fd) == ["inner_persistent"]


def test_a_reshaped_sum_that_is_an_output_is_written(device: str) -> None:
    logits = torch.randn(6, 40, device=device)
    tangent = torch.randn(2, 3, 40, device=device)
    fd = _loss_gradient(logits, tangent, output_sum=True)
    flat, total = execute_with_kernels(fd, [logits, tangent])
    expected = tangent + torch.softmax(logits, 1).view(2, 3, 40)
    torch.testing.assert_close(total, expected)
    torch.testing.assert_close(flat, expected.view(6, 40))
    # the sum is written once, in the kernel; its reshape for the other output is an ATen view of it
    assert kernel_schedulers(fd) == ["inner_persistent"]


def test_a_broadcast_operand_is_added_in_the_kernel(device: str) -> None:
    """An operand broadcast over one of the regrouped axes (a bias over the tokens) is read at the index of
    the axis it has."""
    logits = torch.randn(6, 40, device=device)
    bias = torch.randn(1, 3, 40, device=device)
    with FusionDefinition() as fd:
        x, b = fd.from_pytorch(logits, static_sizes=True), fd.from_pytorch(bias, static_sizes=True)
        probs = fd.ops.exp(fd.ops.sub(x, fd.ops.max(x, [1], True)))
        fd.add_output(fd.ops.reshape(fd.ops.add(fd.ops.reshape(probs, [2, 3, 40]), b), [6, 40]))
    (out,) = execute_with_kernels(fd, [logits, bias])
    torch.testing.assert_close(out, ((logits - logits.amax(1, True)).exp().view(2, 3, 40) + bias).view(6, 40))
    assert kernel_schedulers(fd) == ["inner_persistent"]
