"""Matmul and linear, evaluated with ATen (cuBLAS on GPUs).

Outputs keep the contracted K axis as a trailing reduction ID, as nvFuser does:
``linear(x[m, k], w[n, k]) -> out[m, n, rK]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from pyfuser.ir.base import Expr, indent_str
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.ops.common import header
from pyfuser.ir.ops.shape import check_same_sizes, unproven_equal

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion
    from pyfuser.ir.iter_domain import IterDomain
    from pyfuser.ir.tensor_view import TensorView


def _align_right(producer_ids: list[IterDomain], consumer_ids: list[IterDomain]) -> dict[IterDomain, IterDomain]:
    offset = len(consumer_ids) - len(producer_ids)
    return {p: consumer_ids[offset + k] for k, p in enumerate(producer_ids) if offset + k >= 0}


def _matmul_writes_into(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether ``torch.matmul(a, b, out=out)`` writes ``out`` in place. Some of its paths do not: a
    batched ``a`` times a matrix or vector is folded into one GEMM, and a vector times a batched
    ``b`` is unsqueezed into one, whose result is viewed into ``out``, which fails on a strided
    ``out`` (a stream chunk of a column-major output); a vector times a matrix resizes ``out``
    (deprecated, and a chunk would stop being a view)."""
    if a.dim() == 1 and b.dim() == 2:
        return False
    if (a.dim() >= 3 and b.dim() <= 2) or (a.dim() == 1 and b.dim() >= 3):
        return out.is_contiguous()
    return True


class MatmulOp(Expr):
    """``torch.matmul`` semantics for 1-D to N-D operands."""


    def __init__(self, fusion: Fusion, out: TensorView, a: TensorView, b: TensorView) -> None:
        super().__init__(fusion, [a, b], [out])
        ra, rb = a.ndim, b.ndim
        self._checks = unproven_equal((a, b), 0, ra - 1, 1, 0 if rb == 1 else rb - 2)
        batch_a, batch_b = max(ra - 2, 0), max(rb - 2, 0)
        for k in range(1, min(batch_a, batch_b) + 1):  # batch axes, aligned on the right
            self._checks += unproven_equal((a, b), 0, batch_a - k, 1, batch_b - k)

    def evaluate(self, ctx: EvalContext, a: torch.Tensor, b: torch.Tensor) -> list[Any]:
        if self._checks:
            check_same_sizes("matmul", self._checks, self.defined_inputs, (a, b))
        return [torch.matmul(a, b)]

    def evaluate_into(self, ctx: EvalContext, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        if self._checks:
            check_same_sizes("matmul", self._checks, self.defined_inputs, (a, b))
        if _matmul_writes_into(a, b, out):
            torch.matmul(a, b, out=out)
        else:
            out.copy_(torch.matmul(a, b))

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return self.agreed_map(producer)

    def operand_map(self, position: int) -> dict[IterDomain, IterDomain]:
        a, b = self.inputs
        out_ids = self.output.get_logical_domain()
        rk, kept = out_ids[-1], out_ids[:-1]
        ids = self.inputs[position].get_logical_domain(no_reductions=True)  # type: ignore[attr-defined]
        mapping: dict[IterDomain, IterDomain] = {}
        if position == 0:
            k = ids[-1]
            if len(ids) >= 2:
                n_present = b.ndim >= 2  # type: ignore[attr-defined]
                m_pos = len(kept) - (2 if n_present else 1)
                mapping.update(_align_right(ids[:-2], kept[:m_pos]))
                mapping[ids[-2]] = kept[m_pos]
            mapping[k] = rk
        elif len(ids) == 1:
            mapping[ids[0]] = rk
        else:
            mapping[ids[-2]] = rk
            mapping[ids[-1]] = kept[-1]
            batch_end = len(kept) - 1 - (1 if a.ndim >= 2 else 0)  # type: ignore[attr-defined]
            mapping.update(_align_right(ids[:-2], kept[:batch_end]))
        return mapping

    def to_string(self, indent: int = 0) -> str:
        a, b = self.inputs
        return f"{header(self.output, indent)}matmul({a},\n{indent_str(indent)}          {b})\n"


class LinearOp(Expr):
    """``F.linear(x, weight, bias)``: x ``[..., k]``, weight ``[n, k]`` (or ``[k]``), bias ``[n]``."""


    def __init__(self, fusion: Fusion, out: TensorView, x: TensorView, weight: TensorView,
                 bias: TensorView | None) -> None:
        super().__init__(fusion, [x, weight] + ([bias] if bias is not None else []), [out])
        self._checks = unproven_equal((x, weight, bias), 0, x.ndim - 1, 1, weight.ndim - 1)
        if bias is not None and bias.ndim == 1 and weight.ndim == 2:
            self._checks += unproven_equal((x, weight, bias), 2, 0, 1, 0)

    @property
    def has_bias(self) -> bool:
        return len(self.inputs) == 3

    def evaluate(self, ctx: EvalContext, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> list[Any]:
        if self._checks:
            check_same_sizes("linear", self._checks, self.defined_inputs, (x, w, bias))
        return [F.linear(x, w, bias)]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return self.agreed_map(producer)

    def operand_map(self, position: int) -> dict[IterDomain, IterDomain]:
        w = self.inputs[1]
        out_ids = self.output.get_logical_domain()
        rk, kept = out_ids[-1], out_ids[:-1]
        ids = self.inputs[position].get_logical_domain(no_reductions=True)  # type: ignore[attr-defined]
        n_present = w.ndim == 2  # type: ignore[attr-defined]
        if position == 0:
            mapping = {p: c for p, c in zip(ids[:-1], kept, strict=False)}
            mapping[ids[-1]] = rk
            return mapping
        if position == 1:
            return {ids[0]: kept[-1], ids[1]: rk} if n_present else {ids[0]: rk}
        return {ids[0]: kept[-1]} if n_present and ids else {}

    def to_string(self, indent: int = 0) -> str:
        pad = indent_str(indent)
        x, w = self.inputs[0], self.inputs[1]
        text = f"{header(self.output, indent)}linear({x},\n{pad}            {w}      "
        if self.has_bias:
            text += f",\n{pad}      {self.inputs[2]}      "
        return text + ")\n"
