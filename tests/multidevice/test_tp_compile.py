"""Tensor + sequence parallel blocks compiled by the pyfuser backend, under torchrun on 2 and 4 ranks (gloo on
CPUs, NCCL when every rank has a GPU): md_tp_compile.py's cases."""

from __future__ import annotations

import pytest
from test_multidevice import _backend_env, assert_cases_passed, torchrun

BLOCKS = ["tp_sp_transformer_block"]
#: the pattern matcher's cases do not depend on the ranks' count: on 2 ranks only (each launch compiles anew)
CASES = [*BLOCKS, "allgather_matmul_pipeline_in_inference", "collectives_not_fed_by_a_matmul_run_as_they_are",
         "collective_matmul_chosen_by_size"]
#: the cases check the pipelines' programs, which the machine model would not choose at their tiny sizes on CPUs
#: (``collective_matmul_chosen_by_size`` clears this to see the choice)
FORCE_PIPELINES = {"PYFUSER_ENABLE": "p2p_pipelines_always"}


@pytest.mark.parametrize("nproc, names", [(2, CASES), (4, BLOCKS)], ids=["2-ranks", "4-ranks"])
def test_tp_sp_blocks_compiled(nproc: int, names: list[str]) -> None:
    env = {**_backend_env(nproc), **FORCE_PIPELINES, "PYFUSER_MD_CASES": ",".join(names)}
    assert_cases_passed(torchrun("md_tp_compile.py", nproc, env=env), nproc, names)
