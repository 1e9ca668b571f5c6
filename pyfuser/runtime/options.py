"""Debug dumps (``PYFUSER_DUMP=a,b``) and per-execution enable / disable options."""

from __future__ import annotations

import os
from collections.abc import Iterable

#: Dump names and what they print (to stdout, when a program is compiled).
DUMP_OPTIONS: dict[str, str] = {
    "fusion_ir": "the fusion as defined: inputs, outputs, math and each tensor's domains",
    "fusion_ir_math": "the fusion's %kernel_math block",
    "fusion_ir_preseg": "the fusion after each pre-segmentation pass, under the pass's name",
    "host_ir": "the Host IR program each compiled fusion runs",
}

#: Options ``execute(_enable_options=..., _disable_options=...)`` understands.
ENABLE_OPTIONS: dict[str, str] = {
    "stream_overlap": "iterations of a stream loop run concurrently (join the user's stream after the loop)",
}
DISABLE_OPTIONS: dict[str, str] = {
    "infer_contiguity": "allocation-order inference (outputs without a requirement stay row-major)",
    "stream_ring_buffers": "ring buffers for stream-loop intermediates (allocate them whole instead)",
}


def _parse_dump(raw: str | None) -> frozenset[str]:
    if not raw:
        return frozenset()
    names = frozenset(n.strip() for n in raw.split(",") if n.strip())
    unknown = sorted(names - DUMP_OPTIONS.keys())
    if unknown:
        raise ValueError(f"PYFUSER_DUMP names unknown dumps {unknown}; known: {sorted(DUMP_OPTIONS)}")
    return names


def dump_enabled(name: str) -> bool:
    """Read the environment each time so tests and users can toggle dumps at run time."""
    return name in _parse_dump(os.environ.get("PYFUSER_DUMP"))


def check_options(enable: Iterable[str], disable: Iterable[str]) -> tuple[frozenset[str], frozenset[str]]:
    for given, kind in ((enable, "_enable_options"), (disable, "_disable_options")):
        if isinstance(given, str):  # iterating it would check its letters
            raise TypeError(f"{kind} must be a list of option names, got the string {given!r}; write [{given!r}]")
    enabled, disabled = frozenset(enable), frozenset(disable)
    for given, known, kind in ((enabled, ENABLE_OPTIONS, "_enable_options"), (disabled, DISABLE_OPTIONS, "_disable_options")):
        unknown = sorted(given - known.keys())
        if unknown:
            raise ValueError(f"{kind}: unknown option(s) {unknown}; known: {sorted(known) or 'none'}")
    return enabled, disabled
