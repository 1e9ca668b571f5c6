"""nvFuser's ``compute_tensor_descriptor``: the contiguity and stride order ``define_tensor`` takes for
a tensor of given sizes and strides, ordered exactly as nvFuser orders them."""

from __future__ import annotations

from collections.abc import Sequence


def compute_tensor_descriptor(sizes: Sequence[int], strides: Sequence[int]) -> tuple[list[bool | None], list[int]]:
    """``(contiguity, stride_order)``: contiguity in allocation order (None for size-1 and stride-0
    axes), ``stride_order[d]`` axis d's place counted from the innermost.

    Axes with a stride are ordered by decreasing stride (ties keep their logical order); a stride-0
    axis keeps its logical position among them, as nvFuser places it. pyfuser's own layouts
    (``from_pytorch``) order ties by torch's memory format instead: both describe the same memory.
    """
    sizes, strides = list(sizes), list(strides)
    if len(sizes) != len(strides):
        raise ValueError(f"compute_tensor_descriptor: {len(sizes)} sizes {sizes} but {len(strides)} strides {strides}")
    negative = next((d for d, s in enumerate(strides) if s < 0), None)
    if negative is not None:
        raise ValueError(f"compute_tensor_descriptor: negative strides are not supported: strides[{negative}]="
                         f"{strides[negative]}")
    order = sorted((d for d in range(len(sizes)) if strides[d] != 0), key=lambda d: -strides[d])
    for d in range(len(sizes)):
        if strides[d] == 0:
            order.insert(d, d)
    rank = len(order)
    footprint = [strides[d] != 0 and sizes[d] != 1 for d in order]
    contiguity: list[bool | None] = []
    for place, d in enumerate(order):
        if not footprint[place]:
            contiguity.append(None)
            continue
        inner = next((order[q] for q in range(place + 1, rank) if footprint[q]), None)
        expected = 1 if inner is None else strides[inner] * sizes[inner]
        contiguity.append(strides[d] == expected)
    stride_order = [0] * rank
    for place, d in enumerate(order):
        stride_order[d] = rank - 1 - place
    return contiguity, stride_order
