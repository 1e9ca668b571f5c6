"""The ordered list of pre-segmentation passes, in one place."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pyfuser.ir.fusion import Fusion

if TYPE_CHECKING:
    from pyfuser.runtime.executor import CompileOptions

Pass = Callable[[Fusion, "CompileOptions"], None]

#: (name, pass) in the order they run.
PASSES: list[tuple[str, Pass]] = []


def run_preseg_passes(fusion: Fusion, options: CompileOptions) -> None:
    for _name, run in PASSES:
        run(fusion, options)
