"""welford, matmul of every rank combination, linear with a rank-3 weight, grouped_mm: against
torch, with Python definitions and bad input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition
from tests.ir.test_python_definition import rebuild


def run(build: Callable[..., Any], inputs: list[Any], device: str = "cpu") -> list[torch.Tensor]:
    """``build(fd, *inputs on device)`` defines the fusion (``from_pytorch`` of the device tensors)."""
    args = [x.to(device) for x in inputs]
    with FusionDefinition() as fd:
        build(fd, *args)
    outputs = fd.execute(args)
    for a, b in zip(outputs, rebuild(fd).execute(args), strict=True):
        torch.testing.assert_close(a, b)
    return [o.cpu() for o in outputs]


def test_welford(device: str) -> None:
    x = torch.randn(4, 6, 5).permute(2, 0, 1)  # non-contiguous [5, 4, 6]

    def build(fd: FusionDefinition, x: torch.Tensor) -> None:
        for t in fd.ops.welford(fd.from_pytorch(x), [0, 2]):
            fd.add_output(t)

    avg, var_sum, n = run(build, [x], device)
    torch.testing.assert_close(avg, x.mean((0, 2)))
    torch.testing.assert_close(var_sum, x.var((0, 2), correction=0) * 30)
    assert n.dtype == torch.int64 and n.tolist() == [30] * 4


@pytest.mark.parametrize(("shape_a", "shape_b"), [
    ((5,), (5,)), ((5,), (5, 3)), ((4, 5), (5,)), ((2, 4, 5), (5,)), ((5,), (2, 5, 3)),
    ((2, 1, 4, 5), (3, 5, 6)), ((4, 5), (2, 5, 6)), ((0, 5), (5, 2)),
])
def test_matmul_of_every_rank(shape_a: tuple[int, ...], shape_b: tuple[int, ...], device: str) -> None:
    a, b = torch.randn(shape_a), torch.randn(shape_b)
    (out,) = run(lambda fd, a, b: fd.add_output(fd.ops.matmul(fd.from_pytorch(a), fd.from_pytorch(b))), [a, b],
                 device)
    want = torch.matmul(a, b)
    assert out.shape == want.shape
    torch.testing.assert_close(out, want)


_ROWS = {  # x [*lead, 8] in layouts whose rows merge into one GEMM operand, and some whose rows do not
    "contiguous": lambda: torch.randn(2, 3, 8),
    "one_row": lambda: torch.randn(1, 1, 8),
    "offset_rows": lambda: torch.randn(4, 3, 2, 8)[:, :, 1],
    "strided_k": lambda: torch.randn(2, 3, 16)[..., ::2],
    "rank_4": lambda: torch.randn(2, 1, 3, 8),
    "empty_rows": lambda: torch.randn(0, 3, 8),
    "leading_transposed": lambda: torch.randn(3, 2, 8).transpose(0, 1),
    "expanded_rows": lambda: torch.randn(3, 8).expand(2, 3, 8),
    "matrix": lambda: torch.randn(5, 8).t().contiguous().t(),
}
_WEIGHTS = {"contiguous": lambda: torch.randn(4, 8), "column_major": lambda: torch.randn(8, 4).t(),
            "offset": lambda: torch.randn(6, 8)[2:]}


@pytest.mark.parametrize("weight", sorted(_WEIGHTS))
@pytest.mark.parametrize("rows", sorted(_ROWS))
def test_linear_and_matmul_on_row_and_weight_layouts(rows: str, weight: str, device: str) -> None:
    """linear and matmul with a 2-D weight on inputs whose rows merge into one GEMM operand and on
    inputs whose rows do not (ATen folds or copies them), weights of every layout: as torch."""
    x, w, bias = _ROWS[rows](), _WEIGHTS[weight](), torch.randn(4)

    def build(fd: FusionDefinition, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> None:
        tx, tw = fd.from_pytorch(x), fd.from_pytorch(w)
        fd.add_output(fd.ops.linear(tx, tw))
        fd.add_output(fd.ops.linear(tx, tw, fd.from_pytorch(bias)))
        fd.add_output(fd.ops.matmul(tx, fd.ops.permute(tw, [1, 0])))

    with torch.no_grad():  # as torch.compile's graphs run
        got = run(build, [x, w, bias], device)
    for out, want in zip(got, [F.linear(x, w), F.linear(x, w, bias), torch.matmul(x, w.t())], strict=True):
        assert out.shape == want.shape
        torch.testing.assert_close(out, want)


@pytest.mark.parametrize("bias_rank", [None, 1, 2])
def test_linear_with_a_rank_3_weight(bias_rank: int | None, device: str) -> None:
    x, w = torch.randn(2, 3, 8), torch.randn(4, 5, 8)  # weight [E, N, K]
    bias = None if bias_rank is None else torch.randn(5) if bias_rank == 1 else torch.randn(4, 5)

    def build(fd: FusionDefinition, x: torch.Tensor, w: torch.Tensor, *bias: torch.Tensor) -> None:
        tx, tw = fd.from_pytorch(x), fd.from_pytorch(w)
        fd.add_output(fd.ops.linear(tx, tw, fd.from_pytorch(bias[0]) if bias else None))

    (out,) = run(build, [x, w] + ([] if bias is None else [bias]), device)
    want = torch.stack([F.linear(x, w[e], None if bias is None else bias if bias_rank == 1 else bias[e])
                        for e in range(4)])
    assert out.shape == (4, 2, 3, 5)
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("case", ["k_groups", "n_groups", "m_groups"])
def test_grouped_mm(case: str, device: str) -> None:
    offsets = torch.tensor([2, 2, 7], dtype=torch.int32)  # an empty middle group
    if case == "k_groups":
        a, b = torch.randn(3, 8), torch.randn(8, 4)  # offsets over K (the last group stops short of 8)
        want = torch.stack([a[:, s:e] @ b[s:e] for s, e in ((0, 2), (2, 2), (2, 7))])
    elif case == "n_groups":
        a, b = torch.randn(3, 4, 5), torch.randn(5, 9)
        want = torch.zeros(4, 9)
        for g, (s, e) in enumerate(((0, 2), (2, 2), (2, 7))):
            want[:, s:e] = a[g] @ b[:, s:e]
    else:
        a, b = torch.randn(9, 5), torch.randn(3, 5, 4)
        want = torch.zeros(9, 4)
        for g, (s, e) in enumerate(((0, 2), (2, 2), (2, 7))):
            want[s:e] = a[s:e] @ b[g]
    (out,) = run(lambda fd, a, b, offsets: fd.add_output(fd.ops.grouped_mm(fd.from_pytorch(a), fd.from_pytorch(b),
                                                                            fd.from_pytorch(offsets))),
                 [a, b, offsets], device)
    torch.testing.assert_close(out, want)


def test_grouped_mm_offsets_are_checked_when_it_runs() -> None:
    with FusionDefinition() as fd:
        a, b = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1, -1])
        fd.add_output(fd.ops.grouped_mm(a, b, fd.define_tensor([-1], dtype=DataType.Int32)))
    x, w = torch.randn(6, 5), torch.randn(2, 5, 3)
    with pytest.raises(ValueError, match=r"grouped_mm: offsets \[4, 3\] \(T2\) must be non-decreasing group ends "
                                         r"within T0 axis 0 of size 6"):
        fd.execute([x, w, torch.tensor([4, 3], dtype=torch.int32)])
    with pytest.raises(ValueError, match=r"offsets \[4, 7\] \(T2\) must be non-decreasing group ends within T0"):
        fd.execute([x, w, torch.tensor([4, 7], dtype=torch.int32)])
    with pytest.raises(ValueError, match=r"grouped_mm: T2 has 3 groups but T1 stacks 2 matrices"):
        fd.execute([x, w, torch.tensor([1, 2, 3], dtype=torch.int32)])


@pytest.mark.parametrize(("call", "error", "pattern"), [
    (lambda fd, a: fd.ops.welford(fd.ops.cast(a, DataType.Int), [0]), TypeError, r"welford: T\d+ has dtype int64_t"),
    (lambda fd, a: fd.ops.grouped_mm(a, a, fd.define_tensor([-1])), ValueError,
     r"grouped_mm: offsets T1 must be a 1-D integer tensor, got rank 1 float"),
    (lambda fd, a: fd.ops.grouped_mm(fd.ops.broadcast(a, [True, False, False]), fd.ops.broadcast(a, [True, False, False]),
                                     fd.define_tensor([-1], dtype=DataType.Int)), ValueError,
     r"grouped_mm: expected ranks \(2, 2\), \(3, 2\) or \(2, 3\)"),
    (lambda fd, a: fd.ops.linear(a, fd.define_tensor([2, 3, 4]), fd.define_tensor([3, 3])), ValueError,
     r"linear: T2 axis 0 has extent 3 but T1 axis 0 has extent 2"),
    (lambda fd, a: fd.ops.linear(a, fd.define_tensor([2, 3, 4]), fd.define_tensor([2, 2, 3])), ValueError,
     r"linear: bias T2 must have rank 1 or 2 for weight T1 of rank 3, got 3"),
])
def test_bad_arguments(call: Callable[..., Any], error: type[Exception], pattern: str) -> None:
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, 4])
        with pytest.raises(error, match=pattern):
            call(fd, a)
