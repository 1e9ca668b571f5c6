"""0-dim CPU tensors read by generated kernels: torch treats one beside CUDA tensors as a scalar, so a
kernel takes its value as an argument (read on the host at launch), never as a pointer a GPU cannot
dereference. On a CPU the interpreter would accept either; the kernel's signature shows which."""

from __future__ import annotations

import re

import pytest
import torch
import torch._dynamo

from pyfuser import DataType, FusionDefinition
from pyfuser.integrations.torch_compile import PyfuserBackend
from tests.codegen.conftest import RunKernels, kernel_schedulers


def scaled(dtype: DataType) -> FusionDefinition:
    """``x * s + y`` and the rows' sum of it, ``s`` a 0-dim CPU tensor."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dtype)
        s = fd.define_tensor([], dtype=DataType.Float, is_cpu=True)
        y = fd.define_tensor([-1, -1], dtype=dtype)
        z = fd.ops.add(fd.ops.mul(fd.ops.cast(x, DataType.Float), s), fd.ops.cast(y, DataType.Float))
        fd.add_output(fd.ops.cast(z, dtype))
        fd.add_output(fd.ops.sum(z, [1]))
    return fd


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_kernel_takes_a_cpu_scalar_by_value(device: str, dtype: torch.dtype, run_kernels: RunKernels) -> None:
    fd = scaled(DataType.from_torch(dtype))
    x = torch.randn(37, 129, device=device, dtype=dtype)
    y = torch.randn(129, 37, device=device, dtype=dtype).t()  # permuted: another kernel shape
    for value in (0.125, -3.0):  # a new value on a cached program: read at each launch
        s = torch.tensor(value)
        out, rows = run_kernels(fd, [x, s, y])
        want = x.float() * s + y.float()
        torch.testing.assert_close(out, want.to(dtype))
        torch.testing.assert_close(rows, want.sum(1), rtol=1e-5, atol=1e-4)
    # the fusion's T1 an argument by value; pointers only for x, y and the two outputs
    signature = next(line for line in fd.last_kernel_code().splitlines() if line.startswith("def ") and "_kernel(" in line)
    assert "arg_cpu_T1" in signature
    assert re.findall(r"\bT\d+\b", signature) == ["T0", "T1", "T2", "T3"]


def test_a_bool_cpu_scalar_in_a_reduction(device: str, run_kernels: RunKernels) -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        keep = fd.define_tensor([], dtype=DataType.Bool, is_cpu=True)
        fd.add_output(fd.ops.sum(fd.ops.where(keep, x, 0.0), [1]))
    x = torch.randn(5, 300, device=device)
    for flag in (True, False):
        (out,) = run_kernels(fd, [x, torch.tensor(flag)])
        torch.testing.assert_close(out, x.sum(1) if flag else torch.zeros(5, device=device), rtol=1e-5, atol=1e-5)
    assert kernel_schedulers(fd)


class ScaledScores(torch.nn.Module):
    """DeBERTa's attention scale: a CPU tensor made from a size inside the graph."""

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        scale = torch.sqrt(torch.tensor(q.size(-1), dtype=torch.float) * 2)
        scores = torch.bmm(q, k.transpose(-1, -2) / scale.to(dtype=q.dtype))
        return torch.softmax(scores.float(), -1).to(q.dtype)


def test_torch_compile_region_with_a_cpu_scalar(device: str) -> None:
    torch._dynamo.reset()
    module = ScaledScores()
    compiled = torch.compile(module, backend=PyfuserBackend(triton_interpreter=device == "cpu"))
    q = torch.randn(4, 16, 8, device=device, requires_grad=True)
    k = torch.randn(4, 16, 8, device=device, requires_grad=True)
    out = compiled(q, k)
    want = module(q, k)
    torch.testing.assert_close(out, want)
    grads = torch.autograd.grad(out.sum(), (q, k))
    want_grads = torch.autograd.grad(want.sum(), (q, k))
    for got, expected in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, expected)
