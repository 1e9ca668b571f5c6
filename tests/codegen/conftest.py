"""Generated kernels in tests: on CPU through Triton's interpreter, on CUDA natively."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.scheduler.registry import Machine, SchedulerType

RunKernels = Callable[..., list[torch.Tensor]]


def execute_with_kernels(fd: FusionDefinition, inputs: Sequence[Any], **kwargs: Any) -> list[torch.Tensor]:
    """Execute with generated kernels (the interpreter on CPU) and check a kernel actually ran."""
    on_cuda = (any(isinstance(a, torch.Tensor) and a.is_cuda for a in inputs)
               or torch.device(kwargs.get("device") or "cpu").type == "cuda")
    options = list(kwargs.pop("_enable_options", ()))
    if not on_cuda:
        options.append("triton_interpreter")
    outputs = fd.execute(inputs, _enable_options=options, **kwargs)
    assert fd.last_kernel_code(), "no generated kernel ran"
    return outputs


def execute_with_aten(fd: FusionDefinition, inputs: Sequence[Any]) -> list[torch.Tensor]:
    """The oracle: every expr as an ATen call."""
    return fd.execute(inputs, _disable_options=["kernel_codegen"])


@pytest.fixture
def run_kernels() -> RunKernels:
    return execute_with_kernels


@pytest.fixture
def run_aten() -> RunKernels:
    return execute_with_aten


@pytest.fixture
def one_program_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Schedulers size grids for a machine of one program at a time: a grid reduction's steps then run
    as one cooperative launch, also in Triton's interpreter (which runs one program at a time)."""
    monkeypatch.setattr(Machine, "of", staticmethod(lambda _device: Machine(1, 1024, 128)))


def kernel_segments(fd: FusionDefinition) -> list[Any]:
    """The kernel segments the latest execution launched, in order."""
    program = fd.fec.last_program
    return [n.segment for n in program.container.walk() if type(n).__name__ == "LaunchKernel"]


def kernel_schedulers(fd: FusionDefinition) -> list[str]:
    """The scheduler of each kernel the latest execution launched (``pointwise``, ``reduction``, ...): the
    longest scheduler name that begins its kernel's name (``<scheduler>_<ops>_kernel``)."""
    names = sorted((t.name for t in SchedulerType), key=len, reverse=True)
    return [next(n for n in names if s.name.startswith(f"{n}_")) for s in kernel_segments(fd)]


def tile_branches(code: str) -> tuple[str, str] | None:
    """(the branch a kernel's programs with a full tile take, the source the other programs run, each
    access once) of a kernel written with both (``KernelBuilder._full_tiles_apart``); None for one body."""
    lines = code.splitlines()
    start = next((k for k, line in enumerate(lines) if line.startswith("    if (pid") and " <= " in line), None)
    if start is None:
        return None
    end = lines.index("    else:", start)
    return "\n".join(lines[start + 1:end]), "\n".join(lines[:start] + [line[4:] for line in lines[end + 1:]])


def masked_path(code: str) -> str:
    """A kernel's source as its programs without a full tile run it (the whole source for one body)."""
    branches = tile_branches(code)
    return code if branches is None else branches[1]


def define_layernorm_backward(fd: FusionDefinition, dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor,
                              rstd: torch.Tensor, w: torch.Tensor) -> tuple[Any, Any, Any]:
    """LayerNorm's backward over the last axis of 2-D ``x`` in ``fd`` (``mean``, ``rstd``: the rows' statistics,
    kept as ``[rows, 1]``; 16-bit ``dy``, ``x`` and ``w`` computed in float32): dx, dw and db."""
    tdy, tx, tmean, trstd, tw = (fd.from_pytorch(t) for t in (dy, x, mean, rstd, w))
    if x.dtype is not torch.float32:
        tdy, tx, tw = (fd.ops.cast(t, DataType.Float) for t in (tdy, tx, tw))
    xhat = fd.ops.mul(fd.ops.sub(tx, tmean), trstd)
    g = fd.ops.mul(tdy, fd.ops.broadcast(tw, [True, False]))
    a = fd.ops.sum(g, [1], keepdim=True)
    c = fd.ops.sum(fd.ops.mul(g, xhat), [1], keepdim=True)
    cols = float(x.shape[-1])
    dx = fd.ops.mul(trstd, fd.ops.sub(fd.ops.sub(g, fd.ops.div(a, cols)), fd.ops.mul(xhat, fd.ops.div(c, cols))))
    return dx, fd.ops.sum(fd.ops.mul(tdy, xhat), [0]), fd.ops.sum(tdy, [0])


def define_rmsnorm_backward(fd: FusionDefinition, dy: torch.Tensor, x: torch.Tensor, rms: torch.Tensor,
                            w: torch.Tensor) -> tuple[Any, Any, Any]:
    """RMSNorm's backward over the last axis of 2-D ``x`` in ``fd`` (``rms``: the rows' ``rsqrt(mean(x * x)
    + eps)``, kept as ``[rows, 1]``): dx, dw and the per-row sum ``sum(dy * w * x)`` it reads."""
    tdy, tx, tr, tw = (fd.from_pytorch(t) for t in (dy, x, rms, w))
    g = fd.ops.mul(tdy, fd.ops.broadcast(tw, [True, False]))
    c = fd.ops.sum(fd.ops.mul(g, tx), [1], keepdim=True)
    r3 = fd.ops.mul(fd.ops.mul(tr, tr), tr)
    dx = fd.ops.sub(fd.ops.mul(g, tr), fd.ops.mul(tx, fd.ops.mul(r3, fd.ops.div(c, float(x.shape[-1])))))
    return dx, fd.ops.sum(fd.ops.mul(tdy, fd.ops.mul(tx, tr)), [0]), c
