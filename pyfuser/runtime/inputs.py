"""Checking concrete inputs against the fusion's declared inputs and binding symbolic sizes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pyfuser.codegen.python_writer import define_function
from pyfuser.ir.analysis.sharding import local_static_size, shard_factors
from pyfuser.ir.base import Scalar, Val
from pyfuser.ir.dtypes import DataType, check_scalar_in_range, python_scalar_type
from pyfuser.ir.layout import check_strides
from pyfuser.ir.symbolic import SymVar
from pyfuser.ir.tensor_view import TensorView


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    dtype: DataType
    static_sizes: tuple[int | None, ...]  # None: symbolic
    broadcast: tuple[bool, ...]
    perm: tuple[int, ...]  # allocation order, outermost first
    contiguity: tuple[bool | None, ...]  # in allocation order
    has_stride_order: bool
    is_cpu: bool
    #: Per axis, how many ranks split it (device sharding): the tensor passed in is this rank's shard.
    shard_factors: tuple[int, ...] = ()
    #: Axes declared expanded (a stride-0 broadcast): their stride must be 0.
    expanded: tuple[int, ...] = ()

    @staticmethod
    def of(tv: TensorView) -> TensorSpec:
        logical = tv.get_logical_domain(no_reductions=True)
        alloc = [i for i in tv.get_allocation_domain() if not i.is_reduction()]
        position = {id(i): d for d, i in enumerate(logical)}
        if all(id(i) in position for i in alloc):
            perm = tuple(position[id(i)] for i in alloc)
            contiguity = tuple(tv.contiguity)
        else:  # split allocation (device sharding) is checked per shard by the multidevice layer
            perm = tuple(range(len(logical)))
            contiguity = tuple(False if not i.is_broadcast() else None for i in logical)
        factors = shard_factors(tv)
        return TensorSpec(
            name=tv.short_name, dtype=tv.dtype,
            static_sizes=tuple(local_static_size(tv, d) for d in range(len(logical))),
            broadcast=tuple(i.is_broadcast() for i in logical),
            perm=perm, contiguity=contiguity,
            has_stride_order=tv.has_allocation_domain() and perm != tuple(range(len(logical))),
            is_cpu=tv.is_cpu,
            shard_factors=tuple(factors),
            expanded=tuple(d for d, i in enumerate(logical) if i.expanded),
        )

    def check(self, t: Any, position: int) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"input {position} ({self.name}) must be a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise ValueError(f"input {position} ({self.name}): expected a dense (strided) tensor, got layout "
                             f"{t.layout}; convert it with .to_dense()")
        if t.dtype != self.dtype.torch_dtype:
            raise ValueError(f"input {position} ({self.name}): expected dtype {self.dtype.torch_dtype}, got {t.dtype}")
        if t.dim() != len(self.static_sizes):
            raise ValueError(f"input {position} ({self.name}): expected rank {len(self.static_sizes)}, got rank "
                             f"{t.dim()} (shape {tuple(t.shape)})")
        for d, (want, size) in enumerate(zip(self.static_sizes, t.shape, strict=True)):
            if want is not None and want != size:
                kind = "a broadcast axis of size 1" if self.broadcast[d] else f"static size {want}"
                if self.shard_factors and self.shard_factors[d] > 1:
                    kind += f" (this rank's shard of an axis sharded over {self.shard_factors[d]} ranks)"
                raise ValueError(f"input {position} ({self.name}) axis {d}: expected {kind}, got size {size}")
        if self.is_cpu and t.device.type != "cpu":
            raise ValueError(f"input {position} ({self.name}) was defined is_cpu=True but is on {t.device}")
        for d in self.expanded:
            if t.shape[d] > 1 and t.stride(d) != 0:
                raise ValueError(f"input {position} ({self.name}) axis {d}: declared expanded (contiguity None), so its "
                                 f"stride must be 0 (a broadcast, as x.expand(...) gives), got stride {t.stride(d)} "
                                 f"(sizes {list(t.shape)}, strides {list(t.stride())})")
        # Expanded axes, like broadcast ones, have no memory footprint: strides skip them.
        no_footprint = [b or d in self.expanded for d, b in enumerate(self.broadcast)] if self.expanded \
            else self.broadcast
        check_strides(f"input {position} ({self.name})", t.shape, t.stride(), self.perm, list(self.contiguity),
                      no_footprint, self.has_stride_order)


@dataclass(frozen=True, slots=True)
class ScalarSpec:
    name: str
    dtype: DataType

    def check(self, value: Any, position: int) -> None:
        if isinstance(value, torch.Tensor) and value.dim() == 0:
            value = value.item()
        kind = python_scalar_type(self.dtype)
        # Python's numeric tower: a number of a narrower kind is accepted (and converted, see
        # InputBinder.coerce); a wider one would silently change the fusion's dtypes.
        allowed = {bool: (bool,), int: (bool, int), float: (bool, int, float),
                   complex: (bool, int, float, complex)}[kind]
        if not isinstance(value, allowed):
            # a tensor by its kind, not its values (which can be many)
            got = f"a {value.dtype} tensor of rank {value.dim()}" if isinstance(value, torch.Tensor) else repr(value)
            raise TypeError(f"input {position} ({self.name}): expected a {self.dtype} scalar, got {got}")
        check_scalar_value(value, self.dtype, position, self.name)


def check_devices(specs: Sequence[TensorSpec | ScalarSpec], args: Sequence[Any], target: torch.device) -> tuple[int, ...]:
    """Check each tensor input is on ``target`` (the device the fusion runs on); returns the positions
    of 0-dim CPU tensors given beside tensors of another device, which torch reads as scalars there:
    the caller moves them to ``target``. A tensor declared ``is_cpu`` stays where it is."""
    moved = []
    for pos, (spec, arg) in enumerate(zip(specs, args, strict=True)):
        if not isinstance(spec, TensorSpec) or spec.is_cpu or arg.device == target:
            continue
        if arg.device.type == "cpu" and arg.dim() == 0:
            moved.append(pos)
            continue
        raise ValueError(f"input {pos} ({spec.name}) is on {arg.device} but the fusion runs on {target}")
    return tuple(moved)


def check_scalar_value(value: Any, dtype: DataType, position: int, name: str) -> Any:
    """``value`` converted to ``dtype``'s Python type; ValueError when it does not fit (``2**70`` for an
    int64_t, ``10**400`` for a double), which torch would report as an overflow inside an op."""
    what = f"input {position} ({name})"
    check_scalar_in_range(value, dtype, what)
    try:
        return python_scalar_type(dtype)(value)
    except OverflowError:
        raise ValueError(f"{what}: {value} does not fit {dtype}") from None


class InputBinder:
    """Validates a fusion's concrete inputs and turns them into bound sizes (``env``)."""

    def __init__(self, inputs: Sequence[Val]) -> None:
        self.inputs = list(inputs)
        self.specs: list[TensorSpec | ScalarSpec] = []
        #: (input position, axis, symbol, shard factor) for each symbolic extent of an input tensor
        self._tensor_symbols: list[tuple[int, int, str, int]] = []
        #: (input position, symbol) for each integer input scalar: the only scalars sizes and host
        #: expressions read (``Scalar.host_expr``); the others reach kernels and ops as arguments
        self._scalar_symbols: list[tuple[int, str]] = []
        #: (input position, Python type, dtype, name) of each input scalar: values are converted to it
        #: (and checked to fit it) each run
        self._scalar_types: list[tuple[int, type, DataType, str]] = []
        #: (input position, scalar name, minimum, use) for each input scalar used as a size, slice
        #: index or split factor
        self._bounded: list[tuple[int, str, int, str]] = []
        for pos, val in enumerate(self.inputs):
            if isinstance(val, TensorView):
                spec = TensorSpec.of(val)
                self.specs.append(spec)
                for d, i in enumerate(val.get_logical_domain(no_reductions=True)):
                    if isinstance(i.extent, SymVar):
                        self._tensor_symbols.append((pos, d, i.extent.name, spec.shard_factors[d]))
            elif isinstance(val, Scalar):
                self.specs.append(ScalarSpec(str(val), val.dtype))
                if val.dtype.is_integral:
                    self._scalar_symbols.append((pos, val.symbol))
                self._scalar_types.append((pos, python_scalar_type(val.dtype), val.dtype, str(val)))
                if val.lower_bound is not None:
                    self._bounded.append((pos, str(val), *val.lower_bound))
        #: ``bind`` of a fusion whose symbols are all tensor sizes, as one generated expression (it runs
        #: on every execute)
        self._bind_sizes: Callable[[Sequence[Any]], dict[str, int]] | None = None
        #: the same, reading the sizes off the inputs' ``signature`` (built anyway on every execute)
        self._bind_signature: Callable[[tuple[Any, ...]], dict[str, int]] | None = None
        if not self._scalar_symbols:
            def items(size: str) -> str:
                return ", ".join(f"{name!r}: {size.format(pos=pos)}[{d}]" + (f" * {factor}" if factor != 1 else "")
                                 for pos, d, name, factor in self._tensor_symbols)
            # sources built from ints and symbol names
            self._bind_sizes = define_function("def bind_sizes(args):", [f"return {{{items('args[{pos}].shape')}}}"],
                                               "input sizes")
            self._bind_signature = define_function("def bind_signature(sig):",
                                                   [f"return {{{items('sig[{pos}][1]')}}}"], "input sizes")

    def check(self, args: Sequence[Any]) -> None:
        if len(args) != len(self.specs):
            names = ", ".join(s.name for s in self.specs)
            raise ValueError(f"expected {len(self.specs)} inputs ({names}), got {len(args)}")
        for pos, (spec, arg) in enumerate(zip(self.specs, args, strict=True)):
            spec.check(arg, pos)

    @property
    def has_scalars(self) -> bool:
        return bool(self._scalar_types)

    @property
    def binds_scalars(self) -> bool:
        """Whether a call's scalar values enter its bound sizes (integer scalars: any may size a tensor),
        so a call's sizes are not its signature's alone."""
        return bool(self._scalar_symbols)

    def scalars_are_numbers(self, args: Sequence[Any]) -> bool:
        """Whether every input scalar is passed as a Python number (not a tensor, whose value a caller
        keying its calls by sizes and strides would not see)."""
        return not any(isinstance(args[pos], torch.Tensor) for pos, *_ in self._scalar_types)

    def coerce(self, args: list[Any]) -> list[Any]:
        """``args`` with each scalar input converted to its declared Python type (``2`` for a Double
        scalar computes as ``2.0``; a 0-dim tensor becomes a number), so ops see the dtypes the
        fusion was defined with. Validation (``check``) has accepted their kinds; values are not in the
        signature, so an int's range is checked here, on every run."""
        for pos, kind, dtype, name in self._scalar_types:
            value = args[pos]
            if isinstance(value, torch.Tensor):
                value = value.item()
            if type(value) is not kind or kind is int:
                args[pos] = check_scalar_value(value, dtype, pos, name)
        return args

    def bind_signature(self, sig: tuple[Any, ...], args: Sequence[Any]) -> dict[str, int]:
        """``bind(args)`` where ``sig`` is ``signature(args)``: sizes come from the shapes the signature
        holds (reading a tensor's ``shape`` builds a new ``torch.Size`` each time)."""
        if self._bind_signature is not None:
            return self._bind_signature(sig)
        return self.bind(args)

    def bind(self, args: Sequence[Any]) -> dict[str, int]:
        """The sizes and integer scalars ``args`` bind, by symbol; ``args`` as ``coerce`` returns them
        (an integer scalar given as a 0-dim tensor is an int by then)."""
        if self._bind_sizes is not None:
            return self._bind_sizes(args)
        env: dict[str, int] = {}
        for pos, d, name, factor in self._tensor_symbols:
            env[name] = args[pos].shape[d] * factor  # symbols are global extents
        for pos, name in self._scalar_symbols:
            env[name] = args[pos]
        for pos, name, minimum, use in self._bounded:  # scalar values are not in the signature: check each run
            value = env[name]  # an input scalar prints as its symbol
            if value < minimum:
                raise ValueError(f"input {pos} ({name}) is used as {use} and must be at least {minimum}, got {value}")
        return env


def input_list(inputs: Any) -> list[Any]:
    """The inputs of an execute call as a list; TypeError for what is no list of inputs (``None``, or
    one tensor, which would be taken row by row)."""
    if type(inputs) is list:  # the common case, checked first: it is on every execute's path
        return inputs.copy()
    if isinstance(inputs, torch.Tensor):
        raise TypeError("execute: inputs must be a list of tensors and scalars, got one torch.Tensor; pass "
                        "[tensor] for a single input")
    if isinstance(inputs, (str, bytes, Mapping)) or not isinstance(inputs, Iterable):
        raise TypeError(f"execute: inputs must be a list of tensors and scalars, got {type(inputs).__name__}")
    return list(inputs)


def signature(args: Sequence[Any]) -> tuple[Any, ...]:
    """A hashable key of everything input validation looks at."""
    return tuple([(a.dtype, a.shape, a.stride(), a.device) if isinstance(a, torch.Tensor) else type(a) for a in args])
