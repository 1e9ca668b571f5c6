"""Random ops: the distribution's statistics, reproducibility given rng_seed / rng_offset (across
runs and devices' generators), torch.manual_seed without a seed, Python definitions, bad input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from tests.ir.test_python_definition import rebuild


def seeded(fd: FusionDefinition) -> None:
    x = fd.define_tensor([-1, -1])
    seed, offset = fd.define_scalar(dtype=DataType.Int), fd.define_scalar(dtype=DataType.Int)
    rows, cols = fd.ops.shape(x)
    fd.add_output(fd.ops.uniform(-2.0, 3.0, [rows, cols], rng_seed=seed, rng_offset=offset))
    fd.add_output(fd.ops.normal(1.0, 0.5, [cols, 4000], rng_seed=seed, rng_offset=offset, dtype=DataType.Double))


def test_seeded_values_depend_on_seed_and_offset_only(device: str) -> None:
    with FusionDefinition() as fd:
        seeded(fd)
    x = torch.empty(30, 20, device=device)
    u1, n1 = fd.execute([x, 7, 0])
    torch.manual_seed(123)  # the default generator plays no part
    u2, n2 = fd.execute([x, 7, 0])
    assert torch.equal(u1, u2) and torch.equal(n1, n2)
    u3, _ = fd.execute([x, 7, 1])
    u4, _ = fd.execute([x, 8, 0])
    assert not torch.equal(u1, u3) and not torch.equal(u1, u4) and not torch.equal(u3, u4)
    assert u1.dtype == torch.float32 and n1.dtype == torch.float64 and n1.shape == (20, 4000)
    assert -2.0 <= u1.min().item() and u1.max().item() < 3.0
    assert abs(u1.mean().item() - 0.5) < 0.2
    assert abs(n1.mean().item() - 1.0) < 0.02 and abs(n1.std().item() - 0.5) < 0.02
    u5, n5 = rebuild(fd).execute([x, 7, 0])  # the printed definition keeps the seed
    assert torch.equal(u1, u5) and torch.equal(n1, n5)


def test_without_a_seed_torch_manual_seed_repeats_a_run(device: str) -> None:
    x = torch.randn(8, 16, device=device, dtype=torch.half)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.rand_like(t))
        fd.add_output(fd.ops.randn_like(t))
        fd.add_output(fd.ops.uniform(0, 1, [3]))
    torch.manual_seed(5)
    first = fd.execute([x])
    torch.manual_seed(5)
    again = fd.execute([x])
    other = fd.execute([x])
    for a, b, c in zip(first, again, other, strict=True):
        assert torch.equal(a, b) and not torch.equal(a, c)
    assert first[0].dtype == torch.half and first[0].shape == (8, 16)
    assert 0 <= first[0].min().item() and first[0].max().item() <= 1


@pytest.mark.parametrize(("call", "error", "pattern"), [
    (lambda fd, x: fd.ops.uniform(0, 1, [2], rng_seed=1), ValueError, r"uniform: rng_seed and rng_offset go together"),
    (lambda fd, x: fd.ops.uniform(0, 1, [2], rng_seed=1.5, rng_offset=0), TypeError,
     r"uniform: rng_seed must be an int or an integer scalar"),
    (lambda fd, x: fd.ops.normal(x, 1, [2]), TypeError, r"normal: the first parameter must be a real number or scalar"),
    (lambda fd, x: fd.ops.uniform(0, 1, [2], dtype=DataType.Int), TypeError,
     r"uniform: dtype must be a floating-point type, got int64_t"),
    (lambda fd, x: fd.ops.uniform(0, 1, [-2]), ValueError, r"uniform shape\[0\]: expected a non-negative size, got -2"),
    (lambda fd, x: fd.ops.rand_like(fd.ops.cast(x, DataType.Int)), TypeError, r"rand_like: T\d+ has dtype int64_t"),
])
def test_bad_arguments(call: Callable[..., Any], error: type[Exception], pattern: str) -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        with pytest.raises(error, match=pattern):
            call(fd, x)


def test_negative_std_at_run_time() -> None:
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.normal(0.0, fd.define_scalar(dtype=DataType.Double), [3]))
    with pytest.raises(ValueError, match=r"normal: std must be non-negative, got -1.0"):
        fd.execute([-1.0])
