"""pyfuser's host path alone, on a CPU: what a cached call costs besides the kernels it launches.

Every generated kernel's Triton call is replaced by a no-op after the first (real) execution, so
what is timed is pyfuser's Python (signature lookup, size binding, the Host IR program, the
generated launchers, output allocation) plus the ATen calls a program makes itself. Cases:

* ``one_kernel_fd_execute`` / ``one_kernel_fec_run``: a cached bias + relu fusion, one kernel
  (issue 14's "host overhead of a cached one-kernel region");
* ``llama_layer_pyfuser``: a Llama-style decoder layer (``compile_llama.DecoderLayer``, hidden 64,
  4 heads, MLP 128, sequence 8) through ``torch.compile(backend="pyfuser")``, forward without grad;
  its anchor ``llama_layer_eager`` is the same layer in eager torch (real CPU math, tiny shapes);
* ``llama_training_pyfuser``: the same layer's training step (forward and backward graphs, the
  autograd engine between them), beside the eager step.

``--compare REV`` measures git revision ``REV`` too (in a temporary worktree, same machine, same
run) and writes both side by side. Not a test: numbers depend on the machine.

    python benchmarks/host_path.py --compare HEAD~3 [--repeats 3000]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from compile_llama import DecoderLayer, rotary  # noqa: E402 (the benchmarks folder is not a package)
from cpu_overhead import median_seconds  # noqa: E402
from results_files import RESULTS, write_results  # noqa: E402

from pyfuser import DataType, FusionDefinition  # noqa: E402
from pyfuser.integrations.torch_compile import PyfuserBackend  # noqa: E402


def _median_us(fn: Callable[[], Any], repeats: int) -> float:
    return median_seconds(fn, repeats) * 1e6


class _NoLaunch:
    """Stands in for an interpreted kernel's launch (``DirectLaunches._interpret``): does nothing."""

    def __call__(self, grid: Any, params: Any, stream: Any) -> None:
        return None


def _compiled_kernels(segment: Any) -> list[Any]:
    """The ``CompiledKernel``s behind a launch: itself, a sequence's, or every size bucket's."""
    found = list(getattr(segment, "_by_bucket", {}).values()) or [segment]
    return [k for s in found for k in getattr(s, "kernels", [s])]


def _stub_launches(programs: list[Any]) -> tuple[int, int]:
    """Replace the Triton call of every kernel the programs launch; returns (kernels, ATen calls)."""
    kernels = aten = 0
    for program in programs:
        for node in program.container.walk():
            kind = type(node).__name__
            if kind == "LaunchKernel":
                for kernel in _compiled_kernels(node.segment):
                    kernel.launches._interpret = _NoLaunch()  # every launch of an interpreted kernel
                    kernels += 1
            elif kind == "AtenCall":
                aten += 1
    return kernels, aten


def one_kernel(repeats: int) -> dict[str, float]:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=True, dtype=DataType.Float)
        b = fd.define_tensor([-1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.relu(fd.ops.add(x, fd.ops.broadcast_in_dim(b, [x.size(0), x.size(1)], [1]))))
    args, options = [torch.randn(64, 64), torch.randn(64)], ["triton_interpreter"]
    fd.execute(args, _enable_options=options)
    kernels, _ = _stub_launches([fd.fec.last_program])
    assert kernels == 1
    fec, enabled = fd.fec, tuple(options)
    return {"one_kernel_fd_execute_us": _median_us(lambda: fd.execute(args, _enable_options=options), repeats),
            "one_kernel_fec_run_us": _median_us(lambda: fec.run(args, enable_options=enabled), repeats),
            "torch_empty_us": _median_us(lambda: torch.empty(64, 64), repeats)}


def llama_layer(repeats: int) -> dict[str, float]:
    torch.manual_seed(0)
    layer = DecoderLayer(64, 4, 128)
    x = torch.randn(1, 8, 64)
    cos, sin = rotary(8, 16, "cpu", torch.float32)
    backend = PyfuserBackend(triton_interpreter=True)
    compiled = torch.compile(layer, backend=backend)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, cos, sin), layer(x, cos, sin), atol=1e-5, rtol=1e-5)
    regions = [r for g in backend.graphs for r in g.regions]
    kernels, aten = _stub_launches([r.fec.last_program for r in regions])

    def call(fn: Callable[..., Any]) -> Callable[[], Any]:
        def run() -> Any:
            with torch.no_grad():
                return fn(x, cos, sin)
        return run

    results = {"llama_layer_pyfuser_us": _median_us(call(compiled), max(repeats // 10, 50)),
               "llama_layer_eager_us": _median_us(call(layer), max(repeats // 10, 50)),
               "llama_layer_regions": len(regions), "llama_layer_kernels": kernels, "llama_layer_aten_calls": aten,
               "llama_layer_eager_ops": sum(len(g.eager) for g in backend.graphs)}
    return {**results, **llama_training_step(layer, x, cos, sin, repeats)}


def llama_training_step(layer: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        repeats: int) -> dict[str, float]:
    """The layer's forward and backward (AOTAutograd's two graphs), as a training step calls them."""
    torch._dynamo.reset()
    backend = PyfuserBackend(triton_interpreter=True)
    compiled = torch.compile(layer, backend=backend)
    grad = torch.randn_like(x)

    def step(fn: Callable[..., Any]) -> Callable[[], Any]:
        def run() -> Any:
            layer.zero_grad(set_to_none=True)
            fn(x.detach().requires_grad_(), cos, sin).backward(grad)
        return run

    step(compiled)()
    regions = [r for g in backend.graphs for r in g.regions]
    kernels, aten = _stub_launches([r.fec.last_program for r in regions])
    return {"llama_training_pyfuser_us": _median_us(step(compiled), max(repeats // 20, 30)),
            "llama_training_eager_us": _median_us(step(layer), max(repeats // 20, 30)),
            "llama_training_regions": len(regions), "llama_training_kernels": kernels,
            "llama_training_aten_calls": aten, "llama_training_eager_ops": sum(len(g.eager) for g in backend.graphs)}


def measure(repeats: int) -> dict[str, float]:
    torch.set_num_threads(1)
    return {**one_kernel(repeats), **llama_layer(repeats)}


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def measure_revision(rev: str, repeats: int) -> dict[str, float]:
    """``measure`` run on revision ``rev``'s pyfuser (a temporary worktree): with this script's code, or
    with the revision's own where it has one (its stubs of the Triton call follow its launcher's names)."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        _git("worktree", "add", "--detach", str(tree), rev)
        try:
            env = {**os.environ, "PYTHONPATH": str(tree)}
            script = tree / "benchmarks" if (tree / "benchmarks" / "host_path.py").exists() else ROOT / "benchmarks"
            # pyfuser is imported from the worktree before anything of this tree can put its own first
            code = (f"import sys, json; sys.path.insert(0, {str(tree)!r}); import pyfuser; "
                    f"sys.path.insert(1, {str(script)!r}); "
                    f"assert pyfuser.__file__.startswith({str(tree)!r}), pyfuser.__file__; "
                    f"import host_path; print(json.dumps(host_path.measure({repeats})))")
            out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True,
                                 cwd=tree).stdout
            return json.loads(out.strip().splitlines()[-1])
        finally:
            _git("worktree", "remove", "--force", str(tree))


ROWS = [("one_kernel_fd_execute_us", "one-kernel fusion, cached `fd.execute`"),
        ("one_kernel_fec_run_us", "one-kernel fusion, cached `FusionExecutorCache.run`"),
        ("torch_empty_us", "anchor: one `torch.empty` of the output"),
        ("llama_layer_pyfuser_us", "Llama layer, `torch.compile(backend=\"pyfuser\")` forward"),
        ("llama_layer_eager_us", "anchor: the same layer in eager torch (real math)"),
        ("llama_training_pyfuser_us", "Llama layer, training step (forward + backward) through pyfuser"),
        ("llama_training_eager_us", "anchor: the same training step in eager torch (real math)")]
COUNTS = ["llama_layer_regions", "llama_layer_kernels", "llama_layer_aten_calls", "llama_layer_eager_ops",
          "llama_training_regions", "llama_training_kernels", "llama_training_aten_calls", "llama_training_eager_ops"]


def write(results: dict[str, dict[str, float]], machine: str, out: Path) -> Path:
    meta = {"machine": machine, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "python": sys.version.split()[0], "load_average_1min": round(os.getloadavg()[0], 2)}
    labels = list(results)
    lines = [f"# pyfuser host path on a CPU ({meta['date']})", "",
             f"Machine: {machine}; torch {meta['torch']}, Python {meta['python']}; one torch thread; load average "
             f"{meta['load_average_1min']} (a shared machine: expect +-15% run to run). Generated kernels' Triton "
             "calls are no-ops, so the times are pyfuser's host path (and a program's own ATen calls).", "",
             "| what (us, median) | " + " | ".join(labels) + " |", "| --- |" + " ---: |" * len(labels)]
    for key, text in ROWS:
        lines.append(f"| {text} | " + " | ".join(f"{results[r][key]:.1f}" if key in results[r] else "-" for r in labels)
                     + " |")
    for key in COUNTS:
        what = "training step" if key.startswith("llama_training_") else "layer"
        name = key.removeprefix("llama_layer_").removeprefix("llama_training_").replace("_", " ")
        lines.append(f"| {name} of the {what} | " + " | ".join(str(results[r].get(key, "-")) for r in labels) + " |")
    lines += ["", f"Command: `python benchmarks/host_path.py {' '.join(sys.argv[1:])}`"]
    return write_results("host_path", "cpu", {**meta, "results": results}, "\n".join(lines) + "\n", out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3000)
    parser.add_argument("--compare", default=None, help="a git revision to measure beside the working tree")
    parser.add_argument("--machine", default="2-core CPU dev machine")
    parser.add_argument("--out", default=str(RESULTS), help="results folder: writes OUT/host_path_cpu.json and .md")
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    if args.compare:
        results[f"at {args.compare} ({_git('rev-parse', '--short', args.compare)})"] = \
            measure_revision(args.compare, args.repeats)
    results["this tree"] = measure(args.repeats)
    print(json.dumps(results, indent=2))
    print(f"wrote {write(results, args.machine, Path(args.out))}.md")


if __name__ == "__main__":
    main()
