"""Giving fusion outputs (and host-allocated buffers) the layout their allocation domain asks for."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pyfuser.ir.domain_replay import logical_order
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
        if not tv.has_allocation_domain():
            return OutputLayout(tuple(range(len(logical))), False)
        # A required or hinted allocation alike: a hint is the layout the executor produces unless
        # a later stage replaced it. A sharded allocation ([mesh, i0/d, i1]) reads as its logical order.
        position = {id(i): d for d, i in enumerate(logical)}
        order = [i for i in logical_order(tv) if not i.is_reduction]
        return OutputLayout(tuple(position[id(i)] for i in order), tv.allocation_is_required)

    def empty(self, sizes: torch.Size | list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty_strided(sizes, dense_strides(sizes, self.perm), dtype=dtype, device=device)

    def conform(self, result: torch.Tensor, input_storages: set[int]) -> torch.Tensor:
        """``result`` itself when it already has this layout and owns its memory, else a copy.

        A required layout is met stride for stride: strides of size-1 axes, which address
        nothing, are rewritten in a view rather than left as the producing op chose them.
        """
        want = dense_strides(result.shape, self.perm)
        same = all(s == w or n <= 1 for s, w, n in zip(result.stride(), want, result.shape, strict=True))
        aliases_input = result.untyped_storage().data_ptr() in input_storages and result.numel() > 0
        if same and not aliases_input:
            if self.required and list(result.stride()) != want:
                return result.as_strided(result.shape, want, result.storage_offset())
            return result
        out = self.empty(result.shape, result.dtype, result.device)
        out.copy_(result)
        return out


def allocation_perm(fusion: Fusion, tv: TensorView) -> tuple[int, ...]:
    """Allocation order (logical dims, outermost first) of a buffer the host allocates for ``tv``:
    a required output stride order, else its allocation domain, else row-major."""
    return OutputLayout.of(fusion, tv).perm
