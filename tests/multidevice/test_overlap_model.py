"""``comm/overlap_model.py``: the one decision between a P2P pipeline and the plain collective then GEMM
(2-rank runs of both choices: md_p2p.py's ``p2p_chosen_by_size``)."""

from __future__ import annotations

import pytest
import torch

from pyfuser.comm.overlap_model import CPU, H100, H200, MachineModel, Pattern, decide, machine_model
from pyfuser.options import CompileOptions, DisableOption, EnableOption

AUTO = CompileOptions()
CUBES = [1024, 2048, 4096, 8192, 16384]


@pytest.mark.parametrize("pattern", list(Pattern))
@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_small_sizes_run_plain_large_ones_pipelined_on_h100(pattern: Pattern, ranks: int) -> None:
    """Issue 32's measurements: at 4096^3 the pipelines lost to the collective then GEMM on 2 and 4 H100s, at
    8192^3 and 16384 x 8192 x 8192 they won."""
    for size in (1024, 2048, 4096):
        decision = decide(pattern, size, size, size, torch.bfloat16, ranks, 1, AUTO, H100)
        assert not decision.pipelined, decision
        assert decision.pipelined_s is not None and decision.plain_s is not None
    for m, k, n in ((8192, 8192, 8192), (16384, 8192, 8192)):
        decision = decide(pattern, m, k, n, torch.bfloat16, ranks, 1, AUTO, H100)
        assert decision.pipelined, decision


@pytest.mark.parametrize("model", [H100, H200, CPU])
@pytest.mark.parametrize("pattern", list(Pattern))
@pytest.mark.parametrize("ranks, chunks", [(2, 1), (2, 2), (4, 1), (4, 4)])
def test_once_pipelining_pays_it_pays_at_every_larger_size(model: MachineModel, pattern: Pattern, ranks: int,
                                                           chunks: int) -> None:
    """Monotonic in the size (cubes M = K = N): the pipeline's gain (plain - pipelined) grows with the size, and
    the choice never flips back to plain at a larger size."""
    sizes = [s * chunks * ranks for s in (4, 16, 64, 256, 1024, 4096, 16384)]
    gains, choices = [], []
    for m in sizes:
        decision = decide(pattern, m, m, m, torch.bfloat16, ranks, chunks, AUTO, model)
        assert decision.plain_s is not None and decision.pipelined_s is not None
        gains.append(decision.plain_s - decision.pipelined_s)
        choices.append(decision.pipelined)
    assert gains == sorted(gains), (sizes, gains)
    assert choices == sorted(choices), (sizes, choices)  # False ... False True ... True
    assert not choices[0] and choices[-1], "the smallest size should run plain, the largest pipelined"


@pytest.mark.parametrize("pattern", list(Pattern))
@pytest.mark.parametrize("ranks", [2, 4])
def test_a_program_replayed_from_a_cuda_graph_pipelines_from_smaller_sizes(pattern: Pattern, ranks: int) -> None:
    """Replayed, no node is issued from the host: 4096^3 pipelines on 2 and 4 H200s (measured: 0.22 / 0.28 ms
    against 0.29 / 0.35 for the collective then GEMM, both replayed), and the estimates lose their host terms."""
    replayed = CompileOptions(enabled=frozenset({EnableOption.cuda_graph}), device=torch.device("cuda"))
    on_cpu = CompileOptions(enabled=frozenset({EnableOption.cuda_graph}))  # no graph on the CPU: as issued
    for size in (4096, 8192):
        graph = decide(pattern, size, size, size, torch.bfloat16, ranks, 1, replayed, H200)
        issued = decide(pattern, size, size, size, torch.bfloat16, ranks, 1, AUTO, H200)
        assert graph.pipelined and "replayed from a CUDA graph" in str(graph), graph
        assert graph.pipelined_s is not None and issued.pipelined_s is not None and graph.plain_s is not None
        assert issued.plain_s is not None and graph.pipelined_s <= issued.pipelined_s and graph.plain_s <= issued.plain_s
    assert not decide(pattern, 4096, 4096, 4096, torch.bfloat16, ranks, 1, on_cpu, H100).pipelined
    assert not decide(pattern, 4096, 4096, 4096, torch.bfloat16, ranks, 1, AUTO, H100).pipelined


def test_more_chunks_cost_host_time_at_small_sizes() -> None:
    one, four = (decide(Pattern.allgather_gemm, 4096, 4096, 4096, torch.bfloat16, 4, s, AUTO, H100) for s in (1, 4))
    assert one.pipelined_s is not None and four.pipelined_s is not None and four.pipelined_s > one.pipelined_s


@pytest.mark.parametrize("pattern", list(Pattern))
def test_the_options_force_either_choice(pattern: Pattern) -> None:
    always = CompileOptions(enabled=frozenset({EnableOption.p2p_pipelines_always}))
    never = CompileOptions(disabled=frozenset({DisableOption.p2p_pipelines}))
    both = CompileOptions(enabled=always.enabled, disabled=never.disabled)
    small = (pattern, 64, 64, 64, torch.float32, 2, 1)
    large = (pattern, 16384, 8192, 8192, torch.bfloat16, 4, 1)
    assert not decide(*small, AUTO, H100).pipelined and decide(*small, always, H100).pipelined
    assert decide(*large, AUTO, H100).pipelined and not decide(*large, never, H100).pipelined
    assert not decide(*large, both, H100).pipelined  # the disable wins
    assert "forced" in str(decide(*large, never, H100))


def test_model_by_device_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYFUSER_OVERLAP_MODEL", raising=False)
    assert machine_model(torch.device("cpu")) is CPU
    monkeypatch.setenv("PYFUSER_OVERLAP_MODEL", "500, 200, 5, 15, 10")
    model = machine_model(torch.device("cpu"))
    assert (model.gemm_flops, model.link_bytes_s, model.transfer_s, model.collective_s, model.host_node_s) == \
        pytest.approx((500e12, 200e9, 5e-6, 15e-6, 10e-6))
    for bad in ("500,200", "fast,200,5,15,10", "0,200,5,15,10", "500,200,-1,15,10"):
        monkeypatch.setenv("PYFUSER_OVERLAP_MODEL", bad)
        with pytest.raises(ValueError, match=r"PYFUSER_OVERLAP_MODEL must be 5 non-negative numbers .*" + bad[:4]):
            machine_model(torch.device("cpu"))


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match=r"ranks \(0\) and chunks \(1\) must be positive"):
        decide(Pattern.allgather_gemm, 64, 64, 64, torch.float32, 0, 1, AUTO, CPU)
