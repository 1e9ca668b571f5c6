"""Standalone reproduction scripts: the Python definition plus random inputs of the recorded shapes,
strides, dtypes and devices (``fd.repro_script_for``, ``fd.last_repro_script``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pyfuser.ir.python_definition import literal


@dataclass(frozen=True)
class TensorRecord:
    """What a repro needs of an input tensor: not its values."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: str
    contiguous: bool


InputRecord = TensorRecord | bool | int | float | complex


def record_inputs(args: Sequence[Any]) -> list[InputRecord]:
    records: list[InputRecord] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            records.append(TensorRecord(tuple(a.shape), tuple(a.stride()), a.dtype, str(a.device), a.is_contiguous()))
        elif isinstance(a, (bool, int, float, complex)):
            records.append(a)
        else:
            raise TypeError(f"cannot record input {a!r} for a repro: expected a tensor or a Python number")
    return records


def _tensor_source(t: TensorRecord) -> str:
    shape = tuple(t.size)
    if t.contiguous:
        return f"torch.testing.make_tensor({shape}, dtype={t.dtype}, device='{t.device}')"
    # Storage up to the largest linear index the strides reach.
    extent = 0 if 0 in t.size else 1 + sum((n - 1) * s for n, s in zip(t.size, t.stride, strict=True))
    if t.dtype.is_floating_point or t.dtype.is_complex:
        base = f"torch.randn({extent}, dtype={t.dtype}, device='{t.device}')"
    else:
        high = 2 if t.dtype == torch.bool else 10
        base = f"torch.randint(0, {high}, ({extent},), dtype={t.dtype}, device='{t.device}')"
    return f"{base}.as_strided({shape}, {tuple(t.stride)})"


def _imports() -> list[str]:
    """Code that imported pyfuser as ``nvfuser_direct`` (the alias) gets a script in nvFuser's words,
    which the alias line makes runnable without nvFuser; otherwise pyfuser's own names."""
    if sys.modules.get("nvfuser_direct") is sys.modules.get("pyfuser"):
        return ["import pyfuser.nvfuser_direct_alias  # nvfuser_direct is pyfuser", "import torch",
                "from nvfuser_direct import FusionDefinition, DataType"]
    return ["import torch", "from pyfuser import FusionDefinition, DataType"]


def repro_script(definition: str, inputs: Sequence[InputRecord] | None) -> str:
    lines = ["# CUDA devices:"]
    lines += [f"#  {i}: {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
    lines += [f"# torch version: {torch.__version__}", f"# cuda version: {torch.version.cuda}"]
    lines += _imports()
    text = "\n".join(lines) + "\n" + definition + "with FusionDefinition() as fd:\n    nvfuser_fusion(fd)\n"
    if inputs is None:
        return text
    text += "\ninputs = [\n"
    for x in inputs:
        source = _tensor_source(x) if isinstance(x, TensorRecord) else literal(x)
        text += f"    {source},\n"
    return text + "]\nfd.execute(inputs)\n"

