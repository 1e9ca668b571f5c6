"""Specialization (``host_ir/specialization.py``): per binding, one recording, then replays. A launch
is bound once per binding whichever path runs it (the evaluator's direct path replays what the
steps recorded on the binding's first run); every level keeps at most ``SPECIALIZATION_LIMIT``
bindings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from pyfuser import FusionDefinition
from pyfuser.host_ir.specialization import SPECIALIZATION_LIMIT, Recording, Specializations
from pyfuser.ir.eval_context import EvalContext


def test_specializations_forget_all_past_the_limit() -> None:
    specs: Specializations[int, str] = Specializations()
    for k in range(SPECIALIZATION_LIMIT):
        specs.record(k, str(k))
    specs.record(0, "again")  # a known signature is replaced, not counted twice
    assert len(specs) == SPECIALIZATION_LIMIT and specs[0] == "again"
    specs.record(SPECIALIZATION_LIMIT, "new")
    assert dict(specs) == {SPECIALIZATION_LIMIT: "new"}


def test_a_recording_keeps_the_geometry_of_strided_tensors_only() -> None:
    recording = Recording()
    base = torch.zeros(4, 6)
    seen = recording.note("view", base[1:, ::2])
    assert seen is not None and (seen.sizes, seen.strides, seen.offset) == ((3, 3), (6, 2), 6)
    assert seen.storage == base.untyped_storage().data_ptr()
    assert recording.note("number", 3) is None and recording.get("missing") is None


def test_a_launch_binds_once_per_binding_whichever_path_runs_it(device: str, bind: Callable[..., Any],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-kernel program under a binding: its first run binds through the steps, its later runs
    (the evaluator's direct path, as when its straight-line function declines) replay that binding."""
    x = torch.randn(6, 8, device=device)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(fd.from_pytorch(x)))
    bound = bind(fd, [x])
    segment = bound.program.container.nodes[0].segment
    binds: list[int] = []
    segment_bind = segment.bind

    def counted(ctx: EvalContext, args: Any) -> Any:
        binds.append(1)
        return segment_bind(ctx, args)

    monkeypatch.setattr(segment, "bind", counted)
    for k in range(3):
        x = torch.randn_like(x) + k
        ctx = EvalContext(bound.env.copy(), bound.device, bound.binding)
        (out,) = bound.program.run([x], ctx)
        torch.testing.assert_close(out, x.exp())
    assert len(binds) == 1
