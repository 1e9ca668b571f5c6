"""Where a benchmark's results go: one current file per benchmark and machine kind.

``benchmarks/results/<benchmark>_<kind>.json`` and ``.md`` hold the latest run; a new run overwrites them,
so earlier runs live in git history (``git log -p -- benchmarks/results/<file>``) and the README's table
(``scripts/readme_tables.py``) always reads the current numbers. Every file carries the run's date and
machine kind: the JSON under ``"run"``, the Markdown on the line after its title.
"""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine_kind(device_name: str, count: int = 1) -> str:
    """The short kind in file names: ``"NVIDIA H200"`` -> ``h200``, two of them -> ``h200x2``, no GPU -> ``cpu``."""
    match = re.search(r"\b([A-Z]+\d{2,4})\b", device_name)
    if device_name.lower() in ("", "cpu") or match is None:
        return "cpu"
    return match.group(1).lower() + (f"x{count}" if count > 1 else "")


def kind_label(kind: str) -> str:
    """The machine kind as the device machines name it: ``h200x2`` -> ``nvidia-h200-x2``; ``cpu`` stays."""
    match = re.fullmatch(r"([a-z]+\d+)(?:x(\d+))?", kind)
    if kind == "cpu" or match is None:
        return kind
    return f"nvidia-{match.group(1)}" + (f"-x{match.group(2)}" if match.group(2) else "")


def now_stamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def run_line(benchmark: str, kind: str, stamp: str) -> str:
    """The Markdown header line stating when and where the numbers were measured."""
    return (f"Run: {stamp} on `{kind_label(kind)}` (`benchmarks/{benchmark}.py`); earlier runs: this file's "
            "git history.")


def write_results(benchmark: str, kind: str, data: dict[str, Any], markdown: str, directory: Path = RESULTS,
                  stamp: str | None = None, variant: str = "") -> Path:
    """Write ``<benchmark>[_<variant>]_<kind>.json`` (``data`` plus ``"run"``) and ``.md`` (``markdown`` with the
    run line after its title) into ``directory``, over the previous run's; return the path without suffix.
    ``variant`` names a partial run (some cases, a sweep), so it never replaces the full run's numbers."""
    stamp = stamp or now_stamp()
    directory.mkdir(parents=True, exist_ok=True)
    prefix = directory / "_".join(part for part in (benchmark, variant, kind) if part)
    run = {"benchmark": benchmark, "variant": variant, "machine_kind": kind_label(kind), "date": stamp}
    prefix.with_suffix(".json").write_text(json.dumps({"run": run, **data}, indent=1) + "\n")
    title, _, rest = markdown.partition("\n")
    prefix.with_suffix(".md").write_text(f"{title}\n\n{run_line(benchmark, kind, stamp)}\n{rest}")
    return prefix
