"""Segmentation is read from what a fusion runs: with generated kernels, as codegen's tests run them."""

from __future__ import annotations

import pytest

from tests.codegen.conftest import RunKernels, execute_with_kernels


@pytest.fixture
def run_kernels() -> RunKernels:
    return execute_with_kernels
