"""Launch the multi-device cases of nvFuser's API (md_api_cases.py) on 2 ranks under torchrun."""

from __future__ import annotations

from test_multidevice import _backend_env, assert_cases_passed, torchrun

CASES = ["all_to_all_dispatch_and_combine", "sharding_through_an_inner_split", "dtensors_in_and_out",
         "sdpa_head_and_context_parallel", "sdpa_training_head_parallel_runs_on_the_shards",
         "fused_qkv_heads_sharded_through_a_reshape"]


def test_multidevice_api_cases() -> None:
    assert_cases_passed(torchrun("md_api_cases.py", 2, env=_backend_env(2)), 2, CASES)
