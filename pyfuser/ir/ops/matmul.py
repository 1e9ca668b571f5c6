"""Matmul and linear, evaluated with ATen (cuBLAS on GPUs).

Outputs keep the contracted K axis as a trailing reduction ID, as nvFuser does:
``linear(x[m, k], w[n, k]) -> out[m, n, rK]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from pyfuser.ir.base import Expr, PythonCall, indent_str
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.ops.common import header
from pyfuser.ir.ops.shape import check_same_sizes, unproven_equal

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion
    from pyfuser.ir.iter_domain import IterDomain
    from pyfuser.ir.tensor_view import TensorView


def _as_matrix(t: torch.Tensor) -> torch.Tensor | None:
    """``t [..., k]`` as a ``[rows, k]`` view of the same memory, or None when its strides allow none."""
    if t.dim() == 0:
        return None
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:  # the leading dims cannot be merged without a copy
        return None


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

    returns_new_memory = True


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

    def unchecked_call(self) -> Callable[..., Any]:
        return torch.matmul

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
        a, b = self.tensor_input(0), self.tensor_input(1)
        out_ids = self.output.get_logical_domain()
        rk, kept = out_ids[-1], out_ids[:-1]
        ids = self.tensor_input(position).get_logical_domain(no_reductions=True)
        mapping: dict[IterDomain, IterDomain] = {}
        if position == 0:
            k = ids[-1]
            if len(ids) >= 2:
                n_present = b.ndim >= 2
                m_pos = len(kept) - (2 if n_present else 1)
                mapping.update(_align_right(ids[:-2], kept[:m_pos]))
                mapping[ids[-2]] = kept[m_pos]
            mapping[k] = rk
        elif len(ids) == 1:
            mapping[ids[0]] = rk
        else:
            mapping[ids[-2]] = rk
            mapping[ids[-1]] = kept[-1]
            batch_end = len(kept) - 1 - (1 if a.ndim >= 2 else 0)
            mapping.update(_align_right(ids[:-2], kept[:batch_end]))
        return mapping

    def python_call(self) -> PythonCall:
        return PythonCall("matmul", tuple(self.inputs))

    def to_string(self, indent: int = 0) -> str:
        a, b = self.inputs
        return f"{header(self.output, indent)}matmul({a},\n{indent_str(indent)}          {b})\n"


class LinearOp(Expr):
    """``F.linear(x, weight, bias)``: x ``[..., k]``, weight ``[n, k]`` (or ``[k]``), bias ``[n]``.

    A weight of rank >= 3 (nvFuser's form for weights whose leading axes are split over devices)
    is ``[*wb, n, k]``: ``out[*wb, ..., n] = x @ weight[*wb].T (+ bias[*wb])``, bias ``[*wb, n]``
    or ``[n]``.
    """

    returns_new_memory = True

    def __init__(self, fusion: Fusion, out: TensorView, x: TensorView, weight: TensorView,
                 bias: TensorView | None) -> None:
        super().__init__(fusion, [x, weight] + ([bias] if bias is not None else []), [out])
        self._checks = unproven_equal((x, weight, bias), 0, x.ndim - 1, 1, weight.ndim - 1)
        if bias is not None and bias.ndim >= 1 and weight.ndim >= 2:
            self._checks += unproven_equal((x, weight, bias), 2, bias.ndim - 1, 1, weight.ndim - 2)
            for d in range(bias.ndim - 1):  # bias [*wb, n] against weight [*wb, n, k]
                self._checks += unproven_equal((x, weight, bias), 2, d, 1, d)
        #: leading (batch) axes of a weight of rank >= 3
        self.weight_batch = max(weight.ndim - 2, 0)

    @property
    def has_bias(self) -> bool:
        return len(self.inputs) == 3

    def unchecked_call(self) -> Callable[..., Any] | None:
        return F.linear if not self.weight_batch else None

    def evaluate(self, ctx: EvalContext, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> list[Any]:
        if self._checks:
            check_same_sizes("linear", self._checks, self.defined_inputs, (x, w, bias))
        if not self.weight_batch:
            return [F.linear(x, w, bias)]
        batch, rows = w.shape[:-2], x.shape[:-1]
        y = torch.matmul(x.reshape(-1, x.shape[-1]), w.transpose(-1, -2))  # [*wb, prod(rows), n]
        y = y.reshape(*batch, *rows, w.shape[-2])
        if bias is not None:
            y = y + bias.reshape(*bias.shape[:-1], *([1] * len(rows)), bias.shape[-1])
        return [y]

    def evaluate_into(self, ctx: EvalContext, out: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                      bias: torch.Tensor | None = None) -> None:
        """``F.linear`` has no ``out=``: a 2-D weight runs as one ``mm`` / ``addmm`` writing ``out`` (a chunk
        of a Host IR buffer) in place, so no result is allocated and copied per call."""
        if self._checks:
            check_same_sizes("linear", self._checks, self.defined_inputs, (x, w, bias))
        rows, out_rows = _as_matrix(x), _as_matrix(out)
        if w.dim() != 2 or rows is None or out_rows is None or out.dtype != x.dtype:
            super().evaluate_into(ctx, out, x, w, bias)
        elif bias is None:
            torch.mm(rows, w.t(), out=out_rows)
        else:
            torch.addmm(bias, rows, w.t(), out=out_rows)

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return self.agreed_map(producer)

    def operand_map(self, position: int) -> dict[IterDomain, IterDomain]:
        w = self.tensor_input(1)
        out_ids = self.output.get_logical_domain()
        rk, kept = out_ids[-1], out_ids[:-1]
        ids = self.tensor_input(position).get_logical_domain(no_reductions=True)
        n_present = w.ndim >= 2
        wb = self.weight_batch
        if position == 0:
            mapping = {p: c for p, c in zip(ids[:-1], kept[wb:], strict=False)}
            mapping[ids[-1]] = rk
            return mapping
        if position == 1:
            if not n_present:
                return {ids[0]: rk}
            return {**dict(zip(ids[:wb], kept[:wb], strict=True)), ids[-2]: kept[-1], ids[-1]: rk}
        if not (n_present and ids):
            return {}
        return {**dict(zip(ids[:-1], kept[:wb], strict=False)), ids[-1]: kept[-1]}

    def python_call(self) -> PythonCall:
        return PythonCall("linear", tuple(self.inputs[:2]), {"bias": self.inputs[2] if self.has_bias else None})

    def to_string(self, indent: int = 0) -> str:
        pad = indent_str(indent)
        x, w = self.inputs[0], self.inputs[1]
        text = f"{header(self.output, indent)}linear({x},\n{pad}            {w}      "
        if self.has_bias:
            text += f",\n{pad}      {self.inputs[2]}      "
        return text + ")\n"


class GroupedMmOp(Expr):
    """``grouped_mm(mat1, mat2, offsets)`` (torch's ``_grouped_mm``): ``offsets`` holds the end of
    each group along the grouped axis.

    * ``[M, K] x [K, N]``, groups along K: ``out[g] = mat1[:, Kg] @ mat2[Kg, :]``, out ``[G, M, N]``;
    * ``[G, M, K] x [K, N]``, groups along N: ``out[:, Ng] = mat1[g] @ mat2[:, Ng]``, out ``[M, N]``;
    * ``[M, K] x [G, K, N]``, groups along M: ``out[Mg] = mat1[Mg] @ mat2[g]``, out ``[M, N]``.

    Evaluated one group at a time with ATen matmul; rows or columns past the last offset are zero.
    """

    chunkable = False

    def __init__(self, fusion: Fusion, out: TensorView, mat1: TensorView, mat2: TensorView,
                 offsets: TensorView) -> None:
        super().__init__(fusion, [mat1, mat2, offsets], [out])

    def evaluate(self, ctx: EvalContext, a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> list[Any]:
        mat1, mat2, offs = (self.tensor_input(k, as_defined=True) for k in range(3))
        grouped = {(2, 2): (a, a.dim() - 1), (3, 2): (b, 1), (2, 3): (a, 0)}[(a.dim(), b.dim())]
        owner = mat1 if grouped[0] is a else mat2
        extent = grouped[0].shape[grouped[1]]
        stacked = a if a.dim() == 3 else b if b.dim() == 3 else None
        if stacked is not None and stacked.shape[0] != offsets.numel():
            raise ValueError(f"grouped_mm: {offs.short_name} has {offsets.numel()} groups but "
                             f"{(mat1 if stacked is a else mat2).short_name} stacks {stacked.shape[0]} matrices")
        ends = [int(e) for e in offsets.tolist()]
        starts = [0, *ends[:-1]]
        if any(e < s for s, e in zip(starts, ends, strict=True)) or (ends and ends[-1] > extent):
            raise ValueError(f"grouped_mm: offsets {ends} ({offs.short_name}) must be non-decreasing group ends within "
                             f"{owner.short_name} axis {grouped[1]} of size {extent}")
        dtype = self.output.dtype.torch_dtype
        if a.dim() == 2 and b.dim() == 2:
            parts = [a[:, s:e] @ b[s:e, :] for s, e in zip(starts, ends, strict=True)]
            if not parts:
                return [torch.zeros(0, a.shape[0], b.shape[1], dtype=dtype, device=a.device)]
            return [torch.stack(parts).to(dtype)]
        rows, cols = (a.shape[1], b.shape[1]) if a.dim() == 3 else (a.shape[0], b.shape[2])
        out = torch.zeros(rows, cols, dtype=dtype, device=a.device)
        for g, (s, e) in enumerate(zip(starts, ends, strict=True)):
            if a.dim() == 3:
                out[:, s:e] = a[g] @ b[:, s:e]
            else:
                out[s:e] = a[s:e] @ b[g]
        return [out]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return self.agreed_map(producer)

    def operand_map(self, position: int) -> dict[IterDomain, IterDomain]:
        """The operands' M and N that the output keeps, except the grouped axis: ``offsets`` holds
        positions along the whole of it, so a shard of it would cut groups (sharding propagation follows
        a column-parallel weight's N or a data-parallel M; the grouped axis is gathered). The contraction
        and the offsets map nothing."""
        a, b = self.tensor_input(0), self.tensor_input(1)
        ia, ib = (t.get_logical_domain(no_reductions=True) for t in (a, b))
        out = self.output.get_logical_domain()
        if a.ndim == 2 and b.ndim == 2:  # groups along K: out [G, M, N]
            return {ia[0]: out[1]} if position == 0 else {ib[1]: out[2]} if position == 1 else {}
        if a.ndim == 3:  # groups along N: out [M, N]
            return {ia[1]: out[0]} if position == 0 else {}
        return {ib[2]: out[1]} if position == 1 else {}  # groups along M: out [M, N]

    def shardable_axes(self) -> set[int]:
        """The output's ungrouped M and N (``operand_map``): each group's rows and columns are computed from
        the operands' slices of them alone."""
        mapped = {id(c) for k in (0, 1) for c in self.operand_map(k).values()}
        return {p for p, i in enumerate(self.output.get_logical_domain()) if id(i) in mapped}

    def python_call(self) -> PythonCall:
        return PythonCall("grouped_mm", tuple(self.inputs))

    def to_string(self, indent: int = 0) -> str:
        a, b, offsets = self.inputs
        return f"{header(self.output, indent)}grouped_mm({a},\n{indent_str(indent)}          {b}, {offsets})\n"
