"""What an op needs at execution besides its operands: bound sizes and the device."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class EvalContext:
    #: Values of symbolic extents and input scalars, by name (``i0`` -> 128).
    env: dict[str, int] = field(default_factory=dict)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
