"""Shared fixtures: deterministic seeds and the devices tests run on."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=devices())
def device(request: pytest.FixtureRequest) -> str:
    return request.param
