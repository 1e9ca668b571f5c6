"""``PYFUSER_DUMP=fusion_ir_preseg`` prints the fusion after each preseg pass, under its name."""

from __future__ import annotations

import pytest
import torch

from pyfuser import FusionDefinition
from pyfuser.preseg.pipeline import PRESEG_PASSES


def test_dump_after_each_pass(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1], contiguity=True, stride_order=[0, 1])
        fd.add_output(fd.ops.exp(t0))
    monkeypatch.setenv("PYFUSER_DUMP", "fusion_ir_preseg")
    x = torch.randn(4, 3).t()
    torch.testing.assert_close(fd.execute([x])[0], x.exp())
    text = capsys.readouterr().out
    names = [p.name for p in PRESEG_PASSES]
    headers = [f"Fusion IR after pre-segmenter pass {name}:" for name in names]
    positions = [text.find(h) for h in headers]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), "every pass, in pipeline order"
    sections = {name: text[start:end] for name, start, end in
                zip(names, positions, [*positions[1:], len(text)], strict=True)}
    for section in sections.values():
        assert "%kernel_math {" in section and " logical domain : (iS2{i0}, iS3{i1})" in section
    assert "(hint)" not in sections["apply_required_output_layouts"]
    assert " allocation domain : (iS3{i1}, iS2{i0}) (hint)" in sections["infer_allocation_order"]
    assert "T1_g_float[iS2{i0}, iS3{i1}]\n   = expf(T0_g_float[iS0{i0}, iS1{i1}]);" in sections["infer_allocation_order"]

    capsys.readouterr()
    fd.execute([x])
    assert "pre-segmenter" not in capsys.readouterr().out, "a cached program is not recompiled"


def test_no_dump_by_default(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("PYFUSER_DUMP", raising=False)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(fd.define_tensor([-1])))
    fd.execute([torch.randn(3)])
    assert "pre-segmenter" not in capsys.readouterr().out
