"""Intermediate ring buffers: a tensor produced and consumed inside one stream loop keeps
``numberOfStreams`` chunks; results stay exact with more chunks than streams."""

from __future__ import annotations

import pytest
import torch

from pyfuser import FusionDefinition
from pyfuser.ir.iter_domain import ParallelType

STREAM = ParallelType.stream


def _chain(split: int | None = None, intermediate_is_output: bool = False) -> FusionDefinition:
    """t1 = sin(t0); t2 = t1 * t0; t3 = t2 + 1, all in one stream loop."""
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1, -1])
    t1 = fd.ops.sin(t0)
    t2 = fd.ops.mul(t1, t0)
    t3 = fd.ops.add(t2, 1.0)
    fd.add_output(t3)
    if intermediate_is_output:
        fd.add_output(t1)
    for t in (t1, t2, t3):
        if split is not None:
            t.outer_split(0, split)
        t.axis(0).parallelize(STREAM)
    return fd


def _expected(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * x + 1.0


def _allocations(fd: FusionDefinition, inputs: list[torch.Tensor], monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Shapes of the buffers the host program allocates in one (compiled) execution: the program the
    dump shows (every expr an ATen call, seed 002's loop), also on CUDA where kernels are on."""
    options = {"_disable_options": ["kernel_codegen", "stream_overlap"]}
    fd.execute(inputs, **options)
    shapes: list[list[int]] = []
    real = torch.empty_strided

    def spy(size, stride, **kwargs):
        shapes.append(list(size))
        return real(size, stride, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(torch, "empty_strided", spy)
        fd.execute(inputs, **options)
    return shapes


@pytest.mark.parametrize("num_streams", [1, 2, 4])
@pytest.mark.parametrize(("rows", "split"), [(11, None), (2, None), (13, 6), (9, 9)])
def test_ring_buffers_exact_with_more_chunks_than_streams(rows, split, num_streams, device, run_seed_dumped,
                                                         monkeypatch):
    monkeypatch.setenv("PYFUSER_NUM_STREAMS", str(num_streams))
    fd = _chain(split)
    x = torch.randn(rows, 5, device=device)
    (out,), dump = run_seed_dumped(fd, [x])
    torch.testing.assert_close(out, _expected(x))
    assert dump.count("WaitSlot") == 2 and dump.count("ReleaseSlot") == 2  # t1 and t2
    assert dump.count("index = ( StreamIdx % numberOfStreams )") == 2
    chunk = 1 if split is None else -(-rows // split)
    ring_rows = min(num_streams * chunk, rows)
    assert _allocations(fd, [x], monkeypatch) == [[ring_rows, 5], [ring_rows, 5], [rows, 5]]


def test_slot_wait_precedes_write_and_release_follows_last_use(run_seed_dumped):
    fd = _chain()
    _, dump = run_seed_dumped(fd, [torch.randn(3, 2)])
    body = [line.strip() for line in dump.splitlines()]
    wait = next(k for k, line in enumerate(body) if line.startswith("WaitSlot") and " of T1_" in line)
    chunk = body[wait + 1]  # the view the select of T1 defines, e.g. T5_l_float[iS9{i1}]
    assert body[wait + 2].startswith("= HirAliasSelect( T1_")
    release = next(k for k, line in enumerate(body) if line.startswith("ReleaseSlot") and " of T1_" in line)
    last_use = max(k for k, line in enumerate(body) if chunk in line)
    # t2 = t1 * t0 reads it last (printed over two lines); the release comes right after that expr.
    assert body[last_use].startswith("= T") and body[last_use + 1].startswith("* T") and release == last_use + 2


def test_no_ring_for_outputs_or_tensors_read_after_the_loop(device, run_seed_dumped):
    fd = _chain(intermediate_is_output=True)
    x = torch.randn(7, 3, device=device)
    (out, t1), dump = run_seed_dumped(fd, [x])
    torch.testing.assert_close(out, _expected(x))
    torch.testing.assert_close(t1, torch.sin(x))
    assert " of T1_" not in dump and dump.count("WaitSlot") == 1  # only t2 is ring-buffered


def test_ring_buffers_can_be_disabled(device, run_seed_dumped):
    fd = _chain()
    x = torch.randn(6, 2, device=device)
    (out,), dump = run_seed_dumped(fd, [x], _disable_options=["stream_ring_buffers"])
    torch.testing.assert_close(out, _expected(x))
    assert "numberOfStreams )" not in dump.replace("Stream ( StreamIdx % numberOfStreams )", "")
    assert "Slot" not in dump
