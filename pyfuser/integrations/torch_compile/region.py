"""A translated region as the compiled graph calls it.

The hot path is what issue 14 asks of a cached dispatch: pick the fusion's inputs out of the
call's arguments, ``FusionExecutorCache.run`` (signature lookup, size binding, the compiled Host IR
program; in a graph of static shapes, after the first call, the program with its sizes bound) or a
CUDA-graph replay, and hand the outputs back; nothing else runs per call. Anything
raised is re-raised naming the region, its FX nodes and, for each fusion tensor the message
mentions (``T3``), the FX node it came from.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node

from pyfuser.codegen.kernel_source import KernelLaunchError
from pyfuser.codegen.python_writer import PythonWriter
from pyfuser.host_ir.cuda_graph import CaptureError, CudaGraphRunner
from pyfuser.host_ir.nodes import AtenCall, LaunchKernel
from pyfuser.host_ir.specialization import Seen, Specializations
from pyfuser.host_ir.straight_line import InlinedBody, InlineWriter
from pyfuser.integrations.torch_compile.support import op_name
from pyfuser.integrations.torch_compile.translator import TranslatedRegion
from pyfuser.ir.layout import is_dense
from pyfuser.ir.tensor_view import TensorView
from pyfuser.runtime.executor import BoundProgram

_TENSOR_NAME = re.compile(r"\bT\d+\b")


@dataclass(frozen=True)
class InputConversion:
    """A fusion input an op left in eager computes otherwise than its fake (meta) function traced it,
    converted on every call to what the region was built for: ``dtype``, and where ``strides`` is not
    None, those strides (a copy). torch's meta functions and kernels disagree at times: a convolution
    of a one-channel input (Audio Spectrogram Transformer: ``unsqueeze(1).transpose(2, 3)``) is traced
    channels-last and computed contiguous."""

    position: int
    dtype: torch.dtype
    strides: tuple[int, ...] | None = None

    def __call__(self, value: torch.Tensor) -> torch.Tensor:
        if self.strides is None:
            return value.to(self.dtype)
        converted = torch.empty_strided(value.shape, self.strides, dtype=self.dtype, device=value.device)
        return converted.copy_(value)


def _converting(function: Callable[[list[Any]], Any],
                conversions: Sequence[InputConversion]) -> Callable[[list[Any]], Any]:
    """``function`` called with the inputs ``conversions`` name converted."""
    def run(inputs: list[Any]) -> Any:
        inputs = list(inputs)
        for conversion in conversions:
            inputs[conversion.position] = conversion(inputs[conversion.position])
        return function(inputs)

    return run


def _other_strides(value: torch.Tensor, traced: torch.Tensor) -> bool:
    """Whether ``value`` is laid out otherwise than ``traced`` (a dense tensor of static sizes and
    strides the fusion declared by its contiguity and stride order), axes of one element aside."""
    if not static_tensor(traced) or tuple(value.shape) != tuple(traced.shape):
        return False
    sizes, strides = [int(s) for s in traced.shape], [int(s) for s in traced.stride()]
    if not is_dense(sizes, strides):
        return False  # (declared as a view: any strides fit)
    return any(n != 1 and a != b for n, a, b in zip(sizes, value.stride(), strides, strict=True))


def static_tensor(value: Any) -> bool:
    """Whether an FX value is a tensor whose sizes and strides are plain ints (no symbols)."""
    return isinstance(value, torch.Tensor) and all(type(s) is int for s in (*value.shape, *value.stride()))


def dynamic_signature(values: Sequence[Any]) -> list[Any]:
    """A call's signature where sizes are symbolic (a region's, a graph's): each tensor's sizes and
    strides, each number's type and value (a size symbol's value decides sizes a bound program fixed)."""
    return [(t.shape, t.stride()) if isinstance(t, torch.Tensor) else (type(t), t) for t in values]


def _recorded_signature(arguments: Sequence[Seen | Any]) -> tuple[Any, ...] | None:
    """``dynamic_signature`` of a recorded call (a tensor's ``Seen``, a scalar's value); None where an argument
    is neither (a tensor the recording has no geometry of)."""
    key: list[Any] = []
    for a in arguments:
        if isinstance(a, Seen):
            key.append((a.sizes, a.strides))
        elif isinstance(a, (int, float, bool)):
            key.append((type(a), a))
        else:
            return None
    return tuple(key)


def _launch_error(error: BaseException | None) -> KernelLaunchError | None:
    """The kernel Triton refused, where that is what ``error`` comes from."""
    while error is not None and not isinstance(error, KernelLaunchError):
        error = error.__cause__ or error.__context__
    return error


@dataclass(frozen=True)
class RegionFunction:
    """A region's straight-line function for one signature of its calls: ``run(fusion_inputs)`` -> the
    fusion's outputs; ``positions``: each fusion input's position among the region call's arguments;
    ``slots``: each region output's position among the fusion's outputs."""

    run: Callable[..., Any]
    positions: list[int]
    slots: list[int]
    _inline: InlineWriter
    _conversions: Sequence[InputConversion]

    def inline(self, writer: PythonWriter, fusion_inputs: Sequence[str], prefix: str,
               fixed: Sequence[bool]) -> InlinedBody | None:
        """The same run written into ``writer``'s function on the expressions ``fusion_inputs`` (as ``run``
        takes them; ``fixed``: those whose memory the caller obtains itself, aligned alike on every call);
        the body's outputs are the fusion's, in its order."""
        given, fixed = list(fusion_inputs), list(fixed)
        for conversion in self._conversions:  # (a conversion is a new tensor)
            j = conversion.position
            given[j], fixed[j] = f"{writer.constant(conversion, '_convert')}({given[j]})", True
        return self._inline(writer, given, prefix, fixed)


class RegionExecutionError(RuntimeError):
    """An error inside a region whose original type cannot carry the extra context."""


class KernelFallbackWarning(UserWarning):
    """A region's generated kernels failed to compile or run; it runs its ops as ATen calls instead
    (the message names the region, its FX nodes and the error: a code generator bug to report)."""


class FusionRegion:
    """``region(*args)`` -> the values of the region's output nodes (a list, in order)."""

    def __init__(self, name: str, translated: TranslatedRegion, nodes: Sequence[Node], *,
                 enable_options: Sequence[str] = (), disable_options: Sequence[str] = (),
                 cuda_graph: bool = False, static_inputs: frozenset[Node] = frozenset()) -> None:
        self.__name__ = self.__qualname__ = name  # how torch.fx prints the call
        self.name = name
        self.fd = translated.fd
        self.fec = translated.fd.fec
        self.device = translated.device
        self.nodes = [f"{n.name} ({op_name(n)})" for n in nodes if n.op == "call_function"]
        self.names = translated.names
        self._positions = tuple(translated.fusion_inputs)
        self._slots = tuple(translated.output_slots)
        self._in_order = self._slots == tuple(range(len(self._slots)))
        self._enable = tuple(enable_options)
        self._disable = tuple(disable_options)
        self._graphs: CudaGraphRunner | None = None
        self._static = [j for j, k in enumerate(self._positions) if translated.inputs[k] in static_inputs]
        #: per fusion input: the FX node it comes from (its ``meta['val']``: the value it was traced with)
        self._traced = [translated.inputs[k] for k in self._positions]
        #: fusion inputs converted to their traced dtype and layout on every call (decided on the first call)
        self._conversions_made: tuple[InputConversion, ...] | None = None
        #: what those conversions are: ``"getitem_3: torch.bfloat16 -> torch.float32"``
        self.converted_inputs: list[str] = []
        #: every fusion input a tensor of static sizes and strides (a graph without dynamic shapes):
        #: dynamo's guards fix the sizes, so a call's strides are its signature; otherwise (symbolic sizes,
        #: size symbols as scalar inputs) a signature is every tensor's sizes and strides and every
        #: scalar's value (``signature_of``)
        self._static_shapes = all(static_tensor(translated.inputs[k].meta.get("val")) for k in self._positions)
        #: whether a call's program is bound to its signature after the call (not for a fusion with
        #: work of its own on every call)
        self._binds = True
        #: the fusion's program bound to each input signature it was called with
        self._bound: Specializations[tuple[Any, ...], BoundProgram] = Specializations()
        self.use_cuda_graphs(cuda_graph)

    def use_cuda_graphs(self, on: bool) -> None:
        """Replay the region from CUDA graphs of its own (on a CUDA device), or not (a graph that
        captures the whole compiled graph captures the region's launches itself)."""
        if not on or self.device.type != "cuda":
            self._graphs = None
        elif self._graphs is None:
            self._graphs = CudaGraphRunner(self._execute, self._static, name=f"pyfuser region {self.name}")

    def compile_ahead(self) -> None:
        """Compile the region's program for its traced inputs now, its kernels in compile threads
        (``FusionExecutorCache.compile_ahead``): a graph's regions then compile side by side before
        its first call, not one after another inside it. For regions of static shapes; a failure is
        left to the first call, which handles it (``_without_kernels``)."""
        if not self._static_shapes:
            return
        args = []
        for node in self._traced:
            value = node.meta.get("val")
            if not isinstance(value, torch.Tensor):
                return
            # meta tensors stand for the region's device's; a 0-dim CPU tensor (a scalar read on the host) a zero
            args.append(torch.zeros((), dtype=value.dtype) if value.device.type == "cpu" and value.dim() == 0 else
                        torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta"))
        try:
            self.fec.compile_ahead(args, device=self.device, enable_options=self._enable, disable_options=self._disable)
        except Exception:
            return

    def _execute(self, inputs: list[Any]) -> list[torch.Tensor]:
        """The fusion's outputs for ``inputs``. In a graph of static shapes, dynamo's guards fix the
        graph's inputs (sizes, strides, dtypes, devices), autograd the sizes of incoming gradients, and
        the graph computes everything else the same way each call: so after the first call of each
        input strides (an incoming gradient's may differ) the region skips the executor cache's
        signature, lookup and binding, looking its binding up by the strides."""
        bindings = self._bound
        if bindings:
            bound = bindings.get(self._signature(inputs))
            if bound is not None:
                return bound.run(inputs)
        outputs = self.fec.run(inputs, device=self.device, enable_options=self._enable, disable_options=self._disable)
        if self._binds:
            bound = self.fec.bound_program(inputs, device=self.device, enable_options=self._enable,
                                           disable_options=self._disable, scalars_fixed=not self._static_shapes)
            if bound is None:  # a fusion with work of its own on every call (outputs written into inputs)
                self._binds = False  # is not asked again
            else:
                bindings.record(self._signature(inputs), bound)
        return outputs

    def _signature(self, inputs: list[Any]) -> tuple[Any, ...]:
        """The bindings' key of a call: its inputs' strides (static shapes: dynamo's guards fix the
        rest), else ``dynamic_signature``."""
        return tuple([t.stride() for t in inputs]) if self._static_shapes else tuple(dynamic_signature(inputs))

    def _conversions(self, inputs: Sequence[Any]) -> tuple[InputConversion, ...]:
        """The fusion inputs whose value has another dtype or layout than the graph was traced with, each
        to be converted to the traced one (``InputConversion``). The region was built for the traced
        dtypes and layouts, and the graph after it expects what they compute: a floating-point value is
        converted to its traced dtype (a bfloat16 value widened to float32 is the same number:
        ``_native_batch_norm_legit_functional``'s decomposition, which fake tensors run, gives float32
        running statistics for bfloat16 ones, while the CPU kernel keeps bfloat16), a dense value of
        other strides copied to the traced ones; another dtype mismatch (an integer for a float) is an
        error naming the FX node."""
        conversions: list[InputConversion] = []
        for j, (node, value) in enumerate(zip(self._traced, inputs, strict=True)):
            traced = node.meta.get("val")
            if not isinstance(value, torch.Tensor) or not isinstance(traced, torch.Tensor):
                continue
            dtype = traced.dtype
            if value.dtype != dtype and (not (value.is_floating_point() and dtype.is_floating_point)
                                         or j in self._static):
                raise TypeError(f"pyfuser region {self.name}: its input {node.name} was traced as {dtype}, but "
                                f"the value computed for it is {value.dtype} (its op's meta function and its kernel "
                                "disagree)")
            restride = j not in self._static and _other_strides(value, traced)
            if value.dtype == dtype and not restride:
                continue
            conversions.append(InputConversion(j, dtype, tuple(int(s) for s in traced.stride()) if restride else None))
            change = [f"{value.dtype} -> {dtype}"] if value.dtype != dtype else []
            change += [f"strides {tuple(value.stride())} -> {tuple(traced.stride())}"] if restride else []
            self.converted_inputs.append(f"{node.name}: {', '.join(change)}")
        return tuple(conversions)

    def __call__(self, *args: Any) -> list[torch.Tensor]:
        inputs = [args[k] for k in self._positions]
        conversions = self._conversions_made
        if conversions is None:
            conversions = self._conversions_made = self._conversions(inputs)
        for conversion in conversions:
            inputs[conversion.position] = conversion(inputs[conversion.position])
        try:
            if self._graphs is not None:
                outputs = self._replay(inputs)
            else:
                outputs = self._execute(inputs)
        except Exception as e:
            outputs = self._without_kernels(inputs, e)
        return outputs if self._in_order else [outputs[k] for k in self._slots]

    def straight_line(self, arguments: Sequence[Seen | Any]) -> RegionFunction | None:
        """For a caller that vouches every call passes arguments like ``arguments`` (per argument of the
        call, in order: a tensor's recorded geometry, a scalar's value): the region's straight-line
        function and how to write it into the caller's own (``RegionFunction``). None where the region
        has no such function (that signature not bound yet, a program that keeps its steps, CUDA graphs
        of its own)."""
        given = [arguments[k] for k in self._positions]
        for conversion in self._conversions_made or ():  # (bound to the strides the conversion makes)
            seen = given[conversion.position]
            if conversion.strides is not None and isinstance(seen, Seen):
                given[conversion.position] = dataclasses.replace(seen, strides=conversion.strides)
        if self._static_shapes:
            key: tuple[Any, ...] | None = tuple([a.strides if isinstance(a, Seen) else None for a in given])
        else:
            key = _recorded_signature(given)
        bound = self._bound.get(key) if key is not None else None
        written = bound.function if bound is not None else None
        if not written or self._graphs is not None:
            return None
        function: Callable[..., Any] = written.run
        conversions = self._conversions_made or ()
        if conversions:  # the inputs the region converts to their traced dtype and layout (``_conversions``)
            function = _converting(function, conversions)
        return RegionFunction(function, list(self._positions), list(self._slots), written.inline, conversions)

    def _without_kernels(self, inputs: list[Any], error: Exception) -> list[torch.Tensor]:
        """After a failure with generated kernels, the same fusion with every op an ATen call: if that
        runs, the region stays so (with a warning naming the failure); if not, the first error is
        the caller's (bad input fails both ways)."""
        if "kernel_codegen" in self._disable:
            raise self._error(error) from error
        try:
            outputs = self.fec.run(inputs, device=self.device, enable_options=self._enable,
                                   disable_options=(*self._disable, "kernel_codegen"))
        except Exception:
            raise self._error(error) from error
        self._disable = (*self._disable, "kernel_codegen")
        if self._bound:  # bound to the program with kernels: bind the one without
            self._bound.clear()
            self._binds = True
        launch = _launch_error(error)
        source = f"\n--- the source of {launch.kernel} ---\n{launch.source}" if launch is not None else ""
        warnings.warn(KernelFallbackWarning(f"{self._error(error)}; the region runs its ops as ATen calls from now "
                                            f"on{source}"), stacklevel=3)
        return outputs

    def _replay(self, inputs: list[Any]) -> list[torch.Tensor]:
        assert self._graphs is not None
        try:
            return self._graphs(inputs)
        except CaptureError as e:  # e.g. an ATen call that synchronizes with the host
            warnings.warn(f"{e}; the region runs without CUDA graphs from now on", stacklevel=3)
            self._graphs = None
            return self._execute(inputs)

    def _error(self, e: Exception) -> Exception:
        message = str(e)
        legend = [f"{t} is {self.names[t]}" for t in dict.fromkeys(_TENSOR_NAME.findall(message)) if t in self.names]
        text = (f"pyfuser region {self.name} (FX nodes: {', '.join(self.nodes)}) failed: {message}"
                + (f" [{'; '.join(legend)}]" if legend else ""))
        if type(e) in (ValueError, TypeError, RuntimeError, NotImplementedError):
            return type(e)(text)
        return RegionExecutionError(text)

    def summary(self) -> str:
        """What the region's latest execution ran: each generated kernel with the FX nodes whose values
        it writes, and the ATen calls by kind (before the first call: that it has not run)."""
        program = self.fec.last_program
        if program is None:
            return f"{self.name}: not run yet"
        container = program.container
        kernels: list[str] = []
        aten: collections.Counter[str] = collections.Counter()
        for node in container.walk():
            if isinstance(node, LaunchKernel):
                writes = [self.names.get(v.short_name if isinstance(v, TensorView) else "", "").split(" (")[0]
                          for v in node.outputs]
                kernels.append(f"  kernel {node.segment.name} -> {', '.join(w for w in writes if w) or 'intermediates'}")
            elif isinstance(node, AtenCall):
                aten[type(node.expr).__name__.removesuffix("Op")] += 1
        lines = [f"{self.name}: {len(self.nodes)} FX ops -> {len(kernels)} kernel(s), {sum(aten.values())} ATen call(s)",
                 *kernels]
        if aten:
            lines.append("  ATen calls: " + ", ".join(f"{name} x{n}" for name, n in aten.most_common()))
        return "\n".join(lines)

    @property
    def graph_runner(self) -> CudaGraphRunner | None:
        """The region's own CUDA graphs (None without them, or inside a whole-graph replay)."""
        return self._graphs

    @property
    def captures(self) -> int:
        """CUDA graphs captured so far (0 without CUDA graphs)."""
        return self._graphs.captures if self._graphs is not None else 0

    def __repr__(self) -> str:
        return f"<pyfuser region {self.name}: {len(self.nodes)} ops>"
