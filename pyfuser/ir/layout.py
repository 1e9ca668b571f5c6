"""Stride orders, allocation permutations and contiguity of concrete strides, and ``Layout``: what
a generated kernel may assume of a tensor's memory."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyfuser.ir.tensor_domain import Contiguity


@dataclass(frozen=True, slots=True)
class Layout:
    """A tensor's memory layout as a kernel reads or writes it: ``perm``, its non-reduction logical
    dims in allocation order (outermost first), and nvFuser ``contiguity`` in that order (``None``: a
    broadcast dim; ``False``: its stride is read at run time). It holds for every tensor the kernel
    will be given."""

    perm: tuple[int, ...]
    contiguity: tuple[bool | None, ...]

    @staticmethod
    def of(perm: Sequence[int], contiguity: Sequence[bool | None]) -> Layout:
        return Layout(tuple(perm), tuple(contiguity))

    @staticmethod
    def strided(rank: int) -> Layout:
        """Nothing known: logical order, every stride read at run time."""
        return Layout(tuple(range(rank)), (False,) * rank)

    @staticmethod
    def dense(perm: Sequence[int], broadcast: Sequence[bool]) -> Layout:
        """Dense in ``perm`` order; ``broadcast[d]``: logical dim ``d`` is a broadcast."""
        return Layout(tuple(perm), tuple(None if broadcast[d] else True for d in perm))


def check_stride_order(stride_order: Sequence[int], rank: int, what: str) -> list[int]:
    """Validate ``stride_order`` (dim i's place counted from the innermost dim = 0)."""
    if isinstance(stride_order, (str, bytes)) or not isinstance(stride_order, Sequence):
        raise TypeError(f"{what}: stride_order must be a list of ints, got {stride_order!r}")
    order = list(stride_order)
    if not all(isinstance(o, int) and not isinstance(o, bool) for o in order):
        raise TypeError(f"{what}: stride_order must be a list of ints, got {stride_order!r}")
    if len(order) != rank:
        raise ValueError(f"{what}: stride_order {order} has {len(order)} entries but the tensor has rank {rank}")
    if sorted(order) != list(range(rank)):
        raise ValueError(f"{what}: stride_order {order} is not a permutation of 0..{rank - 1}")
    return order


def allocation_permutation(stride_order: Sequence[int]) -> list[int]:
    """Logical dims listed outermost first (the allocation order) for a stride order."""
    return sorted(range(len(stride_order)), key=lambda d: -stride_order[d])


def stride_order_of_permutation(perm: Sequence[int]) -> list[int]:
    rank = len(perm)
    order = [0] * rank
    for place, dim in enumerate(perm):
        order[dim] = rank - 1 - place
    return order


def dense_strides(sizes: Sequence[int], perm: Sequence[int]) -> list[int]:
    """Strides of a dense tensor of ``sizes`` laid out in allocation order ``perm``."""
    strides = [0] * len(sizes)
    stride = 1
    for dim in reversed(perm):
        strides[dim] = stride
        stride *= max(sizes[dim], 1)
    return strides


def contiguity_of_strides(sizes: Sequence[int], strides: Sequence[int], perm: Sequence[int],
                          broadcast: Sequence[bool]) -> Contiguity:
    """nvFuser contiguity, in allocation order: dim is contiguous when its stride is the next
    non-broadcast dim's stride times that dim's size (the innermost: stride 1). As in torch, a
    size-1 dim is contiguous whatever its stride, and every dim of an empty tensor is."""
    empty = 0 in sizes
    result: Contiguity = []
    expected_next = 1
    for dim in reversed(perm):
        if broadcast[dim]:
            result.append(None)
            continue
        result.append(empty or strides[dim] == expected_next or sizes[dim] == 1)
        if sizes[dim] != 1:
            expected_next = strides[dim] * sizes[dim]
    return list(reversed(result))


def check_strides(name: str, sizes: Sequence[int], strides: Sequence[int], perm: Sequence[int],
                  contiguity: Contiguity, broadcast: Sequence[bool], stride_order_declared: bool) -> None:
    """Raise ValueError naming the tensor and axis when strides violate the declared layout.

    Torch's rule: strides of size-1 axes address nothing, and an empty tensor addresses nothing
    at all, so neither constrains the layout (``torch.zeros(5, 0, 1) / 4`` has strides
    ``(0, 1, 0)`` and is contiguous). An expanded axis (stride 0) has no place in a stride order
    either (as in ``memory_order``); declared contiguous, it is still rejected.
    """
    if 0 in sizes:
        return
    if stride_order_declared:
        previous = None
        for dim in perm:
            if broadcast[dim] or sizes[dim] <= 1 or strides[dim] == 0:
                continue
            if previous is not None and strides[dim] > strides[previous]:
                raise ValueError(
                    f"{name} axis {dim}: stride {strides[dim]} is larger than axis {previous}'s stride "
                    f"{strides[previous]}, but the declared stride order puts axis {dim} inside axis {previous} "
                    f"(allocation order {list(perm)}); got strides {list(strides)}")
            previous = dim
    expected_next = 1
    for place in range(len(perm) - 1, -1, -1):
        dim = perm[place]
        if broadcast[dim]:
            continue
        if contiguity[place] and sizes[dim] > 1 and strides[dim] != expected_next:
            raise ValueError(
                f"{name} axis {dim}: declared contiguous, so its stride must be {expected_next}, but got stride "
                f"{strides[dim]} (sizes {list(sizes)}, strides {list(strides)})")
        if sizes[dim] > 1:
            expected_next = strides[dim] * sizes[dim]


def memory_order(sizes: Sequence[int], strides: Sequence[int]) -> list[int]:
    """Allocation order (outermost first) of a concrete tensor, ignoring axes without a memory footprint.

    Axes of size <= 1 or stride 0 (broadcast / expanded) say nothing about the layout: they keep
    their logical place relative to the other axes, so a plain tensor always gives ``0..n-1`` and
    ``[1, C, H, W]`` channels-last the same order as ``[N, C, H, W]`` channels-last. Neither does
    any axis of an empty tensor: it has the logical order.
    """
    empty = 0 in sizes
    trivial = [empty or n <= 1 or s == 0 for n, s in zip(sizes, strides, strict=True)]
    order = sorted((d for d in range(len(sizes)) if not trivial[d]), key=lambda d: (-strides[d], d))
    for d in (d for d in range(len(sizes)) if trivial[d]):
        at = next((k for k, e in enumerate(order) if e > d), len(order))
        order.insert(at, d)
    return order


def tensor_descriptor(sizes: Sequence[int], strides: Sequence[int]) -> tuple[Contiguity, list[int]]:
    """nvFuser's ``compute_tensor_descriptor``: contiguity in allocation order (None for size-1 and
    stride-0 expanded axes) and the stride order of a concrete tensor's sizes and strides."""
    perm = memory_order(sizes, strides)
    without_footprint = [n == 1 or (s == 0 and n > 1) for n, s in zip(sizes, strides, strict=True)]
    return contiguity_of_strides(sizes, strides, perm, without_footprint), stride_order_of_permutation(perm)


def is_dense(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether a concrete tensor fills its memory exactly, in its own memory order: each axis (size-1
    axes aside) strides over all the axes inside it (torch's non-overlapping-and-dense)."""
    expected = 1
    for d in reversed(memory_order(sizes, strides)):
        if sizes[d] <= 1:
            continue
        if strides[d] != expected:
            return False
        expected *= sizes[d]
    return True
