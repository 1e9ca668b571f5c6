"""Launch the multi-device cases of nvFuser's API (md_api_cases.py) on 2 ranks under torchrun."""

from __future__ import annotations

import re

from test_multidevice import _backend_env, torchrun

CASES = ["all_to_all_dispatch_and_combine", "sharding_through_an_inner_split", "dtensors_in_and_out",
         "sdpa_head_and_context_parallel"]


def test_multidevice_api_cases() -> None:
    result = torchrun("md_api_cases.py", 2, env=_backend_env(2))
    output = result.stdout + result.stderr
    failed = sorted(set(re.findall(r"FAIL (\w+) rank", result.stdout)))
    assert not failed and result.returncode == 0, f"failed cases {failed}:\n{output[-12000:]}"
    for name in CASES:
        passed = len(re.findall(rf"PASS {name} rank \d", result.stdout))
        assert passed == 2, f"{name} passed on {passed} of 2 ranks:\n{output[-6000:]}"
