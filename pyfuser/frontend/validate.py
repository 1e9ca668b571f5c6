"""Validating a fusion's outputs (``fd.validate``) with nvFuser's tolerances.

The tolerance of an output depends on its dtype and on how many values each of its elements
accumulates (its reduction size: the product of the extents reduced on the way from the inputs,
a scan's axis counting as reduced). The tables are nvFuser's measured worst-case errors of sums
of that many values (``ValidationConstants``); a tolerance takes the entry one size up, for
margin, and a relative tolerance of 1 % of it. Integral and boolean outputs must be equal.
A float output computed from a value rounded to Half or BFloat16 on the way (not a copy of an input)
is judged by that dtype's table: a kernel that contracts ``a * b + c`` into one FMA differs from
the op-by-op reference by a float32 ulp, which that rounding can turn into a Half ulp.

Without reference outputs the reference is the fusion evaluated op by op with each op's torch
reference (``Expr.evaluate``), before the fusion runs, so outputs written in place into inputs
do not change what the reference reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pyfuser.ir.base import evaluate_exprs
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.ops.shape import (
    BroadcastOp,
    CatOp,
    ExpandOp,
    LoadStoreOp,
    PadOp,
    PermuteOp,
    ReshapeOp,
    SliceOp,
    SqueezeOp,
)
from pyfuser.ir.tensor_view import TensorView
from pyfuser.runtime.inputs import InputBinder

#: (number of values summed, max abs error measured) for float32 sums (nvFuser's table).
SUM_TOLERANCES_FLOAT = (
    (4, 1.68222e-06), (8, 2.23704e-06), (16, 2.95788e-06), (32, 4.4778e-06), (64, 6.75395e-06),
    (128, 8.57934e-06), (256, 1.30594e-05), (512, 2.19122e-05), (1024, 3.3451e-05), (2048, 5.78476e-05),
    (4096, 0.000108292), (8192, 0.00012207), (16384, 0.000136882), (32768, 0.000248561),
    (65536, 0.000407594), (131072, 0.000500901), (262144, 0.000923019), (524288, 0.00156909),
    (1048576, 0.00223107), (2097152, 0.00343043))
#: The same for half-precision sums.
SUM_TOLERANCES_HALF = (
    (4, 0.00390625), (8, 0.0078125), (16, 0.0078125), (32, 0.0155334), (64, 0.0156269), (128, 0.0312042),
    (256, 0.0312548), (512, 0.0619979), (1024, 0.0625103), (2048, 0.124686), (4096, 0.12501),
    (8192, 0.24945), (16384, 0.250049), (32768, 0.498946), (65536, 0.500071), (131072, 0.985087),
    (262144, 1.00006), (524288, 1.99234), (1048576, 2.00032), (2097152, 3.99073))


def tolerance(dtype: DataType, reduction_size: int) -> tuple[float, float]:
    """``(atol, rtol)`` for an output of ``dtype`` whose elements accumulate ``reduction_size`` values."""
    if not (dtype.is_floating or dtype.is_complex):
        return 0.0, 0.0
    table = SUM_TOLERANCES_HALF if dtype in (DataType.Half, DataType.BFloat16) else SUM_TOLERANCES_FLOAT
    if reduction_size <= 1:
        return table[0][1], table[1][1]
    entry = next((k for k, (size, _) in enumerate(table) if size >= reduction_size), len(table))
    atol = table[entry + 1][1] if entry + 1 < len(table) else table[-1][1] * 2.0
    scale = 10.0 if dtype is DataType.BFloat16 else 1.0  # bfloat16 has 3 fewer mantissa bits than half
    return atol * scale, atol * 0.01 * scale


def reduction_sizes(fusion: Fusion, env: dict[str, int]) -> dict[int, int]:
    """Tensor name -> how many values each of its elements accumulates."""
    sizes: dict[int, int] = {v.name: 1 for v in fusion.inputs() if isinstance(v, TensorView)}
    for expr in fusion.exprs():
        inherited = max((sizes.get(t.name, 1) for t in expr.tensor_inputs), default=1)
        for out in expr.tensor_outputs:
            own = 1
            for i in out.get_logical_domain():
                if i.is_reduction():
                    own *= i.extent.evaluate(env)
            sizes[out.name] = own * expr.accumulated_size(env) * inherited
    return sizes


#: ops whose output elements are copies of their operands' (or a pad's constant): they round nothing
_COPY_OPS = (BroadcastOp, CatOp, ExpandOp, LoadStoreOp, PadOp, PermuteOp, ReshapeOp, SliceOp, SqueezeOp)
_LOW_PRECISION = (DataType.Half, DataType.BFloat16)  # coarser last


def rounded_to(fusion: Fusion) -> dict[int, DataType]:
    """Tensor name -> the coarsest of Half / BFloat16 that a value it is computed from was rounded to
    (tensors computed only in float32 / float64, or copied from inputs, are absent)."""
    found: dict[int, DataType] = {}
    for expr in fusion.exprs():
        inherited = [found[t.name] for t in expr.tensor_inputs if t.name in found]
        for out in expr.tensor_outputs:
            own = [out.dtype] if out.dtype in _LOW_PRECISION and not isinstance(expr, _COPY_OPS) else []
            coarsest = max(inherited + own, key=_LOW_PRECISION.index, default=None)
            if coarsest is not None:
                found[out.name] = coarsest
    return found


def get_val_tolerances(fusion: Fusion, inputs: Sequence[Any]) -> list[tuple[float, float]]:
    """``(atol, rtol)`` of each returned output (nvFuser's ``get_val_tolerances``): by its reduction size,
    and by its dtype or the Half / BFloat16 a value it comes from was rounded to, whichever is coarser."""
    return _tolerances(fusion, reduction_sizes(fusion, _prepare(fusion, inputs)[1]))


def _tolerances(fusion: Fusion, sizes: dict[int, int]) -> list[tuple[float, float]]:
    rounded = rounded_to(fusion)
    tolerances = []
    for out in _returned(fusion):
        dtype = out.dtype
        if dtype in (DataType.Float, DataType.Double) and out.name in rounded:
            dtype = rounded[out.name]
        tolerances.append(tolerance(dtype, sizes.get(out.name, 1)))
    return tolerances


def evaluate_reference(fusion: Fusion, inputs: Sequence[Any], device: torch.device | None = None) -> list[torch.Tensor]:
    """The returned outputs computed op by op with each op's torch reference."""
    args, env = _prepare(fusion, inputs)
    if device is None:
        device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.dim() > 0), torch.device("cpu"))
    ctx = EvalContext(env, device)
    values: dict[int, Any] = {id(v): a for v, a in zip(fusion.inputs(), args, strict=True)}
    evaluate_exprs(fusion.exprs(), ctx, values)
    return [values[id(out)] for out in _returned(fusion)]


def check_outputs(fusion: Fusion, outputs: Sequence[torch.Tensor], inputs: Sequence[Any],
                  reference_outputs: Sequence[torch.Tensor] | None) -> None:
    """Raise AssertionError naming the first returned output that differs from its reference."""
    returned = _returned(fusion)
    references = list(reference_outputs) if reference_outputs is not None else evaluate_reference(fusion, inputs)
    if len(references) != len(outputs):
        raise ValueError(f"validate: the fusion returns {len(outputs)} outputs but {len(references)} reference "
                         "outputs were given")
    sizes = reduction_sizes(fusion, _prepare(fusion, inputs)[1])
    tolerances = _tolerances(fusion, sizes)
    for k, (tv, out, ref) in enumerate(zip(returned, outputs, references, strict=True)):
        what = f"validate: output {k} ({tv.short_name}, {tv.dtype})"
        if tuple(ref.shape) != tuple(out.shape):
            raise AssertionError(f"{what} has shape {tuple(out.shape)} but the reference has {tuple(ref.shape)}")
        atol, rtol = tolerances[k]
        if out.is_floating_point() or out.is_complex():
            ref = ref.to(device=out.device, dtype=out.dtype)
            if not torch.allclose(out, ref, rtol=rtol, atol=atol, equal_nan=True):
                error = (out - ref).abs().nan_to_num(nan=float("inf")).max().item() if out.numel() else 0.0
                raise AssertionError(f"{what} differs from the reference: max abs error {error} (absolute tolerance "
                                     f"{atol}, relative tolerance {rtol}, reduction size {sizes.get(tv.name, 1)})")
        elif not torch.equal(out, ref.to(device=out.device, dtype=out.dtype)):
            raise AssertionError(f"{what} is not equal to the reference (integral and boolean outputs must match "
                                 "exactly)")


def validate_with_auto_inferred_outputs(fusion: Fusion, outputs: Sequence[torch.Tensor], inputs: Sequence[Any]) -> None:
    """nvFuser's name for checking ``outputs`` against the fusion's torch reference."""
    check_outputs(fusion, outputs, inputs, None)


def _returned(fusion: Fusion) -> list[TensorView]:
    return [o for pos, o in enumerate(fusion.outputs()) if fusion.output_alias(pos) is None]  # type: ignore[misc]  # add_output takes tensors


def _prepare(fusion: Fusion, inputs: Sequence[Any]) -> tuple[list[Any], dict[str, int]]:
    """The inputs checked and converted to their declared types, and the sizes they bind."""
    binder = InputBinder(fusion.inputs())
    args = list(inputs)
    binder.check(args)
    if binder.has_scalars:
        args = binder.coerce(args)
    return args, binder.bind(args)

