"""The generated host launcher's direct path (CUDA): compiled variants are keyed by Triton's
argument specializations and launched directly after the first call (through torch's static CUDA
launcher where it applies)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

import pytest
import torch

from pyfuser import DataType, FusionDefinition, ParallelType
from pyfuser.codegen import launcher as launcher_module
from pyfuser.codegen.kernel_builder import KernelBuilder
from pyfuser.codegen.kernel_source import KernelLaunchError
from pyfuser.codegen.launcher import (
    DirectLaunches,
    StaticLaunch,
    Variant,
    bound_launch,
    compiling_ahead,
    launcher_source,
)
from pyfuser.ir.eval_context import EvalContext
from pyfuser.schedule import parallelize_like, transform_like


class _Compiled:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.run = object()

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        return lambda *params, stream: self.log.append(f"direct {grid}")


class _JitFunction:
    """Stands in for a ``triton.jit`` function of a Triton without compile-only warm-up: dispatch through
    it compiles (logs) and launches."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def call(*params: Any, num_warps: int) -> _Compiled:
            self.log.append(f"dispatch {grid}")
            return _Compiled(self.log)
        return call


class _WarmupJitFunction(_JitFunction):
    """A ``triton.jit`` function whose ``warmup`` compiles (logs) without launching."""

    def warmup(self, *params: Any, grid: tuple[int, ...], num_warps: int) -> _Compiled:
        self.log.append(f"compile {grid}")
        return _Compiled(self.log)


def _launcher_run(fn: _JitFunction) -> Any:
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(fd.define_tensor([-1, -1])))
    fusion = fd.fusion
    out = fusion.outputs()[0]
    out.merge(0)
    out.split(0, 128)
    out.axis(0).parallelize(ParallelType.grid_x)
    out.axis(1).parallelize(ParallelType.block_x)
    transform_like(out)
    parallelize_like(out)
    source = KernelBuilder(fusion, "k", "cuda", {}, out).build()
    code, namespace = launcher_source(source, direct=True)
    namespace["fn"] = fn
    launches = namespace["launches"] = DirectLaunches(fn, 4, source.name, source.source)
    namespace["variants"] = launches.variants
    exec(compile(code, "<launcher>", "exec"), namespace)
    return namespace["run"]


def test_each_variant_compiles_once_then_launches_directly() -> None:
    """The first launch of a variant compiles it without launching, then launches it as every later
    call does (no Triton dispatch, so no C launcher of Triton's is built)."""
    fn = _WarmupJitFunction()
    run = _launcher_run(fn)
    ctx = EvalContext(device=torch.device("cpu"))
    run(ctx, torch.randn(64, 33))
    run(ctx, torch.randn(64, 33))
    run(ctx, torch.randn(64, 32))  # a size now a multiple of 16: another variant
    run(ctx, torch.randn(64, 34)[:, 1:])  # an unaligned tensor (and a stride of 34): another variant
    assert fn.log == ["compile (17, 1, 1)", "direct (17, 1, 1)", "direct (17, 1, 1)", "compile (16, 1, 1)",
                      "direct (16, 1, 1)", "compile (17, 1, 1)", "direct (17, 1, 1)"]


class _AlignmentLoggingJitFunction(_WarmupJitFunction):
    """A ``warmup`` that logs the alignment each integer argument is compiled for (the kernel's trailing
    constexpr parameters: one per stride and size, ``KernelSource``'s argument order; a divisor's
    multiplier, ``division_multiplier``, is above 2**40 and has none)."""

    def warmup(self, *params: Any, grid: tuple[int, ...], num_warps: int) -> _Compiled:
        integers = [p for p in params if type(p) is int and p < 1 << 40]
        self.log.append(f"compile {integers[len(integers) // 2:]}")
        return _Compiled(self.log)


def test_a_variant_per_alignment_of_sizes_and_strides() -> None:
    """Each stride and size is compiled for its alignment (the largest power of two up to 16 dividing
    it: Triton's own specialization stops at 16), one variant per combination: rows of 1000 bf16
    elements load 16 bytes at a time only where the kernel knows the row stride is a multiple of 8."""
    fn = _AlignmentLoggingJitFunction()
    run = _launcher_run(fn)
    ctx = EvalContext(device=torch.device("cpu"))
    for cols in (40, 56, 44, 42, 48, 41, 40):
        run(ctx, torch.randn(64, cols))
    compiled = [entry for entry in fn.log if entry.startswith("compile")]
    # (the input's strides, the output's, the rows (64), the columns)
    assert compiled == ["compile [8, 1, 8, 1, 16, 8]", "compile [4, 1, 4, 1, 16, 4]", "compile [2, 1, 2, 1, 16, 2]",
                        "compile [16, 1, 16, 1, 16, 16]", "compile [1, 1, 1, 1, 16, 1]"], fn.log


def test_a_triton_without_warmup_dispatches_every_launch() -> None:
    fn = _JitFunction()
    run = _launcher_run(fn)
    ctx = EvalContext(device=torch.device("cpu"))
    run(ctx, torch.randn(64, 33))
    run(ctx, torch.randn(64, 33))
    assert fn.log == ["dispatch (17, 1, 1)", "dispatch (17, 1, 1)"]


class _RefusingJitFunction:
    """Stands in for a ``triton.jit`` function whose compilation (or first launch) fails."""

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def call(*params: Any, num_warps: int) -> None:
            raise ValueError("Pointer argument (at 1) cannot be accessed from Triton (cpu tensor?)")
        return call


class _RefusingWarmupJitFunction(_RefusingJitFunction):
    def warmup(self, *params: Any, grid: tuple[int, ...], num_warps: int) -> None:
        raise ValueError("Pointer argument (at 1) cannot be accessed from Triton (cpu tensor?)")


@pytest.mark.parametrize("fn", [_RefusingJitFunction(), _RefusingWarmupJitFunction()], ids=["dispatch", "warmup"])
def test_a_refused_variant_names_the_kernel_and_carries_its_source(fn: _RefusingJitFunction) -> None:
    launches = DirectLaunches(fn, 4, "pointwise_kernel", "def pointwise_kernel(T0, T1): ...")
    with pytest.raises(KernelLaunchError, match=r"generated kernel pointwise_kernel failed to compile or launch: "
                                                r"ValueError: Pointer argument \(at 1\)") as caught:
        launches.launch(("key",), (1, 1, 1), [torch.zeros(1)], 0)
    assert caught.value.source == "def pointwise_kernel(T0, T1): ..."
    assert not launches.variants


class _ThreadedWarmupJitFunction(_JitFunction):
    """A ``warmup`` that logs the thread compiling, the device of the first argument, and the grid."""

    def __init__(self, refuse: bool = False) -> None:
        super().__init__()
        self.refuse = refuse

    def warmup(self, *params: Any, grid: tuple[int, ...], num_warps: int) -> _Compiled:
        thread = "compile thread" if threading.current_thread().name.startswith("pyfuser-compile") else "caller"
        self.log.append(f"compile {grid} on {params[0].device.type} in the {thread}")
        if self.refuse:
            raise ValueError("out of resources: shared memory")
        return _Compiled(self.log)


def test_launches_of_a_rehearsal_compile_their_variants_in_threads_for_the_first_launches(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside ``compiling_ahead`` a launch on meta tensors launches nothing: its variant (each once) compiles
    in a compile thread for the given CUDA device, and the first real launch of that variant takes it,
    compiling nothing itself; a variant not rehearsed compiles at its launch. (CPU tensors stand for
    device 0's in the launches after the rehearsal: the fake variants launch nothing.)"""
    devices: list[int] = []
    monkeypatch.setattr(torch.cuda, "set_device", devices.append)
    fn = _ThreadedWarmupJitFunction()
    launches = DirectLaunches(fn, 4, "k", "def k(T0): ...")
    meta = torch.empty(64, 33, device="meta")
    with compiling_ahead(0) as threads:
        assert threads
        for _ in range(2):
            launches.launch(("a",), (17, 1, 1), [meta, 33], -1)
        launches.launch(("b",), (16, 1, 1), [meta, 32], -1)
    assert set(launches.ahead) == {(0, ("a",)), (0, ("b",))} and not launches.variants
    for future in launches.ahead.values():
        future.result()
    taken = launcher_module.variants_compiled_ahead
    launches.launch(("a",), (17, 1, 1), [torch.zeros(64, 33), 33], 0)
    launches.launch(("a",), (17, 1, 1), [torch.zeros(64, 33), 33], 0)
    launches.launch(("c",), (9, 1, 1), [torch.zeros(64, 33), 33], 0)
    assert sorted(fn.log[:2]) == ["compile (16, 1, 1) on meta in the compile thread",
                                  "compile (17, 1, 1) on meta in the compile thread"]
    assert fn.log[2:] == ["direct (17, 1, 1)", "direct (17, 1, 1)", "compile (9, 1, 1) on cpu in the caller",
                          "direct (9, 1, 1)"]
    assert devices == [0, 0] and launcher_module.variants_compiled_ahead == taken + 1
    assert set(launches.ahead) == {(0, ("b",))}  # rehearsed, not launched yet
    launches.launch(("d",), (17, 1, 1), [meta, 33], -1)  # outside a rehearsal: a launch as any other
    assert fn.log[-2:] == ["compile (17, 1, 1) on meta in the caller", "direct (17, 1, 1)"]


def test_a_variant_refused_in_a_compile_thread_fails_its_launch_naming_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    fn = _ThreadedWarmupJitFunction(refuse=True)
    launches = DirectLaunches(fn, 4, "k", "def k(T0): ...")
    with compiling_ahead(0):
        launches.launch(("a",), (2, 1, 1), [torch.empty(8, device="meta")], -1)
    with pytest.raises(KernelLaunchError, match="generated kernel k failed to compile or launch: ValueError: out of "
                                                "resources") as caught:
        launches.launch(("a",), (2, 1, 1), [torch.zeros(8)], 0)
    assert caught.value.source == "def k(T0): ..."
    assert fn.log == ["compile (2, 1, 1) on meta in the compile thread", "compile (2, 1, 1) on cpu in the caller"]


def test_a_static_launch_calls_torchs_launcher_with_the_kept_arguments_and_bound_launches_inline_it() -> None:
    """``StaticLaunch.launcher()`` passes the parameters Triton kept, a None per scratch parameter, the
    grid, warps, shared memory and types; a bound launch of such a variant writes that call inline."""
    calls: list[tuple[Any, ...]] = []
    static = StaticLaunch(lambda *a: calls.append(a), "function", 4, 128, "OOi", (0, 2), 1)
    run = static.launcher()
    a, b = torch.zeros(4), torch.zeros(4)
    run((3, 1, 1), [a, b, 7], "stream")
    assert calls == [("function", 3, 1, 1, 4, 128, "OOi", (a, 7, None), "stream")]
    calls.clear()
    x = torch.zeros(8)
    bound = bound_launch([x], [torch.empty(8)], [("slot", 0), ("slot", 1), ("value", 8)], [1], (2, 1, 1),
                         Variant(run, static))
    assert bound is not None and "_call(_function, 2, 1, 1, 4, 128, _types, (a0, 8, None), _stream)" in bound.source
    (out,) = bound.run([x])
    assert calls == [("function", 2, 1, 1, 4, 128, "OOi", (x, 8, None), None)] and out.shape == (8,)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled kernels")
def test_cuda_variants_launch_through_torchs_static_launcher() -> None:
    """Compiled variants launch through torch's static CUDA launcher with the arguments Triton kept
    (it drops constexprs and integers it specialized to 1) and a float scalar; through Triton's
    runner with a torch that has no static launcher."""
    static = getattr(torch._C, "_StaticCudaLauncher", None) is not None
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        s = fd.define_scalar(dtype=DataType.Float)
        fd.add_output(fd.ops.mul(fd.ops.exp(x), s))
    for shape in ((64, 33), (1, 7), (5, 1), (64, 33)):  # sizes and strides of 1: specialized away
        t = torch.randn(*shape, device="cuda")
        (out,) = fd.execute([t, 2.5])
        torch.testing.assert_close(out, t.exp() * 2.5)
    kernel = fd.fec.last_program.container.nodes[0].segment
    variants = kernel.launches.variants
    assert variants and set(kernel.launches.static) == (set(variants) if static else set())
    assert all(run.__qualname__.startswith("StaticLaunch.launcher" if static else "_triton_launch")
               for run in variants.values())


def test_the_compile_threads_setting_is_checked_and_zero_turns_compiling_ahead_off() -> None:
    script = "from pyfuser.codegen import launcher\nwith launcher.compiling_ahead(0) as threads:\n    print(threads)"
    runs = {value: subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                                  env={**os.environ, "PYFUSER_COMPILE_THREADS": value}) for value in ("0", "2", "many")}
    assert runs["0"].stdout.strip() == "False" and runs["2"].stdout.strip() == "True"
    assert runs["many"].returncode != 0
    assert "PYFUSER_COMPILE_THREADS must be a number of threads" in runs["many"].stderr.splitlines()[-1]


class _Param:
    def __init__(self, name: str) -> None:
        self.name = name


class _NamedWarmupJitFunction(_JitFunction):
    """A ``triton.jit`` function with named parameters whose ``warmup`` logs the warps it compiles for."""

    def __init__(self, names: list[str]) -> None:
        super().__init__()
        self.params = [_Param(n) for n in names]

    def warmup(self, *params: Any, grid: tuple[int, ...], num_warps: int) -> _Compiled:
        self.log.append(f"compile on {num_warps} warps")
        return _Compiled(self.log)


@pytest.mark.parametrize(("prefix", "dtype", "row_stride", "warps"), [
    ("", torch.bfloat16, 127, 8), ("", torch.bfloat16, 4096, 2), ("", torch.bfloat16, 1004, 8),
    ("", torch.float32, 1004, 2), ("", torch.float32, 127, 8), ("", torch.bfloat16, 0, 2),
    ("s0_", torch.bfloat16, 127, 8), ("s0_", torch.bfloat16, 1000, 2)])
def test_a_variant_whose_rows_load_narrower_than_16_bytes_compiles_on_its_narrow_warps(
        prefix: str, dtype: torch.dtype, row_stride: int, warps: int) -> None:
    """A row stride (not 0 or 1) times the element size not a multiple of 16 bytes: the variant compiles on
    ``narrow_warps``, the others on ``num_warps``; strides are read by name, in a cooperative launch's steps
    too (``s{k}_`` before them). Sizes (``ks0``) do not count: only a row's start decides its loads' width."""
    names = [f"{prefix}T0", f"{prefix}T1", f"{prefix}st0_0", f"{prefix}st0_1", f"{prefix}st1_0", f"{prefix}ks0"]
    fn = _NamedWarmupJitFunction(names)
    launches = DirectLaunches(fn, 2, "k", "def k(...): ...", narrow_warps=8)
    params = [torch.zeros(4, 4, dtype=dtype), torch.zeros(4, dtype=torch.float32), row_stride, 1, 1, 127]
    assert launches.warps_of(params) == warps
    launches.launch(("v",), (1, 1, 1), params, 0)
    assert fn.log[0] == f"compile on {warps} warps"
    assert DirectLaunches(fn, 2, "k", "def k(...): ...").warps_of(params) == 2  # no narrow warps asked
