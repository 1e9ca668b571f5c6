"""Giving fusion outputs the layout their allocation domain asks for."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pyfuser.ir.fusion import Fusion
from pyfuser.ir.layout import allocation_permutation, dense_strides
from pyfuser.ir.tensor_view import TensorView


@dataclass(frozen=True, slots=True)
class OutputLayout:
    """Allocation order of one output (outermost first) and whether a user required it."""

    perm: tuple[int, ...]
    required: bool

    @staticmethod
    def of(fusion: Fusion, tv: TensorView) -> OutputLayout:
        required = fusion.get_output_stride_order(tv)
        if required is not None:
            return OutputLayout(tuple(allocation_permutation(required)), True)
        logical = tv.get_logical_domain(no_reductions=True)
        position = {id(i): d for d, i in enumerate(logical)}
        alloc = [i for i in tv.get_allocation_domain() if not i.is_reduction]
        if tv.has_allocation_domain() and all(id(i) in position for i in alloc):
            return OutputLayout(tuple(position[id(i)] for i in alloc), tv.allocation_is_required)
        return OutputLayout(tuple(range(len(logical))), False)

    def empty(self, sizes: torch.Size | list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty_strided(sizes, dense_strides(sizes, self.perm), dtype=dtype, device=device)

    def conform(self, result: torch.Tensor, input_storages: set[int]) -> torch.Tensor:
        """``result`` itself when it already has this layout and owns its memory, else a copy."""
        want = dense_strides(result.shape, self.perm)
        same = all(s == w or n <= 1 for s, w, n in zip(result.stride(), want, result.shape, strict=True))
        aliases_input = result.untyped_storage().data_ptr() in input_storages and result.numel() > 0
        if same and not aliases_input:
            return result
        out = self.empty(result.shape, result.dtype, result.device)
        out.copy_(result)
        return out
