"""Reductions: sum / max / min / prod / mean and var_mean over some axes.

Each reduction kind is a member of ``ReductionOpType`` whose value is its row of the table: the
torch reference, nvFuser's printed op name and initial value, and how partial results of it
combine across ranks (a sum of partial sums, a max of partial maxes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

import torch

from pyfuser.ir.base import Expr, PythonCall
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.ops.common import header, int_list, positional_map
from pyfuser.ir.ops.shape import describe_axis

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion
    from pyfuser.ir.iter_domain import IterDomain
    from pyfuser.ir.tensor_view import TensorView


def _prod(x: torch.Tensor, dims: tuple[int, ...], dtype: torch.dtype | None) -> torch.Tensor:
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, dtype=dtype)
    return x


@dataclass(frozen=True, eq=False)
class ReductionSpec:
    """``fn(x, dims, dtype)``: the torch reference; ``printed`` / ``init``: nvFuser's kernel-math
    op name and initial value; ``combine``: how partial results combine (a ``ReduceOp`` name);
    ``needs_elements``: torch has no result for an empty reduced axis (max, min)."""

    fn: Callable[[torch.Tensor, tuple[int, ...], torch.dtype], torch.Tensor]
    printed: str
    init: str
    combine: str
    needs_elements: bool = False


class ReductionOpType(Enum):
    sum = ReductionSpec(lambda x, dims, dtype: torch.sum(x, dims, dtype=dtype), "add", "0", "sum")
    prod = ReductionSpec(_prod, "mul", "1", "prod")
    max = ReductionSpec(lambda x, dims, dtype: torch.amax(x, dims).to(dtype), "max", "-inf", "max", True)
    min = ReductionSpec(lambda x, dims, dtype: torch.amin(x, dims).to(dtype), "min", "inf", "min", True)
    #: partial means of equal-sized shards average like sums divided by the shard count
    mean = ReductionSpec(lambda x, dims, dtype: torch.mean(x, dims, dtype=dtype), "mean", "0", "mean")

    @property
    def spec(self) -> ReductionSpec:
        return self.value


class ReductionOp(Expr):
    """``out = reduce(kind, in, axes)``; ``out``'s logical domain keeps reduction IDs at ``axes``."""

    def __init__(self, fusion: Fusion, kind: ReductionOpType, out: TensorView, inp: TensorView,
                 axes: list[int], count_ids: tuple[IterDomain, ...] = ()) -> None:
        super().__init__(fusion, [inp], [out])
        self.kind = kind
        self.axes = tuple(sorted(axes))
        #: a mean that finishes an rfactored one divides by the extents of these IDs (the reduced IDs
        #: of the whole reduction), not by its own reduced extents
        self.count_ids = count_ids
        self._needs_elements = kind.spec.needs_elements
        #: a schedule's choice for a sum of ``exp(y - max(y))`` (``ir.analysis.online_softmax``): it
        #: accumulates in the pass of this max, each lane's sum relative to the lane's running max
        self.online_max: ReductionOp | None = None
        #: a sum or mean accumulated in a loop keeps what its adds lost (a compensated sum); a schedule
        #: turns it off where the result is only ever rounded to 16 bits
        #: (``scheduler.reduction_schedule.mark_rounded_sums``)
        self.compensated = True

    def evaluate(self, ctx: EvalContext, x: torch.Tensor) -> list[Any]:
        dtype = self.output.dtype.torch_dtype
        if self.count_ids and self.kind is ReductionOpType.mean:
            count = 1
            for i in self.count_ids:
                count *= int(i.extent.evaluate(ctx.env))
            return [(torch.sum(x, self.axes, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
                     / count).to(dtype)]
        if not self.axes:
            return [x.to(dtype)]
        if self._needs_elements:
            for d in self.axes:
                if x.shape[d] == 0:
                    raise ValueError(f"{self.kind.name}: {describe_axis(self.defined_inputs[0], d)} has size 0; "
                                     f"the {self.kind.name} of an empty axis is undefined")
        return [self.kind.spec.fn(x, self.axes, dtype)]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return positional_map(producer, self.output)

    def python_call(self) -> PythonCall:
        return PythonCall(self.kind.name, (self.inputs[0],), {"dims": list(self.axes), "dtype": self.output.dtype})

    def to_string(self, indent: int = 0) -> str:
        spec = self.kind.spec
        return (f"{header(self.output, indent)}reduction( {self.inputs[0]}, op = {spec.printed}, "
                f"initial value = {self.output.dtype.value}({spec.init}), allreduce = false )\n")


class VarMeanOp(Expr):
    """``var, mean = var_mean(in, axes, correction)``; both outputs keep reduction IDs."""

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

    def python_call(self) -> PythonCall:
        return PythonCall("var_mean", (self.inputs[0],), {"dims": list(self.axes), "correction": self.correction})

    def to_string(self, indent: int = 0) -> str:
        var, mean = self.outputs
        outs = f"{var},\n   {mean}"
        return (f"{header(outs, indent)}var_mean( {self.inputs[0]}, "
                f"dims = {int_list(self.axes)}, correction = {self.correction} )\n")


class WelfordOp(VarMeanOp):
    """``avg, var_sum, n = welford(in, axes)``: the mean, the sum of squared deviations from it (the
    variance times n) and the count n of each reduced group, as Welford's online algorithm carries
    them. A var_mean without correction that also returns its count."""

    def __init__(self, fusion: Fusion, avg: TensorView, var_sum: TensorView, n: TensorView, inp: TensorView,
                 axes: list[int]) -> None:
        Expr.__init__(self, fusion, [inp], [avg, var_sum, n])
        self.axes = tuple(sorted(axes))
        self.correction = 0

    def evaluate(self, ctx: EvalContext, x: torch.Tensor) -> list[Any]:
        var, mean = torch.var_mean(x, self.axes, correction=0)
        count = 1
        for d in self.axes:
            count *= x.shape[d]
        n = torch.full(mean.shape, count, dtype=torch.int64, device=mean.device)
        return [mean, var * count, n]

    def python_call(self) -> PythonCall:
        return PythonCall("welford", (self.inputs[0],), {"dims": list(self.axes)})

    def to_string(self, indent: int = 0) -> str:
        avg, var_sum, n = self.outputs
        outs = f"{avg}(Avg),\n   {var_sum}(Var),\n   {n}(Count)"
        return f"{header(outs, indent)}Welford ( {self.inputs[0]}, dims = {int_list(self.axes)} )\n"

