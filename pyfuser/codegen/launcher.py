"""The host side of a kernel launch, generated per kernel as Python source (as Inductor generates
its wrappers): read the size arguments off the tensors, check the sizes the kernel takes as equal,
allocate the outputs that were not given, compute the grid, call the kernel. Generated, so a
cached launch runs straight-line code instead of interpreting the kernel's description."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import operator
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pyfuser.codegen.kernel_source import (
    ALIGNMENTS,
    STRIDE_PARAM,
    IndexOutOfRange,
    KernelLaunchError,
    KernelSource,
    alignment_param,
    division_multiplier,
    stride_param,
    tensor_param,
)
from pyfuser.codegen.python_writer import PythonWriter
from pyfuser.codegen.triton_support import host_int_expr
from pyfuser.ir.eval_context import NoPrograms
from pyfuser.ir.layout import dense_strides
from pyfuser.utils import next_power_of_2


def _size_error(names: tuple[str, ...], a: int, da: int, sa: int, b: int, db: int, sb: int) -> ValueError:
    return ValueError(f"{names[a]} axis {da} has size {sa} but {names[b]} axis {db} has size {sb}; they must be equal "
                      "(declare an axis with size 1 to broadcast it)")


def _constant_error(names: tuple[str, ...], a: int, da: int, got: int, size: int) -> ValueError:
    return ValueError(f"{names[a]} axis {da} has size {got}, but the fusion takes it as {size} (an expand or an "
                      f"operand of static size {size})")


def _unknown_output_size(name: str, tensor: str, dim: int) -> ValueError:
    return ValueError(f"{name}: the size of {tensor} axis {dim} is not known before the kernel runs; pass the output "
                      "buffer")


#: An empty CUDA tensor of given sizes, strides and dtype on the current device, allocated without
#: the dispatcher (what Inductor's wrappers call); None where this torch lacks it.
_empty_cuda = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
_empty_cuda = getattr(_empty_cuda, "_empty_strided_cuda", None)


def _as_strided_view(t: torch.Tensor, sizes: Sequence[int], strides: Sequence[int], delta: int) -> torch.Tensor:
    return t.as_strided(sizes, strides, t.storage_offset() + delta)


#: ``(t, sizes, strides, offset_increment)`` -> a view of ``t``'s storage made without the dispatcher
#: (Inductor's ``reinterpret_tensor``); an ``as_strided`` where this torch lacks it.
reinterpret_tensor: Callable[[torch.Tensor, Sequence[int], Sequence[int], int], torch.Tensor] = getattr(
    getattr(getattr(torch._C, "_dynamo", None), "guards", None), "_reinterpret_tensor", None) or _as_strided_view
_current_device = getattr(torch._C, "_cuda_getDevice", None)

#: The current CUDA stream of a device as a raw handle, without torch's Python-level device lookups
#: (Inductor's launchers use it too); None in CPU builds of torch.
raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (lambda _device: None)


#: ``launch(grid, params, stream)``: one compiled variant's launch (``grid``: x, y, z).
VariantLaunch = Callable[[tuple[int, ...], list[Any], Any], None]

#: Threads that compile kernel variants ahead of their first launch: ``PYFUSER_COMPILE_THREADS``, else
#: one per core up to 16. Triton spends most of a compilation in its MLIR and LLVM passes and in
#: ``ptxas``, outside the GIL, so variants compiled in threads overlap one another and the host's own
#: work (segmentation, scheduling, code generation of the next program).
def _compile_threads() -> int:
    raw = os.environ.get("PYFUSER_COMPILE_THREADS", "").strip()
    if not raw:
        return min(16, os.cpu_count() or 1)
    if not raw.isdigit():
        raise ValueError(f"PYFUSER_COMPILE_THREADS must be a number of threads (0: compile each kernel at its first "
                         f"launch), got {raw!r}")
    return int(raw)


_COMPILE_THREADS = _compile_threads()
_compile_pool: ThreadPoolExecutor | None = None
#: Variants whose first launch took them compiled from a compile thread, in this process (tests count them).
variants_compiled_ahead = 0
#: The CUDA device that launches on meta tensors compile for, inside ``compiling_ahead``.
_ahead_device: contextvars.ContextVar[int | None] = contextvars.ContextVar("pyfuser_ahead_device", default=None)


def ahead_device() -> int | None:
    """The CUDA device a rehearsal's launches compile for, inside ``compiling_ahead`` (None outside)."""
    return _ahead_device.get()


@contextlib.contextmanager
def compiling_ahead(device: int) -> Iterator[bool]:
    """A dry run of a program on meta tensors (same sizes and strides as a call's) inside this block
    launches nothing: each launch of a compiled kernel hands its variant to the compile threads, to be
    compiled for CUDA device ``device``, and the real launch of that variant later takes the result
    (``DirectLaunches.launch``). Yields whether threads compile (False: none are configured, and the
    dry run would gain nothing)."""
    global _compile_pool
    if _COMPILE_THREADS < 1:
        yield False
        return
    if _compile_pool is None:
        _compile_pool = ThreadPoolExecutor(_COMPILE_THREADS, thread_name_prefix="pyfuser-compile")
    token = _ahead_device.set(device)
    try:
        yield True
    finally:
        _ahead_device.reset(token)


class DirectLaunches:
    """The one path from a kernel's parameters to a Triton launch: every launch of a generated kernel
    (a ``CompiledKernel``'s launcher, a cooperative sequence's one launch, a bound launch's replay)
    goes through ``launch`` or a variant it returned.

    Triton's ``JITFunction`` recomputes which arguments are 1, multiples of 16 or 16-byte aligned
    on every call to find the compiled variant; the launcher knows which arguments are tensors and
    which are integers and keys the variants on the same properties itself, then launches the
    compiled variant directly (what Inductor's wrappers do): through torch's static CUDA launcher
    where it can (``_static_launch``), else through the compiled kernel's Triton runner. The first
    launch of a variant goes through Triton, which compiles it and returns it. A kernel run by
    Triton's interpreter (``interpreted``) has no variants: each launch goes through it.
    """

    def __init__(self, fn: Any, num_warps: int, name: str, source: str, cooperative: bool = False,
                 interpreted: bool = False, device_asserts: bool = False, narrow_warps: int = 0) -> None:
        self.fn = fn
        #: the kernel's name and text, for the error of a variant Triton refuses
        self.name = name
        self.source = source
        self.num_warps = num_warps
        #: warps of the variants whose rows load narrower than 16 bytes (``warps_of``; 0: ``num_warps``)
        self.narrow_warps = narrow_warps
        self._param_names: list[str] | None = None  # the kernel's parameter names (``warps_of``)
        self.interpreted = interpreted
        #: Triton's launch options: all programs resident at once (a kernel with grid synchronizations);
        #: device asserts compiled in, integer adds not checked for overflow (``KernelSource.device_asserts``)
        self.options: dict[str, bool] = {}
        if cooperative and not interpreted:
            self.options["launch_cooperative_grid"] = True
        if device_asserts and not interpreted:
            self.options.update(debug=True, sanitize_overflow=False)
        #: (device, key) -> ``run(grid, params, stream)`` of the compiled variant
        self.variants: dict[tuple[Any, ...], VariantLaunch] = {}
        #: (device, key) -> the variant's launch in parts, where torch's static launcher calls it
        self.static: dict[tuple[Any, ...], StaticLaunch] = {}
        #: (device, key) -> the variant being compiled ahead by a compile thread (``compiling_ahead``)
        self.ahead: dict[tuple[Any, ...], Future[Any]] = {}
        self.direct = not interpreted

    def launch(self, key: tuple[Any, ...] | None, grid: tuple[int, ...], params: list[Any], device: int) -> None:
        """Launch the variant ``key`` selects (Triton's specializations of ``params``) on ``grid``."""
        run = self.variants.get((device, key)) if self.direct else None  # a variant is loaded on one device
        if run is not None:
            run(grid, params, raw_stream(device))
            return
        if self.interpreted:
            self._interpret(grid, params, None)
            return
        if device < 0 and self.direct and (target := ahead_device()) is not None:
            self._compile_ahead(target, key, grid, params)
            return
        if not self.direct or not callable(getattr(self.fn, "warmup", None)):
            # a Triton without compile-only warm-up: it compiles and launches in one call
            self.direct = False
            try:
                self.fn[grid](*params, num_warps=self.warps_of(params), **self.options)
            except Exception as e:
                raise KernelLaunchError(self.name, self.source, e) from e
            return
        try:  # a variant's first launch: Triton compiles it (without launching), or a compile thread has
            ahead = self.ahead.pop((device, key), None) if self.ahead else None
            compiled = ahead.result() if ahead is not None and ahead.exception() is None else None
            if compiled is None:  # (a compile thread's failure: compiled here again, to raise it with the source)
                compiled = self.fn.warmup(*params, grid=grid, num_warps=self.warps_of(params), **self.options)
            else:
                global variants_compiled_ahead
                variants_compiled_ahead += 1
            static = _static_launch(compiled, device)
            run = static.launcher() if static is not None else _triton_launch(compiled)
            run(grid, params, raw_stream(device))
        except Exception as e:
            raise KernelLaunchError(self.name, self.source, e) from e
        self.variants[(device, key)] = run
        if static is not None:
            self.static[(device, key)] = static

    def _compile_ahead(self, device: int, key: tuple[Any, ...] | None, grid: tuple[int, ...], params: list[Any]) -> None:
        """Hand the variant of ``params`` (meta tensors where the launch takes device tensors: Triton
        specializes on their dtypes and the 16-byte alignment of their addresses, which a meta tensor
        has as its CUDA counterpart) to a compile thread, once."""
        slot = (device, key)
        if slot in self.variants or slot in self.ahead or _compile_pool is None or not callable(
                getattr(self.fn, "warmup", None)):
            return
        fn, num_warps, options = self.fn, self.warps_of(params), self.options

        def compile_variant() -> Any:
            torch.cuda.set_device(device)  # (per thread) the device Triton compiles for
            return fn.warmup(*params, grid=grid, num_warps=num_warps, **options)

        self.ahead[slot] = _compile_pool.submit(compile_variant)

    def warps_of(self, params: Sequence[Any]) -> int:
        """The warps a variant compiles for: ``narrow_warps`` where a tensor's row stride (a stride other
        than 0 and 1) times its element size is not a multiple of 16 bytes, so each lane loads a row's
        elements in pieces narrower than a 16-byte vector, else ``num_warps``. A schedule that gives
        its lanes as many elements as 16-byte loads carry (a column sum's 32 a thread) asks for more,
        fuller programs of fewer elements a lane where the loads are narrow: H200, column sums and
        maxima of bf16 131072 x 127, 2 -> 8 warps: 53.9 -> 26.0 and 40.2 -> 25.6 us (Inductor 20.5, 22.1);
        the same change on aligned rows lost up to 1.3x (``kernels_notes.md``). Each variant is
        compiled once: the stride's alignment class is part of its key."""
        if not self.narrow_warps or self.narrow_warps == self.num_warps:
            return self.num_warps
        if self._param_names is None:
            self._param_names = [p.name for p in self.fn.params]
        names = self._param_names
        tensors = {n: p for n, p in zip(names, params, strict=True) if isinstance(p, torch.Tensor)}
        for name, value in zip(names, params, strict=True):
            match = STRIDE_PARAM.fullmatch(name)
            if match is None or not isinstance(value, int) or value in (0, 1):
                continue
            tensor = tensors.get(f"{match[1] or ''}{tensor_param(int(match[2]))}")
            if tensor is not None and ALIGNMENTS[value & 15] * tensor.element_size() % 16:
                return self.narrow_warps
        return self.num_warps

    def variant(self, key: tuple[Any, ...] | None, device: int) -> Variant | None:
        """The variant ``key`` selects, launched before (None where there is none to call directly);
        the interpreter's launch for an interpreted kernel."""
        if self.interpreted:
            return Variant(self._interpret)
        run = self.variants.get((device, key)) if self.direct else None
        return Variant(run, self.static.get((device, key))) if run is not None else None

    def _interpret(self, grid: tuple[int, ...], params: list[Any], stream: Any) -> None:
        # Masked-off lanes compute on placeholder values (log(0)); numpy must not warn about them.
        with np.errstate(all="ignore"):
            try:
                self.fn[grid](*params, num_warps=self.num_warps)
            except Exception as e:
                # the interpreter wraps what a kernel raises (once per nested call): an index out of
                # range (the prelude's ``_check_index``) is the caller's error, as ATen's ValueError is
                cause: BaseException | None = e
                while cause is not None and not isinstance(cause, IndexOutOfRange):
                    cause = cause.__cause__
                if cause is None:
                    raise
                raise ValueError(str(cause)) from None


def _triton_launch(compiled: Any) -> Callable[[tuple[int, ...], list[Any], Any], None]:
    def run(grid: tuple[int, ...], params: list[Any], stream: Any) -> None:
        compiled[grid](*params, stream=stream)

    return run


#: Triton's types of scalar kernel arguments -> the format characters of torch's static launcher.
_STATIC_TYPES = {"i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l", "u1": "I", "u8": "B", "u16": "H",
                 "u32": "I", "u64": "K", "fp16": "f", "bf16": "f", "fp32": "f", "f32": "f", "fp64": "d"}


@dataclass(frozen=True)
class StaticLaunch:
    """A compiled variant's launch through torch's static launcher, in parts: ``call(function, grid x,
    y, z, warps, shared memory, types, arguments, stream)`` with the parameters at ``kept`` and
    ``scratch`` Nones. A bound launch writes it as one call of its own (``BoundLaunch.write``)."""

    call: Callable[..., None]
    function: Any
    warps: int
    shared: int
    types: str
    kept: tuple[int, ...]
    scratch: int

    def launcher(self) -> VariantLaunch:
        """``run(grid, params, stream)``: the launch as one closure (the launcher's hot path reads no
        attribute of this object)."""
        kept, call, function, warps, shared, types = self.kept, self.call, self.function, self.warps, self.shared, \
            self.types
        scratch: tuple[None, ...] = (None,) * self.scratch
        pick = operator.itemgetter(*kept) if len(kept) > 1 else (lambda p: (p[kept[0]],)) if kept else (lambda p: ())

        def run(grid: tuple[int, ...], params: list[Any], stream: Any) -> None:
            call(function, grid[0], grid[1], grid[2], warps, shared, types, pick(params) + scratch, stream)

        return run


@dataclass(frozen=True)
class Variant:
    """A compiled variant launched before: ``launch(grid, params, stream)``, and its parts where
    torch's static launcher calls it (None: Triton's runner, a cooperative launch, the interpreter)."""

    launch: VariantLaunch
    static: StaticLaunch | None = None


def _static_launch(compiled: Any, device: int) -> StaticLaunch | None:
    """A compiled variant launched by torch's static CUDA launcher (Inductor's: the driver call in
    C++, no Python launcher in between; 4.4 vs 8.0 us per launch on the H200's host), or None where
    it does not apply: no such launcher in this torch, launch hooks set (a profiler's, e.g. Proton:
    hooks set after a variant's first launch are not called for it), scratch memory, clusters,
    cooperative launches, or an argument type it does not know.

    The cubin is loaded by torch's launcher too, so Triton never builds its own C launcher for the
    variant (a host compiler run of ~0.3 s per kernel signature on a cold cache: a third of a
    model's first call). It takes the arguments the compiled kernel keeps (Triton drops constexprs
    and the integers it specialized to 1) and a None per scratch parameter the kernel declares."""
    launcher = getattr(torch._C, "_StaticCudaLauncher", None)
    # Loaded already: Triton has just compiled the variant (a Triton without it: hooks unknown).
    knobs = sys.modules.get("triton.knobs")
    if launcher is None or knobs is None:
        return None
    try:
        hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
        metadata, source = compiled.metadata, compiled.src
        if (any(h is not None and getattr(h, "calls", True) for h in hooks)
                or getattr(metadata, "num_ctas", 1) != 1 or getattr(metadata, "launch_cooperative_grid", False)
                or getattr(metadata, "launch_pdl", False)):
            return None
        names = list(source.fn.arg_names)
        constants = {names.index(k) if isinstance(k, str) else k[0] if isinstance(k, tuple) else k
                     for k in getattr(source, "constants", {})}
        kept, types = [], ""
        for k, ty in source.signature.items():
            position = names.index(k) if isinstance(k, str) else k
            if ty == "constexpr" or position in constants:
                continue
            kept.append(position)
            types += "O" if ty.startswith("*") else _STATIC_TYPES[ty]
        scratch = 0
        for size in ("global_scratch_size", "profile_scratch_size"):
            if hasattr(metadata, size):
                if getattr(metadata, size):
                    return None
                scratch, types = scratch + 1, types + "O"
        warps, shared = metadata.num_warps, metadata.shared
        function = _load_cubin(launcher, compiled, device)
    except (AttributeError, KeyError, ValueError, TypeError, OSError):
        return None
    if function is None:
        return None
    return StaticLaunch(launcher._launch_kernel, function, warps, shared, types, tuple(kept), scratch)


def _load_cubin(launcher: Any, compiled: Any, device: int) -> Any:
    """The CUDA function of a compiled variant, loaded from its cubin in Triton's cache by torch's static
    launcher (None where the cache holds no cubin, or the kernel asks for more shared memory than the
    device has: Triton's own launch then refuses it with its error)."""
    paths = [p for name, p in getattr(compiled, "metadata_group", {}).items() if name.endswith(".cubin")]
    if not paths:
        return None
    shared = compiled.metadata.shared
    properties = torch.cuda.get_device_properties(device)
    available = properties.shared_memory_per_block_optin  # type: ignore[attr-defined]  # not in torch's stubs
    if shared > available:
        return None
    loaded = launcher._load_kernel(paths[0], compiled.metadata.name, shared, device)
    # (module, function, registers, spills) in newer torch, (function, registers, spills) before
    return loaded[1] if len(loaded) == 4 else loaded[0]


def _dense_stride_exprs(shape: str, rank: int, perm: Sequence[int]) -> str:
    """The strides of a dense tensor of shape ``shape`` (a tuple's name) in allocation order
    ``perm``, as a tuple expression (``dense_strides`` written out)."""
    strides = [""] * rank
    stride = "1"
    for dim in reversed(perm):
        strides[dim] = stride
        extent = f"max({shape}[{dim}], 1)"
        stride = extent if stride == "1" else f"{stride} * {extent}"
    return "(" + ", ".join(strides) + ("," if rank == 1 else "") + ")"


#: ``division_multiplier`` of the sizes launches divide by, kept (a lookup, where computing one is a few
#: big-integer operations, on a launch's path)
_division_multiplier = functools.lru_cache(maxsize=4096)(division_multiplier)


def _specialization(names: list[str], kinds: list[str]) -> str:
    """The key expression of an argument list: alignment of tensors, 1 / 64-bit of integers (Triton's
    specializations), the value of constexprs (tile sizes, the integers' alignments, which include
    Triton's multiple of 16), the type of scalars."""
    parts = []
    for name, kind in zip(names, kinds, strict=True):
        if kind == "tensor":
            parts.append(f"{name}.data_ptr() % 16 == 0")
        elif kind == "int":
            parts.append(f"{name} == 1, {name} > 2147483647")
        elif kind == "constexpr":
            parts.append(name)
        else:
            parts.append(f"type({name}), {name} == 1 if type({name}) is int else 0, "
                         f"{name} % 16 == 0 if type({name}) is int else 0, "
                         f"abs({name}) > 2147483647 if type({name}) is int else 0")
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def launcher_source(s: KernelSource, direct: bool = False) -> tuple[str, dict[str, Any]]:
    """Python source of ``prepare(ctx, args, out) -> (outputs, grid, params)``, ``run(ctx, *args,
    out=None)`` and ``key(params)`` (the compiled variant's key of ``prepare``'s arguments) for
    kernel ``s``, and the globals they need (``launches``: the kernel's ``DirectLaunches``, set by
    the caller, and ``variants``, its ``variants``: ``run`` calls a variant launched before itself,
    else ``launches.launch``). ``direct``: a compiled (not interpreted) kernel, whose outputs on the
    current CUDA device are allocated without the dispatcher."""
    w = PythonWriter(f"launcher of {s.name}", {
        "torch": torch, "_size_error": _size_error, "_constant_error": _constant_error, "_unknown": _unknown_output_size,
        "names": s.tensor_names, "_dense": dense_strides, "_next_pow2": next_power_of_2, "_NoPrograms": NoPrograms,
        "_raw_stream": raw_stream, "_ALIGNMENTS": ALIGNMENTS,
        "_multiplier": _division_multiplier})
    n_in, n_out = len(s.tensor_inputs), len(s.output_shapes)
    device = "t0.device" if n_in else "ctx.device"
    # On the current CUDA device, outputs come from torch's allocator without the dispatcher
    # (Inductor's ``empty_strided_cuda``: 1 us less per output on a 2 us call).
    fast = direct and n_in > 0 and _empty_cuda is not None and _current_device is not None
    if fast:
        w.env["_empty_cuda"], w.env["_current_device"] = _empty_cuda, _current_device
    # The constants, bound once: ``prepare`` and ``run`` read the same names.
    extents = [w.constant(src.extent, "_extent") if src.extent is not None else None for src in s.sizes]
    mapped = [(w.constant(extent, "_mapped"), host_int_expr(loop), w.constant(message, "_mapped_message"))
              for extent, loop, message in s.mapped_extent_checks]
    whole = [(w.constant(extent, "_whole"), constant, w.constant(message, "_whole_message"))
             for extent, constant, message in s.extent_checks]
    nonempty = [(host_int_expr(extent), w.constant(message, "_empty_message")) for extent, message in s.nonempty_checks]
    nonnegative = [(host_int_expr(extent), w.constant(message, "_negative_message"))
                   for extent, message in s.nonnegative_checks]
    tiles = [(param, host_int_expr(extent), limit, w.constant(message, "_tile_message"))
             for param, extent, limit, message in s.dynamic_tiles]
    divisible = [(host_int_expr(extent), factor, w.constant(message, "_message"))
                 for extent, factor, message in s.divisibility_checks]
    allocations: list[tuple[str, str, str | None]] = []  # per output: its shape, the general allocation, the fast one
    for k, (shape, perm, dtype) in enumerate(zip(s.output_shapes, s.output_perms, s.output_dtypes, strict=True)):
        dtype_name = w.constant(dtype.torch_dtype, "_dtype")
        sizes = ", ".join(host_int_expr(e) for e in shape)
        if tuple(perm) == tuple(range(len(shape))):  # row-major: torch.empty is the cheaper call
            general = f"torch.empty(_shape{k}, dtype={dtype_name}, device={device})"
        else:
            general = (f"torch.empty_strided(_shape{k}, _dense(_shape{k}, {w.constant(perm, '_perm')}), "
                       f"dtype={dtype_name}, device={device})")
        quick = (f"_empty_cuda(_shape{k}, {_dense_stride_exprs(f'_shape{k}', len(shape), perm)}, {dtype_name}) "
                 f"if _here else {general}") if fast else None
        allocations.append((f"({sizes}{',' if len(shape) == 1 else ''})", general, quick))
    outputs = ", ".join(f"o{k}" for k in range(n_out))
    # Nothing to compute only when every output is empty (an empty one beside others is written by
    # no program, the others still are).
    empty = " and ".join(f"o{k}.numel() == 0" for k in range(n_out))
    tensors = [*(f"t{k}" for k in range(n_in)), *(f"o{k}" for k in range(n_out))]
    strides = [stride_param(k, d) for k, d in s.stride_args]
    scalars = [f"sc{k}" for k in range(len(s.scalar_inputs))]
    tile_params = [param for param, *_ in s.dynamic_tiles]
    integers = [*strides, *(src.symbol for src in s.sizes)]
    alignments = [alignment_param(n) for n in integers]
    multipliers = [name for name, _ in s.divisors]
    names = [*tensors, *integers, *multipliers, *scalars, *tile_params, *alignments]
    params = ", ".join(names)
    kinds = [*(["tensor"] * len(tensors)), *(["int"] * (len(integers) + len(multipliers))), *(["scalar"] * len(scalars)),
             *(["constexpr"] * (len(tile_params) + len(alignments)))]
    grid = ", ".join(host_int_expr(e) for e in s.grid) + ("," if len(s.grid) == 1 else "")
    grid3 = ", ".join([*(host_int_expr(e) for e in s.grid), *(["1"] * (3 - len(s.grid)))])  # the runner's x, y, z
    empty_grid = " or ".join(f"{host_int_expr(e)} == 0" for e in s.grid if e.value is None or e.value == 0)
    spec = _specialization(names, kinds)

    def arguments() -> None:
        """Read the sizes, check them, allocate (or take) the outputs, read the strides and scalars."""
        for k, p in enumerate(s.tensor_inputs):
            w.line(f"t{k} = args[{p}]")
        for src, extent in zip(s.sizes, extents, strict=True):
            if src.index >= 0 and not src.output:
                w.line(f"{src.symbol} = t{src.index}.shape[{src.dim}]")
            elif src.index >= 0:  # an output's size: a given buffer (a stream loop's chunk) says it first
                with w.block("if out is not None:"):
                    w.line(f"{src.symbol} = out[{src.index}].shape[{src.dim}]")
                with w.block("else:"):
                    w.line(f"{src.symbol} = {extent}.evaluate(ctx.env)" if extent is not None
                           else f"raise _unknown({s.name!r}, names[{n_in + src.index}], {src.dim})")
            else:
                w.line(f"{src.symbol} = {extent}.evaluate(ctx.env)")
        for extent_name, loop, message in mapped:
            with w.block(f"if {extent_name}.evaluate(ctx.env) != {loop}:"):
                w.line(f"raise ValueError({message}.format({extent_name}.evaluate(ctx.env), {loop}))")
        for a, da, b, db in s.size_checks:
            with w.block(f"if t{a}.shape[{da}] != t{b}.shape[{db}]:"):
                w.line(f"raise _size_error(names, {a}, {da}, t{a}.shape[{da}], {b}, {db}, t{b}.shape[{db}])")
        for a, da, size in s.constant_checks:
            with w.block(f"if t{a}.shape[{da}] != {size}:"):
                w.line(f"raise _constant_error(names, {a}, {da}, t{a}.shape[{da}], {size})")
        for extent_name, constant, message in whole:
            with w.block(f"if {extent_name}.evaluate(ctx.env) != {constant}:"):
                w.line(f"raise ValueError({message}.format({extent_name}.evaluate(ctx.env)))")
        for extent, message in nonempty:
            with w.block(f"if {extent} == 0:"):
                w.line(f"raise ValueError({message})")
        for extent, message in nonnegative:
            with w.block(f"if {extent} < 0:"):
                w.line(f"raise ValueError({message}.format({extent}))")
        for param, extent, limit, message in tiles:
            w.line(f"{param} = _next_pow2({extent})")
            with w.block(f"if {param} > {limit}:"):
                w.line(f"raise ValueError({message} + ', ' + str({extent}) + ' elements, over the {limit} a tile may "
                       "hold; schedule it in a loop')")
        for extent, factor, message in divisible:
            with w.block(f"if {extent} % {factor}:"):
                w.line(f"raise ValueError({message} + ', but it is ' + str({extent}))")
        with w.block("if out is None:"):
            if fast:
                w.line("_here = t0.get_device() == _current_device()")
            for k, (shape, general, quick) in enumerate(allocations):
                w.line(f"_shape{k} = {shape}", f"o{k} = {quick or general}")
        with w.block("else:"):
            w.line(*(f"o{k} = out[{k}]" for k in range(n_out)))
        # One stride() call per tensor (a call costs as much as reading every element of the tuple).
        for k in sorted({k for k, _ in s.stride_args}):
            w.line(f"_st{k} = {tensors[k]}.stride()")
        for k, d in s.stride_args:
            w.line(f"{stride_param(k, d)} = _st{k}[{d}]")
        for k, d, outer in s.stride_fallbacks:
            fallback = stride_param(k, d)
            for o in reversed(outer):
                fallback = f"_st{k}[{o}] if {tensors[k]}.shape[{o}] != 1 else {fallback}"
            with w.block(f"if {tensors[k]}.shape[{d}] == 1:"):
                w.line(f"{stride_param(k, d)} = {fallback}")
        for k, p in enumerate(s.scalar_inputs):
            value = f"args[{p}].item()" if k in s.cpu_scalars else f"args[{p}]"
            w.line(f"sc{k} = int({value})" if k in s.bool_scalars else f"sc{k} = {value}")
        for integer, alignment in zip(integers, alignments, strict=True):
            w.line(f"{alignment} = _ALIGNMENTS[{integer} & 15]")
        for name, divisor in s.divisors:
            w.line(f"{name} = _multiplier({host_int_expr(divisor)})")

    def no_programs() -> None:
        """No output to write: nothing to launch. Outputs but no program to write them (a reduction of
        an empty axis, or a broadcast, beside an empty output): the caller computes them with ATen."""
        if empty_grid:
            with w.block(f"if {empty_grid}:"):
                w.line("raise _NoPrograms()")

    with w.block("def prepare(ctx, args, out):"):
        arguments()
        with w.block(f"if {empty}:"):
            w.line(f"return [{outputs}], None, []")
        no_programs()
        w.line(f"return [{outputs}], ({grid}), [{params}]")
    w.line("", "")
    with w.block("def run(ctx, *args, out=None):"):
        arguments()
        with w.block(f"if {empty}:"):
            w.line(f"return [{outputs}]")
        no_programs()
        # The compiled variant's launch looked up here, not in a call of ``launches.launch`` (which
        # compiles a variant the first time, and runs an interpreted kernel).
        w.line("_device = o0.get_device()", f"_variant = variants.get((_device, {spec}))")
        with w.block("if _variant is not None:"):
            w.line(f"_variant(({grid3}), [{params}], _raw_stream(_device))")
        with w.block("else:"):
            w.line(f"launches.launch({spec}, ({grid3}), [{params}], _device)")
        w.line(f"return [{outputs}]")
    w.line("", "")
    with w.block("def key(params):"):  # the same key from what ``prepare`` returned (a launch that takes them over)
        w.line(f"{params}, = params", f"return {spec}")
    return w.source, w.env


#: What a parameter of a bound launch is: ("slot", k) the value in slot k (the arguments first,
#: then each allocated output), ("value", v) the constant v, ("counter", None) the grid
#: synchronizations' counter of the launch's stream.
BoundParam = tuple[str, Any]
#: ``run(args)``: launches bound to one binding replayed on ``args`` (None: an argument's alignment
#: differs from the recorded call's, so the caller runs the launcher).
BoundRun = Callable[[Sequence[Any]], "list[torch.Tensor] | None"]


@dataclass(frozen=True, slots=True)
class BoundFunction:
    """A bound replay called as a function of its own (a sequence's launches, one after another),
    where a straight-line function cannot inline it as it does a ``BoundLaunch``."""

    run: BoundRun


class BoundLaunch:
    """A launch recorded on a bound program's first call, replayed on its later calls, whose sizes and
    strides are those of the first (the caller vouches for that): allocate the outputs as they were,
    fill the recorded parameters in and launch, with none of the reading of sizes and strides,
    checks, grid and variant key of the generated launcher (a dozen calls into torch fewer per
    launch). An argument whose 16-byte alignment (part of the compiled variant) differs from the
    first call's needs the launcher instead.

    ``write`` renders the replay as lines of Python for a caller's generated code (a bound
    program's straight-line function inlines its launches); ``run`` is the replay as a function of
    its own, ``source`` its text."""

    def __init__(self, args: Sequence[Any], made: Sequence[torch.Tensor], params: Sequence[BoundParam],
                 results: Sequence[int], grid: tuple[int, ...], variant: Variant,
                 counter: Callable[[Any], torch.Tensor] | None) -> None:
        self.n_args = len(args)
        #: (a launch that writes into an argument allocates nothing)
        self.device = made[0].device if made else next(a.device for a in args if isinstance(a, torch.Tensor))
        self.reads = sorted({value for kind, value in params if kind == "slot" and value < self.n_args})
        self.aligned = {k: args[k].data_ptr() % 16 == 0 for k in self.reads}
        self.made = [(tuple(t.shape), t.stride(), t.dtype) for t in made]
        self.params = list(params)
        self.results = list(results)
        self.grid, self.variant, self.counter = grid, variant, counter
        self.source = ""
        self.run: BoundRun = self._function()

    def misaligned(self, names: Sequence[str], fixed: Sequence[bool] = ()) -> str:
        """A condition on the arguments ``names`` (the launch's argument list): whether one's alignment
        differs from the recorded call's ("" where no argument is read; none of those ``fixed`` marks,
        whose alignment cannot change)."""
        return " or ".join(f"{names[k]}.data_ptr() % 16" + (" != 0" if self.aligned[k] else " == 0")
                           for k in self.reads if not (k < len(fixed) and fixed[k]))

    def write(self, names: Sequence[str], made: Sequence[str], stream: str, writer: PythonWriter) -> list[str]:
        """Lines allocating the outputs into ``made`` and launching on ``stream`` (an expression), for
        the arguments ``names``; the constants they read are bound into ``writer``'s globals."""
        slots = [*names, *made]
        launch, grid = writer.constant(self.variant.launch, "_launch"), writer.constant(self.grid, "_grid")
        cuda = self.device.type == "cuda" and _empty_cuda is not None
        device = self.device
        alloc = writer.constant(_empty_cuda if cuda else (
            lambda sizes, strides, dtype: torch.empty_strided(sizes, strides, dtype=dtype, device=device)), "_alloc")
        lines = []
        for j, (sizes, strides, dtype) in enumerate(self.made):
            lines.append(f"{made[j]} = {alloc}({sizes}, {strides}, {writer.constant(dtype, '_dtype')})")
        values = []
        for kind, value in self.params:
            if kind == "slot":
                values.append(slots[value])
            elif kind == "counter":
                values.append(f"{writer.constant(self.counter, '_counter')}({stream})")
            elif type(value) is int or (type(value) is float and math.isfinite(value)):
                values.append(repr(value))
            else:
                values.append(writer.constant(value, "_v"))
        static = self.variant.static
        if static is None or len(self.grid) != 3:
            lines.append(f"{launch}({grid}, [{', '.join(values)}], {stream})")
            return lines
        call, function = writer.constant(static.call, "_call"), writer.constant(static.function, "_function")
        types = writer.constant(static.types, "_types")
        arguments = [values[k] for k in static.kept] + ["None"] * static.scratch
        xyz = ", ".join(map(str, self.grid))
        lines.append(f"{call}({function}, {xyz}, {static.warps}, {static.shared}, {types}, "
                     f"({', '.join(arguments)}{',' if len(arguments) == 1 else ''}), {stream})")
        return lines

    def stream_expression(self, writer: PythonWriter) -> str:
        """The expression of the current stream the launch goes on (its names bound into ``writer``)."""
        if self.device.type != "cuda":
            return "None"
        return f"{writer.constant(raw_stream, '_raw_stream')}({self.device.index})"

    def _function(self) -> BoundRun:
        writer = PythonWriter("bound launch")
        names = [f"a{k}" for k in range(self.n_args)]
        made = [f"a{self.n_args + j}" for j in range(len(self.made))]
        body = [f"a{k} = args[{k}]" for k in self.reads]
        check = self.misaligned(names)
        if check:
            body += [f"if {check}:", "    return None"]
        body.append(f"_stream = {self.stream_expression(writer)}")
        body += self.write(names, made, "_stream", writer)
        slots = [*names, *made]
        body.append(f"return [{', '.join(slots[s] for s in self.results)}]")
        writer.function("def run(args):", body)
        run: BoundRun = writer.define("run")
        self.source = writer.source
        return run


#: What a segment's ``bind`` returns (``host_ir.nodes.BoundSegment``): one launch a caller's generated
#: code may inline, or a replay it calls.
Bound = BoundLaunch | BoundFunction


def bound_launch(args: Sequence[Any], made: Sequence[torch.Tensor], params: Sequence[BoundParam],
                 results: Sequence[int], grid: tuple[int, ...], variant: Variant,
                 counter: Callable[[Any], torch.Tensor] | None = None) -> BoundLaunch | None:
    """The ``BoundLaunch`` of the first call's arguments ``args`` (slots ``0..``), the outputs it
    allocated ``made`` (slots ``len(args)..``), the launch's parameters, the slots of its results,
    its grid, the compiled variant it launched and ``counter(stream)`` (the counter for ("counter",
    None) parameters). Its ``run`` returns None when an argument's alignment differs from the
    first call's (the caller runs the launcher then); None instead of it when an output the first
    call allocated was not aligned."""
    if any(t.data_ptr() % 16 for t in made):
        return None
    return BoundLaunch(args, made, params, results, grid, variant, counter)
