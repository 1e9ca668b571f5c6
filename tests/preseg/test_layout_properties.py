"""Properties of inferred layouts on random inputs: values match torch, every output is dense, and
pointwise / permute outputs have exactly the memory order torch gives them, whatever the layouts
of both operands and their order (torch's per-pair operand precedence)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyfuser import FusionDefinition

SHAPE = (2, 3, 4, 5)


def layout(t: torch.Tensor) -> list[int]:
    """Strides of the axes that address memory (size > 1)."""
    return [s for s, n in zip(t.stride(), t.shape, strict=True) if n > 1]


def is_dense(t: torch.Tensor) -> bool:
    expected = 1
    for d in sorted(range(t.dim()), key=lambda d: t.stride(d)):
        if t.shape[d] == 1:
            continue
        if t.stride(d) != expected:
            return False
        expected *= t.shape[d]
    return True


@st.composite
def cases(draw: st.DrawFn) -> dict:
    rank = draw(st.integers(2, 4))
    return {
        "shape": SHAPE[:rank],
        "x_perm": draw(st.permutations(range(rank))),
        "declared": draw(st.booleans()),
        "y_broadcast": draw(st.lists(st.booleans(), min_size=rank, max_size=rank)),
        "y_perm": draw(st.permutations(range(rank))),
        "x_first": draw(st.booleans()),
        "out_perm": draw(st.permutations(range(rank))),
        "reduce_axis": draw(st.integers(0, rank - 1)),
        "infer": draw(st.booleans()),
    }


@settings(max_examples=40, deadline=None)
@given(case=cases())
def test_inferred_layouts_against_torch(case: dict) -> None:
    shape, perm = case["shape"], list(case["x_perm"])
    rank = len(shape)
    x = torch.randn([shape[d] for d in perm]).permute([perm.index(d) for d in range(rank)])
    y_shape = [1 if b else n for b, n in zip(case["y_broadcast"], shape, strict=True)]
    y_perm = list(case["y_perm"])
    y = torch.randn([y_shape[d] for d in y_perm]).permute([y_perm.index(d) for d in range(rank)])
    stride_order = [rank - 1 - perm.index(d) for d in range(rank)] if case["declared"] else None
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1] * rank, contiguity=True if case["declared"] else None, stride_order=stride_order)
        ty = fd.define_tensor([1 if b else -1 for b in case["y_broadcast"]])
        a = fd.ops.tanh(tx)
        b = fd.ops.mul(a, ty) if case["x_first"] else fd.ops.mul(ty, a)
        c = fd.ops.permute(b, list(case["out_perm"]))
        d = fd.ops.sum(c, [case["reduce_axis"]])
        for out in (b, c, d):
            fd.add_output(out)
    disabled = [] if case["infer"] else ["infer_contiguity"]
    got_b, got_c, got_d = fd.execute([x, y], _disable_options=disabled)
    ref_b = torch.tanh(x) * y if case["x_first"] else y * torch.tanh(x)
    ref_c = ref_b.permute(list(case["out_perm"]))
    ref_d = ref_c.sum(case["reduce_axis"])
    torch.testing.assert_close(got_b, ref_b)
    torch.testing.assert_close(got_c, ref_c)
    torch.testing.assert_close(got_d, ref_d)
    assert all(is_dense(t) for t in (got_b, got_c, got_d))
    if case["infer"]:
        assert layout(got_b) == layout(ref_b), "pointwise: torch's operand precedence"
        assert layout(got_c) == layout(ref_c), "permute keeps the memory order, as torch's view does"
    else:
        assert all(t.is_contiguous() for t in (got_b, got_c, got_d))
