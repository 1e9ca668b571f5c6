"""Shared helpers of the torchrun-launched multi-device test scripts.

A script registers cases with ``@case`` and calls ``main()``: every rank runs every case in order and
reports ``PASS name`` / ``FAIL name`` lines; the process exits non-zero when any case failed on it. Cases
run on CUDA with NCCL when GPUs are visible (one per local rank), else on the CPU with gloo.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

import torch

from pyfuser.multidevice import Communicator

CASES: list[tuple[str, int, Callable[[], None]]] = []


def case(min_world: int = 1) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """Register a case that needs at least ``min_world`` processes."""
    def register(fn: Callable[[], None]) -> Callable[[], None]:
        CASES.append((fn.__name__, min_world, fn))
        return fn
    return register


def comm() -> Communicator:
    return Communicator.instance()


def device() -> torch.device:
    return comm().device()


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The same full tensor on every rank (a shared seed), on this rank's device."""
    gen = torch.Generator().manual_seed(hash(shape) % (2**31))
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype=dtype, device=device())


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, atol: float = 1e-4,
                 rtol: float = 1e-4) -> None:
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    torch.testing.assert_close(actual, expected.to(actual.dtype), atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


def expect_error(fn: Callable[[], object], exc: type[Exception], *needles: str) -> str:
    """Run ``fn``; it must raise ``exc`` with every needle in the message."""
    try:
        fn()
    except exc as e:
        message = str(e)
        missing = [n for n in needles if n not in message]
        if missing:
            raise AssertionError(f"{exc.__name__} message lacks {missing}: {message}") from e
        return message
    raise AssertionError(f"expected {exc.__name__} mentioning {needles}, but nothing was raised")


def main() -> None:
    c = comm()
    only = set(filter(None, os.environ.get("PYFUSER_MD_CASES", "").split(",")))
    failed = []
    for name, min_world, fn in CASES:
        if (only and name not in only) or c.size() < min_world:
            continue
        try:
            fn()
            print(f"PASS {name} rank {c.rank()}", flush=True)
        except Exception:  # report every case, then fail the process
            failed.append(name)
            print(f"FAIL {name} rank {c.rank()}\n{traceback.format_exc()}", flush=True)
        c.barrier()
    c.shutdown()
    # Skip the interpreter's finalization: with the groups destroyed and every result printed, what is
    # left is torch's C++ teardown, where a gloo worker thread that outlives the interpreter now and then
    # aborts the process ("terminate called without an active exception", CI 2026-11-24) after every
    # case passed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if failed else 0)
