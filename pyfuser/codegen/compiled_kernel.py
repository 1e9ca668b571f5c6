"""Compiling a generated kernel and launching it.

A kernel's source is written once to the kernel cache directory (``PYFUSER_CACHE_DIR``, default
``~/.cache/pyfuser/kernels``), named by its hash, and imported from there: Triton's ``jit`` needs a
file to read, and its own disk cache then makes the next process fast. In memory, kernels are
cached by source, so a segment scheduled the same way compiles once per process.

The launch is the hot path: read the size arguments off the tensors, check the sizes the kernel
takes as equal, allocate the outputs that were not given, compute the grid, call the kernel.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pyfuser.codegen.kernel_builder import KernelSource
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.layout import dense_strides

_LOADED: dict[str, Any] = {}
#: Kernels compiled by this process (distinct sources); tests count compilations with it.
compile_count = 0


def cache_dir() -> Path:
    root = os.environ.get("PYFUSER_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "pyfuser")
    path = Path(root) / "kernels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _load(source: KernelSource) -> Any:
    """The jitted function of ``source`` (written to the cache directory and imported once)."""
    global compile_count
    fn = _LOADED.get(source.source)
    if fn is not None:
        return fn
    digest = hashlib.sha256(source.source.encode()).hexdigest()[:20]
    path = cache_dir() / f"{source.name}_{digest}.py"
    if not path.exists():
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as f:
            f.write(source.source)
        os.replace(f.name, path)
    spec = importlib.util.spec_from_file_location(f"pyfuser_kernel_{digest}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = _LOADED[source.source] = getattr(module, source.name)
    compile_count += 1
    return fn


class CompiledKernel:
    """A generated kernel, ready to launch on a segment's inputs (``run``, as Host IR calls it)."""

    def __init__(self, source: KernelSource, num_warps: int = 4) -> None:
        self.source = source
        self.name = source.name
        self.num_warps = num_warps
        self._fn = _load(source)
        s = source
        self._size_sources = [(src.symbol, src.index, src.dim, src.output, src.extent) for src in s.sizes]
        self._positions = s.tensor_inputs
        self._scalars = s.scalar_inputs
        self._interpreted = "InterpretedFunction" in s.source

    @property
    def code(self) -> str:
        return self.source.source

    def run(self, ctx: EvalContext, *args: Any, out: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        outputs, grid, params = self.prepare(ctx, *args, out=out)
        if grid is not None:
            self.launch(grid, params)
        return outputs

    def launch(self, grid: tuple[int, ...], params: Sequence[Any]) -> None:
        """Call the Triton kernel (what ``run`` does after ``prepare``)."""
        if self._interpreted:
            # Masked-off lanes compute on placeholder values (log(0)); numpy must not warn about them.
            with np.errstate(all="ignore"):
                self._fn[grid](*params, num_warps=self.num_warps)
        else:
            self._fn[grid](*params, num_warps=self.num_warps)

    def prepare(self, ctx: EvalContext, *args: Any, out: Sequence[torch.Tensor] | None = None,
                ) -> tuple[list[torch.Tensor], tuple[int, ...] | None, list[Any]]:
        """The host side of a launch: sizes, checks, outputs, grid and argument list (grid None: the
        outputs are empty and nothing runs)."""
        s = self.source
        tensors = [args[p] for p in self._positions]
        sizes: dict[str, int] = {}
        for symbol, index, dim, output, extent in self._size_sources:
            if index >= 0 and not output:
                sizes[symbol] = tensors[index].shape[dim]
            elif index >= 0 and out is not None:
                sizes[symbol] = out[index].shape[dim]  # a stream loop's chunk: narrower than the extent
            elif extent is not None:
                sizes[symbol] = extent.evaluate(ctx.env)
            else:
                raise ValueError(f"{self.name}: the size of {s.tensor_names[len(tensors) + index]} axis {dim} is not "
                                 "known before the kernel runs; pass the output buffer")
        for a, da, b, db in s.size_checks:
            if tensors[a].shape[da] != tensors[b].shape[db]:
                raise ValueError(f"{s.tensor_names[a]} axis {da} has size {tensors[a].shape[da]} but "
                                 f"{s.tensor_names[b]} axis {db} has size {tensors[b].shape[db]}; they must be equal "
                                 "(declare an axis with size 1 to broadcast it)")
        for a, da, size in s.constant_checks:
            if tensors[a].shape[da] != size:
                raise ValueError(f"{s.tensor_names[a]} axis {da} has size {tensors[a].shape[da]}, but the fusion "
                                 f"takes it as {size} (an expand or an operand of static size {size})")
        for extent, factor, message in s.divisibility_checks:
            value = extent.evaluate(sizes)
            if value % factor:
                raise ValueError(f"{message}, but it is {value}")
        if out is None:
            device = tensors[0].device if tensors else ctx.device
            out = []
            for shape, perm, dtype in zip(s.output_shapes, s.output_perms, s.output_dtypes, strict=True):
                dims = [e.evaluate(sizes) for e in shape]
                out.append(torch.empty_strided(dims, dense_strides(dims, perm), dtype=dtype.torch_dtype,
                                               device=device))
        outputs = list(out)
        if any(t.numel() == 0 for t in outputs):
            return outputs, None, []
        everything = [*tensors, *outputs]
        grid = tuple(e.evaluate(sizes) for e in s.grid)
        params = [*everything, *(everything[k].stride(d) for k, d in s.stride_args),
                  *(sizes[src.symbol] for src in s.sizes), *(args[p] for p in self._scalars)]
        return outputs, grid, params
