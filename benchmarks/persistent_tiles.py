"""Tiles of whole rows by row width: how many rows a program holds and on how many warps, for the
inner persistent scheduler (layernorm, softmax) and the plain reduction of rows (row sum), beside
torch.compile, measured side by side in one process.

Each variant runs through ``fd.manual_execute`` with the default parameters edited; GB/s of bytes
read + written, timed by ``kernels.bench`` (L2 flushed, host time hidden) in rotated rounds, median
over rounds. What the defaults (``reduction_schedule.inner_params``) were tuned from.

    python benchmarks/persistent_tiles.py [--rounds 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernels import _layernorm, _softmax, bench, gbps
from results_files import RESULTS, machine_kind, write_results

from pyfuser import DataType, FusionDefinition, schedule
from pyfuser.schedule import SchedulerType

BF16 = torch.bfloat16


def _row_sum(fd: FusionDefinition, inputs: list[torch.Tensor]) -> None:
    fd.add_output(fd.ops.sum(fd.ops.cast(fd.from_pytorch(inputs[0]), DataType.Float), [1]))


@dataclasses.dataclass
class Op:
    name: str
    define: Callable[[FusionDefinition, list[torch.Tensor]], None]
    eager: Callable[..., Any]
    scheduler: SchedulerType
    widths: tuple[int, ...]


OPS = [
    Op("layernorm", _layernorm, lambda x, w, b: F.layer_norm(x, (x.shape[1],), w, b), SchedulerType.inner_persistent,
       (256, 512, 1024, 2048, 4096)),
    Op("softmax", _softmax, lambda x: torch.softmax(x.float(), -1).to(BF16), SchedulerType.inner_persistent,
       (256, 512, 1024, 2048, 4096)),
    Op("row_sum", _row_sum, lambda x: x.float().sum(1), SchedulerType.reduction, (256, 1024, 2048)),
]
#: rows of each width: 8 Mi elements (16 MiB of bf16 read)
ELEMENTS = 1 << 23


def measure(op: Op, width: int, rounds: int) -> dict[str, Any]:
    x = torch.randn(ELEMENTS // width, width, device="cuda", dtype=BF16)
    inputs = [x] if op.name != "layernorm" else [x, torch.randn(width, device="cuda", dtype=BF16),
                                                  torch.randn(width, device="cuda", dtype=BF16)]
    written = x.numel() * 2 if op.name != "row_sum" else x.shape[0] * 4
    nbytes = x.numel() * 2 + written
    with FusionDefinition() as probe:
        op.define(probe, inputs)
    default = schedule.compute_heuristics(probe.fusion, op.scheduler, inputs)
    torch._dynamo.reset()  # each shape compiled afresh (no dynamic-shape recompilation)
    compiled = torch.compile(op.eager, dynamic=False)
    variants: dict[str, Callable[[], Any]] = {"torch.compile": lambda: compiled(*inputs)}
    for rows in (1, 2, 4, 8, 16):
        for warps in (1, 2, 4, 8):
            is_default = (rows, warps) == (default.rows, default.num_warps)
            if not is_default and (rows * width > 8192 or rows * width < 128 * warps):
                continue  # over the tile's registers, or under 4 elements a thread
            params = dataclasses.replace(default, rows=rows, num_warps=warps)
            with FusionDefinition() as fd:
                op.define(fd, inputs)
                schedule.schedule(fd.fusion, op.scheduler, params)
            fd.manual_execute(inputs, params)
            name = f"{rows} rows, {warps} warps" + (" (default)" if is_default else "")
            variants[name] = lambda fd=fd, params=params: fd.manual_execute(inputs, params)
    names = list(variants)
    runs: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            runs[name].append(gbps(nbytes, bench(variants[name], rep_ms=50)))
    return {"op": op.name, "shape": list(x.shape), "GBps": {k: statistics.median(v) for k, v in runs.items()}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    torch.manual_seed(0)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                              "torch": torch.__version__, "cases": []}
    lines = [f"# Tiles of whole rows, {result['device']} ({result['date']})", "",
             "GB/s of bytes read + written, median of rotated rounds; the default, the best three variants.", "",
             "| op | shape | torch.compile | default | best variants |", "| --- | --- | ---: | ---: | --- |"]
    for op in OPS:
        for width in op.widths:
            case = measure(op, width, args.rounds)
            result["cases"].append(case)
            speeds = case["GBps"]
            default = next(k for k in speeds if k.endswith("(default)"))
            best = sorted((k for k in speeds if k != "torch.compile"), key=lambda k: -speeds[k])[:3]
            lines.append(f"| {op.name} | {case['shape'][0]}x{case['shape'][1]} | {speeds['torch.compile']:.0f} | "
                         f"{speeds[default]:.0f} ({default.removesuffix(' (default)')}) | "
                         + ", ".join(f"{k.removesuffix(' (default)')} {speeds[k]:.0f}" for k in best) + " |")
            print(lines[-1], flush=True)
    write_results("persistent_tiles", machine_kind(result["device"]), result, "\n".join(lines) + "\n", Path(args.out))


if __name__ == "__main__":
    main()
