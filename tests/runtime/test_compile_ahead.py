"""Compiling ahead: a program compiled from meta tensors before its first call (what a torch.compile
graph does for its regions), and on a GPU its kernels' variants compiled in threads from a rehearsal
on meta tensors, which the first run's launches take."""

from __future__ import annotations

import pytest
import torch

from pyfuser import FusionDefinition
from pyfuser.codegen import launcher
from pyfuser.runtime.executor import FusionExecutorCache


def _relu_matmul_exp() -> FusionDefinition:
    """A kernel, an ATen matmul, a kernel (the rehearsal runs the matmul on meta tensors between them)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        w = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.exp(fd.ops.matmul(fd.ops.relu(x), w)))
    return fd


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


@pytest.mark.parametrize("ahead", [True, False], ids=["compile_ahead", "disabled"])
def test_a_program_compiled_ahead_from_meta_tensors_serves_the_first_call(device: str, kernel_options: list[str],
                                                                          ahead: bool) -> None:
    fd = _relu_matmul_exp()
    disabled = [] if ahead else ["compile_ahead"]
    x, w = torch.randn(37, 24, device=device), torch.randn(24, 19, device=device) / 5
    fd.fec.compile_ahead([_meta(x), _meta(w)], device=device, enable_options=kernel_options,
                         disable_options=disabled)
    assert fd.fec.compile_count == 1
    taken = launcher.variants_compiled_ahead
    (got,) = fd.execute([x, w], _enable_options=kernel_options, _disable_options=disabled)
    torch.testing.assert_close(got, torch.exp(torch.relu(x) @ w))
    assert fd.fec.compile_count == 1
    # On a GPU the first run's two kernels took their variants from compile threads (none disabled).
    assert launcher.variants_compiled_ahead - taken == (2 if device == "cuda" and ahead else 0)
    (got,) = fd.execute([x.t().contiguous().t(), w], _enable_options=kernel_options, _disable_options=disabled)
    torch.testing.assert_close(got, torch.exp(torch.relu(x) @ w))
    assert fd.fec.compile_count == 2  # another layout: compiled at its first call


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_programs_first_run_takes_variants_compiled_from_its_rehearsal() -> None:
    """Without a caller compiling ahead, a CUDA program's first run rehearses it on meta tensors first:
    each kernel's variant compiles in a thread, the run takes them (and launches nothing twice)."""
    fd = _relu_matmul_exp()
    x, w = torch.randn(300, 64, device="cuda"), torch.randn(64, 48, device="cuda")
    taken = launcher.variants_compiled_ahead
    for _ in range(2):
        (got,) = fd.execute([x, w])
        torch.testing.assert_close(got, torch.exp(torch.relu(x) @ w))
    assert launcher.variants_compiled_ahead - taken == 2 and fd.fec.compile_count == 1


def test_a_torch_profiler_does_not_see_the_rehearsals_aten_calls() -> None:
    """A CUDA program's first call rehearses it on meta tensors, its ATen calls included: a torch profiler of
    that call sees each of them once, the real one (nvFuser's stream tests count a profiled call's
    ``aten::mm``). The rehearsal is called directly here, for device 0, on a program compiled for the CPU."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        w = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.matmul(x, w))
    args = [torch.randn(5, 7), torch.randn(7, 6)]
    fd.execute(args)
    program, binder = fd.fec.last_program, fd.fec._binder
    with torch.profiler.profile(record_shapes=True) as profile:
        FusionExecutorCache._rehearse(program, args, binder, torch.device("cuda", 0))  # type: ignore[arg-type]
        torch.mm(*args)
    assert [e.input_shapes for e in profile.events() if e.name == "aten::mm"] == [[[5, 7], [7, 6]]]
    with torch.profiler.profile() as profile:  # the thread's record functions are on again
        torch.mm(*args)
    assert [e.name for e in profile.events() if e.name == "aten::mm"] == ["aten::mm"]
