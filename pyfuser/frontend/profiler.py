"""``with PythonProfiler() as prof: fd.execute(...)``: what the executions inside ran (nvFuser's
``PythonProfiler``): ``prof.profile`` is the last one's ``FusionProfile``, ``prof.profiles`` all."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from pyfuser.runtime.profiling import FusionProfile, KernelProfile, recording

__all__ = ["FusionProfile", "KernelProfile", "PythonProfiler"]


class PythonProfiler:
    """Records each ``execute`` / ``manual_execute`` inside its block: the segments the fusion ran as,
    each segment's kernel (or ATen ops) and scheduler (``"user"`` for ``manual_execute``), the call's
    host time and bytes. ``auto_scheduled`` is nvFuser's argument; both kinds are always recorded."""

    def __init__(self, auto_scheduled: bool = True) -> None:
        self.auto_scheduled = auto_scheduled
        self.profiles: list[FusionProfile] = []
        self._recording: AbstractContextManager[list[FusionProfile]] | None = None

    def __enter__(self) -> PythonProfiler:
        self._recording = recording()
        self.profiles = self._recording.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._recording is not None
        self._recording.__exit__(*exc)
        self._recording = None

    @property
    def profile(self) -> FusionProfile:
        if not self.profiles:
            raise ValueError("PythonProfiler: no fusion was executed inside the profiler's with block")
        return self.profiles[-1]
