"""A recorded ``torch.matmul`` / ``F.linear`` as the one BLAS call torch makes for it
(``host_ir/blas_calls.py``): wherever the rule names a call, torch's own dispatch of the composite
call runs exactly that BLAS op and nothing else that computes, and the call on the reinterpreted operands gives the
same bits in the same geometry; where torch copies, broadcasts or adds a bias afterwards, the rule
keeps the composite call. Drawn over ranks 2-4, storage orders, sliced views and size-1 axes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from pyfuser.host_ir.blas_calls import BlasCall, blas_call, contiguous_strides
from pyfuser.host_ir.specialization import Seen

_BLAS = {torch.ops.aten.mm.default: torch.mm, torch.ops.aten.addmm.default: torch.addmm,
         torch.ops.aten.bmm.default: torch.bmm}


class _ComputeOps(TorchDispatchMode):
    """The ATen ops a call dispatches that are not views (what reaches a kernel)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Any] = []
        #: each op's tensor arguments as (sizes, strides)
        self.geometries: list[list[tuple[tuple[int, ...], tuple[int, ...]]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not func.is_view and func not in (torch.ops.aten._unsafe_view.default,):
            self.ops.append(func)
            self.geometries.append([(tuple(a.shape), a.stride()) for a in args if isinstance(a, torch.Tensor)])
        return func(*args, **(kwargs or {}))


def _strided(sizes: list[int], order: list[int], sliced: bool) -> torch.Tensor:
    """A tensor of ``sizes`` whose axes lie in memory in ``order`` (last fastest), optionally a view at
    an offset inside a larger buffer."""
    stored = [sizes[k] for k in order]
    base = torch.randn(*[s + (1 if sliced else 0) for s in stored])
    if sliced:
        base = base[tuple(slice(1, None) for _ in stored)]
    inverse = [order.index(k) for k in range(len(sizes))]
    return base.permute(*inverse)


def _check(function: Callable[..., torch.Tensor], args: list[torch.Tensor | None]) -> BlasCall | None:
    recorder = _ComputeOps()
    with recorder:
        expected = function(*args)
    call = blas_call(function, [Seen.of(a) for a in args], Seen.of(expected))
    if call is None:
        return None
    assert recorder.ops == [next(op for op, f in _BLAS.items() if f is call.function)], recorder.ops
    operands = []
    for position, view in zip(call.operands, call.views, strict=True):
        a = args[position]
        assert a is not None
        operands.append(a if view is None else torch.as_strided(a, view[0], view[1], a.storage_offset()))
    # the operands' strides as torch passes them, size-1 axes included: BLAS reads leading dimensions there
    assert [(tuple(o.shape), o.stride()) for o in operands] == recorder.geometries[0]
    got = call.function(*operands)
    if call.result is not None:
        got = torch.as_strided(got, call.result[0], call.result[1], 0)
    assert got.shape == expected.shape and got.stride() == expected.stride()
    assert torch.equal(got, expected)
    return call


_sizes = st.integers(1, 5)


@st.composite
def _tensor(draw: st.DrawFn, sizes: list[int]) -> torch.Tensor:
    order = draw(st.permutations(range(len(sizes))))
    return _strided(sizes, list(order), draw(st.booleans()))


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_matmul_becomes_the_blas_call_torch_makes(data: st.DataObject) -> None:
    rank_a = data.draw(st.integers(2, 4))
    rank_b = data.draw(st.sampled_from([2, rank_a]))
    batch = [data.draw(_sizes) for _ in range(rank_a - 2)]
    m, k, n = data.draw(_sizes), data.draw(_sizes), data.draw(_sizes)
    a = data.draw(_tensor([*batch, m, k]))
    b_batch = batch[len(batch) - (rank_b - 2):] if rank_b > 2 else []
    if b_batch and data.draw(st.booleans()):
        b_batch = [1, *b_batch[1:]]  # a broadcast batch axis: torch expands, so no single call
    b = data.draw(_tensor([*b_batch, k, n]))
    with torch.no_grad():
        _check(torch.matmul, [a, b])


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_linear_becomes_the_blas_call_torch_makes(data: st.DataObject) -> None:
    rank = data.draw(st.integers(2, 4))
    rows = [data.draw(_sizes) for _ in range(rank - 1)]
    k, n = data.draw(_sizes), data.draw(_sizes)
    x, w = data.draw(_tensor([*rows, k])), data.draw(_tensor([n, k]))
    bias = data.draw(st.sampled_from([None, "vector", "row"]))
    args: list[torch.Tensor | None] = [x, w]
    if bias is not None:
        args.append(torch.randn(n) if bias == "vector" else torch.randn(1, n))
    with torch.no_grad():
        _check(F.linear, args)


def test_the_gemms_of_a_transformer_layer_are_single_calls() -> None:
    """What real graphs make (activations contiguous, weights as parameters, heads split by a
    transposing view): each is the one call torch makes, and the ones torch folds with a copy or
    adds a bias to afterwards are left as they are."""
    x, w, bias = torch.randn(2, 6, 8), torch.randn(4, 8), torch.randn(4)
    heads = torch.randn(2, 6, 3, 4).transpose(1, 2)  # [batch, heads, seq, dim], a view
    with torch.no_grad():
        assert _check(F.linear, [x, w]).function is torch.mm  # type: ignore[union-attr]
        assert _check(F.linear, [x, w, bias]).function is torch.addmm  # type: ignore[union-attr]
        assert _check(torch.matmul, [x, w.t()]).function is torch.mm  # type: ignore[union-attr]
        scores = _check(torch.matmul, [torch.randn(2, 3, 6, 4), torch.randn(2, 3, 4, 6)])
        assert scores is not None and scores.function is torch.bmm
        assert _check(torch.matmul, [x.transpose(0, 1), w.t()]) is None  # folding copies
        assert _check(torch.matmul, [heads, torch.randn(2, 3, 4, 6)]) is None  # the batch reshape copies
        assert _check(F.linear, [x.transpose(0, 1), w, bias]) is None  # bias added after the product
        assert _check(torch.matmul, [torch.randn(6), torch.randn(6, 4)]) is None  # a vector operand


@example(sizes=[0, 3])
@given(st.lists(st.integers(0, 4), min_size=1, max_size=4))
def test_contiguous_strides_are_torchs(sizes: list[int]) -> None:
    assert contiguous_strides(sizes) == torch.empty(sizes).stride()
