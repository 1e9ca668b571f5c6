"""Giving fusion outputs the layout their allocation domain asks for."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from pyfuser.ir.analysis.allocation_order import allocation_perm
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.layout import dense_strides
from pyfuser.ir.tensor_view import TensorView


@lru_cache(maxsize=4096)
def _dense_strides(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[int, ...]:
    """``dense_strides`` as a tuple, remembered: every call of a program conforms its outputs' shapes."""
    return tuple(dense_strides(list(shape), list(perm)))


@dataclass(frozen=True, slots=True)
class OutputLayout:
    """Allocation order of one output (outermost first) and whether a user required it.

    Not an ``ir.layout.Layout``: that is what a kernel may assume of every tensor it is given (a
    contiguity per dim, other strides read at run time); this is what the program hands back, always
    dense in ``perm``, and whether a stride-for-stride match is owed (a requirement) or only the
    order (a hint), with the allocation and conforming that follow from it."""

    perm: tuple[int, ...]
    required: bool

    @staticmethod
    def of(fusion: Fusion, tv: TensorView) -> OutputLayout:
        # A required or hinted allocation alike: a hint is the layout the executor produces unless
        # a later stage replaced it.
        required = fusion.get_output_stride_order(tv) is not None or tv.allocation_is_required
        return OutputLayout(allocation_perm(fusion, tv), required)

    def empty(self, sizes: torch.Size | list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty_strided(sizes, dense_strides(sizes, self.perm), dtype=dtype, device=device)

    def conform(self, result: torch.Tensor, input_storages: set[int] | None) -> torch.Tensor:
        """``result`` itself when it already has this layout and owns its memory, else a copy.
        ``input_storages``: storages ``result`` must not share (None: it cannot share any).

        A required layout is met stride for stride: strides of size-1 axes, which address
        nothing, are rewritten in a view rather than left as the producing op chose them.
        """
        shape = result.shape
        want = _dense_strides(shape, self.perm)
        strides = result.stride()
        same = strides == want or all(s == w or n <= 1 for s, w, n in zip(strides, want, shape, strict=True))
        # Empty tensors may all report address 0: copying one costs nothing, returning an input does.
        aliases_input = input_storages is not None and result.untyped_storage().data_ptr() in input_storages
        if same and not aliases_input:
            if self.required and strides != want:
                return result.as_strided(result.shape, want, result.storage_offset())
            return result
        return self.copy(result)

    def copy(self, result: torch.Tensor) -> torch.Tensor:
        """A copy of ``result`` in this layout, owning its memory."""
        out = self.empty(result.shape, result.dtype, result.device)
        out.copy_(result)
        return out
