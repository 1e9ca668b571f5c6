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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from pyfuser.codegen.kernel_source import KernelSource
from pyfuser.codegen.launcher import (
    Bound,
    BoundParam,
    DirectLaunches,
    Variant,
    bound_launch,
    launcher_source,
)
from pyfuser.codegen.python_writer import compile_source
from pyfuser.ir.eval_context import EvalContext

_LOADED: dict[str, Any] = {}
#: Kernels compiled by this process (distinct sources); tests count compilations with it.
compile_count = 0


def cache_dir() -> Path:
    root = os.environ.get("PYFUSER_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "pyfuser")
    path = Path(root) / "kernels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def load_kernel(name: str, source: str) -> Any:
    """The jitted function ``name`` of module ``source`` (written to the cache directory and
    imported once)."""
    global compile_count
    fn = _LOADED.get(source)
    if fn is not None:
        return fn
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    path = cache_dir() / f"{name}_{digest}.py"
    if not path.exists():
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as f:
            f.write(source)
        os.replace(f.name, path)
    spec = importlib.util.spec_from_file_location(f"pyfuser_kernel_{digest}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as e:
        if e.name != "triton":
            raise
        raise ModuleNotFoundError(
            "pyfuser's generated kernels need Triton (on a CPU too: its interpreter runs them), and it is not "
            "installed: pip install 'pyfuser[triton]' (or pip install triton). Without it fd.execute evaluates "
            "fusions with ATen on a CPU; manual_execute and the triton_interpreter option need Triton.",
            name="triton") from None
    fn = _LOADED[source] = getattr(module, name)
    compile_count += 1
    return fn


class CompiledKernel:
    """A generated kernel, ready to launch on a segment's inputs (``run``, as Host IR calls it)."""

    #: ``run(ctx, *args, out=None) -> outputs``: the generated launcher (``launcher_source``), which
    #: Host IR calls itself: read the sizes, check them, allocate the outputs, launch through
    #: ``launches``
    run: Callable[..., list[torch.Tensor]]

    def __init__(self, source: KernelSource, num_warps: int = 4, narrow_warps: int = 0) -> None:
        self.source = source
        self.name = source.name
        self.num_warps = num_warps
        self.narrow_warps = narrow_warps
        self.output_perms = source.output_perms
        fn = load_kernel(source.name, source.source)
        interpreted = "InterpretedFunction" in source.source
        #: the one path from the kernel's parameters to its launch
        self.launches = DirectLaunches(fn, num_warps, source.name, source.source, interpreted=interpreted,
                                       device_asserts=source.device_asserts, narrow_warps=narrow_warps)
        host, namespace = launcher_source(source, direct=not interpreted)
        namespace["launches"], namespace["variants"] = self.launches, self.launches.variants
        compile_source(host, f"launcher of {source.name}", namespace)
        self.launcher_code = host
        #: the scheduled fusion the kernel was generated from (set by the runtime, for inspection)
        self.scheduled_ir = ""
        #: the heuristics it was scheduled with (set by the runtime; None for a manual schedule)
        self.scheduler_params: object = None
        self._prepare = namespace["prepare"]
        self.run = namespace["run"]
        #: ``key(params)``: the compiled variant of the parameters ``prepare`` returned
        self.key = namespace["key"]

    @property
    def code(self) -> str:
        return self.source.source

    def prepare(self, ctx: EvalContext, *args: Any, out: Sequence[torch.Tensor] | None = None,
                ) -> tuple[list[torch.Tensor], tuple[int, ...] | None, list[Any]]:
        """The host side of a launch: outputs, grid and argument list (grid None: the outputs are
        empty and nothing runs). ``run`` is ``prepare`` then ``launch``, in one generated function."""
        return self._prepare(ctx, args, out)

    def launch(self, grid: tuple[int, ...], params: Sequence[Any]) -> Variant | None:
        """Launch the kernel with what ``prepare`` returned, as ``run`` does; returns the launched
        variant's ``launch(grid, params, stream)`` for a bound launch (None: none to call directly)."""
        device = next(p for p in params if isinstance(p, torch.Tensor)).get_device()
        key = self.key(params)
        self.launches.launch(key, (*grid, *(1,) * (3 - len(grid))), list(params), device)
        return self.launches.variant(key, device)

    def bound_params(self, reads: Sequence[int], first_output: int, params: Sequence[Any]) -> list[BoundParam] | None:
        """``prepare``'s parameters as a bound launch's: the tensors it reads from ``reads`` (slots of
        its arguments, in order), its outputs from slot ``first_output`` on, the rest as they were;
        None when a parameter comes from a scalar argument (its value may change)."""
        if self.source.scalar_inputs:
            return None
        n_in, n_out = len(self.source.tensor_inputs), len(self.source.output_shapes)
        entries: list[BoundParam] = [("slot", reads[p]) for p in self.source.tensor_inputs]
        entries += [("slot", first_output + j) for j in range(n_out)]
        entries += [("value", v) for v in params[n_in + n_out:]]
        return entries

    def bind(self, ctx: EvalContext, args: Sequence[Any]) -> tuple[list[torch.Tensor], Bound | None]:
        """Run on ``args``, and return with the outputs a ``bound_launch`` for later calls of a bound
        program (None where there can be none: nothing launched, a scalar parameter, no variant to
        call directly)."""
        outputs, grid, params = self._prepare(ctx, args, None)
        if grid is None:
            return outputs, None
        launch = self.launch(grid, params)  # compiles the variant on its first launch
        entries = self.bound_params(range(len(args)), len(args), params)
        if launch is None or entries is None:
            return outputs, None
        grid = (*grid, *(1,) * (3 - len(grid)))  # the variant's x, y, z
        return outputs, bound_launch(args, outputs, entries, range(len(args), len(args) + len(outputs)), grid, launch)
