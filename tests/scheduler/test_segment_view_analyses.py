"""Analyses that several schedulers' ``can_schedule`` ask of one segment view while segmenting run once
per view (``registry.once_per_view``); a whole fusion, which a scheduler may transform between calls,
is analyzed on every call."""

from __future__ import annotations

from typing import Any

import pytest

from pyfuser import DataType, FusionDefinition
from pyfuser.ir.analysis import id_graph
from pyfuser.scheduler import pointwise, pointwise_analysis, reduction_analysis, transpose
from pyfuser.scheduler.registry import SegmentView


def _graph_builds(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    built: list[object] = []

    class CountedIdGraph(id_graph.IdGraph):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            built.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(pointwise_analysis, "IdGraph", CountedIdGraph)
    monkeypatch.setattr(reduction_analysis, "IdGraph", CountedIdGraph)
    return built


def _definition() -> FusionDefinition:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        y = fd.define_tensor([-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.relu(fd.ops.add(x, y)))
        fd.add_output(fd.ops.sum(fd.ops.mul(x, y), [1]))
    return fd


def test_schedulers_share_one_analysis_of_a_view(monkeypatch: pytest.MonkeyPatch) -> None:
    built = _graph_builds(monkeypatch)
    fusion = _definition().fusion
    add, relu = fusion.exprs()[:2]
    view = SegmentView([add, relu], add.inputs, relu.outputs)
    assert pointwise.can_schedule(view)[0]
    transpose.can_schedule(view)  # asks whether the same view is pointwise
    assert len(built) == 1
    assert reduction_analysis.analyze(view) is reduction_analysis.analyze(view)
    other = SegmentView([add, relu], add.inputs, relu.outputs)  # a new view is analyzed anew
    pointwise.can_schedule(other)
    assert len(built) == 2


def test_a_whole_fusion_is_analyzed_on_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    built = _graph_builds(monkeypatch)
    fusion = _definition().fusion
    reduction_analysis.analyze(fusion)
    reduction_analysis.analyze(fusion)
    assert len(built) == 2
