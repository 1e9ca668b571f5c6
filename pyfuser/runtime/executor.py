"""FusionExecutorCache: compiles a fusion once per input layout and runs it.

The hot path of a cached execution is: build the input signature, look it up, bind symbolic
sizes, run the compiled program. Validation and compilation happen on a signature miss only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from pyfuser.comm.communicator import Communicator
from pyfuser.ir.analysis.sharding import check_meshes_fit, is_multidevice
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.layout import memory_order
from pyfuser.options import CompileOptions, check_options
from pyfuser.runtime.compile import compile_fusion
from pyfuser.runtime.inputs import InputBinder, TensorSpec, signature


class Program(Protocol):
    """A compiled fusion: runs on concrete inputs with bound sizes, returns the outputs."""

    def run(self, args: Sequence[Any], ctx: EvalContext) -> list[torch.Tensor]: ...


#: How many exact input signatures a FusionExecutorCache remembers (least recently used dropped first).
#: A miss only costs validation when the layout was seen: programs stay keyed by layout.
SIGNATURE_CACHE_SIZE = 256


class FusionExecutorCache:
    def __init__(self, fusion: Fusion, signature_cache_size: int = SIGNATURE_CACHE_SIZE) -> None:
        self.fusion = fusion
        self._version = -1
        self._binder: InputBinder | None = None
        self._signature_cache_size = signature_cache_size
        self._by_signature: OrderedDict[tuple[Any, ...], Program] = OrderedDict()
        self._by_layout: dict[tuple[Any, ...], Program] = {}
        self.compile_count = 0
        #: The program the latest ``run`` executed (for dumps and tests: ``str(program)`` is its Host IR).
        self.last_program: Program | None = None

    def _reset(self) -> None:
        self._version = self.fusion.version
        self._binder = InputBinder(self.fusion.inputs())
        self._by_signature.clear()
        self._by_layout.clear()

    def run(self, args: Sequence[Any], *, device: torch.device | str | int | None = None,
            enable_options: Sequence[str] = (), disable_options: Sequence[str] = ()) -> list[torch.Tensor]:
        if self._version != self.fusion.version:
            self._reset()
        binder = self._binder
        assert binder is not None  # set by _reset
        target = _resolve_device(device, args, binder)
        try:
            sig = signature(args)
        except RuntimeError:  # an input without strides (sparse): validation names it
            binder.check(args)
            raise
        key = (sig, target, tuple(enable_options), tuple(disable_options))
        by_signature = self._by_signature
        program = by_signature.get(key)
        if program is None:
            program = self._compile_for(args, binder, target, enable_options, disable_options)
            by_signature[key] = program
            if len(by_signature) > self._signature_cache_size:
                by_signature.popitem(last=False)
        else:
            by_signature.move_to_end(key)
        self.last_program = program
        if binder.has_scalars:
            args = binder.coerce(list(args))
        ctx = EvalContext(binder.bind(args), target)
        return program.run(args, ctx)

    def _compile_for(self, args: Sequence[Any], binder: InputBinder, target: torch.device,
                     enable_options: Sequence[str], disable_options: Sequence[str]) -> Program:
        enabled, disabled = check_options(enable_options, disable_options)
        binder.check(args)
        for pos, (spec, arg) in enumerate(zip(binder.specs, args, strict=True)):
            if isinstance(spec, TensorSpec) and not spec.is_cpu and arg.device != target:
                raise ValueError(f"input {pos} ({spec.name}) is on {arg.device} but the fusion runs on {target}")
        layout = (_layout_key(args), target, enabled, disabled)
        program = self._by_layout.get(layout)
        if program is None:
            orders = tuple(tuple(memory_order(a.shape, a.stride())) if isinstance(a, torch.Tensor) else None
                           for a in args)
            options = CompileOptions(enabled, disabled, target, input_orders=orders, rank=self._rank())
            program = compile_fusion(self.fusion, options)
            self.compile_count += 1
            self._by_layout[layout] = program
        return program


    def _rank(self) -> int:
        """This process' rank for a multi-device fusion (joining the process group on first use: every
        rank compiles, also those with nothing to communicate), after checking every mesh fits."""
        if not is_multidevice(self.fusion):
            return 0
        comm = Communicator.instance()
        check_meshes_fit(self.fusion, comm.size())
        return comm.rank()


def _layout_key(args: Sequence[Any]) -> tuple[Any, ...]:
    """What a compiled program may depend on: dtypes, ranks, size-1 axes and memory orders."""
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            order = tuple(memory_order(a.shape, a.stride()))
            key.append((a.dtype, tuple(s == 1 for s in a.shape), order, a.device.type))
        else:
            key.append(type(a))
    return tuple(key)


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
    return torch.device("cpu")
