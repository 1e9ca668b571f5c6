"""``PythonProfiler``'s records carry nvFuser's ``KernelProfile`` / ``FusionProfile`` fields: what pyfuser
measures (compile time, bytes, stream) and CUPTI's counters at nvFuser's values without CUPTI."""

from __future__ import annotations

import types

import pytest
import torch

import pyfuser
from pyfuser import FusionDefinition, ParallelType
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.tensor_view import TensorView
from pyfuser.runtime import profiling

INTERPRETER = ["triton_interpreter"]


def _exp_of_sum(x: torch.Tensor, y: torch.Tensor) -> tuple[FusionDefinition, TensorView]:
    with FusionDefinition() as fd:
        a, b = fd.from_pytorch(x), fd.from_pytorch(y)
        out = fd.ops.exp(fd.ops.add(a, b))
        fd.add_output(out)
    return fd, out


def test_manual_kernel_profile_has_the_calls_compile_time_and_bytes() -> None:
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    fd, out_tv = _exp_of_sum(x, y)
    out_tv.axis(1).parallelize(ParallelType.block_x)
    with pyfuser.PythonProfiler(auto_scheduled=False) as prof:
        (out,) = fd.manual_execute([x, y])
        fd.manual_execute([x, y])
    torch.testing.assert_close(out, torch.exp(x + y))
    first, second = prof.profiles
    (kernel,) = first.kernel_profiles
    assert kernel.scheduler == "user" and kernel.device == "cpu" and kernel.stream == 0
    assert kernel.compile_time_ms == first.compile_time_ms > 0
    assert kernel.input_bytes == first.input_bytes == 2 * 32 * 4 and kernel.output_bytes == first.output_bytes == 32 * 4
    assert second.compile_time_ms == second.kernel_profiles[0].compile_time_ms == 0.0  # cached
    # CUPTI's counters, as nvFuser leaves them when it does not measure: present, zero or empty
    assert (kernel.time_ms, kernel.effective_bandwidth_gbs, kernel.percentage_peak_bandwidth) == (0.0, 0.0, 0.0)
    assert (kernel.registers, kernel.correlation_id, kernel.grid_str, kernel.block_str) == (0, 0, "", "")
    assert (kernel.cluster_str, kernel.shared_mem_str) == ("", "")


def test_segments_of_a_program_share_its_compile_time_on_the_fusion_profile() -> None:
    x, y = torch.randn(2, 5), torch.randn(2, 5)
    with FusionDefinition() as fd:
        a, b = fd.from_pytorch(x), fd.from_pytorch(y)
        fd.add_output(fd.ops.sum(fd.ops.sum(fd.ops.add(a, b), dim=-1), dim=-1))
    with pyfuser.PythonProfiler() as prof:
        (out,) = fd.execute([x, y], _enable_options=INTERPRETER)
        fd.execute([x, y], _enable_options=INTERPRETER)
    torch.testing.assert_close(out, (x + y).sum())
    first, second = prof.profiles
    assert first.segments == 2 and first.compile_time_ms > 0 and second.compile_time_ms == 0.0
    # two kernels of one call: neither is the whole call, so per-kernel compile time and bytes are unknown
    assert [(k.compile_time_ms, k.input_bytes, k.output_bytes) for k in first.kernel_profiles] == [(0.0, 0, 0)] * 2
    assert (first.input_bytes, first.output_bytes) == (80, 4)
    assert first.verbose is False and first.kernel_time_ms == first.cuda_evt_time_ms == 0.0
    assert first.percentage_peak_bandwith == first.percentage_peak_bandwidth == 0.0  # nvFuser's spelling too


def test_a_program_of_one_segment_gives_its_kernel_the_calls_bytes() -> None:
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    fd, _ = _exp_of_sum(x, y)
    with pyfuser.PythonProfiler() as prof:
        (out,) = fd.execute([x, y], _enable_options=INTERPRETER)
    torch.testing.assert_close(out, torch.exp(x + y))
    (kernel,) = prof.profile.kernel_profiles
    assert kernel.scheduler == "pointwise" and (kernel.input_bytes, kernel.output_bytes) == (96, 48)
    assert kernel.compile_time_ms == prof.profile.compile_time_ms > 0


def test_stream_is_the_cuda_stream_current_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the kernels were queued on the device's current stream: its id is the kernel's ``stream``."""
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(stream_id=7))
    with profiling.recording() as sink:
        profiling.record(Fusion(), [profiling.SegmentInfo("k", "user")], torch.device("cuda", 0), 0.0, [], [])
    assert sink[0].kernel_profiles[0].stream == 7 and sink[0].kernel_profiles[0].device == "cuda:0"
