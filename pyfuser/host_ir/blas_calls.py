"""A recorded GEMM as the one BLAS call torch makes for it (Inductor's ``extern_kernels.mm``).

``torch.matmul`` and ``F.linear`` are composite: each call folds its operands' batch axes (a
``reshape``), transposes the weight (``t``), calls ``mm`` / ``addmm`` / ``bmm`` and views the result
back (``_unsafe_view``), a dispatcher round trip per step, every step a few microseconds of host
time on a GPU. Under a binding the operands' geometry is the recorded one, so where torch's own rules
fold those operands into one BLAS call without a copy, a straight-line function can make that call
directly on reinterpreted operands: the same BLAS call on the same memory, so the same result, with
one dispatch. Everything else (a fold that copies, broadcast batch axes, vectors, a bias torch adds
after the product) keeps the composite call.

The rules mirror ATen's ``linear`` (``_flatten_nd_linear``, ``addmm`` for a 2-D input with a bias)
and ``_matmul_impl`` (``should_fold``; ``bmm`` of batch axes that ``reshape`` merges as a view).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

import torch
import torch.nn.functional as F

from pyfuser.host_ir.specialization import Seen

#: sizes and strides of a tensor argument, or None: the operand as it is
Geometry = tuple[tuple[int, ...], tuple[int, ...]] | None


@dataclass(frozen=True)
class BlasCall:
    """``function(*operands)``, each operand an argument of the composite call reinterpreted (``views``:
    its sizes and strides, None as it is), the result reinterpreted to the composite call's result
    (``result``: None where it is the BLAS result as it is)."""

    function: Callable[..., torch.Tensor]
    #: position of each BLAS operand among the composite call's arguments
    operands: tuple[int, ...]
    views: tuple[Geometry, ...]
    result: Geometry


def contiguous_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    """The strides of a new contiguous tensor of ``sizes`` (torch's, size-1 axes included)."""
    strides, step = [], 1
    for size in reversed(sizes):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _is_contiguous(seen: Seen) -> bool:
    """torch's ``is_contiguous``: size-1 axes may have any stride."""
    expected = 1
    for size, stride in zip(reversed(seen.sizes), reversed(seen.strides), strict=True):
        if size != 1:
            if stride != expected:
                return False
            expected *= size
    return True


def _folds(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether ``reshape`` merges these axes into one as a view (ATen's ``should_fold`` test: each
    stride the next axis's extent times its stride)."""
    return all(strides[i] == strides[i + 1] * sizes[i + 1] for i in range(len(sizes) - 1))


def _viewed(seen: Seen, sizes: tuple[int, ...]) -> Geometry:
    """``seen`` viewed as ``sizes`` with the strides torch's ``view`` gives it (the caller checked it is a
    view). Size-1 axes matter: BLAS reads a matrix's leading dimension from them, and a different one can
    pick another kernel, whose sums round differently (``[2, 1]`` with strides ``(1, 2)`` or ``(1, 1)``)."""
    return sizes, tuple(torch.empty_strided(seen.sizes, seen.strides, device="meta").view(sizes).stride())


def _merged(seen: Seen, keep: int) -> Geometry:
    """``seen`` with every axis before its last ``keep`` merged into one (a view: the caller checked
    they fold), or None where nothing merges."""
    lead = len(seen.sizes) - keep
    if lead == 1:
        return None
    return _viewed(seen, (prod(seen.sizes[:lead]), *seen.sizes[lead:]))


def _result(result: Seen, sizes: tuple[int, ...]) -> tuple[bool, Geometry]:
    """Whether the composite call's recorded result is a view of a new contiguous BLAS result of
    ``sizes`` (what ``_unsafe_view`` makes of it), and that view (None: the BLAS result as it is)."""
    if result.offset != 0 or result.strides != contiguous_strides(result.sizes) or prod(result.sizes) != prod(sizes):
        return False, None
    return True, None if result.sizes == sizes else (result.sizes, result.strides)


def _matmul(operands: Sequence[Seen | None], result: Seen) -> BlasCall | None:
    a, b = operands[0], operands[1]
    if a is None or b is None or len(a.sizes) < 2 or len(b.sizes) < 2:
        return None
    if len(b.sizes) == 2 and (len(a.sizes) == 2 or _folds(a.sizes[:-1], a.strides[:-1])):  # mm, a's batch axes folded
        rows = prod(a.sizes[:-1])
        viewed, view = _result(result, (rows, b.sizes[1]))
        return BlasCall(torch.mm, (0, 1), (_merged(a, 1), None), view) if viewed else None
    batch = a.sizes[:-2]
    if len(a.sizes) != len(b.sizes) or b.sizes[:-2] != batch or prod(batch) == 0:
        return None  # broadcast batch axes: torch expands and copies
    if not (_folds(batch, a.strides[:-2]) and _folds(batch, b.strides[:-2])):
        return None  # the batch reshape would copy
    viewed, view = _result(result, (prod(batch), a.sizes[-2], b.sizes[-1]))
    # ATen reshapes both operands to 3-D even where they are 3-D already: strides as ``view`` gives them
    operand_views = tuple(_viewed(t, (prod(batch), *t.sizes[-2:])) for t in (a, b))
    return BlasCall(torch.bmm, (0, 1), operand_views, view) if viewed else None


def _linear(operands: Sequence[Seen | None], result: Seen) -> BlasCall | None:
    x, w = operands[0], operands[1]
    bias = operands[2] if len(operands) > 2 else None
    if x is None or w is None or len(w.sizes) != 2 or len(x.sizes) < 2:
        return None
    weight_t = ((w.sizes[1], w.sizes[0]), (w.strides[1], w.strides[0]))
    rows = prod(x.sizes[:-1])
    viewed, view = _result(result, (rows, w.sizes[0]))
    if not viewed:
        return None
    if len(operands) > 2:  # ATen's addmm: a 2-D input, or a contiguous one with a vector bias
        if bias is None or len(bias.sizes) != 1 or not (len(x.sizes) == 2 or _is_contiguous(x)):
            return None  # torch adds the bias after the product
        flat = None if len(x.sizes) == 2 else _viewed(x, (rows, x.sizes[-1]))
        return BlasCall(torch.addmm, (2, 0, 1), (None, flat, weight_t), view)
    if len(x.sizes) > 2 and not _folds(x.sizes[:-1], x.strides[:-1]):
        return None
    return BlasCall(torch.mm, (0, 1), (_merged(x, 1), weight_t), view)


#: the composite GEMMs a straight-line function may call as one BLAS call, by their torch function
_RULES: dict[Any, Callable[[Sequence[Seen | None], Seen], BlasCall | None]] = {
    torch.matmul: _matmul,
    F.linear: _linear,
}


def blas_call(function: Callable[..., Any], operands: Sequence[Seen | None], result: Seen | None) -> BlasCall | None:
    """The one BLAS call ``function(*operands)`` makes, given the recorded geometry of its operands and
    its result; None where it makes more (or where ``function`` is not a GEMM)."""
    rule = _RULES.get(function)
    if rule is None or result is None or result.numel == 0 or any(s is not None and s.numel == 0 for s in operands):
        return None
    return rule(operands, result)
