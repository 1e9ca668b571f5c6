"""Reduction and normalization kernels that compute reshapes of kept axes: a ``[B * S, V]`` and the ``[B, S,
V]`` it is reshaped into (or from) iterate one space, ``B * S`` being ``merge(B, S)`` (``ir/analysis/
reshape.py``), so pointwise producers and consumers on either side of the reshape join the reduction's
kernel. A reshape that splits or merges a reduced axis ends the kernel. Through generated kernels (Triton's
interpreter on CPU, natively on a GPU) against torch: float32 and bfloat16, odd and 1-sized axes, permuted and broadcast
operands, rows on chip, looped and split across programs, inner and outer reductions."""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from pyfuser import DataType, FusionDefinition
from pyfuser.integrations.torch_compile import PyfuserBackend
from pyfuser.scheduler.reduction_analysis import analyze
from pyfuser.scheduler.registry import Machine
from tests.codegen.conftest import execute_with_kernels, kernel_schedulers
from tests.codegen.test_reshape_kernels import aten_calls

DTYPES = [torch.float32, torch.bfloat16]


def _tensor(fd: FusionDefinition, t: torch.Tensor):
    return fd.from_pytorch(t, static_sizes=True)


def _close(out: torch.Tensor, want: torch.Tensor) -> None:
    if want.dtype == torch.bfloat16:
        torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
    else:
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("vocab", [40, 1, 3000], ids=["tile", "one", "looped"])
def test_softmax_gradient_reshaped_and_added_is_one_kernel(dtype: torch.dtype, vocab: int, device: str) -> None:
    """A loss's softmax over ``[B * S, V]`` reshaped to ``[B, S, V]``, the logits' own gradient added and a
    soft-capping's tanh backward applied (Gemma2's backward): one kernel, no ATen reshape."""
    b, s = 2, 3
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(b * s, vocab, generator=g).to(dtype)
    grad = torch.randn(b, s, vocab, generator=g).to(dtype)
    capped = torch.randn(b, s, vocab, generator=g).tanh().to(dtype)
    logits, grad, capped = (t.to(device) for t in (logits, grad, capped))
    with FusionDefinition() as fd:
        x, dy, t = _tensor(fd, logits), _tensor(fd, grad), _tensor(fd, capped)
        xf = fd.ops.cast(x, DataType.Float)
        shifted = fd.ops.exp(fd.ops.sub(xf, fd.ops.max(xf, [1], True)))
        probs = fd.ops.div(shifted, fd.ops.sum(shifted, [1], True))
        total = fd.ops.add(fd.ops.cast(dy, DataType.Float), fd.ops.reshape(probs, [b, s, vocab]))
        tf = fd.ops.cast(t, DataType.Float)
        out = fd.ops.mul(total, fd.ops.sub(1.0, fd.ops.mul(tf, tf)))
        fd.add_output(fd.ops.cast(out, DataType.BFloat16 if dtype == torch.bfloat16 else DataType.Float))
    (out,) = execute_with_kernels(fd, [logits, grad, capped])
    probs = torch.softmax(logits.float(), 1).view(b, s, vocab)
    _close(out, ((grad.float() + probs) * (1 - capped.float() ** 2)).to(dtype))
    assert len(kernel_schedulers(fd)) == 1 and aten_calls(fd) == []


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_softcapped_logits_saved_and_their_log_sum_exp_is_one_kernel(dtype: torch.dtype, device: str) -> None:
    """Gemma2's forward: the soft-capped logits ``[B, S, V]`` are an output (saved for the backward) and
    their float32 ``view(-1, V)`` is reduced: one kernel writes both, reading the logits once."""
    b, s, v = 2, 5, 37
    x = torch.randn(b, s, v, generator=torch.Generator().manual_seed(3)).to(dtype).to(device)
    with FusionDefinition() as fd:
        a = _tensor(fd, x)
        capped = fd.ops.mul(fd.ops.tanh(fd.ops.div(a, 3.0)), 3.0)
        fd.add_output(capped)
        flat = fd.ops.reshape(fd.ops.cast(capped, DataType.Float), [b * s, v])
        lse = fd.ops.log(fd.ops.sum(fd.ops.exp(fd.ops.sub(flat, fd.ops.max(flat, [1], True))), [1]))
        fd.add_output(fd.ops.add(lse, fd.ops.squeeze(fd.ops.max(flat, [1], True), [1])))
    capped, lse = execute_with_kernels(fd, [x])
    want = torch.tanh(x / 3.0) * 3.0
    _close(capped, want)
    torch.testing.assert_close(lse, torch.logsumexp(want.float().view(b * s, v), 1), atol=1e-4, rtol=1e-4)
    assert kernel_schedulers(fd) == ["inner_persistent"] and aten_calls(fd) == []


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_attention_scores_reshaped_into_a_masked_softmax_and_back_is_one_kernel(dtype: torch.dtype,
                                                                                 device: str) -> None:
    """DeBERTa's and Gemma2's attention: scores computed over ``[B * H, S, S]`` (here read transposed),
    viewed ``[B, H, S, S]``, soft-capped, a mask broadcast over the heads added, softmax, and viewed back
    ``[B * H, S, S]`` for the next batched matmul: one kernel."""
    b, h, s = 2, 3, 9
    g = torch.Generator().manual_seed(5)
    scores = torch.randn(b * h, s, s, generator=g).to(dtype).transpose(1, 2)
    mask = torch.randn(b, 1, s, s, generator=g).to(dtype)
    scores, mask = scores.to(device), mask.to(device)
    with FusionDefinition() as fd:
        x, m = _tensor(fd, scores), _tensor(fd, mask)
        y = fd.ops.reshape(fd.ops.mul(x, 0.5), [b, h, s, s])
        y = fd.ops.add(fd.ops.mul(fd.ops.tanh(fd.ops.div(y, 5.0)), 5.0), m)
        shifted = fd.ops.exp(fd.ops.sub(y, fd.ops.max(y, [3], True)))
        fd.add_output(fd.ops.reshape(fd.ops.div(shifted, fd.ops.sum(shifted, [3], True)), [b * h, s, s]))
    (out,) = execute_with_kernels(fd, [scores, mask])
    y = (torch.tanh((scores * 0.5).view(b, h, s, s) / 5.0) * 5.0 + mask).float()
    _close(out, torch.softmax(y, -1).to(dtype).view(b * h, s, s))
    assert kernel_schedulers(fd) == ["inner_persistent"] and aten_calls(fd) == []


def test_relative_positions_of_two_equal_axes_keep_the_softmax_one_kernel(device: str) -> None:
    """DeBERTa's scores add a relative-position term ``p[:, None] - p[None, :]``, whose two axes are one
    iteration: mapped through the reshape, each would join the softmax's two axes (one kept, one reduced).
    The reshape maps the first only; the scores are read at computed indices and the softmax stays one
    kernel writing each row once."""
    b, h, s = 2, 4, 8
    g = torch.Generator().manual_seed(12)
    x, p = torch.randn(b * h, s, s, generator=g).to(device), torch.randn(s, generator=g).to(device)
    with FusionDefinition() as fd:
        a, pp = _tensor(fd, x), _tensor(fd, p)
        rel = fd.ops.sub(fd.ops.broadcast(pp, [False, True]), fd.ops.broadcast(pp, [True, False]))
        y = fd.ops.reshape(fd.ops.add(a, fd.ops.broadcast(rel, [True, False, False])), [b, h, s, s])
        shifted = fd.ops.exp(fd.ops.sub(y, fd.ops.max(y, [3], True)))
        fd.add_output(fd.ops.reshape(fd.ops.div(shifted, fd.ops.sum(shifted, [3], True)), [b * h, s, s]))
    (out,) = execute_with_kernels(fd, [x, p])
    want = torch.softmax((x + (p[:, None] - p[None, :])).view(b, h, s, s), -1).view(b * h, s, s)
    torch.testing.assert_close(out, want)
    assert kernel_schedulers(fd) == ["inner_persistent"] and aten_calls(fd) == []
    # the row is on chip: no loop of a second pass to store it
    assert not re.search(r"^\s+for i\d+ in", fd.last_kernel_code(), re.MULTILINE)


def test_outer_reduction_of_regrouped_kept_axes_is_one_kernel(device: str) -> None:
    """A column sum over ``[R, B * S]`` of a ``[R, B, S]`` product, its result viewed ``[B, S]`` and scaled
    by a ``[B, S]`` input: the reduction kernel (outer in memory) computes both reshapes."""
    r, b, s = 33, 3, 5
    g = torch.Generator().manual_seed(6)
    x, w, y = torch.randn(r, b, s, generator=g), torch.randn(r, b, s, generator=g), torch.randn(b, s, generator=g)
    x, w, y = x.to(device), w.to(device), y.to(device)
    with FusionDefinition() as fd:
        a, c, d = _tensor(fd, x), _tensor(fd, w), _tensor(fd, y)
        total = fd.ops.sum(fd.ops.reshape(fd.ops.mul(a, c), [r, b * s]), [0])
        fd.add_output(fd.ops.mul(fd.ops.reshape(total, [b, s]), d))
    (out,) = execute_with_kernels(fd, [x, w, y])
    torch.testing.assert_close(out, (x * w).sum(0) * y, atol=1e-5, rtol=1e-5)
    assert kernel_schedulers(fd) == ["reduction"] and aten_calls(fd) == []


@pytest.mark.parametrize("machine", [None, Machine(132, 16384, 2048)], ids=["interpreter", "h100"])
@pytest.mark.parametrize("rows", [8, 300], ids=["tile", "looped"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_kept_axes_permuted_apart_then_regrouped(dtype: torch.dtype, rows: int, machine: Machine | None,
                                                 monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """DeBERTa-v2's attention bias gradient: a ``[R, H, S, D]`` gradient summed over ``R``, permuted
    ``[S, H, D]`` and viewed ``[S, H * D]`` (returned), then summed over ``S``. The view merges ``H`` and
    ``D``, which ``S`` separates in the reduction's kept axes: the loop nest iterates ``merge(merge(H, D),
    S)``, and the view's operand, read at the view's indices, must be indexed as that nest indexes the
    reduction (``H`` is ``i // (D * S)``, not ``(i // S) // D``) for the reduction's result to be found.
    With the interpreter's tiles and an H100's (``machine``; there 300 rows are split across programs)."""
    if machine is not None:
        monkeypatch.setattr(Machine, "of", staticmethod(lambda _device: machine))
    h, s, d = 4, 16, 8
    x = torch.randn(rows, h, s, d, generator=torch.Generator().manual_seed(rows)).to(dtype).to(device)
    with FusionDefinition() as fd:
        a = _tensor(fd, x)
        summed = fd.ops.sum(a, [0], dtype=DataType.BFloat16 if dtype == torch.bfloat16 else DataType.Float)
        grad = fd.ops.reshape(fd.ops.permute(summed, [1, 0, 2]), [s, h * d])
        fd.add_output(grad)
        fd.add_output(fd.ops.sum(grad, [0]))
    grad, bias = execute_with_kernels(fd, [x])
    want = x.float().sum(0).to(dtype).permute(1, 0, 2).reshape(s, h * d)
    _close(grad, want)
    _close(bias, want.float().sum(0).to(dtype))
    assert "reduction" in kernel_schedulers(fd) and aten_calls(fd) == []


@pytest.mark.parametrize("cut", [1, 2, 3])
@pytest.mark.parametrize("perm", list(itertools.permutations(range(4))), ids=lambda p: "".join(map(str, p)))
def test_kept_axes_in_any_order_viewed_two_dimensional(perm: tuple[int, ...], cut: int,
                                                        monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """A sum over ``R`` of ``[R, A, B, C, D]``, its kept axes permuted and viewed as two axes (the first
    ``cut`` permuted ones merged, and the rest), returned and summed again: whichever groups the view
    makes and however the loop nest orders them, the view's operand is read where the reduction
    computed it (an H100's tiles)."""
    monkeypatch.setattr(Machine, "of", staticmethod(lambda _device: Machine(132, 16384, 2048)))
    sizes = [(2, 3, 2, 5)[p] for p in perm]
    shape = [math.prod(sizes[:cut]), math.prod(sizes[cut:])]
    x = torch.randn(8, 2, 3, 2, 5, generator=torch.Generator().manual_seed(cut)).to(device)
    with FusionDefinition() as fd:
        viewed = fd.ops.reshape(fd.ops.permute(fd.ops.sum(_tensor(fd, x), [0]), list(perm)), shape)
        fd.add_output(viewed)
        fd.add_output(fd.ops.sum(viewed, [0]))
    viewed, total = execute_with_kernels(fd, [x])
    want = x.sum(0).permute(*perm).reshape(shape)
    torch.testing.assert_close(viewed, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(total, want.sum(0), atol=1e-5, rtol=1e-5)


def test_a_split_row_reduction_reshaped_after(device: str) -> None:
    """Few long rows (split across programs, a grid reduction whose last launch computes what follows):
    the sum of each ``[B * S]`` row viewed ``[B, S]`` and scaled."""
    b, s, v = 1, 2, 20000
    g = torch.Generator().manual_seed(8)
    x, y = torch.randn(b * s, v, generator=g).to(device), torch.randn(b, s, generator=g).to(device)
    with FusionDefinition() as fd:
        a, d = _tensor(fd, x), _tensor(fd, y)
        fd.add_output(fd.ops.mul(fd.ops.reshape(fd.ops.sum(fd.ops.mul(a, a), [1]), [b, s]), d))
    (out,) = execute_with_kernels(fd, [x, y])
    torch.testing.assert_close(out, (x * x).sum(1).view(b, s) * y, atol=1e-3, rtol=1e-4)
    assert set(kernel_schedulers(fd)) == {"reduction"} and aten_calls(fd) == []


def test_a_reshape_of_the_reduced_axes_ends_the_kernel() -> None:
    """``[B, S, V]`` viewed ``[B, S * V]`` and normalized over the merged axis: the reduction kernel does
    not compute that reshape (it regroups a reduced axis); the pointwise producer is a kernel of its own."""
    b, s, v = 2, 3, 5
    x = torch.randn(b, s, v, generator=torch.Generator().manual_seed(9))
    with FusionDefinition() as fd:
        a = _tensor(fd, x)
        y = fd.ops.reshape(fd.ops.mul(a, 2.0), [b, s * v])
        shifted = fd.ops.exp(fd.ops.sub(y, fd.ops.max(y, [1], True)))
        fd.add_output(fd.ops.div(shifted, fd.ops.sum(shifted, [1], True)))
    (out,) = execute_with_kernels(fd, [x])
    torch.testing.assert_close(out, torch.softmax((x * 2).view(b, s * v), 1))
    assert sorted(kernel_schedulers(fd)) == ["inner_persistent", "pointwise"]
    analysis, reason = analyze(fd.fusion)
    assert analysis is None and "splits or merges a reduced axis" in reason


def test_a_reshaped_input_returned_stays_an_aten_view() -> None:
    """A reshape of a tensor already in global memory (here an input) that the segment returns is an ATen
    view of it, never a copy the reduction kernel beside it writes."""
    x = torch.randn(2, 3, 40, generator=torch.Generator().manual_seed(10))
    with FusionDefinition() as fd:
        a = _tensor(fd, x)
        fd.add_output(fd.ops.sum(a, [2]))
        fd.add_output(fd.ops.reshape(a, [6, 40]))
    total, flat = execute_with_kernels(fd, [x])
    torch.testing.assert_close(total, x.sum(2))
    torch.testing.assert_close(flat, x.view(6, 40))
    assert kernel_schedulers(fd) == ["reduction"] and aten_calls(fd) == ["Reshape"]


def _factorizations(n: int) -> list[list[int]]:
    """``n`` as ordered products of two or three factors (1s included)."""
    found = [[a, n // a] for a in range(1, n + 1) if n % a == 0]
    found += [[a, b, n // (a * b)] for a in range(1, n + 1) for b in range(1, n + 1) if n % (a * b) == 0]
    return found


@settings(max_examples=30, deadline=None)
@given(kept=st.lists(st.sampled_from([1, 2, 3, 5, 6]), min_size=1, max_size=3),
       reduced=st.sampled_from([9, 17, 64, 300]), which=st.integers(0, 2), split=st.integers(0, 1000),
       before=st.booleans(), normalize=st.booleans(), bf16=st.booleans(), permuted=st.booleans(),
       outer=st.booleans())
def test_regrouped_kept_axes_match_torch(kept: list[int], reduced: int, which: int, split: int, before: bool,
                                         normalize: bool, bf16: bool, permuted: bool, outer: bool) -> None:
    """Any rank: one kept axis (``which``) split into factors (or, read the other way, the factors merged),
    the reshape before the reduction (on the producer's input) or after it (on its consumer's side), and
    back; a plain reduction (a sum, its result scaled) or a normalization (a softmax) of the innermost axis
    or (``outer``) the outermost; an input read permuted: one kernel, torch's values."""
    which %= len(kept)
    dtype = torch.bfloat16 if bf16 else torch.float32
    pieces = _factorizations(kept[which])
    pieces = pieces[split % len(pieces)]

    def with_reduced(axes: list[int], extent: int) -> list[int]:
        return [extent, *axes] if outer else [*axes, extent]

    wide = with_reduced(kept, reduced)  # the axis ``which`` whole
    fine = with_reduced([*kept[:which], *pieces, *kept[which + 1:]], reduced)  # split into ``pieces``
    first, second = (wide, fine) if before else (fine, wide)
    result_shape = with_reduced(kept if before else [*kept[:which], *pieces, *kept[which + 1:]],
                                reduced if normalize else 1)
    g = torch.Generator().manual_seed(sum(fine) + which)
    x = torch.randn(*reversed(first), generator=g).to(dtype).permute(*reversed(range(len(first)))) if permuted \
        else torch.randn(*first, generator=g).to(dtype)
    axis = 0 if outer else len(second) - 1
    with FusionDefinition() as fd:
        a = _tensor(fd, x)
        y = fd.ops.reshape(fd.ops.mul(a, 0.5), second)
        if normalize:
            shifted = fd.ops.exp(fd.ops.sub(y, fd.ops.max(y, [axis], True)))
            result = fd.ops.div(shifted, fd.ops.sum(shifted, [axis], True))
        else:
            result = fd.ops.mul(fd.ops.sum(y, [axis], True), 2.0)
        fd.add_output(fd.ops.reshape(result, result_shape))
    (out,) = execute_with_kernels(fd, [x])
    y = (x * 0.5).reshape(second).float()
    want = torch.softmax(y, axis) if normalize else y.sum(axis, keepdim=True) * 2
    _close(out, want.to(dtype).reshape(result_shape))
    assert len(kernel_schedulers(fd)) == 1 and aten_calls(fd) == []


@pytest.fixture
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


@pytest.mark.usefixtures("_fresh_dynamo")
@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_softcapped_lm_loss_is_one_kernel_per_direction(dtype: torch.dtype) -> None:
    """Gemma2's final logit soft-capping, then ``logits.float().view(-1, V)`` into cross-entropy, compiled:
    the forward's soft-cap and the loss's statistics are one kernel, and so are the backward's softmax
    gradient and the tanh backward over ``[B, S, V]``."""
    b, s, v, cap = 2, 4, 37, 30.0
    g = torch.Generator().manual_seed(11)
    hidden = torch.randn(b, s, v, generator=g).to(dtype) * 20
    labels = torch.randint(0, v, (b, s), generator=g)

    def loss_of(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = torch.tanh(h / cap) * cap
        return F.cross_entropy(logits.float().view(-1, v), t.view(-1))

    backend = PyfuserBackend(triton_interpreter=True)
    compiled = torch.compile(loss_of, backend=backend)
    results = []
    for run in (compiled, compiled, loss_of):
        h = hidden.detach().clone().requires_grad_()
        loss = run(h, labels)
        loss.backward()
        results.append((loss.detach(), h.grad))
    (got, got_grad), (want, want_grad) = results[1], results[2]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    _close(got_grad, want_grad)
    for kind in ("forward", "backward"):
        graph = next(gr for gr in backend.graphs if gr.kind == kind)
        # the kernels reading the logits-sized values: the soft-cap's tanh is computed in the loss's
        # normalization kernel, not in a pointwise kernel of its own before (forward) or after (backward)
        wide = [line for r in graph.regions for line in r.summary().splitlines()
                if " kernel " in line and "tanh" in line]
        assert len(wide) == 1 and "kernel inner_persistent" in wide[0], "\n".join(r.summary() for r in graph.regions)
    assert math.isfinite(got.item())
