"""FusionDefinition: the user-facing way to define, schedule and execute a fusion."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pyfuser.frontend.ops import Ops
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
from pyfuser.ir.iter_domain import IterDomain, IterType
from pyfuser.ir.layout import (
    allocation_permutation,
    check_stride_order,
    contiguity_of_strides,
    memory_order,
    stride_order_of_permutation,
)
from pyfuser.ir.symbolic import SymVar
from pyfuser.ir.tensor_domain import TensorDomain
from pyfuser.ir.tensor_view import MemoryType, TensorView
from pyfuser.runtime.executor import FusionExecutorCache
from pyfuser.runtime.inputs import input_list


class FusionDefinition:
    """Define a fusion inside ``with FusionDefinition() as fd:``, then ``fd.execute(inputs)``.

    Tensors returned by ``define_tensor`` and ``fd.ops`` are TensorViews: schedule them directly
    (``tv.split(0, 4)``, ``tv.axis(0).parallelize(ParallelType.stream)``).
    """

    def __init__(self) -> None:
        self.fusion = Fusion()
        self.ops = Ops(self.fusion)
        self._executor = FusionExecutorCache(self.fusion)

    def __enter__(self) -> FusionDefinition:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    # --- inputs -------------------------------------------------------------------------------
    def define_tensor(self, shape: Sequence[int], contiguity: bool | Sequence[bool | None] | None = None,
                      dtype: DataType | torch.dtype = DataType.Float, is_cpu: bool = False,
                      stride_order: Sequence[int] | None = None) -> TensorView:
        """Declare an input tensor.

        ``shape``: -1 symbolic, 1 broadcast, N static. ``contiguity``: per logical axis (like
        ``shape``), a single bool for all, or None for no contiguity promise. ``stride_order[i]``:
        axis i's place counted from the innermost (``[1, 0]`` row-major).
        """
        name = f"T{self.fusion._counters.get('tv', 0)}"
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
            per_axis: list[bool | None] = [bool(contiguity)] * rank
        elif isinstance(contiguity, (str, bytes)) or not isinstance(contiguity, Sequence):
            raise TypeError(f"define_tensor {name}: contiguity must be a bool, None or a list of them, got "
                            f"{contiguity!r}")
        else:
            per_axis = list(contiguity)
            if len(per_axis) != rank:
                raise ValueError(f"define_tensor {name}: contiguity {per_axis} has {len(per_axis)} entries but shape "
                                 f"{dims} has rank {rank}")
        for d, (size, c) in enumerate(zip(dims, per_axis, strict=True)):
            if c is None and size != 1:
                raise ValueError(f"define_tensor {name}: contiguity of axis {d} is None, but only broadcast axes "
                                 "(size 1) may have None contiguity")
        dtype = as_data_type(dtype)
        # Everything is checked: only now create IDs, so a rejected call leaves no trace.
        ids = []
        for size in dims:
            if size == -1:
                ids.append(IterDomain(self.fusion, SymVar(f"i{self.fusion.next_name('scalar')}")))
            elif size == 1:
                ids.append(IterDomain(self.fusion, 1, IterType.Broadcast))
            else:
                ids.append(IterDomain(self.fusion, size))
        tv = TensorView(self.fusion, TensorDomain(ids), dtype, MemoryType.Global)
        alloc_contiguity = [None if ids[d].is_broadcast else bool(per_axis[d]) for d in perm]
        if stride_order is not None and perm != list(range(rank)):
            tv.set_allocation_domain([ids[d] for d in perm], alloc_contiguity)
        else:
            tv.domain().contiguity = alloc_contiguity
        tv.is_cpu = is_cpu
        self.fusion.add_input(tv)
        return tv

    def from_pytorch(self, tensor: torch.Tensor, static_sizes: bool = False) -> TensorView:
        """Declare an input matching ``tensor``'s dtype, rank, size-1 axes and strides."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"from_pytorch expects a torch.Tensor, got {type(tensor).__name__}")
        sizes, strides = list(tensor.shape), list(tensor.stride())
        shape = [s if (static_sizes or s == 1) else -1 for s in sizes]
        # Axes without a memory footprint (size 1, or expanded with stride 0) keep their logical
        # place: an expanded example must not declare an order its materialized copy violates.
        perm = memory_order(sizes, strides)
        broadcast = [s == 1 for s in sizes]
        contig_alloc = contiguity_of_strides(sizes, strides, perm, broadcast)
        per_axis: list[bool | None] = [None] * len(sizes)
        for place, d in enumerate(perm):
            per_axis[d] = contig_alloc[place]
        order = stride_order_of_permutation(perm) if perm != sorted(perm) else None
        return self.define_tensor(shape, per_axis, DataType.from_torch(tensor.dtype),
                                  is_cpu=tensor.device.type == "cpu" and tensor.dim() == 0,
                                  stride_order=order)

    def define_scalar(self, value: Any = None, dtype: DataType | torch.dtype | None = None) -> Scalar:
        """A constant (``value`` given) or a scalar input of the fusion (``value`` None)."""
        if dtype is None:
            dt = data_type_of_python(value) if value is not None else DataType.Double
            check_scalar_in_range(value, dt, "define_scalar")
        else:
            dt = as_data_type(dtype)
            if value is not None:
                _check_scalar_value(value, dt)
        scalar = Scalar(self.fusion, dt, value)
        if value is None:
            self.fusion.add_input(scalar)
        return scalar

    # --- outputs ---------------------------------------------------------------------------------
    def add_output(self, tv: TensorView | Scalar, stride_order: Sequence[int] | None = None) -> None:
        """Mark ``tv`` an output. A scalar output is returned as a 0-dim tensor of its dtype."""
        if isinstance(tv, Scalar) and tv.fusion is self.fusion:
            if stride_order not in (None, [], ()):
                raise ValueError(f"add_output: scalar {tv} is returned as a 0-dim tensor; its stride_order must be "
                                 f"empty, got {list(stride_order)}")  # type: ignore[arg-type]
            tv = self.ops.full([], tv, tv.dtype)
            stride_order = None
        if isinstance(tv, TensorView) and tv.fusion is not self.fusion:
            raise ValueError(f"{tv.short_name} belongs to another FusionDefinition and cannot be an output here")
        if isinstance(tv, TensorView) and stride_order is not None:
            check_stride_order(stride_order, tv.ndim, f"add_output {tv.short_name}")
            earlier = self.fusion.get_output_stride_order(tv) if tv.is_fusion_output else None
            if earlier is not None and earlier != list(stride_order):
                raise ValueError(f"add_output {tv.short_name}: already an output with stride_order {earlier}; one "
                                 f"tensor cannot also be required in stride_order {list(stride_order)} (add_output "
                                 f"fd.ops.set({tv.short_name}) for a second layout)")
        self.fusion.add_output(tv)
        if stride_order is not None:
            self.fusion.set_output_stride_order(tv, stride_order)

    # --- execution ---------------------------------------------------------------------------------
    def execute(self, inputs: Sequence[Any], *, device: torch.device | str | int | None = None,
                _enable_options: Sequence[str] = (), _disable_options: Sequence[str] = ()) -> list[torch.Tensor]:
        if not self.fusion.outputs():
            raise ValueError("the fusion has no outputs; call fd.add_output(tv) before execute")
        return self._executor.run(input_list(inputs), device=device, enable_options=_enable_options,
                                  disable_options=_disable_options)

    # --- printing ----------------------------------------------------------------------------------
    def __repr__(self) -> str:
        return str(self.fusion)

    __str__ = __repr__


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
