"""The kernel sweep (``benchmarks/kernels.py`` over ``benchmarks/kernel_cases.py``) on the CPU: every op family's
fusion against its torch function through Triton's interpreter, the point tables, and a sweep's rows through
the summary, the results files and the README row, so the benchmark cannot rot between GPU runs."""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from pyfuser import DataType, FusionDefinition, schedule
from pyfuser.codegen.values import L2Hint
from pyfuser.schedule import SchedulerType
from pyfuser.scheduler.reduction_schedule import ReductionParams

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "benchmarks"))  # the benchmarks import their sibling modules by name
sys.path.append(str(ROOT / "scripts"))

kernel_cases: ModuleType = importlib.import_module("kernel_cases")
kernels: ModuleType = importlib.import_module("kernels")
results_files: ModuleType = importlib.import_module("results_files")
readme_tables: ModuleType = importlib.import_module("readme_tables")


@pytest.mark.parametrize("family", list(kernel_cases.FAMILIES))
def test_dry_run_of_each_family_matches_torch(family: str) -> None:
    points = [p for p in kernel_cases.tiny_points() if p.family == family]
    assert points
    rows = kernels.dry_run(points)
    assert [r["status"] for r in rows] == ["ok"] * len(points), rows


def test_dry_run_reports_a_wrong_fusion(monkeypatch: pytest.MonkeyPatch) -> None:
    """A family whose fusion differs from its torch function is an error row naming the point and output."""
    family = kernel_cases.FAMILIES["softmax"]
    monkeypatch.setitem(kernel_cases.FAMILIES, "softmax", dataclasses.replace(
        family, torch_fn=lambda x: torch.log_softmax(x, -1)))
    rows = kernels.dry_run([kernel_cases.Point("softmax", (5, 33), torch.float32)])
    assert rows[0]["status"] == "error"
    assert "softmax_f32_5x33: output 0 differs" in rows[0]["reason"]


def test_point_tables_cover_every_family_within_the_byte_cap() -> None:
    full, quick = kernel_cases.full_points(), kernel_cases.QUICK
    families = set(kernel_cases.FAMILIES)
    assert {p.family for p in full} == families and {p.family for p in quick} == families
    assert len({p.name for p in full}) == len(full)  # names tell points apart (results, --match)
    for point in (*full, *quick):
        family = kernel_cases.FAMILIES[point.family]
        assert point.layout in family.layouts, point
        assert kernel_cases.estimated_bytes(family, point.shape, point.dtype) <= kernel_cases.MAX_POINT_BYTES, point
    columns = {p.shape[1] for p in full if kernel_cases.FAMILIES[p.family].grid == "2d"}
    assert min(columns) == 64 and max(columns) == 262144 and any(c % 2 for c in columns)
    assert {p.dtype for p in full} == {torch.bfloat16, torch.float32}


def test_shards_split_the_sweep() -> None:
    def selected(*argv: str) -> tuple[list[Any], str]:
        parser_args = kernels.argparse.Namespace(quick=False, families="", match="", shard="", sweep=False,
                                                  sweep_heuristics=False)
        for arg in argv:
            key, _, value = arg.partition("=")
            setattr(parser_args, key, value if value else True)
        return kernels.select(parser_args)  # type: ignore[no-any-return]

    full, name = selected()
    shards = [selected(f"shard={k}/3") for k in (1, 2, 3)]
    assert name == "" and [s[1] for s in shards] == ["shard1of3", "shard2of3", "shard3of3"]
    assert sorted(p.name for s in shards for p in s[0]) == sorted(p.name for p in full)
    points, name = selected("quick", "families=rotary,softmax")
    assert name == "quick_rotary-softmax" and {p.family for p in points} == {"rotary", "softmax"}
    with pytest.raises(SystemExit, match="unknown"):
        selected("families=nope")


def test_a_sweep_on_the_cpu_makes_its_results_and_readme_row(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    """``run_point`` with a fixed timer and torch.compile as the identity (Inductor's CPU build is slow): the rows,
    the summary (worst beside geomean), a failed point left out of it, the Markdown and the README row."""
    def compile_(fn: Any, **_: Any) -> Any:  # Inductor fails on rotary: the point keeps eager as its anchor
        if fn is kernel_cases.FAMILIES["rotary"].torch_fn:
            raise RuntimeError("inductor broke")
        return fn

    monkeypatch.setattr(torch, "compile", compile_)

    def timer(fn: Any) -> float:
        fn()
        return 1.0

    points = [kernel_cases.Point("rmsnorm", (5, 33), torch.bfloat16),
              kernel_cases.Point("rotary", (2, 3, 4, 8), torch.bfloat16, "permuted"),
              kernel_cases.Point("seed003", (1, 6, 33), torch.bfloat16, "permuted")]
    copy = kernels.CopyBandwidth("cpu", timer)
    rows = [kernels.run_point(p, "cpu", copy, timer, enable_options=["triton_interpreter"]) for p in points]
    broken = dataclasses.replace(kernel_cases.FAMILIES["rmsnorm"], torch_fn=lambda x, w: x)
    monkeypatch.setitem(kernel_cases.FAMILIES, "rmsnorm", broken)
    rows.append(kernels.run_point(kernel_cases.Point("rmsnorm", (5, 127), torch.float32), "cpu", copy, timer,
                                  enable_options=["triton_interpreter"]))
    assert [r["status"] for r in rows] == ["ok", "ok", "skipped", "error"]
    assert rows[3]["stage"] == "check" and "rmsnorm_f32_5x127" in rows[3]["reason"]
    assert rows[0]["bytes"] == 2 * 5 * 33 * 2 + 33 * 2 and rows[0]["vs_best_anchor"] == 1.0
    assert rows[0]["kernels"] >= 1 and rows[1]["pyfuser_GBps"] > 0
    assert rows[1]["inductor_error"] == "RuntimeError: inductor broke" and "vs_inductor" not in rows[1]

    summary = kernels.summarize(rows)
    assert (summary["overall"]["ok"], summary["overall"]["errors"], summary["overall"]["skipped"]) == (2, 1, 1)
    assert summary["families"]["rmsnorm"]["worst_point"] == "rmsnorm_bf16_5x33"
    assert "geomean" not in summary["families"]["seed003"]

    result = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-01-01", "selection": "quick", "copy_GBps": 3000.0,
              "points": rows, "summary": summary, "host": {"execute_us": 15.0, "launch_us": 9.0, "overhead_us": 6.0}}
    text = kernels.markdown(result)
    assert "| **overall** | 2/4 | 1.00 | 1.00 |" in text and "rmsnorm_f32_5x127: error in check" in text
    assert "- rotary_bf16_2x3x4x8_permuted: inductor: RuntimeError: inductor broke" in text
    results_files.write_results("kernels", "h100", json.loads(json.dumps(result)), text, tmp_path,
                                "2026-01-01 00:00 UTC", variant="quick")
    progress = tmp_path / "progress.jsonl"  # a shard that died after two points (``--progress``): a new point,
    header = {k: v for k, v in result.items() if k not in ("points", "summary", "host")}  # and one measured again
    again = {**rows[0], "pyfuser_ms": rows[0]["pyfuser_ms"] * 2}
    other = {**rows[0], "point": "rmsnorm_bf16_7x33"}
    progress.write_text("\n".join(json.dumps(line) for line in (header, other, again)) + "\n")
    merged = kernels.merge([str(tmp_path / "kernels_quick_h100.json"), str(progress)])
    assert merged["summary"]["overall"]["points"] == 5 and merged["selection"] == "full"
    assert merged["summary"]["families"]["rmsnorm"]["ok"] == 2 and merged["host"] == result["host"]
    assert [r["pyfuser_ms"] for r in merged["points"] if r["point"] == rows[0]["point"]] == [again["pyfuser_ms"]]
    assert "run" not in merged and merged["merged_from"] == ["quick (2026-01-01)", "quick (2026-01-01)"]
    rows_md = readme_tables.table(tmp_path)
    assert len(rows_md) == 3 and "`kernels.py` `quick` cases (nvidia-h100, 2026-01-01 00:00 UTC): 4 points" in rows_md[2]
    assert "rmsnorm 1.00x (worst 1.00x), rotary 1.00x (worst 1.00x), seed003: none ran" in rows_md[2]
    assert "Failed points: 1, skipped: 1" in rows_md[2]


@pytest.mark.parametrize("shape", ["loop", "split"])
def test_the_sweep_of_looped_rows_varies_step_warps_and_the_online_pass(shape: str) -> None:
    """``--sweep`` of a normalization over looped rows: loop steps x warps x the online softmax on and off
    (one GPU call compares them), the L2 hint flipped and the loops pipelined at the default step, and for
    few wide rows (split) programs per row too."""
    base = ReductionParams(SchedulerType.inner_persistent, 0, shape, tile=4096, num_warps=16, l2=L2Hint.none,
                           split=3 if shape == "split" else 1)
    variants = kernels._variants(SchedulerType.inner_persistent, base, (1024, 65536))
    loops = {(v.tile, v.num_warps, v.online) for v in variants if v.shape == "loop"}
    assert {(t, w, o) for t in (1024, 2048, 4096, 8192) for w in (8, 16) for o in (True, False)} <= loops
    assert any(v.shape == "split" for v in variants) == (shape == "split")
    assert {(v.tile, v.num_warps, v.online) for v in variants if v.l2 is L2Hint.keep} == {(4096, 16, True), (4096, 16, False)}
    assert {(v.tile, v.num_warps, v.num_stages) for v in variants if v.num_stages} == {(4096, 16, 2), (4096, 16, 3)}
    assert all(v.shape in ("loop", "split") for v in variants)


def _executed(point: Any) -> tuple[list[Any], Any]:
    """``point``'s inputs (on the CPU) and its fusion, executed once through Triton's interpreter."""
    inputs = kernel_cases.FAMILIES[point.family].make(point, "cpu")
    fd = kernels._define(point, inputs)
    fd.execute(inputs, _enable_options=["triton_interpreter"])
    return inputs, fd


def test_the_outer_heuristic_sweep_times_every_segment_under_each_variant() -> None:
    """``--sweep`` of a fusion with outer segments (channels-last batch-norm forward: an outer var_mean over
    H, W, then a normalization of its partials over N, then the pointwise normalization) compiles the whole
    fusion under each outer heuristic: both outer segments follow it, each variant checked against torch."""
    point = kernel_cases.Point("batchnorm_fwd", (3, 5, 4, 3), torch.bfloat16, "channels_last")
    inputs, fd = _executed(point)
    assert kernels.runs_outer(fd)
    narrow, wide = (kernels.OuterHeuristic(column_bytes=b, welford_column_bytes=b, min_columns=m)
                    for b, m in ((16, 8), (512, 16)))
    rows = kernels.sweep_outer(point, inputs, 100, lambda fn: (fn(), 1.0)[1], ["triton_interpreter"], [narrow, wide])
    # a var_mean: each variant also with outer var_means staged
    assert [r.get("error") for r in rows] == [None] * 4 and sum(" staged " in r["params"] for r in rows) == 2
    by_bytes = {("column_bytes=16" in r["params"]): r["params"] for r in rows if " staged " not in r["params"]}
    # 16 bytes of bf16 data: blocks of 8 columns (4 of the float32 partials); 512 bytes, at least 16 columns
    # (the interpreter's 4 SMs would narrow them further): the first stage's N*C = 15 columns whole, the
    # second stage's C = 5 whole
    assert "reduction: tile 8," in by_bytes[True] and "outer_persistent: tile 4," in by_bytes[True], by_bytes
    assert "reduction: tile 16," in by_bytes[False] and "outer_persistent: tile 8," in by_bytes[False], by_bytes


def test_outer_sweep_variants_keep_the_outer_shape() -> None:
    """``--sweep`` of an outer reduction varies its column block, rows per step, split and warps (the inner
    shapes would read the rows across memory); each variant runs (Triton's interpreter) and matches torch."""
    x = torch.randn(300, 20).to(torch.bfloat16)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.sum(fd.ops.cast(fd.from_pytorch(x), DataType.Float), [0]))
    base = schedule.compute_heuristics(fd.fusion, SchedulerType.reduction, [x])
    variants = kernels._variants(SchedulerType.reduction, dataclasses.replace(base, split=4), (300, 20))
    assert {v.shape for v in variants} == {"outer"} and {v.split for v in variants} == {2, 4, 8}
    assert {v.tile for v in variants} == {32, 64, 128, 256} and {v.tile_reduced for v in variants} == {8, 16, 32, 64}
    for params in (variants[0], variants[-1]):
        with FusionDefinition() as fd:
            fd.add_output(fd.ops.sum(fd.ops.cast(fd.from_pytorch(x), DataType.Float), [0]))
        schedule.schedule(fd.fusion, SchedulerType.reduction, params)
        (out,) = fd.manual_execute([x], params)
        torch.testing.assert_close(out, x.float().sum(0), rtol=1e-5, atol=1e-4)


def test_the_inner_heuristic_sweep_runs_each_variant() -> None:
    """``--sweep-heuristics`` of a plain row reduction: the whole fusion under each inner heuristic given,
    checked against torch (Triton's interpreter), the kernel's shape in each row's description."""
    point = kernel_cases.Point("amax_inner", (5, 2000), torch.bfloat16)
    inputs, fd = _executed(point)
    assert kernels.runs_inner(fd) and not kernels.runs_outer(fd)
    variants = [kernels.InnerHeuristic(), kernels.InnerHeuristic(max_waste=1.0, loop_step=1024)]
    rows = kernels.sweep_inner(point, inputs, 100, lambda fn: (fn(), 1.0)[1], ["triton_interpreter"], variants)
    assert [r.get("error") for r in rows] == [None, None]
    described = sorted(r["params"] for r in rows)
    assert described[0].startswith("InnerHeuristic(loop_step=1024, max_waste=1.0) (reduction: loop rows 1, tile 1024")
    assert described[1].startswith("default (reduction: loop rows 1, tile 256"), described
    assert len(kernels.INNER_HEURISTICS) == len({kernels.heuristic_name(h) for h in kernels.INNER_HEURISTICS})
    assert len(kernels.OUTER_HEURISTICS) == len({kernels.heuristic_name(h) for h in kernels.OUTER_HEURISTICS})


def test_the_many_rows_sweep_runs_each_variant_of_an_inner_outer_fusion() -> None:
    """``--sweep`` of a norm backward: the whole fusion under each ``ManyRows`` rule given (the default and off),
    checked against torch (Triton's interpreter), the inner-outer kernel's programs in each row's description."""
    point = kernel_cases.Point("layernorm_bwd", (300, 127), torch.bfloat16)
    inputs, fd = _executed(point)
    assert kernels.runs_inner_outer(fd)
    off = kernels.ManyRows(waves=10 ** 9)
    rows = kernels.sweep_inner_outer(point, inputs, 100, lambda fn: (fn(), 1.0)[1], ["triton_interpreter"],
                                     [kernels.ManyRows(), off])
    assert [r.get("error") for r in rows] == [None, None]
    described = {r["params"].split(" (")[0]: r["params"] for r in rows}
    assert set(described) == {"default", "ManyRows(waves=1000000000)"}, described
    assert all("inner_outer_persistent: tile" in d for d in described.values()), described
    assert described["default"] != described["ManyRows(waves=1000000000)"]  # blocks of rows against one program an SM
    assert len(kernels.MANY_ROWS_HEURISTICS) == len({kernels.heuristic_name(h) for h in kernels.MANY_ROWS_HEURISTICS})


def test_a_point_as_close_to_float64_as_torch_passes_where_torch_itself_errs() -> None:
    """A reference that errs (ATen's bf16 batch-norm backward on large channels) does not fail pyfuser's exact
    output; an output that errs by more than twice torch's own error does."""
    exact = torch.tensor([1000.0, -500.0, 250.0], dtype=torch.float64)
    torchs = torch.tensor([1006.0, -500.0, 250.0])
    close = torch.tensor([1000.0, -500.5, 250.0])
    kernel_cases.check([close], [torchs], "point", exact=lambda: [exact])
    with pytest.raises(AssertionError, match="point: output 0 differs"):
        kernel_cases.check([close], [torchs], "point")
    far = torch.tensor([1000.0, -520.0, 250.0])
    with pytest.raises(AssertionError, match="point: output 0 differs"):
        kernel_cases.check([far], [torchs], "point", exact=lambda: [exact])
