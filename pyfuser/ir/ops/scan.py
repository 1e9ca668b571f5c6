"""Ops along one axis: scans (cumsum, cumprod, cummin, cummax), topk, argsort, argmax / argmin,
and triu, evaluated with ATen.

A scan or a sort needs its whole axis: those ops cannot run on chunks of a stream loop. argmax
and argmin are reductions: their output keeps the reduced axis as a reduction ID, as ``sum``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any

import torch

from pyfuser.ir.base import Expr, PythonCall, Val
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.ops.common import call_string, header, positional_map
from pyfuser.ir.symbolic import SymExpr

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion
    from pyfuser.ir.iter_domain import IterDomain
    from pyfuser.ir.tensor_view import TensorView


class ScanOpType(Enum):
    """Inclusive scans; the value names the torch reference."""

    cumsum = "cumsum"
    cumprod = "cumprod"
    cummin = "cummin"
    cummax = "cummax"

    @property
    def accumulates(self) -> bool:
        """Whether torch's op takes ``dtype=``: the operand cast to it first, the scan accumulated in it."""
        return self in (ScanOpType.cumsum, ScanOpType.cumprod)

    def __call__(self, x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        fn: Callable[..., Any] = getattr(torch, self.value)
        result = fn(x, dim, dtype=dtype) if dtype is not None else fn(x, dim)
        return result.values if self in (ScanOpType.cummin, ScanOpType.cummax) else result  # (values, indices)


class ScanOp(Expr):
    """``out[..., i, ...] = op(in[..., 0, ...], ..., in[..., i, ...])`` along ``dim``; ``accumulate``: a
    cumsum's / cumprod's ``dtype=`` (the operand cast to it, the scan in it), None for torch's default
    (integers in int64)."""

    chunkable = False

    def __init__(self, fusion: Fusion, kind: ScanOpType, out: TensorView, inp: TensorView, dim: int,
                 accumulate: DataType | None = None) -> None:
        super().__init__(fusion, [inp], [out])
        if accumulate is not None and not kind.accumulates:
            raise ValueError(f"{kind.name} takes no dtype: only cumsum and cumprod accumulate in one")
        self.kind = kind
        self.dim = dim
        self.accumulate = accumulate

    def evaluate(self, ctx: EvalContext, x: torch.Tensor) -> list[Any]:
        dtype = self.accumulate.torch_dtype if self.accumulate is not None else None
        return [self.kind(x, self.dim, dtype).to(self.output.dtype.torch_dtype)]

    def accumulated_size(self, env: dict[str, int]) -> int:
        return self.output.get_logical_domain()[self.dim].extent.evaluate(env)

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return positional_map(producer, self.output)

    def python_call(self) -> PythonCall:
        dtype = {} if self.accumulate is None else {"dtype": self.accumulate}
        return PythonCall(self.kind.name, (self.inputs[0],), {"dim": self.dim, **dtype})

    def to_string(self, indent: int = 0) -> str:
        dtype = "" if self.accumulate is None else f", dtype = {self.accumulate}"
        return call_string(self.output, "scan", self.inputs, f"op = {self.kind.name}, dim = {self.dim}{dtype}", indent)


class TopKOp(Expr):
    """``values, indices = torch.topk(in, k, dim, largest, sorted)``; ``k`` is a size."""

    chunkable = False

    def __init__(self, fusion: Fusion, values: TensorView, indices: TensorView, inp: TensorView, k: SymExpr,
                 dim: int, largest: bool, sorted: bool) -> None:
        super().__init__(fusion, [inp], [values, indices])
        self.k = k
        self.dim = dim
        self.largest = largest
        self.sorted = sorted

    def evaluate(self, ctx: EvalContext, x: torch.Tensor) -> list[Any]:
        k = self.k.evaluate(ctx.env)
        if not 0 <= k <= x.shape[self.dim]:
            raise ValueError(f"topk: k = {k} is out of range for {self.tensor_input(0, as_defined=True).short_name} axis "
                             f"{self.dim} of size {x.shape[self.dim]} (valid: 0..{x.shape[self.dim]})")
        values, indices = torch.topk(x, k, self.dim, self.largest, self.sorted)
        return [values, indices]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        mapping = positional_map(producer, self.output)
        return {p: c for d, (p, c) in enumerate(mapping.items()) if d != self.dim}

    def python_call(self) -> PythonCall:
        return PythonCall("topk", (self.inputs[0], self.k), {"dim": self.dim, "largest": self.largest,
                                                             "sorted": self.sorted})

    def to_string(self, indent: int = 0) -> str:
        values, indices = self.outputs
        return (f"{header(f'{values},{chr(10)}   {indices}', indent)}topk( {self.inputs[0]}, k = {self.k}, "
                f"dim = {self.dim}, largest = {str(self.largest).lower()}, sorted = {str(self.sorted).lower()} )\n")


class ArgsortOp(Expr):
    """``indices = torch.argsort(in, dim, descending, stable)``."""

    chunkable = False

    def __init__(self, fusion: Fusion, out: TensorView, inp: TensorView, dim: int, descending: bool,
                 stable: bool) -> None:
        super().__init__(fusion, [inp], [out])
        self.dim = dim
        self.descending = descending
        self.stable = stable

    def evaluate(self, ctx: EvalContext, x: torch.Tensor) -> list[Any]:
        return [torch.argsort(x, dim=self.dim, descending=self.descending, stable=self.stable)]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        mapping = positional_map(producer, self.output)
        return {p: c for d, (p, c) in enumerate(mapping.items()) if d != self.dim}

    def python_call(self) -> PythonCall:
        return PythonCall("argsort", (self.inputs[0],), {"dim": self.dim, "descending": self.descending,
                                                         "stable": self.stable})

    def to_string(self, indent: int = 0) -> str:
        return call_string(self.output, "argsort", self.inputs,
                           f"dim = {self.dim}, descending = {str(self.descending).lower()}", indent)


class ArgReductionOp(Expr):
    """``out = torch.argmax(in, dim)`` (or argmin); ``dim`` None: the index into the flattened input.
    The output keeps the reduced axes as reduction IDs."""

    def __init__(self, fusion: Fusion, out: TensorView, inp: TensorView, dim: int | None, largest: bool) -> None:
        super().__init__(fusion, [inp], [out])
        self.dim = dim
        self.largest = largest

    @property
    def op_name(self) -> str:
        return "argmax" if self.largest else "argmin"

    def evaluate(self, ctx: EvalContext, x: torch.Tensor) -> list[Any]:
        extent = x.numel() if self.dim is None else x.shape[self.dim]
        if extent == 0:
            raise ValueError(f"{self.op_name}: {self.tensor_input(0, as_defined=True).short_name} "
                             f"{'is empty' if self.dim is None else f'axis {self.dim} has size 0'}; there is no "
                             f"{'largest' if self.largest else 'smallest'} element to index")
        return [(torch.argmax if self.largest else torch.argmin)(x, self.dim)]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return positional_map(producer, self.output)

    def python_call(self) -> PythonCall:
        return PythonCall(self.op_name, (self.inputs[0],), {"dim": self.dim})

    def to_string(self, indent: int = 0) -> str:
        return call_string(self.output, self.op_name, self.inputs, f"dim = {self.dim}", indent)


class TriuOp(Expr):
    """``out = torch.triu(in, diagonal)``: elements below the ``diagonal``-th diagonal of the last two
    axes zeroed."""

    chunkable = False

    def __init__(self, fusion: Fusion, out: TensorView, inp: TensorView, diagonal: Val) -> None:
        super().__init__(fusion, [inp, diagonal], [out])

    def evaluate(self, ctx: EvalContext, x: torch.Tensor, diagonal: int) -> list[Any]:
        return [torch.triu(x, int(diagonal))]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return positional_map(producer, self.output) if producer is self.inputs[0] else {}

    def python_call(self) -> PythonCall:
        return PythonCall("triu", (self.inputs[0],), {"diagonal": self.inputs[1]})

    def to_string(self, indent: int = 0) -> str:
        return call_string(self.output, "triu", self.inputs[:1], f"diagonal = {self.inputs[1]}", indent)
