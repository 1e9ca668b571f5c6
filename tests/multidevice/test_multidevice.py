"""Launch the multi-device scripts under torchrun (gloo on CPU, NCCL when GPUs are visible).

Each launch runs many cases (process start-up dominates), and a timeout turns any hang into a failure.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
LAUNCH_TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(script: str, nproc: int, env: dict[str, str] | None = None,
             timeout: float = LAUNCH_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-port", str(_free_port()), str(HERE / script)]
    full_env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{HERE}", "OMP_NUM_THREADS": "1",
                "PYFUSER_DIST_TIMEOUT": "60", **(env or {})}
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout, check=False)


def _backend_env(nproc: int) -> dict[str, str]:
    """NCCL with one GPU per rank when there are enough GPUs, else gloo on the CPU."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= nproc:
        return {}
    return {"PYFUSER_DIST_BACKEND": "gloo", "CUDA_VISIBLE_DEVICES": ""}


CASES_2 = [
    "pointwise_sharded_input", "extent_reading_ops_on_sharded_tensors", "fused_qkv_reshape_runs_on_the_shards",
    "reshapes_that_carry_a_shard", "resizes_along_unsharded_axes_run_on_the_shards",
    "reshapes_and_slices_that_need_the_whole_axis", "column_parallel_linear", "column_parallel_grouped_mm",
    "column_parallel_linear_stream_pipelined", "row_parallel_linear_allreduce", "row_parallel_linear_reduce_scatter",
    "row_parallel_linear_stream_pipelined", "row_parallel_matmul_rfactored_by_hand", "sum_over_sharded_axis",
    "matmul_batch_and_contraction_sharding",
    "mesh_not_in_rank_order", "mesh_axis_of_size_one", "sequence_parallel_allgather_linear",
    "seed_004_allgather_linear_pipeline", "seed_004_shard_outermost", "stream_loop_over_split_sharded_axis_errors",
    "stream_loop_gathers_the_shards_of_a_split_sharded_axis",
    "mlp_tensor_and_sequence_parallel", "pipeline_across_meshes", "gather_scatter_reduce_between_meshes",
    "dtensor_wrapper", "bad_inputs_raise_clear_errors", "matmul_output_sharded_on_its_reduction_and_an_output_axis",
    "residual_sequence_sharding_reaches_the_row_parallel_linear",
]
CASES_4 = [*CASES_2, "mesh_2d_data_and_tensor_parallel", "mesh_on_a_subset_of_ranks",
           "resharding_along_two_mesh_axes_at_once", "reshape_on_a_2d_mesh"]
P2P_CASES = [
    "p2p_transport_falls_back_with_one_warning", "p2p_allgather_linear_pipeline", "p2p_linear_reduce_scatter_pipeline",
    "p2p_allgather_several_gemms_and_gathered_output",
    "p2p_without_stream_loop", "p2p_noncontiguous_and_empty_shards", "p2p_only_when_asked",
    "p2p_shards_of_different_shapes_raise", "p2p_chosen_by_size", "pipelines_replayed_from_cuda_graphs",
]


@pytest.mark.parametrize("script, nproc, expected", [("md_cases.py", 2, CASES_2), ("md_cases.py", 4, CASES_4),
                                                      ("md_p2p.py", 2, P2P_CASES), ("md_p2p.py", 4, P2P_CASES)],
                         ids=["2-ranks", "4-ranks", "p2p-2-ranks", "p2p-4-ranks"])
def test_multidevice_cases(script: str, nproc: int, expected: list[str]) -> None:
    assert_cases_passed(torchrun(script, nproc, env=_backend_env(nproc)), nproc, expected)


def assert_cases_passed(result: subprocess.CompletedProcess[str], nproc: int, names: list[str]) -> None:
    """Every rank of a torchrun of case scripts printed PASS for each of ``names`` and none FAIL."""
    output = result.stdout + result.stderr
    # Ranks share one stdout, so lines of different ranks may interleave: match without anchors.
    failed = sorted(set(re.findall(r"FAIL (\w+) rank", result.stdout)))
    assert not failed and result.returncode == 0, f"failed cases {failed}:\n{output[-12000:]}"
    for name in names:
        passed = len(re.findall(rf"PASS {name} rank \d", result.stdout))
        assert passed == nproc, f"{name} passed on {passed} of {nproc} ranks:\n{output[-6000:]}"


FAULT_TIMEOUT_S = 8


def _launch_with_a_failing_rank(extra_env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """``md_fault.py`` on 2 ranks, rank 1 raising on a bad input: rank 1 names the error, rank 0 never
    finishes, and the whole launch ends within a few timeouts (no hang)."""
    start = time.monotonic()
    env = {"PYFUSER_DIST_TIMEOUT": str(FAULT_TIMEOUT_S), **extra_env, **_backend_env(2)}
    result = torchrun("md_fault.py", 2, env=env, timeout=120)
    elapsed = time.monotonic() - start
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-6000:]
    assert re.search(r"RANK 1 FAILED after \d+\.\ds: ValueError: input 0 \(T0\)", result.stdout), output[-6000:]
    assert "RANK 0 finished" not in result.stdout, output[-6000:]
    assert elapsed < FAULT_TIMEOUT_S * 3 + 60, f"the launch took {elapsed:.0f}s"
    return result, env


def test_failing_rank_does_not_block_the_others() -> None:
    result, env = _launch_with_a_failing_rank({})
    output = result.stdout + result.stderr
    if "PYFUSER_DIST_BACKEND" not in env and torch.cuda.is_available():
        return  # NCCL's watchdog aborts the waiting rank's process: no Python error to read
    survivor = re.search(r"RANK 0 FAILED after (\d+\.\d)s: RuntimeError: Communication \d+ \(Allgather",
                         result.stdout)
    assert survivor, output[-6000:]
    assert float(survivor.group(1)) < FAULT_TIMEOUT_S * 3, f"rank 0 waited {survivor.group(1)}s for a dead peer"


def test_failing_rank_does_not_block_p2p_peers() -> None:
    """One rank raises before its copy in a P2P pipeline: the other exits with an error within the timeout
    (gloo: the receive fails; CUDA: the stream waits on a signal that never comes, and the watchdog ends
    the process), never waiting forever."""
    result, env = _launch_with_a_failing_rank({"PYFUSER_FAULT_P2P": "1"})
    output = result.stdout + result.stderr
    if "PYFUSER_DIST_BACKEND" not in env and torch.cuda.is_available():
        watchdog = re.search(r"pyfuser: rank 0: the P2P transfers into T\d+ over team \(0 1\) in execution 2 did not "
                             r"complete within 8s \(PYFUSER_DIST_TIMEOUT\)", result.stderr)
        assert watchdog, output[-6000:]
        return
    survivor = re.search(r"RANK 0 FAILED after (\d+\.\d)s: RuntimeError: P2PCommunication [\d.]+ \(recv with rank 1\) "
                         r"on rank 0 failed", result.stdout)
    assert survivor, output[-6000:]
    assert float(survivor.group(1)) < FAULT_TIMEOUT_S * 3, f"rank 0 waited {survivor.group(1)}s for a dead peer"


def test_multidevice_cases_with_generated_kernels() -> None:
    """The 2-rank cases with generated kernels (Triton's interpreter on CPU): kernels of sharded
    segments see shards, in stream loops chunks, never the global extents."""
    env = {**_backend_env(2), "PYFUSER_ENABLE": "triton_interpreter"}
    if not env.get("PYFUSER_DIST_BACKEND"):
        pytest.skip("on GPUs the 2-rank cases already run with generated kernels")
    result = torchrun("md_cases.py", 2, env=env)
    failed = sorted(set(re.findall(r"FAIL (\w+) rank", result.stdout)))
    assert not failed and result.returncode == 0, f"failed cases {failed}:\n{(result.stdout + result.stderr)[-12000:]}"
    for name in CASES_2:
        assert len(re.findall(rf"PASS {name} rank \d", result.stdout)) == 2, name
