"""Shared fixtures: deterministic seeds, the devices tests run on, and bound programs on them."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import settings

# CI replays the same examples every run (a landing never hinges on a lucky draw); local runs
# explore new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _seed() -> Iterator[None]:
    torch.manual_seed(0)
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    stream = torch.cuda.current_stream() if cuda else None
    yield
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # A test that leaves torch's CUDA generator capturing (a capture that failed midway) fails
        # itself here, not whichever test of the worker draws random numbers next.
        torch.randn(1, device="cuda")
        # So does a test after which another stream is current (a stream switch not undone on an
        # error path): the next test of the worker would issue its work there.
        current = torch.cuda.current_stream()
        if stream is not None and current != stream:
            torch.cuda.set_stream(stream)
            pytest.fail(f"the test left {current} current (it started on {stream})")


def devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=devices())
def device(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def kernel_options(device: str) -> list[str]:
    """``_enable_options`` that run generated kernels on ``device`` (through Triton's interpreter on CPU)."""
    return ["triton_interpreter"] if device == "cpu" else []


@pytest.fixture
def bind(kernel_options: list[str]) -> Callable[[Any, list[torch.Tensor]], Any]:
    """``bind(fd, args)``: ``fd`` executed once on ``args`` with generated kernels, then its program bound
    to their signature (``fec.bound_program``: what a static-shape torch.compile region runs)."""
    def bound_program(fd: Any, args: list[torch.Tensor]) -> Any:
        fd.execute(args, _enable_options=kernel_options)
        bound = fd.fec.bound_program(args, enable_options=kernel_options)
        assert bound is not None
        return bound

    return bound_program
