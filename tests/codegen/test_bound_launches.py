"""Bound launches: a bound program (sizes and input strides fixed from call to call, as a
torch.compile region of a static-shape graph runs) records each kernel launch on its first run and
replays it after: same results as the launcher on new data, the launcher again where an argument's
alignment changed, every kind of segment (one kernel, a size-dispatched reduction, a cooperative grid
reduction, empty outputs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from pyfuser import FusionDefinition
from pyfuser.codegen import compiled_kernel, kernel_sequence, launcher
from pyfuser.integrations.torch_compile import PyfuserBackend


@pytest.fixture
def replays(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The source of each bound launch replayed (one entry per replay)."""
    seen: list[str] = []

    def counting(*args: Any, **kwargs: Any) -> launcher.BoundFunction | None:
        bound = launcher.bound_launch(*args, **kwargs)
        if bound is None:
            return None

        def replay(values: Any) -> Any:
            seen.append(bound.source)
            return bound.run(values)

        return launcher.BoundFunction(replay)  # called by a straight-line function, not inlined: counted

    monkeypatch.setattr(compiled_kernel, "bound_launch", counting)
    monkeypatch.setattr(kernel_sequence, "bound_launch", counting)
    return seen


def test_a_pointwise_launch_replays_on_new_data(device: str, replays: list[str], bind: Callable[..., Any]) -> None:
    x, w = torch.randn(3, 5, 8, device=device), torch.randn(8, device=device)
    with FusionDefinition() as fd:
        tx, tw = fd.from_pytorch(x), fd.from_pytorch(w)
        fd.add_output(fd.ops.add(fd.ops.mul(tx, fd.ops.broadcast(tw, [True, True, False])), tx))
    bound = bind(fd, [x, w])
    for k in range(3):
        x, w = torch.randn_like(x) + k, torch.randn_like(w)
        (out,) = bound.run([x, w])
        torch.testing.assert_close(out, x * w + x)
    assert len(replays) == 2  # the first bound run records, the later two replay
    assert "data_ptr() % 16" in replays[0] and ".stride()" not in replays[0] and ".shape" not in replays[0]


def test_a_changed_alignment_runs_the_launcher(device: str, replays: list[str], bind: Callable[..., Any]) -> None:
    """Same sizes and strides, an input 4 bytes off a 16-byte boundary: the compiled variant assumed
    alignment, so the launcher (which picks another) runs instead of the replay."""
    x = torch.randn(4, 8, device=device)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(fd.from_pytorch(x)))
    bound = bind(fd, [x])
    bound.run([x])
    shifted = torch.randn(33, device=device)[1:].view(4, 8)
    assert shifted.data_ptr() % 16 and shifted.stride() == x.stride()
    (out,) = bound.run([shifted])
    torch.testing.assert_close(out, shifted.exp())
    (out,) = bound.run([x])
    torch.testing.assert_close(out, x.exp())


def test_a_size_dispatched_reduction_and_a_program_of_several_steps_replay(device: str, replays: list[str],
                                                                        bind: Callable[..., Any]) -> None:
    x = torch.randn(6, 40, device=device)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        fd.add_output(fd.ops.div(fd.ops.exp(t0), fd.ops.sum(fd.ops.exp(t0), [1], keepdim=True)))
        fd.add_output(fd.ops.sum(t0, [0]))
        fd.add_output(fd.ops.reshape(fd.ops.mul(t0, t0), [240]))
    bound = bind(fd, [x])
    for _ in range(3):
        x = torch.randn_like(x)
        soft, total, square = bound.run([x])
        torch.testing.assert_close(soft, torch.softmax(x, 1))
        torch.testing.assert_close(total, x.sum(0), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(square, (x * x).reshape(240))
    assert len(replays) >= 2  # each later run replays its launches (one cooperative launch on a GPU)


def test_a_cooperative_grid_reduction_replays_its_one_launch(device: str, replays: list[str],
                                                             one_program_machine: None, bind: Callable[..., Any]) -> None:
    """Seed 003's shape of segment (a reduction per row and across rows) as one cooperative launch:
    the replay fills in every step's parameters, the grids and the counter of its stream."""
    x = torch.randn(37, 96, device=device)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        y = fd.ops.sub(t0, fd.ops.sum(t0, [1], keepdim=True))
        fd.add_output(y)
        fd.add_output(fd.ops.sum(y, [0]))
    bound = bind(fd, [x])
    before = kernel_sequence.cooperative_launches
    for _ in range(3):
        x = torch.randn_like(x)
        y, column = bound.run([x])
        ref = x - x.sum(1, keepdim=True)
        torch.testing.assert_close(y, ref)
        torch.testing.assert_close(column, ref.sum(0), atol=1e-4, rtol=1e-4)
    assert kernel_sequence.cooperative_launches - before == 3
    assert len(replays) == 2 and "_counter(_stream)" in replays[0]


def test_empty_outputs_under_a_binding(device: str, replays: list[str], bind: Callable[..., Any]) -> None:
    """An empty output beside a reduction of an empty axis (whose programs write zeros), then only
    empty outputs (nothing launched, nothing bound)."""
    x = torch.randn(0, 8, device=device)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        fd.add_output(fd.ops.exp(t0))
        fd.add_output(fd.ops.sum(t0, [0]))
    bound = bind(fd, [x])
    for _ in range(2):
        out, total = bound.run([x])
        assert out.shape == (0, 8)
        torch.testing.assert_close(total, torch.zeros(8, device=device))
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(fd.from_pytorch(x)))
    bound, before = bind(fd, [x]), len(replays)
    for _ in range(2):
        assert bound.run([x])[0].shape == (0, 8)
    assert len(replays) == before


def test_a_compiled_region_replays_its_launches(device: str, replays: list[str], kernel_options: list[str]) -> None:
    """torch.compile's static-shape regions run bound programs: later calls replay the launches."""
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.silu(x) * w
        return h / h.square().mean(-1, keepdim=True).add(1e-6).sqrt()

    compiled = torch.compile(fn, backend=PyfuserBackend(enable_options=kernel_options), dynamic=False)
    x, w = torch.randn(4, 16, device=device), torch.randn(16, device=device)
    for k in range(4):
        x = torch.randn_like(x) + k
        torch.testing.assert_close(compiled(x, w), fn(x, w))
    assert replays


def test_bound_outputs_keep_their_own_memory_and_layouts(device: str, bind: Callable[..., Any]) -> None:
    """Under a binding, outputs that must be copied (a view of an input, one value returned twice)
    are copied on every run; an output whose layout the first run met is returned as is."""
    x = torch.randn(4, 6, device=device)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        y = fd.ops.exp(t0)
        fd.add_output(fd.ops.reshape(t0, [24]))
        fd.add_output(y)
        fd.add_output(y)
        fd.add_output(fd.ops.permute(fd.ops.mul(t0, 2.0), [1, 0]))
    bound = bind(fd, [x])
    for _ in range(3):
        x = torch.randn_like(x)
        flat, a, b, scaled = bound.run([x])
        storages = {t.untyped_storage().data_ptr() for t in (x, flat, a, b, scaled)}
        assert len(storages) == 5
        torch.testing.assert_close(flat, x.reshape(24))
        torch.testing.assert_close(a, x.exp())
        torch.testing.assert_close(b, x.exp())
        torch.testing.assert_close(scaled, (x * 2).t())
