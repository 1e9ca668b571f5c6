"""Reductions: sum / max / min / prod / mean and var_mean over some axes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from pyfuser.ir.base import Expr
from pyfuser.ir.ops.common import header, int_list, positional_map
from pyfuser.ir.tensor_view import TensorView

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion
    from pyfuser.ir.iter_domain import IterDomain
    from pyfuser.runtime.context import EvalContext

#: op -> (nvFuser's printed op name, printed initial value)
_REDUCTION_PRINT = {"sum": ("add", "0"), "prod": ("mul", "1"), "max": ("max", "-inf"),
                    "min": ("min", "inf"), "mean": ("mean", "0")}


def _prod(x: torch.Tensor, dims: tuple[int, ...], dtype: torch.dtype | None) -> torch.Tensor:
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, dtype=dtype)
    return x


class ReductionOp(Expr):
    """``out = reduce(op, in, axes)``; ``out``'s logical domain keeps reduction IDs at ``axes``."""

    op_name = "reduction"

    def __init__(self, fusion: Fusion, op: str, out: TensorView, inp: TensorView, axes: list[int]) -> None:
        super().__init__(fusion, [inp], [out])
        self.op = op
        self.axes = tuple(sorted(axes))

    def evaluate(self, ctx: EvalContext, x: torch.Tensor) -> list[Any]:
        dtype = self.output.dtype.torch_dtype
        axes = self.axes
        if not axes:
            return [x.to(dtype)]
        if self.op == "sum":
            return [torch.sum(x, axes, dtype=dtype)]
        if self.op == "mean":
            return [torch.mean(x, axes, dtype=dtype)]
        if self.op == "max":
            return [torch.amax(x, axes).to(dtype)]
        if self.op == "min":
            return [torch.amin(x, axes).to(dtype)]
        return [_prod(x, axes, dtype)]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return positional_map(producer, self.output)

    def to_string(self, indent: int = 0) -> str:
        name, init = _REDUCTION_PRINT[self.op]
        return (f"{header(self.output, indent)}reduction( {self.inputs[0]}, op = {name}, "
                f"initial value = {self.output.dtype.value}({init}), allreduce = false )\n")


class VarMeanOp(Expr):
    """``var, mean = var_mean(in, axes, correction)``; both outputs keep reduction IDs."""

    op_name = "var_mean"

    def __init__(self, fusion: Fusion, var: TensorView, mean: TensorView, inp: TensorView,
                 axes: list[int], correction: int) -> None:
        super().__init__(fusion, [inp], [var, mean])
        self.axes = tuple(sorted(axes))
        self.correction = correction

    def evaluate(self, ctx: EvalContext, x: torch.Tensor) -> list[Any]:
        var, mean = torch.var_mean(x, self.axes, correction=self.correction)
        return [var, mean]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return positional_map(producer, self.output)

    def to_string(self, indent: int = 0) -> str:
        var, mean = self.outputs
        outs = f"{var},\n   {mean}"
        return (f"{header(outs, indent)}var_mean( {self.inputs[0]}, "
                f"dims = {int_list(self.axes)}, correction = {self.correction} )\n")
