"""Ops that create tensors from scalars: full and iota."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from pyfuser.ir.base import Expr, PythonCall, Val
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.ops.common import call_string, checked_sizes

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion
    from pyfuser.ir.tensor_view import TensorView


class FullOp(Expr):
    chunkable = True

    def __init__(self, fusion: Fusion, out: TensorView, fill_value: Val) -> None:
        super().__init__(fusion, [fill_value], [out])
        self._extents = [i.extent for i in out.get_logical_domain()]

    def evaluate(self, ctx: EvalContext, value: Any) -> list[Any]:
        dtype = self.output.dtype
        sizes = checked_sizes(f"full {self.output.short_name}", [e.evaluate(ctx.env) for e in self._extents],
                              dtype.itemsize)
        return [torch.full(sizes, value, dtype=dtype.torch_dtype, device=ctx.device)]

    def evaluate_into(self, ctx: EvalContext, out: torch.Tensor, value: Any) -> None:
        """``out`` may be one chunk of the output (stream loop), so fill it rather than build a full tensor."""
        out.fill_(value)

    def python_call(self) -> PythonCall:
        return PythonCall("full", (), {"shape": list(self._extents), "fill_value": self.inputs[0],
                                       "dtype": self.output.dtype})

    def to_string(self, indent: int = 0) -> str:
        extents = ", ".join(str(e) for e in self._extents)
        return call_string(self.output, "full", [f"{{{extents}}}", self.inputs[0]], "", indent)


class IotaOp(Expr):
    """``start + step * arange(length)``."""

    chunkable = False

    def __init__(self, fusion: Fusion, out: TensorView, length: Val, start: Val, step: Val) -> None:
        super().__init__(fusion, [length, start, step], [out])

    def evaluate(self, ctx: EvalContext, length: int, start: Any, step: Any) -> list[Any]:
        dtype = self.output.dtype.torch_dtype
        checked_sizes(f"iota {self.output.short_name}", [int(length)], dtype.itemsize)
        index = torch.arange(int(length), device=ctx.device, dtype=dtype)
        return [(index * step + start).to(dtype)]

    def python_call(self) -> PythonCall:
        length, start, step = self.inputs
        return PythonCall("iota", (length, start, step), {"dtype": self.output.dtype})

    def to_string(self, indent: int = 0) -> str:
        return call_string(self.output, "iota", self.inputs, f"dtype = {self.output.dtype.value}", indent)
