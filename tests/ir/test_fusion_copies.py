"""Copies of fusions (``pyfuser/ir/cloning.py``): a whole fusion, and a segment of one without the rest of
its graph (what compiling a model's region makes once per kernel)."""

from __future__ import annotations

import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.ir.base import Expr
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.tensor_view import TensorView
from pyfuser.runtime.executor import FusionExecutorCache


def _chain(links: int) -> FusionDefinition:
    """``links`` normalizations one after another, each output also returned."""
    with FusionDefinition() as fd:
        t = fd.ops.cast(fd.define_tensor([-1, -1], dtype=DataType.BFloat16), DataType.Float)
        for _ in range(links):
            var, mean = fd.ops.var_mean(t, [1], correction=0, keepdim=True)
            t = fd.ops.mul(fd.ops.sub(t, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
            fd.add_output(t)
    return fd


def _restricted_full_copy(fusion: Fusion, inputs: list[TensorView], outputs: list[TensorView]) -> Fusion:
    memo: dict[int, object] = {}
    copy = fusion.clone(memo)
    copy.restrict([memo[id(v)] for v in inputs], [memo[id(v)] for v in outputs])  # type: ignore[misc]
    return copy


def test_a_segment_copy_is_the_restricted_copy_of_the_whole_without_copying_the_rest() -> None:
    fusion = _chain(12).fusion
    exprs = fusion.exprs()
    outputs = [o for o in fusion.outputs() if isinstance(o, TensorView)]
    inputs = [outputs[4]]
    segment_outputs = [outputs[6]]
    memo: dict[int, object] = {}
    segment = fusion.clone_segment(inputs, segment_outputs, memo)
    want = _restricted_full_copy(fusion, inputs, segment_outputs)
    assert str(segment) == str(want) and str(segment.inputs()) == str(want.inputs())
    assert segment.inputs()[0].definition is None
    kept = {id(e) for e in Fusion.exprs_between(inputs, segment_outputs)}
    assert 0 < len(kept) < len(exprs) // 4
    assert not [e for e in exprs if id(e) not in kept and id(e) in memo]  # nothing outside was copied
    copied_exprs = [v for v in memo.values() if isinstance(v, Expr)]
    assert len(copied_exprs) == len(kept)
    for v in segment.vals():  # no copy refers to an expr outside the segment
        assert all(id(e) in {id(x) for x in segment.exprs()} for e in v.uses), v
    # the original is untouched: its values keep their definitions and every use
    assert inputs[0].definition is not None and len(inputs[0].uses) >= 2


def test_a_segment_copy_runs_like_the_segment() -> None:
    fd = _chain(3)
    x = torch.randn(5, 7, dtype=torch.bfloat16)
    outputs = fd.execute([x])
    fusion = fd.fusion
    tvs = [o for o in fusion.outputs() if isinstance(o, TensorView)]
    segment = fusion.clone_segment([tvs[0]], [tvs[2]])
    (got,) = FusionExecutorCache(segment).run([outputs[0]], enable_options=["triton_interpreter"])
    torch.testing.assert_close(got, outputs[2])


def test_a_segment_between_intermediate_values_is_copied() -> None:
    """Boundaries that are neither inputs nor outputs of the whole fusion: only the dropped rest of the
    graph leads to them from the fusion's ends."""
    fusion = _chain(8).fusion
    exprs = fusion.exprs()
    middle = [e.outputs[0] for e in exprs[len(exprs) // 3: 2 * len(exprs) // 3]
              if isinstance(e.outputs[0], TensorView) and not e.outputs[0].is_fusion_output]
    inputs, outputs = [middle[0]], [middle[-1]]
    segment = fusion.clone_segment(inputs, outputs)
    assert str(segment) == str(_restricted_full_copy(fusion, inputs, outputs))
    assert 0 < len(segment.exprs()) < len(exprs)


def test_a_segment_copy_costs_what_the_segment_holds_not_the_fusion() -> None:
    """The nodes a segment's copy makes do not grow with the fusion around it (a model's region is copied
    once per kernel: a copy proportional to the whole graph makes compiling it quadratic)."""
    def copied(links: int) -> int:
        fusion = _chain(links).fusion
        outputs = [o for o in fusion.outputs() if isinstance(o, TensorView)]
        memo: dict[int, object] = {}
        segment = fusion.clone_segment([outputs[2]], [outputs[3]], memo)
        assert len(segment.exprs()) == len(Fusion.exprs_between([outputs[2]], [outputs[3]]))
        return len(memo)

    small, large = copied(6), copied(60)
    assert small == large, (small, large)
