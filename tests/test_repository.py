"""The repository as a map: current results files with their run, a README table generated from them,
and documentation that points only inside the repository."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def _load(path: Path) -> ModuleType:
    """Scripts and benchmarks are not packages: load one module from its file."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


readme_tables = _load(ROOT / "scripts" / "readme_tables.py")
results_files = _load(ROOT / "benchmarks" / "results_files.py")


def test_readme_benchmark_table_is_generated_from_the_results_files() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_tables.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_a_stale_readme_table_is_detected() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme_tables.table()
    assert readme_tables.rewrite(readme, table) == readme
    stale = readme.replace(table[2], table[2].replace(" | ", " | 0.1x faster; ", 1))
    assert stale != readme
    assert readme_tables.rewrite(stale, table) == readme


def test_every_results_file_has_a_readme_row() -> None:
    rows = "\n".join(readme_tables.table())
    for path in RESULTS.glob("*.json"):
        assert f"`{path.stem}.md`" in rows, path.name


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_results_file_is_the_current_one_with_its_run(path: Path) -> None:
    """``<benchmark>[_<variant>]_<kind>``: one current file per benchmark and machine kind, its run in the JSON
    and on the line after the Markdown's title."""
    run = json.loads(path.read_text())["run"]
    assert set(run) == {"benchmark", "variant", "machine_kind", "date"}
    assert (ROOT / "benchmarks" / f"{run['benchmark']}.py").exists(), run["benchmark"]
    kind = path.stem.rsplit("_", 1)[1]
    assert results_files.kind_label(kind) == run["machine_kind"]
    assert path.stem == "_".join(p for p in (run["benchmark"], run["variant"], kind) if p)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d( \d\d:\d\d UTC)?", run["date"]), run["date"]
    lines = path.with_suffix(".md").read_text().splitlines()
    assert lines[0].startswith("# ") and lines[2] == results_files.run_line(run["benchmark"], kind, run["date"])


def test_markdown_results_without_json_state_their_run() -> None:
    for path in RESULTS.glob("*.md"):
        if path.stem.endswith("_notes") or path.with_suffix(".json").exists():
            continue
        assert re.match(r"Run: \d{4}-\d\d-\d\d .* on `[a-z0-9-]+`", path.read_text().splitlines()[2]), path.name


def test_results_are_written_over_the_current_file(tmp_path: Path) -> None:
    first = results_files.write_results("kernels", "h200", {"x": 1}, "# Title\n\nbody\n", tmp_path, "2026-01-01 00:00 UTC")
    second = results_files.write_results("kernels", "h200", {"x": 2}, "# Title\n\nbody\n", tmp_path, "2026-01-02 00:00 UTC")
    partial = results_files.write_results("kernels", "h200", {"x": 3}, "# Title\n", tmp_path, variant="sweep")
    assert first == second and partial.name == "kernels_sweep_h200"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernels_h200.json", "kernels_h200.md",
                                                          "kernels_sweep_h200.json", "kernels_sweep_h200.md"]
    assert json.loads(second.with_suffix(".json").read_text())["x"] == 2
    assert second.with_suffix(".md").read_text().splitlines()[2].startswith("Run: 2026-01-02 00:00 UTC on `nvidia-h200`")


@pytest.mark.parametrize(("device", "count", "kind", "label"), [
    ("NVIDIA H200", 1, "h200", "nvidia-h200"), ("NVIDIA H100 80GB HBM3", 1, "h100", "nvidia-h100"),
    ("NVIDIA H200", 2, "h200x2", "nvidia-h200-x2"), ("cpu", 1, "cpu", "cpu")])
def test_machine_kinds(device: str, count: int, kind: str, label: str) -> None:
    assert results_files.machine_kind(device, count) == kind
    assert results_files.kind_label(kind) == label


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return [ROOT / name for name in out.stdout.split()]


def test_tests_are_laid_out_like_the_package() -> None:
    """``tests/<area>/`` tests ``pyfuser/<area>/`` (``tests/fuzz``: the differential fuzzer); the top level holds
    the checks of the repository itself. Test files have no ``__init__.py``, so pytest imports each by its
    file name: one name per file across the folders."""
    tests = ROOT / "tests"
    assert sorted(p.name for p in tests.glob("*.py")) == [
        "conftest.py", "test_benchmark_shards.py", "test_benchmarks.py", "test_repository.py", "test_structure.py"]
    areas = {p.name for p in (ROOT / "pyfuser").iterdir() if (p / "__init__.py").exists()}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert folders - areas == {"fuzz"}
    names = [p.name for p in tests.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_nothing_points_outside_the_repository() -> None:
    """Design references are the docs/ pages, which cite nvFuser's public issues: no path to a machine's
    directories or to design documents kept elsewhere."""
    outside = re.compile(r"/work/|\.\./shared|shared/seeds|ARCHITECTURE\.md")
    for path in _tracked("pyfuser", "docs", "README.md", "scripts", "examples", "benchmarks/*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not outside.search(line), f"{path.relative_to(ROOT)}:{number}: {line.strip()}"


def test_docs_links_resolve() -> None:
    for path in _tracked("docs", "README.md"):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text()):
            assert (path.parent / target).exists(), f"{path.relative_to(ROOT)} links to missing {target}"


def test_each_design_topic_page_cites_nvfuser() -> None:
    """A topic page states pyfuser's behaviour and the public nvFuser issue or pull request it comes from."""
    pages = [p for p in (ROOT / "docs").glob("*.md") if p.name not in ("architecture.md", "multidevice.md")]
    assert len(pages) >= 5
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    for page in pages:
        text = page.read_text()
        assert re.search(r"github\.com/NVIDIA/Fuser/(issues|pull)/\d+", text), page.name
        assert "pyfuser/" in text, f"{page.name} names no code"
        assert f"]({page.name})" in architecture, f"docs/architecture.md does not list {page.name}"


def test_model_zoo_results_make_one_row(tmp_path: Path) -> None:
    """``models_<kind>.json`` (benchmarks/models.py): one row with the geomean and worst case per mode and the
    failed cases counted."""
    def case(model: str, mode: str, variant: str, ms: float, status: str = "ok") -> dict[str, object]:
        return {"model": model, "mode": mode, "dtype": "bf16", "variant": variant, "status": status, "ms": ms}

    cases = [case(m, mode, v, ms) for m in ("llama", "vit") for mode in ("inference", "training")
             for v, ms in (("eager", 4.0), ("inductor", 2.0))]
    cases += [case("llama", "inference", "pyfuser", 2.5), case("vit", "inference", "pyfuser", 1.6),
              case("llama", "training", "pyfuser", 2.0, "fallback"), case("vit", "training", "pyfuser", 0.0, "error")]
    summary = [{"mode": "inference", "dtype": "bf16", "variant": "pyfuser", "anchor": "inductor", "models": 2,
                "failed": [], "geomean": (0.8 * 1.25) ** 0.5, "worst": 0.8, "worst_model": "llama"},
               {"mode": "training", "dtype": "bf16", "variant": "pyfuser", "anchor": "inductor", "models": 1,
                "failed": ["llama", "vit"], "geomean": 1.0, "worst": 1.0, "worst_model": "llama"}]
    data = {"meta": {"models": ["llama", "vit"], "size": "default"}, "summary": summary, "cases": cases}
    results_files.write_results("models", "h100", data, "# Zoo\n\nbody\n", tmp_path, "2026-01-01 00:00 UTC")
    rows = readme_tables.table(tmp_path)
    assert len(rows) == 3
    assert rows[2].startswith("| `models.py` (nvidia-h100, 2026-01-01 00:00 UTC): 2 `transformers` models")
    assert ("bf16: inference 1.00x (worst 0.80x, llama); training 1.00x (worst 1.00x, llama). Failed cases: 2 "
            "(1 with a kernel fallback)") in rows[2]
    assert "`models_h100.md`" in rows[2]
