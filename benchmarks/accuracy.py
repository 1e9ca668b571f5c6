"""Accuracy of generated reduction kernels against float64, beside torch's own error.

Rows of data of std 1 shifted by an offset (0, 1e2, 1e3, 1e4), float32 or 16-bit floats widened to
float32 before the op (``--dtypes``): the further from 0, the more a reduction's order and algorithm
matter (a row's total rounds at the scale of the offset, a variance is a small difference of large
numbers). For each op and row length the table gives the largest absolute difference from the
float64 result for pyfuser's generated kernel and for torch on the same float32 values and device
(its op, or the same formula in eager torch), and their ratio (torch's error floored at half a
float32 ulp of the largest result, so an exact torch result does not divide by 0).

Runs on a GPU when there is one, else through Triton's interpreter on the CPU (slow: use the
default short sweep there). Writes Markdown and JSON to ``--out`` when given.

    python benchmarks/accuracy.py [--ops layernorm,var_mean,...] [--offsets 0,1e4] [--cols 64,4096]
                                  [--rows N] [--dtypes float32,bfloat16] [--device cpu|cuda] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks.results_files import machine_kind, write_results
from pyfuser import FusionDefinition
from pyfuser.ir.tensor_view import TensorView

EPS = 1e-5


def _layernorm(fd: FusionDefinition, x: TensorView) -> None:
    """Layer norm as torch's decomposition writes it (``var_mean``, then ``rsqrt``)."""
    var, mean = fd.ops.var_mean(x, [1], correction=0, keepdim=True)
    fd.add_output(fd.ops.mul(fd.ops.sub(x, mean), fd.ops.rsqrt(fd.ops.add(var, EPS))))


def _layernorm_sums(fd: FusionDefinition, x: TensorView) -> None:
    """Layer norm as a user writes it with sums: the mean, then the mean of squared deviations."""
    mean = fd.ops.mean(x, [1], keepdim=True)
    centered = fd.ops.sub(x, mean)
    var = fd.ops.mean(fd.ops.mul(centered, centered), [1], keepdim=True)
    fd.add_output(fd.ops.mul(centered, fd.ops.rsqrt(fd.ops.add(var, EPS))))


def _var_mean(fd: FusionDefinition, x: TensorView) -> None:
    var, mean = fd.ops.var_mean(x, [1], correction=1)
    fd.add_output(var)
    fd.add_output(mean)


def _var_mean_columns(fd: FusionDefinition, x: TensorView) -> None:
    """var_mean over the rows (axis 0): an outer reduction, as batch norm's statistics."""
    var, mean = fd.ops.var_mean(x, [0], correction=1)
    fd.add_output(var)
    fd.add_output(mean)


def _softmax(fd: FusionDefinition, x: TensorView) -> None:
    shifted = fd.ops.sub(x, fd.ops.max(x, [1], keepdim=True))
    e = fd.ops.exp(shifted)
    fd.add_output(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)))


def _sum(fd: FusionDefinition, x: TensorView) -> None:
    fd.add_output(fd.ops.sum(x, [1]))


def _column_sum(fd: FusionDefinition, x: TensorView) -> None:
    """A sum over the rows (axis 0): an outer reduction, split across programs for many rows."""
    fd.add_output(fd.ops.sum(x, [0]))


def _sum_all(fd: FusionDefinition, x: TensorView) -> None:
    """A sum of every element: a reduction across programs (a grid reduction) for large inputs."""
    fd.add_output(fd.ops.sum(x, [0, 1]))


def _row_and_column_sums(fd: FusionDefinition, x: TensorView) -> None:
    """Sums across each row and each column of one input: one inner-outer kernel."""
    fd.add_output(fd.ops.sub(x, fd.ops.mean(x, [1], keepdim=True)))
    fd.add_output(fd.ops.sum(x, [0]))


def _rmsnorm(fd: FusionDefinition, x: TensorView) -> None:
    ms = fd.ops.mean(fd.ops.mul(x, x), [1], keepdim=True)
    fd.add_output(fd.ops.mul(x, fd.ops.rsqrt(fd.ops.add(ms, EPS))))


def _torch_layernorm_sums(x: torch.Tensor) -> torch.Tensor:
    centered = x - x.mean(1, keepdim=True)
    return centered * torch.rsqrt(centered.square().mean(1, keepdim=True) + EPS)


def _torch_rmsnorm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + EPS)


@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    define: Callable[[FusionDefinition, TensorView], None]
    torch_fn: Callable[[torch.Tensor], Sequence[torch.Tensor]]


OPS = {op.name: op for op in [
    Op("layernorm", _layernorm, lambda x: [F.layer_norm(x, x.shape[1:], eps=EPS)]),
    Op("layernorm_sums", _layernorm_sums, lambda x: [_torch_layernorm_sums(x)]),
    Op("var_mean", _var_mean, lambda x: list(torch.var_mean(x, 1, correction=1))),
    Op("var_mean_columns", _var_mean_columns, lambda x: list(torch.var_mean(x, 0, correction=1))),
    Op("softmax", _softmax, lambda x: [torch.softmax(x, 1)]),
    Op("sum", _sum, lambda x: [x.sum(1)]),
    Op("column_sum", _column_sum, lambda x: [x.sum(0)]),
    Op("sum_all", _sum_all, lambda x: [x.sum()]),
    Op("row_and_column_sums", _row_and_column_sums, lambda x: [x - x.mean(1, keepdim=True), x.sum(0)]),
    Op("rmsnorm", _rmsnorm, lambda x: [_torch_rmsnorm(x)]),
]}


def fusion(op: Op, dtype: torch.dtype = torch.float32) -> FusionDefinition:
    """``op`` on a float32 input, or on a 16-bit one widened to float32 first (as torch.compile lowers
    ``x.float()``)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dtype)
        op.define(fd, x if dtype == torch.float32 else fd.ops.cast(x, torch.float32))
    return fd


def max_error(got: Sequence[torch.Tensor], ref: Sequence[torch.Tensor]) -> float:
    return max(float((g.double() - r).abs().max()) for g, r in zip(got, ref, strict=True))


def floor(ref: Sequence[torch.Tensor]) -> float:
    """Half a float32 ulp of the largest result: the error of the result correctly rounded."""
    return max(float(r.abs().max()) for r in ref) * 2.0 ** -24


@dataclasses.dataclass
class Row:
    op: str
    dtype: str
    rows: int
    cols: int
    offset: float
    pyfuser: float
    torch: float
    floor: float

    @property
    def ratio(self) -> float:
        return self.pyfuser / max(self.torch, self.floor)


def measure(op: Op, rows: int, cols: int, offset: float, device: str, seed: int = 0,
            dtype: torch.dtype = torch.float32) -> Row:
    """pyfuser's and torch's max-abs error against float64 on ``rows`` x ``cols`` data of std 1 around
    ``offset``, stored in ``dtype`` (a 16-bit input is widened to float32 before the op, for torch too)."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, cols, generator=gen, dtype=torch.float64) + offset).to(dtype).to(device)
    ref = op.torch_fn(x.double())
    options = ["triton_interpreter"] if device == "cpu" else []
    got = fusion(op, dtype).execute([x], _enable_options=options)
    return Row(op.name, str(dtype).removeprefix("torch."), rows, cols, offset, max_error(got, ref),
               max_error(op.torch_fn(x.float()), ref), floor(ref))


def table(results: Sequence[Row]) -> str:
    lines = ["| op | data | rows x cols | offset | pyfuser | torch | ratio |", "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.op} | {r.dtype} | {r.rows} x {r.cols} | {r.offset:g} | {r.pyfuser:.2e} | {r.torch:.2e} | "
                     f"{r.ratio:.2f} |")
    lines += ["", "| op | worst ratio | at |", "|---|---|---|"]
    for name, dtype in dict.fromkeys((r.op, r.dtype) for r in results):
        worst = max((r for r in results if r.op == name and r.dtype == dtype), key=lambda r: r.ratio)
        lines.append(f"| {name} ({dtype}) | {worst.ratio:.2f} | {worst.rows} x {worst.cols}, offset {worst.offset:g} |")
    return "\n".join(lines)


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v]


def main(argv: list[str] | None = None) -> int:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {', '.join(OPS)}")
    parser.add_argument("--offsets", default="0,1e2,1e3,1e4")
    parser.add_argument("--cols", default="64,1000,4096,65536,4097" if cuda else "64,1000,1531",
                        help="row lengths (the interpreter's default is short: it runs on the CPU)")
    parser.add_argument("--rows", type=int, default=256 if cuda else 3)
    parser.add_argument("--dtypes", default="float32", help="data types of the input, comma-separated: float32, "
                        "bfloat16, float16 (16-bit data widened to float32 before the op)")
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--out", type=Path, default=None, help="directory for accuracy_<kind>.md/.json (benchmarks/results)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.ops.split(",") if n not in OPS]
    if unknown:
        parser.error(f"unknown op(s) {unknown}; known: {', '.join(OPS)}")
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    unknown = [d for d in args.dtypes.split(",") if d not in dtypes]
    if unknown:
        parser.error(f"unknown dtype(s) {unknown}; known: {', '.join(dtypes)}")
    results = []
    for dtype in (dtypes[d] for d in args.dtypes.split(",")):
        for name in args.ops.split(","):
            for cols in (int(c) for c in _floats(args.cols)):
                for offset in _floats(args.offsets):
                    row = measure(OPS[name], args.rows, cols, offset, args.device, dtype=dtype)
                    results.append(row)
                    print(f"{row.op:18} {row.dtype:8} {row.rows:5} x {row.cols:6} offset {row.offset:7g}: pyfuser "
                          f"{row.pyfuser:.2e} torch {row.torch:.2e} ratio {row.ratio:.2f}", flush=True)
    report = table(results)
    print()
    print(report)
    if args.out is not None:
        where = "Triton's interpreter on the CPU" if args.device == "cpu" else torch.cuda.get_device_name()
        kind = machine_kind(torch.cuda.get_device_name() if args.device == "cuda" else "cpu")
        markdown = (f"# pyfuser's max-abs error against float64 beside torch's ({where})\n\n`python "
                    f"benchmarks/accuracy.py {' '.join(sys.argv[1:] if argv is None else argv)}`\n\n{report}\n")
        rows = [dataclasses.asdict(r) | {"ratio": r.ratio} for r in results]
        write_results("accuracy", kind, {"rows": rows}, markdown, directory=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
