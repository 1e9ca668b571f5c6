"""The pointwise and transpose schedulers with outputs that carry broadcasts of their own: DeBERTa computes each
layer's relative positions again (``clamp(pos + span).unsqueeze(0)`` per layer), so one segment has
several outputs whose size-1 axes come from different broadcasts. Every output follows the reference's
loop nest; none is written by serial loops over its whole extent in every program (191 ms for one
such kernel at sequence 512 on an H100, against 3 us)."""

from __future__ import annotations

import re

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from tests.codegen.conftest import execute_with_kernels, kernel_schedulers


def positions_per_layer(layers: int) -> FusionDefinition:
    with FusionDefinition() as fd:
        pos = fd.define_tensor([-1, -1], dtype=DataType.Float)
        shift = fd.define_tensor([-1, -1], dtype=DataType.Float)
        for _ in range(layers):
            r = fd.ops.cast(fd.ops.mul(fd.ops.add(pos, 8.0), shift), DataType.Int)
            n, m = fd.ops.size(pos, 0), fd.ops.size(pos, 1)
            for sign in (1, -1):
                clamped = fd.ops.clamp(fd.ops.add(fd.ops.mul(r, sign), 16), 0, 31)
                fd.add_output(fd.ops.broadcast_in_dim(clamped, [1, n, m], [1, 2]))
    return fd


@pytest.mark.parametrize("scheduler", ["pointwise", "transpose"])
def test_outputs_with_broadcasts_of_their_own_follow_the_reference(device: str, scheduler: str) -> None:
    fd = positions_per_layer(3)
    pos = torch.randn(37, 53, device=device) * 20
    shift = torch.rand(37, 53, device=device)
    if scheduler == "transpose":
        shift = torch.rand(53, 37, device=device).t()  # the inputs' innermost axes differ
    outputs = execute_with_kernels(fd, [pos, shift])
    r = ((pos + 8.0) * shift).to(torch.int64)
    for k, out in enumerate(outputs):
        sign = 1 if k % 2 == 0 else -1
        torch.testing.assert_close(out, (r * sign + 16).clamp(0, 31).unsqueeze(0))
    assert kernel_schedulers(fd) == [scheduler]
    assert not re.search(r"^\s+for ", fd.last_kernel_code(), re.MULTILINE)  # no serial loop in the kernel


def test_a_broadcast_output_beside_a_full_one(device: str) -> None:
    """Broadcast axes left of, between and right of the real ones, in the reference and not."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        y = fd.ops.exp(fd.ops.cast(x, DataType.Float))
        n, m = fd.ops.size(x, 0), fd.ops.size(x, 1)
        fd.add_output(fd.ops.broadcast_in_dim(y, [1, n, 1, m, 1], [1, 3]))
        fd.add_output(fd.ops.cast(fd.ops.broadcast_in_dim(fd.ops.neg(y), [n, 1, m], [0, 2]), DataType.BFloat16))
    x = torch.randn(33, 65, device=device, dtype=torch.bfloat16)
    first, second = execute_with_kernels(fd, [x])
    want = x.float().exp()
    torch.testing.assert_close(first, want[None, :, None, :, None])
    torch.testing.assert_close(second, (-want).to(torch.bfloat16)[:, None, :])
    assert not re.search(r"^\s+for ", fd.last_kernel_code(), re.MULTILINE)


@pytest.mark.parametrize("outputs", [("q",), ("kv",), ("q", "kv"), ("positions", "q", "kv")])
@pytest.mark.parametrize("length", [None, 37])
def test_a_mask_beside_the_positions_it_compares(device: str, outputs: tuple[str, ...], length: int | None) -> None:
    """``transformers``' causal mask: ``positions[:, None] <= positions[None, :]`` written beside the
    unsqueezed positions (Llama and GPT-2 training). The mask's two axes are one ID class; an output
    broadcast along one of them is not the mask's shape, so it gets a kernel of its own instead of
    failing to find a loop nest in the mask's (the whole region fell back to ATen on CUDA)."""
    with FusionDefinition() as fd:
        if length is None:
            base = fd.define_tensor([-1], dtype=DataType.Int)
        else:
            base = fd.ops.iota(length, 0, 1, dtype=DataType.Int)
        positions = fd.ops.broadcast(fd.ops.add(base, 1), [True, False])
        rows = fd.ops.broadcast(positions, [False, True, False])
        q = fd.ops.broadcast(rows, [False, False, False, True])
        kv = fd.ops.broadcast(rows, [False, False, True, False])
        named = {"positions": positions, "q": q, "kv": kv}
        for name in outputs:
            fd.add_output(named[name])
        fd.add_output(fd.ops.le(kv, q))
    base_values = torch.arange(37, device=device) * 3 - 20
    got = execute_with_kernels(fd, [base_values] if length is None else [], device=device)
    p = (base_values if length is None else torch.arange(37, device=device)) + 1
    want = {"positions": p[None, :], "q": p[None, None, :, None], "kv": p[None, None, None, :]}
    for name, out in zip(outputs, got, strict=False):
        torch.testing.assert_close(out, want[name])
    torch.testing.assert_close(got[-1], p[None, None, None, :] <= p[None, None, :, None])
    assert set(kernel_schedulers(fd)) == {"pointwise"}


@pytest.mark.parametrize(("bias_shape", "scheduler"), [((1, 45, 70), "transpose"), ((70,), "pointwise")])
def test_an_input_shared_by_the_batch_decides_the_layout_a_bias_does_not(device: str, bias_shape: tuple[int, ...],
                                                                          scheduler: str) -> None:
    """Scores stored transposed ([B, S, T] over [B, T, S] memory) plus a mask shared by the batch ([1, S, T],
    row-major): the mask spans two of the scores' axes and is innermost along the other one, so a 1-D
    schedule over the scores' memory would read it a line per element; the transpose scheduler tiles
    both. A bias along one axis is read along it whatever the schedule."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1], dtype=DataType.BFloat16, stride_order=[2, 0, 1])
        m = fd.define_tensor([1 if k == 0 and len(bias_shape) == 3 else -1 for k in range(len(bias_shape))],
                             dtype=DataType.BFloat16)
        y = fd.ops.add(fd.ops.mul(fd.ops.cast(x, DataType.Float), 0.125), fd.ops.cast(m, DataType.Float))
        fd.add_output(fd.ops.cast(y, DataType.BFloat16))
    scores = torch.randn(3, 70, 45, device=device, dtype=torch.bfloat16).transpose(1, 2)
    mask = torch.randn(*bias_shape, device=device, dtype=torch.bfloat16)
    (out,) = execute_with_kernels(fd, [scores, mask])
    torch.testing.assert_close(out, (scores.float() * 0.125 + mask.float()).bfloat16())
    assert out.stride() == scores.stride()
    assert kernel_schedulers(fd) == [scheduler]
