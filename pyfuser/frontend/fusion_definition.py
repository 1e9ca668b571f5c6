"""FusionDefinition: the user-facing way to define, schedule and execute a fusion."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from pyfuser.frontend.kernel_executor import KernelExecutor
from pyfuser.frontend.ops import Ops
from pyfuser.frontend.repro import InputRecord, record_inputs, repro_script
from pyfuser.frontend.scheduling import DefinedFusion, ScheduleOps
from pyfuser.frontend.validate import check_outputs, evaluate_reference
from pyfuser.ir.base import Scalar
from pyfuser.ir.dtypes import (
    INT64_MAX,
    DataType,
    as_data_type,
    check_scalar_in_range,
    data_type_of_python,
    python_scalar_type,
)
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import DEVICE_PARALLEL_TYPES, IterDomain, IterType, ParallelType
from pyfuser.ir.layout import allocation_permutation, check_stride_order, tensor_descriptor
from pyfuser.ir.python_definition import translate_fusion
from pyfuser.ir.symbolic import SymVar
from pyfuser.ir.tensor_domain import TensorDomain
from pyfuser.ir.tensor_view import MemoryType, TensorView
from pyfuser.runtime.executor import FusionExecutorCache
from pyfuser.runtime.inputs import input_list
from pyfuser.runtime.manual import ManualKernels
from pyfuser.scheduler.registry import KernelParams


class EmptyFusionError(NotImplementedError, ValueError):
    """nvFuser raises ``NotImplementedError("Fusion is empty!")``; it is a ValueError too, as every
    other error about what a caller passed."""


class MissingReproInputsError(AssertionError, ValueError):
    """``last_repro_script`` before ``execute(..., save_repro_inputs=True)``: nvFuser raises an
    AssertionError; a ValueError too, as every other error about how the API was called."""


class ClosedDefinitionError(RuntimeError):
    """An op added after the ``with FusionDefinition() as fd:`` block closed (nvFuser raises a RuntimeError:
    "Attempting to add to a completed definition!")."""


class IgnoredScheduleWarning(UserWarning):
    """``fd.execute`` schedules every kernel itself: kernel parallel types the user set do not apply."""


class _ClosedOps:
    """``fd.ops`` after the ``with`` block closed: naming an op raises, so a line meant for the definition
    cannot silently grow a fusion that was already executed or printed."""

    __slots__ = ("_ops",)

    def __init__(self, ops: Ops) -> None:
        self._ops = ops

    def __getattr__(self, name: str) -> Any:
        getattr(self._ops, name)  # an unknown name stays an AttributeError
        raise ClosedDefinitionError(
            f"fd.ops.{name}: the `with FusionDefinition() as fd:` block has closed and the definition is complete "
            "(nvFuser: Attempting to add to a completed definition!); call fd.ops inside the block, or reopen it "
            "with `with fd:`. Scheduling the tensors (split, parallelize, set_device_mesh) may follow the block.")


class FusionDefinition:
    """Define a fusion inside ``with FusionDefinition() as fd:``, then ``fd.execute(inputs)``.

    Tensors returned by ``define_tensor`` and ``fd.ops`` are TensorViews: schedule them directly
    (``tv.split(0, 4)``, ``tv.axis(0).parallelize(ParallelType.stream)``). ``repr(fd)`` is the
    definition as Python (nvFuser's ``nvfuser_fusion(fd)``), ``str(fd)`` the fusion's kernel math.
    """

    def __init__(self) -> None:
        self._fusion = DefinedFusion()
        self._ops = Ops(self._fusion)
        self._closed = False  # the ``with`` block ended: no more ops
        self._entered = False  # a ``with`` block ran: an empty fusion is then "empty", not "not defined"
        #: the fusion version whose kernel parallel types ``execute`` last looked for (warned once a version)
        self._schedule_checked = -1
        self.sched = ScheduleOps(self._fusion)
        self._fec: FusionExecutorCache | None = None
        self._manual = ManualKernels(self._fusion)
        self._last_was_manual = False
        #: What ``execute(..., save_repro_inputs=True)`` saw, for ``last_repro_script``.
        self._repro_inputs: list[InputRecord] | None = None
        #: Inputs declared by ``from_pytorch`` from a CPU tensor that is not a 0-dim scalar.
        self._cpu_examples: list[str] = []

    def __enter__(self) -> FusionDefinition:
        self._closed = False
        self._entered = True
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed = True

    @property
    def ops(self) -> Ops:
        """The ops that define the fusion (nvFuser's ``fd.ops``); inside the ``with`` block, or on a
        definition built without one."""
        return _ClosedOps(self._ops) if self._closed else self._ops  # type: ignore[return-value]  # a stand-in: any op raises

    @property
    def fusion(self) -> Fusion:
        """The fusion: this definition's, or the cached one its executor runs (``fd.fec = ...``)."""
        return self._fec.fusion if self._fec is not None else self._fusion

    @property
    def fec(self) -> FusionExecutorCache:
        """The executor cache that compiles and runs this fusion (nvFuser's ``fd.fec``); settable
        to one from an ``LRUCache`` so that equal definitions share compiled programs."""
        if self._fec is None:
            self._fec = FusionExecutorCache(self._fusion)
        return self._fec

    @fec.setter
    def fec(self, executor: FusionExecutorCache) -> None:
        if not isinstance(executor, FusionExecutorCache):
            raise TypeError(f"fd.fec must be a FusionExecutorCache, got {type(executor).__name__}")
        self._fec = executor

    @property
    def ke(self) -> KernelExecutor:
        """The executor behind ``manual_execute`` (nvFuser's ``fd.ke``): ``fd.ke.is_compiled()``."""
        return KernelExecutor(self._manual)

    # --- inputs -------------------------------------------------------------------------------
    def define_tensor(self, shape: Sequence[int] | None = None,
                      contiguity: bool | Sequence[bool | None] | None = None,
                      dtype: DataType | torch.dtype = DataType.Float, is_cpu: bool = False,
                      stride_order: Sequence[int] | None = None, *, sizes: Sequence[int] | None = None,
                      strides: Sequence[int] | None = None, static_sizes: bool = False) -> TensorView:
        """Declare an input tensor.

        ``shape``: -1 symbolic, 1 broadcast, N static. ``contiguity``: one entry per axis in
        allocation order (the logical order unless ``stride_order`` is given), a single bool for
        all, or None for no contiguity promise; None on an axis whose size is not 1 declares it
        expanded (a stride-0 broadcast, as ``x.expand(...)``). ``stride_order[i]``: axis i's place
        counted from the innermost (``[1, 0]`` row-major). Or ``sizes`` and ``strides`` of an
        example tensor (symbolic sizes unless ``static_sizes``), as nvFuser's third form.
        """
        name = f"T{self._fusion._counters.get('tv', 0)}"
        if sizes is not None or strides is not None:
            if shape is not None or contiguity is not None or stride_order is not None:
                raise TypeError(f"define_tensor {name}: pass either shape / contiguity / stride_order or sizes / "
                                "strides, not both")
            if sizes is None or strides is None:
                raise TypeError(f"define_tensor {name}: sizes and strides go together")
            shape, contiguity, stride_order = _from_sizes_and_strides(name, sizes, strides, static_sizes)
        if shape is None:
            raise TypeError(f"define_tensor {name}: shape (or sizes and strides) is required")
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
            raise TypeError(f"define_tensor {name}: shape must be a list of ints, got {shape!r}")
        dims = list(shape)
        for d, size in enumerate(dims):
            if isinstance(size, bool) or not isinstance(size, int) or not -1 <= size <= INT64_MAX:
                raise ValueError(f"define_tensor {name}: shape[{d}] must be -1 (symbolic), 1 (broadcast) or a "
                                 f"non-negative size below 2**63, got {size!r}")
        rank = len(dims)
        perm = list(range(rank)) if stride_order is None else allocation_permutation(
            check_stride_order(stride_order, rank, f"define_tensor {name}"))
        if contiguity is None or isinstance(contiguity, bool):
            in_alloc_order: list[bool | None] = [bool(contiguity)] * rank
        elif isinstance(contiguity, (str, bytes)) or not isinstance(contiguity, Sequence):
            raise TypeError(f"define_tensor {name}: contiguity must be a bool, None or a list of them, got "
                            f"{contiguity!r}")
        else:
            in_alloc_order = list(contiguity)
            if len(in_alloc_order) != rank:
                raise ValueError(f"define_tensor {name}: contiguity {in_alloc_order} has {len(in_alloc_order)} "
                                 f"entries but shape {dims} has rank {rank}")
            bad = next((c for c in in_alloc_order if c is not None and not isinstance(c, bool)), None)
            if bad is not None:
                raise ValueError(f"define_tensor {name}: contiguity entries must be True, False or None (expanded), "
                                 f"got {bad!r}")
        expanded = {d for place, d in enumerate(perm) if in_alloc_order[place] is None and dims[d] != 1}
        dtype = as_data_type(dtype)
        if is_cpu and rank:
            raise ValueError(f"define_tensor {name}: is_cpu=True is for 0-dim scalar tensors (CPU non-scalar tensors "
                             f"are not supported), got shape {dims}")
        # Everything is checked: only now create IDs, so a rejected call leaves no trace.
        ids = []
        for d, size in enumerate(dims):
            if size == -1:
                ids.append(IterDomain(self._fusion, SymVar(f"i{self._fusion.next_name('scalar')}")))
            elif size == 1:
                ids.append(IterDomain(self._fusion, 1, IterType.Broadcast))
            else:
                ids.append(IterDomain(self._fusion, size))
            ids[-1].expanded = d in expanded
        tv = TensorView(self._fusion, TensorDomain(ids), dtype, MemoryType.Global)
        alloc_contiguity = [None if ids[d].is_broadcast() else (False if d in expanded else bool(in_alloc_order[place]))
                            for place, d in enumerate(perm)]
        if stride_order is not None and perm != list(range(rank)):
            tv.set_allocation_domain([ids[d] for d in perm], alloc_contiguity)
        else:
            tv.domain().contiguity = alloc_contiguity
        tv.is_cpu = is_cpu
        self._fusion.add_input(tv)
        return tv

    def from_pytorch(self, tensor: torch.Tensor, static_sizes: bool = False) -> TensorView:
        """Declare an input matching ``tensor``'s dtype, rank, size-1 and expanded axes and strides."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"from_pytorch expects a torch.Tensor, got {type(tensor).__name__}")
        cpu_scalar = tensor.device.type == "cpu" and tensor.dim() == 0
        tv = self.define_tensor(sizes=list(tensor.shape), strides=list(tensor.stride()),
                                dtype=DataType.from_torch(tensor.dtype), static_sizes=static_sizes)
        tv.is_cpu = cpu_scalar
        if tensor.device.type == "cpu" and not cpu_scalar:
            self._cpu_examples.append(tv.short_name)
        return tv

    def define_scalar(self, value: Any = None, dtype: DataType | torch.dtype | None = None) -> Scalar:
        """A constant (``value`` given) or a scalar input of the fusion (``value`` None)."""
        if dtype is None:
            dt = data_type_of_python(value) if value is not None else DataType.Double
            check_scalar_in_range(value, dt, "define_scalar")
        else:
            dt = as_data_type(dtype)
            if value is not None:
                _check_scalar_value(value, dt)
        scalar = Scalar(self._fusion, dt, value)
        if value is None:
            self._fusion.add_input(scalar)
        return scalar

    def define_vector(self, size: int) -> list[Scalar]:
        """``size`` integer scalar inputs, passed to ``execute`` as one list (a shape, say)."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"define_vector: size must be a non-negative int, got {size!r}")
        return [self.define_scalar(None, DataType.Int) for _ in range(size)]

    # --- outputs ---------------------------------------------------------------------------------
    def add_output(self, tv: TensorView | Scalar, alias_input: TensorView | Sequence[int] | None = None,
                   stride_order: Sequence[int] | None = None) -> None:
        """Mark ``tv`` an output. A scalar output is returned as a 0-dim tensor of its dtype.

        With ``alias_input`` (nvFuser's second argument) the output is written in place into that
        input (any strides) after the fusion runs and is not returned (add it again without
        ``alias_input`` to also get it). A list of ints in its place is a ``stride_order``, as in
        nvFuser's legacy frontend.
        """
        if alias_input is not None and not isinstance(alias_input, (TensorView, Scalar)):
            if stride_order is not None:
                raise TypeError(f"add_output {tv}: stride_order given twice (positionally and by keyword)")
            alias_input, stride_order = None, alias_input
        if isinstance(tv, Scalar) and tv.fusion is self._fusion:
            if stride_order not in (None, [], ()):
                raise ValueError(f"add_output: scalar {tv} is returned as a 0-dim tensor; its stride_order must be "
                                 f"empty, got {list(stride_order)}")
            tv = self._ops.full([], tv, tv.dtype)
            stride_order = None
        if isinstance(tv, TensorView) and tv.fusion is not self._fusion:
            raise ValueError(f"{tv.short_name} belongs to another FusionDefinition and cannot be an output here")
        if alias_input is not None:
            if stride_order is not None:
                raise ValueError(f"add_output {tv}: an output written into alias_input takes that input's strides; "
                                 "it cannot also have a stride_order")
            self._fusion.alias_output_to_input(tv, alias_input)
            return
        if isinstance(tv, TensorView) and stride_order is not None:
            check_stride_order(stride_order, tv.ndim, f"add_output {tv.short_name}")
            earlier = self._fusion.get_output_stride_order(tv) if tv.is_fusion_output else None
            if earlier is not None and earlier != list(stride_order):
                raise ValueError(f"add_output {tv.short_name}: already an output with stride_order {earlier}; one "
                                 f"tensor cannot also be required in stride_order {list(stride_order)} (add_output "
                                 f"fd.ops.set({tv.short_name}) for a second layout)")
        self._fusion.add_output(tv)
        if isinstance(tv, TensorView) and stride_order is not None:
            self._fusion.set_output_stride_order(tv, stride_order)

    # --- execution ---------------------------------------------------------------------------------
    def _check_not_empty(self, what: str) -> None:
        """A definition never written (no ``with`` block, no ops) and one written without outputs get
        nvFuser's two messages: the first is usually a forgotten ``with``."""
        if self.fusion.outputs():
            return
        if not self._entered and self._fec is None and not self._fusion.inputs():
            raise EmptyFusionError("Fusion does not exist! Use `with FusionDefinition() as fd: ...` to define a "
                                   f"fusion. Nothing was defined before {what}.")
        raise EmptyFusionError(f"Fusion is empty! The fusion has no outputs; call fd.add_output(tv) before {what}")

    def execute(self, inputs: Sequence[Any], *, device: torch.device | str | int | None = None,
                save_repro_inputs: bool = False, _enable_options: Sequence[str] = (),
                _disable_options: Sequence[str] = ()) -> list[torch.Tensor]:
        """Run the fusion. A list or tuple among ``inputs`` passes its items as consecutive inputs
        (the scalars of ``define_vector``)."""
        return self._execute(inputs, device, save_repro_inputs, _enable_options, _disable_options, True)

    def _execute(self, inputs: Sequence[Any], device: torch.device | str | int | None, save_repro_inputs: bool,
                 enable_options: Sequence[str], disable_options: Sequence[str], check_schedule: bool,
                 ) -> list[torch.Tensor]:
        self._check_not_empty("execute")
        args = _flatten(inputs)
        if save_repro_inputs:
            self._repro_inputs = record_inputs(args)
        if self._cpu_examples:
            self._check_cpu_examples(args, device)
        if check_schedule and self.fusion.version != self._schedule_checked:
            self._schedule_checked = self.fusion.version
            _warn_kernel_parallel_types(self.fusion)
        self._last_was_manual = False
        return self.fec.run(args, device=device, enable_options=enable_options, disable_options=disable_options)

    def manual_execute(self, inputs: Sequence[Any], heuristic_params: KernelParams | None = None) -> list[torch.Tensor]:
        """Run the whole fusion as one kernel, scheduled as the user (or ``schedule.schedule``) left it:
        no automatic scheduling. Kernels are generated on CUDA, through Triton's interpreter on CPU."""
        self._check_not_empty("manual_execute")
        self._last_was_manual = True
        if heuristic_params is None:
            return self._manual.run(_flatten(inputs))
        return self._manual.run(_flatten(inputs), heuristic_params.reference, heuristic_params.num_warps,
                                heuristic_params.num_stages, heuristic_params.l2)

    def manual_validate(self, inputs: Sequence[Any], reference_outputs: Sequence[torch.Tensor] | None = None,
                        ) -> list[torch.Tensor]:
        """``manual_execute`` and compare with ``reference_outputs`` (default: the fusion evaluated by
        ATen) with tolerances by dtype, widened by the square root of how many inputs each output
        element sums (rounding grows with reduction order); AssertionError naming the output."""
        # The references come from the automatic path, which sets the kernel schedule aside on purpose here.
        references = (reference_outputs if reference_outputs is not None
                      else self._execute(inputs, None, False, (), (), check_schedule=False))
        outputs = self.manual_execute(inputs)
        if len(references) != len(outputs):
            raise ValueError(f"manual_validate: {len(outputs)} outputs but {len(references)} reference outputs")
        largest = max((a.numel() for a in inputs if isinstance(a, torch.Tensor)), default=1)
        for k, (out, ref) in enumerate(zip(outputs, references, strict=True)):
            ref = ref.to(out.device)
            if out.shape != ref.shape:
                raise AssertionError(f"output {k}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
            widen = max(1.0, (largest / max(out.numel(), 1)) ** 0.5) if out.is_floating_point() else 1.0
            rtol, atol = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
                          torch.float32: (1.3e-6, 1e-5)}.get(out.dtype, (1e-7, 1e-7))
            torch.testing.assert_close(out, ref.to(out.dtype), rtol=rtol * widen, atol=atol * widen,
                                       msg=functools.partial(_output_mismatch, k))
        return outputs

    def last_scheduled_fusion_ir(self) -> str:
        """The kernel segments the latest ``execute`` ran, as scheduled: every tensor's loop,
        logical and allocation domains and the math (nvFuser's ``last_scheduled_fusion_ir``)."""
        irs = self.fec.scheduled_fusion_irs()
        if not irs:
            raise ValueError("last_scheduled_fusion_ir: the latest execution scheduled no kernel (on CPU, enable "
                             "_enable_options=['triton_interpreter'])")
        return "\n".join(irs)

    def last_kernel_code(self) -> str:
        """The source of the kernel(s) the latest ``execute`` or ``manual_execute`` ran."""
        if self._last_was_manual and self._manual.last is not None:
            return self._manual.last.code
        codes = self.fec.kernel_codes()
        if not codes:
            raise ValueError("last_kernel_code: the latest execution ran no generated kernel (on CPU, enable "
                             "_enable_options=['triton_interpreter'])")
        return "\n".join(codes)

    def _check_cpu_examples(self, args: Sequence[Any], device: torch.device | str | int | None) -> None:
        """nvFuser only takes 0-dim CPU tensors: an input declared from a CPU tensor of a fusion
        that runs on CUDA is a mistake reported as nvFuser reports it."""
        target = self.fec.target_device(args, device)
        if target.type == "cuda":
            raise ValueError(f"{', '.join(self._cpu_examples)} was declared by from_pytorch from a tensor on cpu but "
                             f"the fusion runs on {target}: Found unsupported device cpu, only scalar CPU or CUDA "
                             "tensors are supported")

    def validate(self, inputs: Sequence[Any], reference_outputs: Sequence[torch.Tensor] | None = None,
                 device: torch.device | str | int | None = None, **kwargs: Any) -> list[torch.Tensor]:
        """Execute and compare each output with ``reference_outputs`` (default: the fusion's torch
        reference), within nvFuser's tolerances for its dtype and reduction size; raises
        AssertionError naming the output on a mismatch. Returns the outputs."""
        args = _flatten(inputs)
        if reference_outputs is None:  # before executing: an in-place output may overwrite an input
            reference_outputs = evaluate_reference(self.fusion, args)
        outputs = self.execute(args, device=device, **kwargs)
        check_outputs(self.fusion, outputs, args, reference_outputs)
        return outputs

    # --- printing ----------------------------------------------------------------------------------
    def __repr__(self) -> str:
        """The definition as executable Python (``def nvfuser_fusion(fd : FusionDefinition)``)."""
        return translate_fusion(self.fusion)

    def __str__(self) -> str:
        return str(self.fusion)

    def repro_script_for(self, inputs: Sequence[Any] | None = None) -> str:
        """A standalone script that rebuilds this fusion and, given ``inputs``, runs it on random
        tensors of their shapes, strides, dtypes and devices."""
        return repro_script(repr(self), None if inputs is None else record_inputs(_flatten(inputs)))

    def last_repro_script(self) -> str:
        if self._repro_inputs is None:
            raise MissingReproInputsError("fd.last_repro_script() cannot provide a repro because fd.execute(inputs, "
                                          "save_repro_inputs=True) was not executed!")
        return repro_script(repr(self), self._repro_inputs)


#: parallel types ``fd.execute`` honours in a user's schedule: host loops and devices, not kernel loops
_EXECUTED_PARALLEL_TYPES = frozenset({ParallelType.serial, ParallelType.stream, *DEVICE_PARALLEL_TYPES})


def _warn_kernel_parallel_types(fusion: Fusion) -> None:
    """``fd.execute`` segments and schedules the fusion itself, so kernel parallel types set by the user
    (grid, block, vectorize, unroll, ...) do not apply; say so once, and where they do apply."""
    found = [f"{tv.short_name} axis {pos} ({i.parallel_type.name})" for tv in fusion.tensors()
             for pos, i in enumerate(tv.get_loop_domain()) if i.parallel_type not in _EXECUTED_PARALLEL_TYPES]
    if found:
        shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        warnings.warn(f"fd.execute schedules each kernel itself and ignores the kernel parallel types of {shown}; "
                      "fd.manual_execute runs the fusion as you scheduled it (fd.execute honours only stream and "
                      "mesh parallel types)", IgnoredScheduleWarning, stacklevel=4)


def _flatten(inputs: Sequence[Any]) -> list[Any]:
    """The inputs as a flat list (a ``define_vector`` input is passed as a list of its values)."""
    flat: list[Any] = []
    for x in input_list(inputs):
        if isinstance(x, (list, tuple)):
            flat.extend(x)
        else:
            flat.append(x)
    return flat


def _from_sizes_and_strides(name: str, sizes: Sequence[int], strides: Sequence[int],
                            static_sizes: bool) -> tuple[list[int], list[bool | None], list[int] | None]:
    sizes, strides = list(sizes), list(strides)
    if len(sizes) != len(strides):
        raise ValueError(f"define_tensor {name}: {len(sizes)} sizes {sizes} but {len(strides)} strides {strides}")
    for what, values in (("sizes", sizes), ("strides", strides)):
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise ValueError(f"define_tensor {name}: {what} must be non-negative ints, got {values}")
    contiguity, order = tensor_descriptor(sizes, strides)
    shape = [s if (static_sizes or s == 1) else -1 for s in sizes]
    return shape, contiguity, order if order != sorted(order, reverse=True) else None


def _check_scalar_value(value: Any, dtype: DataType) -> None:
    """A constant must be a number that ``dtype`` holds exactly (``2.5`` is no int64_t)."""
    if isinstance(value, str) or not isinstance(value, (bool, int, float, complex)):
        raise TypeError(f"define_scalar: value must be a Python number, got {type(value).__name__}")
    check_scalar_in_range(value, dtype, "define_scalar")
    kind = python_scalar_type(dtype)
    try:
        converted = kind(value)
    except (TypeError, ValueError, OverflowError):
        converted = None
    same = converted is not None and (converted == value or (converted != converted and value != value))  # NaN
    if not same:
        raise ValueError(f"define_scalar: {value!r} is not a {dtype} value (it would become {converted!r})"
                         if converted is not None else f"define_scalar: {value!r} is not a {dtype} value")


def _output_mismatch(k: int, message: str) -> str:
    return f"output {k}: {message}"
