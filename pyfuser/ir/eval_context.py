"""What an op needs at execution besides its operands: bound sizes and the device; and what a
compiled segment signals when it cannot compute a launch."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class EvalContext:
    #: Values of symbolic extents and input scalars, by name (``i0`` -> 128).
    env: dict[str, int] = field(default_factory=dict)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    #: A bound program's token (``runtime.executor.BoundProgram``): every run under it has the same
    #: sizes, input strides and layouts, which its caller vouches for, so a kernel launch recorded on
    #: its first run replays (``codegen.launcher.bound_launch``). None: each run may differ.
    binding: object | None = None


class NoPrograms(Exception):  # a signal to the caller, not an error
    """A kernel's grid has no program for these sizes (an extent it spans is 0) while an output it
    writes is not empty (a reduction of an empty axis, or a broadcast, beside an empty tensor): the
    caller computes the segment's exprs with ATen instead."""
