"""Inner-outer segments (a per-row reduction and one across rows) whose rows are too long to stay on
chip: the segment runs as two launches split at its per-row statistics, each of a scheduler that takes
it, so each element is read twice rather than once per step of its row (``Scheduler.split_at``). And
loops over rows pipelined only as deep as a GPU's shared memory holds (``pipeline_stages``): failures
the interpreter, which has no shared memory, cannot show."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition
from pyfuser.integrations.torch_compile import PyfuserBackend
from pyfuser.scheduler import inner_outer_persistent, outer_persistent
from pyfuser.scheduler.registry import Machine, SizeHints
from tests.codegen.conftest import define_rmsnorm_backward, kernel_schedulers

DT = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16}


def _wide(device: str, extra: int) -> int:
    """A row past the device's on-chip limit, not a power of two."""
    return 2 * Machine.of(torch.device(device)).max_persistent + extra


def _kernels(fd: FusionDefinition) -> list[str]:
    return re.findall(r"^def ([a-z]\w*)\(", fd.last_kernel_code(), flags=re.M)


@pytest.mark.parametrize(("rows", "extra", "dtype"), [(5, 37, torch.float32), (2, 3, torch.bfloat16),
                                                      (9, 1, torch.bfloat16)])
def test_layernorm_backward_of_wide_rows_is_two_launches(rows: int, extra: int, dtype: torch.dtype, device: str,
                                                         run_kernels) -> None:
    cols = _wide(device, extra)
    # float64 gradients of the very inputs the kernel reads (rounded to ``dtype``)
    x, w, b, dy = (torch.randn(*shape, device=device, dtype=dtype).double()
                   for shape in ((rows, cols), (cols,), (cols,), (rows, cols)))
    x, w, b = (t.requires_grad_() for t in (x, w, b))
    F.layer_norm(x, (cols,), w, b, 1e-5).backward(dy)
    mean = x.detach().mean(1)
    rstd = torch.rsqrt(x.detach().var(1, unbiased=False) + 1e-5)
    args = [dy.to(dtype), x.detach().to(dtype), w.detach().to(dtype), mean.float(), rstd.float()]
    with FusionDefinition() as fd:
        tdy, tx, tw, tm, tr = (fd.from_pytorch(t) for t in args)
        dyf, xf, wf = (fd.ops.cast(t, DataType.Float) for t in (tdy, tx, tw))
        per_row = [False, True]
        xhat = fd.ops.mul(fd.ops.sub(xf, fd.ops.broadcast(tm, per_row)), fd.ops.broadcast(tr, per_row))
        g = fd.ops.mul(dyf, fd.ops.broadcast(wf, [True, False]))
        a = fd.ops.broadcast(fd.ops.sum(g, [1]), per_row)
        c = fd.ops.broadcast(fd.ops.sum(fd.ops.mul(g, xhat), [1]), per_row)
        dx = fd.ops.mul(fd.ops.broadcast(tr, per_row), fd.ops.sub(fd.ops.sub(g, fd.ops.div(a, float(cols))),
                                                                    fd.ops.mul(xhat, fd.ops.div(c, float(cols)))))
        for out in (dx, fd.ops.sum(fd.ops.mul(dyf, xhat), [0]), fd.ops.sum(dyf, [0])):
            fd.add_output(fd.ops.cast(out, DT[dtype]))
    got = run_kernels(fd, args)
    tol = 1e-4 if dtype is torch.float32 else 3e-2
    for out, ref in zip(got, (x.grad, w.grad, b.grad), strict=True):
        assert out.dtype is dtype
        torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol * (1 + ref.abs().max().item() / 100))
    assert kernel_schedulers(fd) == ["inner_outer_persistent"]
    # a reduction of rows, then a reduction across rows that also writes dx (a split of it, finished by a
    # third launch, where the columns leave the SMs too few programs); no inner-outer kernel
    kernels = _kernels(fd)
    assert kernels and all(k.startswith("reduction_") for k in kernels), kernels


def test_rmsnorm_backward_of_wide_rows_against_torch(device: str, run_kernels) -> None:
    rows, cols = 3, _wide(device, 101)
    x = torch.randn(rows, cols, device=device, requires_grad=True)
    w = torch.randn(cols, device=device, requires_grad=True)
    dy = torch.randn(rows, cols, device=device)
    rms = torch.rsqrt((x * x).mean(1, keepdim=True) + 1e-6)
    (x * rms * w).backward(dy)
    r = rms.detach()
    with FusionDefinition() as fd:
        for out in define_rmsnorm_backward(fd, dy, x.detach(), r, w.detach()):
            fd.add_output(out)  # the last, a per-row statistic: the first launch writes it
    dx, dw, c = run_kernels(fd, [dy, x.detach(), r, w.detach()])
    torch.testing.assert_close(dx, x.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dw, w.grad, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(c, (dy * w.detach() * x.detach()).sum(1, keepdim=True), rtol=1e-4, atol=1e-3)


def test_layernorm_with_a_column_sum_of_wide_rows(device: str, run_kernels) -> None:
    """A var_mean per row and a sum across rows of the normalized rows: the var_mean's two results
    (and the count it carries) come from the first launch."""
    rows, cols = 4, _wide(device, 5)
    x = torch.randn(rows, cols, device=device) * 3 + 100
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        var, mean = fd.ops.var_mean(tx, [1], correction=0, keepdim=True)
        y = fd.ops.mul(fd.ops.sub(tx, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
        fd.add_output(y)
        fd.add_output(fd.ops.sum(y, [0]))
    y, s = run_kernels(fd, [x])
    ref = F.layer_norm(x.double(), (cols,)).float()
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s, ref.sum(0), rtol=1e-4, atol=1e-3)


def test_rows_on_chip_are_not_split() -> None:
    """The split is for rows past half the persistent tile only (``on_chip_row``); up to it one
    inner-outer kernel runs."""
    h200 = Machine(132, 16384, 2048)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        dy = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.mul(dy, fd.ops.sum(fd.ops.mul(dy, x), [1], keepdim=True)))
        fd.add_output(fd.ops.sum(fd.ops.mul(dy, x), [0]))
    assert inner_outer_persistent.row_statistics(fd.fusion, SizeHints(8192, 4096, h200)) == []
    split = inner_outer_persistent.row_statistics(fd.fusion, SizeHints(16384, 4096, h200))
    assert len(split) == 1 and split[0].get_logical_domain()[1].is_reduction()


@pytest.mark.parametrize(("dtype", "stages"), [(DataType.Float, 0), (DataType.BFloat16, 3)])
def test_row_loop_is_pipelined_only_as_deep_as_shared_memory_holds(dtype: DataType, stages: int) -> None:
    """Rows of 11008 in one tile of 16384: three steps of two float32 inputs need 384 KiB of buffers, more
    than an H200's 227 KiB (the kernel failed to launch); bfloat16's 192 KiB fit."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dtype)
        dy = fd.define_tensor([-1, -1], dtype=dtype)
        xf, dyf = fd.ops.cast(x, DataType.Float), fd.ops.cast(dy, DataType.Float)
        fd.add_output(fd.ops.mul(dyf, fd.ops.sum(fd.ops.mul(dyf, xf), [1], keepdim=True)))
        fd.add_output(fd.ops.sum(fd.ops.mul(dyf, xf), [0]))
    params = inner_outer_persistent.compute_heuristics(fd.fusion, SizeHints(11008, 1024, Machine(132, 16384, 2048)))
    assert params.shape == "tile" and params.num_stages == stages


def test_wide_layernorm_training_step_through_torch_compile() -> None:
    """A LayerNorm over rows too long to stay on chip, trained through torch.compile: its backward's
    inner-outer region runs as the split's two launches, also when the region's program is bound and
    replayed (the second step)."""
    torch.manual_seed(0)
    cols = _wide("cpu", 11)
    norm = torch.nn.LayerNorm(cols)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    backend = PyfuserBackend(triton_interpreter=True)
    compiled = torch.compile(norm, backend=backend)
    for _ in range(2):
        x = torch.randn(40, cols)
        dy = torch.randn(40, cols)
        got = [x.clone().requires_grad_()]
        compiled(got[0]).backward(dy)
        got_grads = [got[0].grad, norm.weight.grad.clone(), norm.bias.grad.clone()]
        norm.zero_grad(set_to_none=True)
        want = [x.clone().requires_grad_()]
        norm(want[0]).backward(dy)
        want_grads = [want[0].grad, norm.weight.grad.clone(), norm.bias.grad.clone()]
        norm.zero_grad(set_to_none=True)
        for g, w in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    (backward,) = [g for g in backend.graphs if g.kind == "backward"]
    (region,) = backward.regions
    assert "1 kernel(s)" in region.summary() and "inner_outer_persistent" in region.summary(), region.summary()
    kernels = _kernels(region.fd)  # the segment ran as its parts: a reduction of rows, one across rows
    assert kernels and all(k.startswith("reduction_") for k in kernels), kernels


@pytest.mark.parametrize(("inputs", "stages"), [(2, 3), (6, 2)])
def test_outer_normalization_pipelines_only_as_deep_as_shared_memory_holds(inputs: int, stages: int) -> None:
    """A batch-norm-like normalization over many rows reading several float32 inputs of the whole space:
    three 16 KiB steps of six of them (288 KiB) exceed an H200's 227 KiB of shared memory; two fit."""
    with FusionDefinition() as fd:
        xs = [fd.define_tensor([-1, -1], dtype=DataType.Float) for _ in range(inputs)]
        y = xs[0]
        for x in xs[1:]:
            y = fd.ops.add(y, fd.ops.mul(x, 0.5))
        fd.add_output(fd.ops.sub(y, fd.ops.sum(y, [0], keepdim=True)))
    params = outer_persistent.compute_heuristics(fd.fusion, SizeHints(100000, 1024, Machine(132, 16384, 2048)))
    assert params.shape == "outer" and params.tile_reduced > 0 and params.num_stages == stages, params
