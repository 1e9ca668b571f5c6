"""Write the README's benchmark table from the current results files.

Each benchmark writes ``benchmarks/results/<benchmark>[_<variant>]_<kind>.json`` (``benchmarks/results_files.py``);
this script reads them and rewrites the rows between ``<!-- results:begin -->`` and ``<!-- results:end -->``
in README.md: one row per results file, its run (machine kind, date), what it measures and its key numbers
beside their anchors, with the worst case and the geometric mean where a file has several cases.

    python scripts/readme_tables.py          # rewrite README.md
    python scripts/readme_tables.py --check  # exit 1 if README.md is not what the results files give
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
HEADER = ["| benchmark | result |", "| --- | --- |"]

Data = dict[str, Any]


def geomean(values: Iterable[float]) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def spread(values: Iterable[float]) -> str:
    values = sorted(values)
    return f"{values[0]:.2f}x" if f"{values[0]:.2f}" == f"{values[-1]:.2f}" else f"{values[0]:.2f}-{values[-1]:.2f}x"


def case_label(name: str) -> str:
    """``layernorm_bf16_16384x8192`` -> ``layernorm 16384x8192``: the dtype is in the JSON, the shape tells cases apart."""
    words = [w for w in name.split("_") if w not in ("bf16", "f32", "f16")]
    return " ".join(words)


def kernel_sweep(data: Data) -> tuple[str, str]:
    """The op-family sweep: per family the geomean and worst ratio to the faster of eager and Inductor, then
    overall (with copy bandwidth) and the points that failed."""
    summary, parts = data["summary"], []
    for name, family in summary["families"].items():
        if "geomean" in family:
            parts.append(f"{name} {family['geomean']:.2f}x (worst {family['worst']:.2f}x)")
        else:
            parts.append(f"{name}: none ran")
    overall = summary["overall"]
    result = "pyfuser / max(eager, Inductor) per family, geomean (worst): " + ", ".join(parts)
    if "geomean" in overall:
        result += (f". Overall geomean {overall['geomean']:.2f}x, worst {overall['worst']:.2f}x "
                   f"({overall['worst_point']}), {overall['below_0_95']} of {overall['ok']} points below 0.95x; "
                   f"of a copy of the same bytes: geomean {overall['geomean_copy']:.2f}, worst "
                   f"{overall['worst_copy']:.2f} ({overall['worst_copy_point']})")
    result += f". Failed points: {overall['errors']}, skipped: {overall['skipped']}"
    if "host" in data:
        result += f"; cached one-kernel `fd.execute` {data['host']['execute_us']:.1f} us of host time"
    result += "; notes in `kernels_notes.md`"
    what = (f"{overall['points']} points (`{data['selection']}`) of {len(summary['families'])} op families over "
            "sizes, dtypes and layouts, pyfuser vs torch eager and Inductor, checked before timing; GPU time of "
            f"one call, L2 flushed; copy bandwidth {data['copy_GBps']:.0f} GB/s for 1 GiB")
    return what, result


def kernels(data: Data) -> tuple[str, str]:
    """``kernels_<kind>.json``: the op-family sweep, or the fixed cases of runs before it."""
    if "points" in data:
        return kernel_sweep(data)
    copy = data["copy_GBps"]
    parts, ratios = [], {}
    for case in data["cases"]:
        gbps = case["pyfuser_GBps"]
        ratio = case["inductor_ms"] / case["pyfuser_ms"]
        ratios[case["case"]] = ratio
        text = f"{case_label(case['case'])} {gbps:.0f} ({ratio:.2f}x, {gbps / copy:.2f} of copy"
        own = case.get("copy_same_bytes_GBps")
        if own and own < 0.95 * copy:  # a small case: its own bytes copy slower than a GiB does
            text += f", {gbps / own:.2f} of a copy of its {case['bytes'] / 2**20:.0f} MiB"
        parts.append(text + ")")
    worst = min(ratios, key=lambda k: ratios[k])
    host = data["host"]
    what = (f"generated kernels vs torch eager, torch.compile and copy bandwidth ({copy:.0f} GB/s for 1 GiB); "
            "GPU time only (a spin kernel hides each call's host time from `do_bench`'s interval)")
    result = (f"GB/s, pyfuser / torch.compile: {', '.join(parts)}. Geomean {geomean(ratios.values()):.2f}x of "
              f"torch.compile, worst {ratios[worst]:.2f}x ({case_label(worst)}); cached one-kernel `fd.execute` "
              f"{host['execute_us']:.1f} us of host time (the same Triton kernel launched directly: "
              f"{host['launch_us']:.1f}); notes in `kernels_notes.md`")
    return what, result


def compile_llama(data: Data) -> tuple[str, str]:
    turns = data["meta"].get("interleave", 0)
    sentences, interleaved = [], {}
    for size in dict.fromkeys(case["case"] for case in data["cases"]):
        timed, turn_by_turn = [], []
        for case in (c for c in data["cases"] if c["case"] == size):
            passname = "forward + backward" if case["training"] else "forward"
            v = case["variants"]
            anchor = next((a for a in ("inductor", "eager") if "ms" in v.get(a, {})), None)
            if "ms" in v.get("pyfuser", {}) and anchor is not None:
                label = "" if anchor == "inductor" else f" {anchor}"
                timed.append(f"{passname} {v['pyfuser']['ms']:.2f} ms vs{label} {v[anchor]['ms']:.2f} "
                             f"({v[anchor]['ms'] / v['pyfuser']['ms']:.2f}x)")
            for variant, label in (("pyfuser", ""), ("pyfuser_cuda_graph", " with CUDA graphs")):
                ratio = v.get(variant, {}).get("interleaved_ratio", {}).get("median")
                if ratio is not None:
                    interleaved[f"{size} {passname}{label}"] = ratio
                    turn_by_turn.append(f"{passname}{label} {ratio:.3f}x")
        shape = next(c["shape"] for c in data["cases"] if c["case"] == size)
        text = f"{size} (seq {shape['seq']} x {shape['batch']}): " + ", ".join(timed)
        if turn_by_turn:
            text += f"; interleaved, anchor / pyfuser turn by turn: {', '.join(turn_by_turn)}"
        sentences.append(text)
    host = data["host_overhead"]
    result = ". ".join(sentences)
    if interleaved:
        worst = min(interleaved, key=lambda k: interleaved[k])
        result += (f". Interleaved geomean {geomean(interleaved.values()):.3f}x, worst {interleaved[worst]:.3f}x "
                   f"({worst})")
    result += (f"; cached one-kernel `fd.execute` {host['fd_execute_us']:.1f} us of host time, a region call "
               f"{host['pyfuser_region_call_us']:.1f} (two eager ops: {host['eager_torch_two_ops_us']:.1f}); where the "
               "time goes: `compile_llama_notes.md`")
    meta = data["meta"]
    what = (f"Llama decoder layer, {meta['dtype'].removeprefix('torch.')}, `backend=\"pyfuser\"` vs Inductor"
            + (", and with CUDA graphs vs `mode=\"reduce-overhead\"`; CUDA events" if meta["device"] == "cuda" else
               " (eager where Inductor did not run); wall clock")
            + (f", then interleaved in one process ({turns} turns, variants rotated: this host's sequential "
               "medians drift)" if turns else ""))
    return what, result


def overlap(what: str, anchor: str, anchor_label: str) -> Callable[[Data], tuple[str, str]]:
    """pyfuser's own choice per size (the overlap model's, replayed from a CUDA graph where the file has that
    column) against not overlapping (torch's, plain and in a CUDA graph), torch's fused op and the ideal."""
    anchor_graph = anchor.replace("_ms", "_graph_ms")

    def row(data: Data) -> tuple[str, str]:
        parts, ratios = [], []
        for r in data["results"]:
            size = r["size"].split(",")[0]
            graphed = "pyfuser_auto_graph_ms" in r
            ours = r["pyfuser_auto_graph_ms" if graphed else "pyfuser_auto_ms"]
            label = "with a CUDA graph" if graphed else "without CUDA graphs"
            graph = f" ({r[anchor_graph]:.3f} in a CUDA graph)" if anchor_graph in r else ""
            fused = f", {r['torch_fused_ms']:.3f} torch fused" if "torch_fused_ms" in r else ""
            ratios.append((ours / r["ideal_ms"], ours / r[anchor], size))
            chose = r.get("pyfuser_auto_graph", r.get("pyfuser_auto", "")) if graphed else r.get("pyfuser_auto", "")
            plain = f"{r['pyfuser_auto_ms']:.3f} ({r.get('pyfuser_auto', '')}) without"
            parts.append(f"{size}: {ours:.3f} ms ({chose}, {label}; {plain}) vs {r[anchor]:.3f} {anchor_label}{graph}"
                         f"{fused}, {r['ideal_ms']:.3f} ideal "
                         f"({ours / r['ideal_ms']:.2f}x of ideal, {ours / r[anchor]:.2f}x of {anchor_label})")
        worst_ideal, worst_anchor = max(ratios), max(ratios, key=lambda t: t[1])
        result = ("pyfuser's own choice (`comm/overlap_model.py`: P2P pipeline over the copy engines or the "
                  "collective then the GEMM) at M = " + "; ".join(parts)
                  + f". Worst {worst_ideal[0]:.2f}x of ideal ({worst_ideal[2]}), {worst_anchor[1]:.2f}x of "
                  f"{anchor_label} ({worst_anchor[2]}); notes: `overlap_notes.md`")
        return f"{what}, {data['config']['dtype']}", result
    return row


def stream_overhead(data: Data) -> tuple[str, str]:
    rows = data["rows"]
    small = [r["ratio"] for r in rows if "small" in r["case"]]
    large = [r["ratio"] for r in rows if "small" not in r["case"]]
    worst = max(rows, key=lambda r: r["ratio"])
    sizes = [f"{spread(group)} at {what} sizes" for group, what in ((small, "small"), (large, "large")) if group]
    result = (f"pyfuser / hand-written time: {', '.join(sizes)}; geomean "
              f"{geomean(r['ratio'] for r in rows):.2f}x, worst {worst['ratio']:.2f}x ({worst['case']} "
              f"{worst['shape']}, {worst['chunks']} chunks)")
    return "stream loops vs hand-written `torch.cuda.stream` code", result


def cpu_overhead(data: Data) -> tuple[str, str]:
    per_op = (data["cached_execute_us"] - data["eager_torch_us"]) / data["ops"]
    result = (f"cached execute {data['cached_execute_us']:.1f} us vs eager {data['eager_torch_us']:.1f} us "
              f"({data['cached_over_eager']:.2f}x; {per_op:.2f} us of Python per op over eager); first execute "
              f"{data['first_execute_ms']:.0f} ms")
    return f"{data['ops']}-op fusion of tiny tensors, cached `fd.execute` vs eager torch", result


def host_path(data: Data) -> tuple[str, str]:
    labels = [re.sub(r"^at (\S+) \((\w+)\)$", r"revision \2", label) for label in data["results"]]
    series = list(data["results"].values())

    def both(key: str, fmt: str = ".0f") -> str:
        return " -> ".join(format(s[key], fmt) for s in series)

    cur = series[-1]
    result = (f"Llama layer through `backend=\"pyfuser\"`: training step (forward + backward graphs) "
              f"{both('llama_training_pyfuser_us')} us of host time (eager's step with its real math: "
              f"{cur['llama_training_eager_us']:.0f}), {both('llama_training_eager_ops')} eager ops; forward "
              f"{both('llama_layer_pyfuser_us')} us (eager {cur['llama_layer_eager_us']:.0f}), "
              f"{both('llama_layer_eager_ops')} eager ops; cached one-kernel `fd.execute` "
              f"{both('one_kernel_fd_execute_us', '.1f')} us")
    what = "pyfuser's host path with kernel launches as no-ops"
    if len(labels) > 1:
        what += f", {' against '.join(reversed(labels))} in the same run"
    return what, result


def seed003_ceiling(data: Data) -> tuple[str, str]:
    g = data["median_GBps"]
    copy, own = g["copy of 1 GiB"], g["copy of the case's bytes"]
    hand = max((k for k in g if k.startswith("hand-written")), key=lambda k: g[k])
    row_copy = next(k for k in g if k.startswith("row copy"))

    def of(name: str) -> str:
        return f"{g[name]:.0f} GB/s ({g[name] / copy:.2f} of the 1-GiB copy, {g[name] / own:.2f} of a copy of its bytes)"

    result = (f"pyfuser {of('pyfuser')}; the best hand-written Triton kernel ({hand.removeprefix('hand-written ')}) "
              f"{of(hand)}; a row copy with its structure {of(row_copy)}; torch.compile {g['torch.compile']:.0f}")
    return "seed 003's fusion beside hand-written kernels, its structure's row copy and the copies", result


def persistent_tiles(data: Data) -> tuple[str, str]:
    ratios, parts = {}, []
    for case in data["cases"]:
        speeds = case["GBps"]
        default = next(k for k in speeds if k.endswith("(default)"))
        name = f"{case['op']} {case['shape'][0]}x{case['shape'][1]}"
        ratios[name] = speeds[default] / speeds["torch.compile"]
        parts.append(f"{name} {speeds[default]:.0f} ({ratios[name]:.2f}x)")
    worst = min(ratios, key=lambda k: ratios[k])
    result = (f"GB/s of the default tiles, pyfuser / torch.compile: {', '.join(parts)}; geomean "
              f"{geomean(ratios.values()):.2f}x, worst {ratios[worst]:.2f}x ({worst})")
    return "normalizations of short rows: the default tiles of whole rows against every variant", result


def accuracy(data: Data) -> tuple[str, str]:
    worst: dict[str, Data] = {}
    for row in data["rows"]:
        # float32 data unless the row names another (files written before ``--dtypes`` name none)
        op = row["op"] if row.get("dtype", "float32") == "float32" else f"{row['op']} ({row['dtype']})"
        if op not in worst or row["ratio"] > worst[op]["ratio"]:
            worst[op] = row
    parts = [f"{op} {row['ratio']:.2f} ({row['rows']}x{row['cols']}, offset {row['offset']:g})" for op, row in worst.items()]
    overall = max(worst.values(), key=lambda row: row["ratio"])
    result = (f"worst max-abs error over torch's, per op: {', '.join(parts)}; worst {overall['ratio']:.2f} "
              f"({overall['op']})")
    return "generated reductions' error against float64 beside torch's, rows of offsets 0 to 1e4", result


def models(data: Data) -> tuple[str, str]:
    """One row for the zoo: per dtype and mode, pyfuser's geomean and worst ratio to Inductor across models
    (with CUDA graphs: to ``reduce-overhead``), and the cases that failed (a kernel fallback included)."""
    meta, parts = data["meta"], []
    for dtype in dict.fromkeys(row["dtype"] for row in data["summary"]):
        modes = []
        for mode in dict.fromkeys(row["mode"] for row in data["summary"] if row["dtype"] == dtype):
            rated = []
            for row in data["summary"]:
                if (row["dtype"], row["mode"]) != (dtype, mode) or "geomean" not in row:
                    continue
                label = ""
                if row["variant"].endswith("cuda_graph"):  # a partial run may time only some models with graphs
                    label = " with CUDA graphs" + (f" over {row['models']} models"
                                                   if row["models"] < len(meta["models"]) else "")
                rated.append(f"{row['geomean']:.2f}x{label} (worst {row['worst']:.2f}x, {row['worst_model']})")
            if rated:
                modes.append(f"{mode} {', '.join(rated)}")
        if modes:
            parts.append(f"{dtype}: {'; '.join(modes)}")
    failed = [c for c in data["cases"] if c["status"] not in ("ok", "skipped")]
    fallbacks = sum(c["status"] == "fallback" for c in failed)
    result = (f"pyfuser / Inductor, geomean over {len(meta['models'])} models: " + ". ".join(parts)
              + f". Failed cases: {len(failed)} ({fallbacks} with a kernel fallback)")
    what = (f"{len(meta['models'])} `transformers` models (size `{meta['size']}`), inference and training, eager / "
            "Inductor / pyfuser, without and with CUDA graphs; median ms per step, checked against fp32 eager")
    return what, result


def tp_training(data: Data) -> tuple[str, str]:
    """Tensor + sequence parallel training: each variant's step against Inductor's and async-TP's, and
    whether every variant's first loss matched eager."""
    config, by_variant = data["config"], {r["variant"]: r for r in data["results"]}
    pyfuser, anchors = by_variant.get("pyfuser"), [v for v in ("inductor", "inductor_async_tp") if v in by_variant]
    parts = [f"{v} {by_variant[v]['step_ms']:.2f} ms" for v in ("eager", *anchors, "pyfuser") if v in by_variant]
    result = "step: " + ", ".join(parts)
    if pyfuser is not None:
        result += "; pyfuser / " + ", ".join(f"{v} {by_variant[v]['step_ms'] / pyfuser['step_ms']:.2f}x" for v in anchors)
    what = (f"TP + SP training step of a Llama (hidden {config['hidden']}, {config['layers']} layers, sequence "
            f"{config['seq']}) over {config['world']} ranks, {config['dtype']}, through torch.compile")
    return what, result


def model_breadth(data: Data) -> tuple[str, str]:
    """Architectures outside the zoo: the CPU check's passing cases, or the GPU run's ratios to Inductor."""
    cases = data["cases"]
    if data["run"].get("variant") == "check":
        ok = sum(c["result"] == "ok" for c in cases)
        theirs = sum(c["result"] == "not pyfuser's" for c in cases)
        models = len({c["model"] for c in cases})
        what = (f"{models} `transformers` architectures outside the zoo, tiny, CPU: a training step in float64 where eager has "
                "its kernels (regions as ATen calls), float32 inference through generated kernels against eager, and a float32 "
                "training step through generated kernels against the float64 step beside eager float32")
        return what, f"{ok} of {len(cases)} cases pass; failed not by pyfuser (also with aot_eager): {theirs}"
    timed = [c for c in cases if "vs_inductor" in c and "error" not in c]
    worst = min(timed, key=lambda c: c["vs_inductor"])
    faster_first = sum(c["first_s"]["pyfuser"] <= c["first_s"]["inductor"] for c in timed)
    what = "`transformers` architectures outside the zoo at realistic sizes, bf16, eager / Inductor / pyfuser"
    result = (f"pyfuser / Inductor over {len(timed)} cases: geomean {geomean(c['vs_inductor'] for c in timed):.2f}x "
              f"(worst {worst['vs_inductor']:.2f}x, {worst['model']} {worst['mode']}), vs eager "
              f"{geomean(c['vs_eager'] for c in timed):.2f}x; first call faster than Inductor's in {faster_first} of "
              f"{len(timed)}; failed: {len(cases) - len(timed)}")
    for mode in sorted({c["mode"] for c in timed}):
        ratios = [c["vs_inductor"] for c in timed if c["mode"] == mode]
        result += f"; {mode} {geomean(ratios):.2f}x (worst {min(ratios):.2f}x, {len(ratios)} cases)"
    return what, result


ROWS: dict[str, Callable[[Data], tuple[str, str]]] = {
    "kernels": kernels,
    "compile_llama": compile_llama,
    "ag_linear": overlap("seed 004 all-gather + linear", "ag_then_gemm_ms", "all-gather-then-GEMM"),
    "linear_rs": overlap("row-parallel linear + reduce-scatter", "gemm_then_rs_ms", "GEMM-then-reduce-scatter"),
    "stream_overhead": stream_overhead,
    "cpu_overhead": cpu_overhead,
    "host_path": host_path,
    "seed003_ceiling": seed003_ceiling,
    "persistent_tiles": persistent_tiles,
    "accuracy": accuracy,
    "models": models,
    "model_breadth": model_breadth,
    "tp_training": tp_training,
}


def results_files(directory: Path = RESULTS) -> list[Path]:
    """The current results files, in the order of ``ROWS`` (then variants, then machine kinds)."""
    order = list(ROWS)

    def key(path: Path) -> tuple[int, str, str]:
        run = json.loads(path.read_text())["run"]
        rank = order.index(run["benchmark"]) if run["benchmark"] in order else len(order)
        return rank, run.get("variant", ""), run["machine_kind"]

    return sorted(directory.glob("*.json"), key=key)


def table(directory: Path = RESULTS) -> list[str]:
    lines = list(HEADER)
    for path in results_files(directory):
        data = json.loads(path.read_text())
        run = data["run"]
        if run["benchmark"] not in ROWS:
            raise SystemExit(f"{path.name}: no README row for benchmark {run['benchmark']!r}: add one to ROWS in "
                             "scripts/readme_tables.py")
        what, result = ROWS[run["benchmark"]](data)
        variant = f" `{run['variant']}` cases" if run.get("variant") else ""
        lines.append(f"| `{run['benchmark']}.py`{variant} ({run['machine_kind']}, {run['date']}): {what}; "
                     f"`{path.stem}.md` | {result} |")
    return lines


def rewrite(readme: str, lines: list[str]) -> str:
    pattern = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.S)
    if not pattern.search(readme):
        raise SystemExit(f"README.md has no {BEGIN} ... {END} block")
    return pattern.sub(lambda _: "\n".join([BEGIN, *lines, END]), readme)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md's table is stale")
    args = parser.parse_args()
    current = README.read_text()
    wanted = rewrite(current, table())
    if args.check:
        if current != wanted:
            print("README.md's benchmark table is stale: run `python scripts/readme_tables.py`", file=sys.stderr)
            return 1
        return 0
    README.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
