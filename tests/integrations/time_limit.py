"""A wall-clock limit for a test that could otherwise hang (no pytest-timeout here)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType


@contextlib.contextmanager
def time_limit(seconds: int, what: str) -> Iterator[None]:
    """Raise ``TimeoutError`` in the block after ``seconds`` (SIGALRM: the main thread, on POSIX)."""
    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"{what} did not finish within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
