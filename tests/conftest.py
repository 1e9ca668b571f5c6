"""Shared fixtures: deterministic seeds and the devices tests run on."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings

# CI replays the same examples every run (a landing never hinges on a lucky draw); local runs
# explore new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=devices())
def device(request: pytest.FixtureRequest) -> str:
    return request.param
