"""Functionalized slice and select assignments (``slice_scatter``, ``select_scatter``) and ``stack`` through
generated kernels (Triton's interpreter on the CPU, the GPU where present) against eager, under hypothesis:
any axis, bounds negative, past the end or empty, permuted operands, float32 and bfloat16. Each is computed
inside the kernel that reads it (a cat of slices), never an ATen call that clones the base and copies the
source into it (Funnel's relative shift: two full copies a layer)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from hypothesis import given, settings
from hypothesis import strategies as st

from pyfuser.integrations.torch_compile import PyfuserBackend
from tests.conftest import devices

SHAPE = (3, 5, 4)


def compiled_matches(fn, args: list[torch.Tensor], device: str) -> PyfuserBackend:  # type: ignore[no-untyped-def]
    torch._dynamo.reset()
    backend = PyfuserBackend(triton_interpreter=device == "cpu")
    got = torch.compile(fn, backend=backend)(*args)
    torch.testing.assert_close(got, fn(*args))
    assert not any("scatter" in n or "stack" in n for g in backend.graphs for n in g.eager), backend.graphs[0].eager
    return backend


def operand(shape: tuple[int, ...], permuted: bool, dtype: torch.dtype, device: str) -> torch.Tensor:
    if not permuted:
        return torch.randn(shape, dtype=dtype, device=device)
    return torch.randn(shape[::-1], dtype=dtype, device=device).permute(*reversed(range(len(shape))))


@pytest.mark.parametrize("device", devices())
@settings(max_examples=12, deadline=None)
@given(dim=st.integers(-3, 2), start=st.one_of(st.none(), st.integers(-7, 7)), end=st.one_of(st.none(), st.integers(-7, 7)),
       permuted=st.booleans(), bf16=st.booleans())
def test_slice_scatter(device: str, dim: int, start: int | None, end: int | None, permuted: bool, bf16: bool) -> None:
    dtype = torch.bfloat16 if bf16 else torch.float32
    base = operand(SHAPE, permuted, dtype, device)
    written = base[(slice(None),) * (dim % 3) + (slice(start, end),)]
    src = operand(tuple(written.shape), not permuted, dtype, device)

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.ops.aten.slice_scatter.default(x * 2, torch.sigmoid(y), dim, start, end)
        return out + 1

    compiled_matches(fn, [base, src], device)


@pytest.mark.parametrize("device", devices())
@settings(max_examples=8, deadline=None)
@given(dim=st.integers(-3, 2), index=st.integers(-3, 2), permuted=st.booleans())
def test_select_scatter(device: str, dim: int, index: int, permuted: bool) -> None:
    base = operand(SHAPE, permuted, torch.float32, device)
    src = operand(tuple(base.select(dim, index).shape), permuted, torch.float32, device)

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.select_scatter.default(x - 1, y * 3, dim, index) * 2

    compiled_matches(fn, [base, src], device)


@pytest.mark.parametrize("device", devices())
@settings(max_examples=8, deadline=None)
@given(dim=st.integers(-4, 3), count=st.integers(1, 3), permuted=st.booleans())
def test_stack(device: str, dim: int, count: int, permuted: bool) -> None:
    parts = [operand(SHAPE, permuted and k == 0, torch.float32, device) for k in range(count)]

    def fn(*xs: torch.Tensor) -> torch.Tensor:
        return torch.stack([x * (k + 1) for k, x in enumerate(xs)], dim).flatten(-2) + 1

    compiled_matches(fn, parts, device)


def test_a_slice_assignment_in_a_model_is_one_kernel() -> None:
    """Funnel's relative shift as its code writes it (a slice assignment into a fresh tensor, which AOTAutograd
    functionalizes into ``slice_scatter``), read by a softmax: no ATen op left in eager."""
    def fn(scores: torch.Tensor, shifted: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(scores)
        out[:, :, 1:] = shifted[:, :, :-1]
        return torch.softmax(out + scores, dim=-1)

    scores, shifted = torch.randn(2, 3, 6, 5), torch.randn(2, 3, 6, 5)
    backend = compiled_matches(fn, [scores, shifted], "cpu")
    assert [len(g.regions) for g in backend.graphs] == [1]
