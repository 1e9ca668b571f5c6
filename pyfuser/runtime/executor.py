"""FusionExecutorCache: compiles a fusion once per input layout and runs it.

The hot path of a cached execution is: build the input signature, look it up, bind symbolic
sizes, run the compiled program. Validation and compilation happen on a signature miss only.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

from pyfuser.codegen.launcher import compiling_ahead
from pyfuser.comm.communicator import Communicator
from pyfuser.host_ir.evaluator import HostIrEvaluator
from pyfuser.host_ir.nodes import HostIrContainer, KernelSegment, LaunchKernel, PlainSegment
from pyfuser.host_ir.specialization import SPECIALIZATION_LIMIT
from pyfuser.host_ir.straight_line import StraightLineFunction
from pyfuser.ir.analysis.sharding import Sharding, check_meshes_fit, is_multidevice, sharding_of
from pyfuser.ir.base import FusionRuleError
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.layout import is_dense, memory_order
from pyfuser.ir.ops import VarMeanOp
from pyfuser.ir.tensor_view import TensorView
from pyfuser.options import CommunicatorBackend, CompileOptions, DisableOption, EnableOption, check_options, comm_backend
from pyfuser.preseg.staged_var_mean import one_stage_var_means
from pyfuser.runtime import profiling
from pyfuser.runtime.compile import compile_fusion
from pyfuser.runtime.inputs import InputBinder, check_devices, signature
from pyfuser.runtime.profiling import SegmentInfo


class Program(Protocol):
    """A compiled fusion: runs on concrete inputs with bound sizes, returns the outputs (a
    ``HostIrEvaluator``)."""

    #: the compiled (pre-segmented) fusion's output tensors, in order
    output_tvs: list[TensorView]

    @property
    def container(self) -> HostIrContainer:
        """The Host IR program it runs (what tools read: its kernels, its communications)."""
        ...

    @property
    def segments(self) -> Sequence[SegmentInfo]:
        """Its segments, each a name and a scheduler (for profiles)."""
        ...

    def run(self, args: Sequence[Any], ctx: EvalContext) -> list[torch.Tensor]: ...

    def straight_line(self, binding: object) -> StraightLineFunction | None:
        """Its run under ``binding`` as one generated function, once the binding's first run wrote it
        (None: runs under the binding take the program's steps)."""
        ...

    @property
    def writes_straight_line(self) -> bool:
        """Whether a binding's runs become one generated function (no loops, streams, communications
        or CUDA graphs: those keep the evaluator's steps)."""
        ...


@dataclass(slots=True)
class BoundProgram:
    """A compiled program with its symbolic sizes bound: ``run(args)`` skips the signature, its lookup
    and the binding, which the caller vouches for (a torch.compile region of a graph with static
    shapes, whose inputs dynamo's guards and the graph itself fix). After its first run a Host IR
    program without loops or streams runs as one generated function (``host_ir/straight_line.py``)."""

    program: Program
    env: dict[str, int]
    device: torch.device
    #: the ``EvalContext.binding`` of its runs: their kernel launches replay what the first recorded
    binding: object = field(default_factory=object, compare=False)
    #: the program's run as one function under ``binding``, once written (False: it has none)
    function: StraightLineFunction | Literal[False] | None = field(default=None, compare=False)
    #: converts the input scalars to their declared types (a fusion with scalar inputs, bound to their values)
    coerce: Any = field(default=None, compare=False)

    def run(self, args: Sequence[Any]) -> list[torch.Tensor]:
        if self.coerce is not None:
            args = self.coerce(list(args))
        function = self.function
        if function:
            outputs = function.run(args)
            if outputs is not None:  # None: another current device
                return outputs
        outputs = self.program.run(args, EvalContext(self.env.copy(), self.device, self.binding))
        if function is None:
            self.function = self.program.straight_line(self.binding) or False
        return outputs


#: How many exact input signatures a FusionExecutorCache remembers (least recently used dropped first).
#: A miss only costs validation when the layout was seen: programs stay keyed by layout.
SIGNATURE_CACHE_SIZE = 256


@dataclass(slots=True)
class _Compiled:
    """What an input signature runs: its program, the device, the positions of 0-dim CPU tensors moved
    there, and from its second call the program bound to the signature (``BoundProgram``: after one
    recorded run, one generated function), or False where the signature's calls cannot bind."""

    program: Program
    device: torch.device
    moved: tuple[int, ...]
    bound: BoundProgram | Literal[False] | None = None


class FusionExecutorCache:
    def __init__(self, fusion: Fusion, signature_cache_size: int = SIGNATURE_CACHE_SIZE) -> None:
        self.fusion = fusion
        self._version = -1
        self._binder: InputBinder | None = None
        self._has_scalars = False
        #: ``device`` arguments already resolved (those naming one device for good)
        self._devices: dict[torch.device | str | int, torch.device] = {}
        self._signature_cache_size = signature_cache_size
        #: whether the program key has a size class (``one_stage_var_means``; set by ``_reset``)
        self._var_means = False
        #: exact input signature -> what it runs (``_Compiled``)
        self._by_signature: OrderedDict[tuple[Any, ...], _Compiled] = OrderedDict()
        #: signatures bound to each program (at most ``SPECIALIZATION_LIMIT``: more would make the program
        #: forget its recordings, and calls cycling through many sizes would record on every call)
        self._bindings: dict[int, int] = {}
        self._by_layout: dict[tuple[Any, ...], HostIrEvaluator] = {}
        #: (output position, input position) of outputs written in place into an input
        self._aliases: list[tuple[int, int]] = []
        #: returned output position -> the input it is: the value written into that input (or the input itself)
        self._returns_input: dict[int, int] = {}
        self.compile_count = 0
        #: The program the latest ``run`` executed (for dumps and tests: ``str(program)`` is its Host IR).
        self.last_program: Program | None = None

    def _launched_segments(self) -> list[KernelSegment]:
        """The segments the latest program launches, read off its Host IR (``Program.container``, every
        block walked: a program replayed from CUDA graphs shows the kernels its ``CaptureGraph`` captures)."""
        program = self.last_program
        if program is None:
            return []
        return [n.segment for n in program.container.walk() if isinstance(n, LaunchKernel)]

    def kernel_codes(self) -> list[str]:
        """Sources of the generated kernels the latest program launches."""
        return [s.code for s in self._launched_segments() if not isinstance(s, PlainSegment)]

    def scheduled_fusion_irs(self) -> list[str]:
        """Each kernel segment of the latest program as scheduled (math and domains)."""
        return [s.scheduled_ir for s in self._launched_segments() if s.scheduled_ir]

    def _reset(self) -> None:
        self._version = self.fusion.version
        self._binder = InputBinder(self.fusion.inputs())
        self._has_scalars = self._binder.has_scalars
        self._var_means = any(isinstance(e, VarMeanOp) for e in self.fusion.exprs())
        self._by_signature.clear()
        self._by_layout.clear()
        self._bindings.clear()
        inputs = self.fusion.inputs()
        self._aliases = []
        outputs = self.fusion.outputs()
        for pos in range(len(outputs)):
            target = self.fusion.output_alias(pos)
            if target is not None:
                self._aliases.append((pos, next(k for k, v in enumerate(inputs) if v is target)))
        # An output that is also written into an input, or is that input, is returned as the input, as
        # nvFuser's: after the write the input's buffer holds it, and a copy would be stale or redundant.
        self._returns_input = {}
        written = {pos for pos, _ in self._aliases}
        returned = [pos for pos in range(len(outputs)) if pos not in written]
        for place, pos in enumerate(returned):
            for alias_pos, k in self._aliases:
                if outputs[pos] is outputs[alias_pos] or outputs[pos] is inputs[k]:
                    self._returns_input[place] = k
                    break

    def run(self, args: Sequence[Any], *, device: torch.device | str | int | None = None,
            enable_options: Sequence[str] = (), disable_options: Sequence[str] = (),
            backend: CommunicatorBackend | str | None = None) -> list[torch.Tensor]:
        started = time.perf_counter() if profiling.active() else 0.0
        if self._version != self.fusion.version:
            self._reset()
        binder = self._binder
        assert binder is not None  # set by _reset
        sig, target, key = self._key(args, binder, device, enable_options, disable_options, backend)
        by_signature = self._by_signature
        entry = by_signature.get(key)
        compile_ms = 0.0
        if entry is None:
            begun = time.perf_counter()
            resolved = target if target is not None else _resolve_device(None, args, binder)
            program, moved = self._compile_for(args, binder, resolved, enable_options, disable_options,
                                               comm_backend(backend))
            compile_ms = (time.perf_counter() - begun) * 1e3
            entry = _Compiled(program, resolved, moved)
            by_signature[key] = entry
            if len(by_signature) > self._signature_cache_size:
                by_signature.popitem(last=False)
        else:
            by_signature.move_to_end(key)
            if entry.bound is None:
                self._bind(entry, sig, args)
        program, resolved, moved, bound = entry.program, entry.device, entry.moved, entry.bound
        self.last_program = program
        given = args
        env: dict[str, int] = {}
        if not bound:
            if moved:  # 0-dim CPU tensors beside tensors of another device: scalars, as torch reads them
                args = list(args)
                for pos in moved:
                    args[pos] = args[pos].to(resolved)
            if self._has_scalars:
                args = binder.coerce(list(args))
            env = binder.bind(args) if self._has_scalars else binder.bind_signature(sig, args)
        # Execution is not recorded by autograd, whichever path computes an output (a generated
        # kernel's output has no history, an ATen op's or a view's would): outputs never require
        # grad, as torch's outputs under no_grad, and in-place outputs may be written into leaves.
        # (The grad mode is switched directly: ``torch.no_grad()`` costs a few times more per call.)
        grad = torch.is_grad_enabled()
        if grad:
            torch._C._set_grad_enabled(False)
        try:
            if bound:  # the signature's generated function (its binding's first run: the program's steps)
                outputs = bound.run(args)
            else:
                outputs = program.run(args, EvalContext(env, resolved))
                outputs = self._write_aliases(given, outputs) if self._aliases else outputs
        finally:
            if grad:
                torch._C._set_grad_enabled(True)
        if profiling.active():
            profiling.record(self.fusion, self.segments(), resolved, started, given, outputs, compile_ms)
        return outputs

    def _bind(self, entry: _Compiled, sig: tuple[Any, ...], args: Sequence[Any]) -> BoundProgram | Literal[False]:
        """The signature's bound program, on its second call (the first may be its only one): for a
        program whose bound runs become one generated function, called without integer scalars (whose
        values may size tensors: the signature does not hold them) or scalars given as tensors, outputs
        written into inputs or CPU scalars moved; else False, and the signature's calls keep the
        program's run. Floating-point and boolean scalars are the function's arguments, converted to
        their declared types on each call; a launch reading one runs its generated launcher (a bound
        launch replays recorded parameters, so a scalar's is not recorded)."""
        program = entry.program
        binder = self._binder
        assert binder is not None  # set by _reset
        bindings = self._bindings.get(id(program), 0)
        if (self._aliases or entry.moved or not program.writes_straight_line or bindings >= SPECIALIZATION_LIMIT
                or (self._has_scalars and (binder.binds_scalars or not binder.scalars_are_numbers(args)))):
            entry.bound = False
            return False
        self._bindings[id(program)] = bindings + 1
        coerce = binder.coerce if self._has_scalars else None
        entry.bound = BoundProgram(program, binder.bind_signature(sig, args), entry.device, coerce=coerce)
        return entry.bound

    def is_compiled(self, args: Sequence[Any]) -> bool:
        """Whether a program for ``args``' layout is compiled, so ``run(args)`` would compile nothing
        (nvFuser's ``isCompiled``)."""
        if self._version != self.fusion.version:
            return False
        layout = _layout_key(args)
        return any(key[0] == layout for key in self._by_layout)

    def segments(self) -> list[profiling.SegmentInfo]:
        """The segments of the program the latest ``run`` executed."""
        program = self.last_program
        return list(program.segments) if program is not None else []

    def _key(self, args: Sequence[Any], binder: InputBinder, device: torch.device | str | int | None,
             enable_options: Sequence[str], disable_options: Sequence[str],
             backend: CommunicatorBackend | str | None) -> tuple[tuple[Any, ...], torch.device | None, tuple[Any, ...]]:
        """(the inputs' signature, the resolved ``device`` or None, the key of the program for them)."""
        try:
            sig = signature(args)
        except RuntimeError:  # an input without strides (sparse): validation names it
            binder.check(args)
            raise
        # Without ``device`` the target follows from the inputs' devices, which the signature holds:
        # it is resolved on a miss only. A given device is resolved each call ("cuda" means the
        # current device, which may change between calls).
        target = None if device is None else self._target(device, args, binder)
        return sig, target, (sig, target, tuple(enable_options), tuple(disable_options), backend)

    def bound_program(self, args: Sequence[Any], *, device: torch.device | str | int | None = None,
                      enable_options: Sequence[str] = (), disable_options: Sequence[str] = (),
                      scalars_fixed: bool = False) -> BoundProgram | None:
        """The program that ``run`` with these arguments executed, its sizes bound to theirs: for a caller
        that knows every later call has the same input signature (and, with ``scalars_fixed``, the same
        values of the input scalars: a dynamic-shape graph's size symbols, which its caller keys its
        bindings by). None before such a run, and for a fusion whose every call has work of its own
        (input scalars to bind whose values may change, outputs written in place into inputs)."""
        if self._version != self.fusion.version or (self._has_scalars and not scalars_fixed) or self._aliases:
            return None
        binder = self._binder
        assert binder is not None  # set by _reset
        sig, _, key = self._key(args, binder, device, enable_options, disable_options, None)
        entry = self._by_signature.get(key)
        if entry is None:
            return None
        program, resolved = entry.program, entry.device
        if entry.moved:  # each call moves its CPU scalars: no binding
            return None
        if self._has_scalars:
            if not binder.scalars_are_numbers(args):
                return None
            return BoundProgram(program, binder.bind(binder.coerce(list(args))), resolved, coerce=binder.coerce)
        if not entry.bound:  # one binding per signature: the caller's calls and ``run``'s share it
            self._bindings[id(program)] = self._bindings.get(id(program), 0) + 1
            entry.bound = BoundProgram(program, binder.bind_signature(sig, args), resolved)
        return entry.bound

    def _target(self, device: torch.device | str | int, args: Sequence[Any], binder: InputBinder) -> torch.device:
        """``device`` resolved; remembered when it names one device for good (an index, or the CPU):
        a torch.compile region passes its device on every call."""
        fixed = type(device) in (torch.device, str, int)  # not bool, whose True hashes like 1
        target = self._devices.get(device) if fixed else None
        if target is None:
            target = _resolve_device(device, args, binder)
            if fixed and (target.type == "cpu" or isinstance(device, int) or ":" in str(device)):
                self._devices[device] = target
        return target

    def _write_aliases(self, args: Sequence[Any], outputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Copy each in-place output into its input (any strides) and return only the others (those that
        are a written input's value, as that input)."""
        for pos, k in self._aliases:
            dst, src = args[k], outputs[pos]
            if dst.shape != src.shape:  # copy_ would broadcast silently
                out_name, in_name = (v.short_name if isinstance(v, TensorView) else str(v)
                                     for v in (self.fusion.outputs()[pos], self.fusion.inputs()[k]))
                raise ValueError(f"output {pos} ({out_name}) has shape {tuple(src.shape)} but is written in place "
                                 f"into input {k} ({in_name}) of shape {tuple(dst.shape)}")
            dst.copy_(src)
        written = {pos for pos, _ in self._aliases}
        returned = [o for pos, o in enumerate(outputs) if pos not in written]
        for place, k in self._returns_input.items():
            returned[place] = args[k]
        return returned

    def compiled_outputs(self) -> list[TensorView]:
        """The returned outputs of the latest run's program, as compiled: after the pre-segmentation
        passes, so their shardings (propagated to outputs the user left unsharded) are final."""
        if self.last_program is None:
            raise ValueError("the fusion has not run yet: its compiled outputs are known after the first execute")
        outputs = self.last_program.output_tvs
        return [tv for pos, tv in enumerate(outputs) if self.fusion.output_alias(pos) is None]

    def get_output_shardings(self) -> list[Sharding]:
        """nvFuser's name: the sharding of each returned output of the latest run."""
        return [sharding_of(tv) for tv in self.compiled_outputs()]

    def target_device(self, args: Sequence[Any], device: torch.device | str | int | None = None) -> torch.device:
        """Where ``run(args, device=device)`` computes: ``device``, else the first non-scalar tensor's, else
        (only scalars and 0-dim CPU tensors) the current CUDA device where there is one, as nvFuser's."""
        if self._version != self.fusion.version:
            self._reset()
        assert self._binder is not None  # set by _reset
        return _resolve_device(device, args, self._binder)

    def _compile_for(self, args: Sequence[Any], binder: InputBinder, target: torch.device,
                     enable_options: Sequence[str], disable_options: Sequence[str],
                     backend: CommunicatorBackend | None) -> tuple[Program, tuple[int, ...]]:
        """The program for ``args``' layout, and the positions of the 0-dim CPU tensors each call moves to
        ``target`` (``check_devices``)."""
        enabled, disabled = check_options(enable_options, disable_options)
        binder.check(args)
        moved = check_devices(binder.specs, args, target)
        return self._program(args, binder, target, enabled, disabled, backend), moved

    def compile_ahead(self, args: Sequence[Any], *, device: torch.device | str | int,
                      enable_options: Sequence[str] = (), disable_options: Sequence[str] = ()) -> None:
        """Compile the program that ``run(args, device=device, ...)`` runs, before that call, and start
        compiling its kernels (``_rehearse``): for a caller that knows a call's inputs before their
        values exist (a torch.compile graph's regions, from their traced sizes and strides), so the
        programs of many fusions compile side by side. ``args``: meta tensors stand for tensors of
        ``device``."""
        if self._version != self.fusion.version:
            self._reset()
        binder = self._binder
        assert binder is not None  # set by _reset
        target = self._target(device, args, binder)
        enabled, disabled = check_options(enable_options, disable_options)
        binder.check(args)
        self._program(args, binder, target, enabled, disabled, None)

    def _program(self, args: Sequence[Any], binder: InputBinder, target: torch.device,
                 enabled: frozenset[EnableOption], disabled: frozenset[DisableOption],
                 backend: CommunicatorBackend | None) -> HostIrEvaluator:
        """The program for ``args``' layout, compiled on its first call."""
        one_stage = frozenset[int]()
        if self._var_means:
            one_stage = one_stage_var_means(self.fusion, binder.bind(binder.coerce(list(args)) if self._has_scalars
                                                                    else args))
        layout = (_layout_key(args, target), target, enabled, disabled, backend, one_stage)
        program = self._by_layout.get(layout)
        if program is None:
            _check_no_cpu_scalar_outputs(self.fusion)
            orders = tuple(tuple(memory_order(a.shape, a.stride())) if isinstance(a, torch.Tensor) else None
                           for a in args)
            dense = tuple(isinstance(a, torch.Tensor) and is_dense(a.shape, a.stride()) for a in args)
            options = CompileOptions(enabled, disabled, target, input_orders=orders, input_dense=dense,
                                     one_stage_var_means=one_stage, rank=self._rank(), backend=backend)
            program = compile_fusion(self.fusion, options)
            self.compile_count += 1
            self._by_layout[layout] = program
            if (target.type == "cuda" and options.kernels and not options.is_disabled(DisableOption.compile_ahead)
                    and not is_multidevice(self.fusion)):
                self._rehearse(program, args, binder, target)
        return program

    @staticmethod
    def _rehearse(program: HostIrEvaluator, args: Sequence[Any], binder: InputBinder, target: torch.device) -> None:
        """Run ``program`` once on meta tensors of ``args``' sizes and strides, inside ``compiling_ahead``:
        it launches nothing, and each kernel variant its launches would compile on the first run starts
        compiling in a thread. A first run then finds its variants compiled or compiling, where it would
        compile them one after another (a model's first call spends more time in Triton than anywhere
        else). The rehearsal stops where meta tensors cannot go on (an ATen op without a meta kernel, a
        value read on the host): the variants it reached compile ahead, the others at their launch. A torch
        profiler does not record the rehearsal's ops: they are not the call's work."""
        meta = [torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
                if isinstance(a, torch.Tensor) and not (a.device.type == "cpu" and a.dim() == 0) else a for a in args]
        device = torch.device("meta")
        with compiling_ahead(target.index if target.index is not None else torch.cuda.current_device()) as threads:
            if not threads:
                return
            try:
                rehearsal = program.on_device(device)
                if binder.has_scalars:
                    meta = binder.coerce(meta)
                    env = binder.bind(meta)
                else:
                    env = binder.bind_signature(signature(meta), meta)
                with profiling.unseen_by_torch_profiler():
                    rehearsal.run(meta, EvalContext(env, device))
            except Exception:  # (the first run raises whatever is the caller's error)
                return


    def _rank(self) -> int:
        """This process' rank for a multi-device fusion (joining the process group on first use: every
        rank compiles, also those with nothing to communicate), after checking every mesh fits."""
        if not is_multidevice(self.fusion):
            return 0
        comm = Communicator.instance()
        check_meshes_fit(self.fusion, comm.size())
        return comm.rank()


def _layout_key(args: Sequence[Any], target: torch.device | None = None) -> tuple[Any, ...]:
    """What a compiled program may depend on: dtypes, ranks, size-1 axes, memory orders, density and
    devices (a meta tensor stands for one of ``target``'s)."""
    key: list[object] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            order = tuple(memory_order(a.shape, a.stride()))
            where = target.type if a.device.type == "meta" and target is not None else a.device.type
            key.append((a.dtype, tuple(s == 1 for s in a.shape), order, is_dense(a.shape, a.stride()), where))
        else:
            key.append(type(a))
    return tuple(key)


def _check_no_cpu_scalar_outputs(fusion: Fusion) -> None:
    """nvFuser's rule: an output computed only from 0-dim CPU scalar inputs (``is_cpu``, ``from_pytorch``
    of a CPU scalar) would be a CPU tensor, which a fusion of device tensors does not produce.
    RuntimeError with nvFuser's message, naming the output and the scalars."""
    inputs = fusion.inputs()
    if not any(isinstance(v, TensorView) and not v.is_cpu for v in inputs):
        return  # no device tensors: CPU scalars are this fusion's only tensors
    cpu: dict[int, bool] = {}

    def on_cpu(tv: TensorView) -> bool:
        """Computed from CPU scalar inputs only (a creation op, with no tensor inputs, makes a device tensor)."""
        if id(tv) not in cpu:
            definition = tv.definition
            sources = definition.tensor_inputs if definition is not None else []
            cpu[id(tv)] = tv.is_cpu if definition is None else bool(sources) and all(on_cpu(t) for t in sources)
        return cpu[id(tv)]

    for pos, out in enumerate(fusion.outputs()):
        if isinstance(out, TensorView) and out.definition is not None and on_cpu(out):
            scalars = ", ".join(v.short_name for v in inputs if isinstance(v, TensorView) and v.is_cpu)
            raise FusionRuleError(f"output {pos} ({out.short_name}) is computed only from the CPU scalar tensors "
                               f"{scalars}, so it would be a CPU tensor of a fusion of device tensors: KernelExecutor "
                               "does not support the Fusion provided. (nvFuser's rule; pass the scalar as a number "
                               "with define_scalar, or compute the output on the host)")


def _resolve_device(device: torch.device | str | int | None, args: Sequence[Any], binder: InputBinder) -> torch.device:
    if device is not None:
        if isinstance(device, bool) or not isinstance(device, (torch.device, str, int)):
            raise TypeError(f"execute(device={device!r}): expected a torch.device, a device string or a CUDA index")
        try:
            resolved = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"execute(device={device!r}) is not a device: {e}") from None
        if resolved.type not in ("cpu", "cuda"):
            raise ValueError(f"execute(device={device!r}): pyfuser runs on CPU or CUDA devices")
        if resolved.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"execute(device={device!r}): CUDA is not available on this machine")
        if resolved.type == "cuda" and resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
        return resolved
    for pos, a in enumerate(args):
        if isinstance(a, torch.Tensor) and not (a.device.type == "cpu" and a.dim() == 0):
            if a.device.type not in ("cpu", "cuda"):
                name = binder.specs[pos].name if pos < len(binder.specs) else "an extra input"
                raise ValueError(f"input {pos} ({name}) is on {a.device}; pyfuser runs on CPU or CUDA devices")
            return a.device
    if torch.cuda.is_available():  # nvFuser's rule: a fusion of scalars and 0-dim CPU tensors runs on CUDA
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
