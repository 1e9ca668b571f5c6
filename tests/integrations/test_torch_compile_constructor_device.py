"""CPU factories moved to the graph's device (``constructor_device``): what moves, what stays and why, on
graphs traced for the meta device (what a CPU machine has besides the CPU), and end to end through
``backend="pyfuser"`` on CUDA (WavLM's relative-position buckets)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch._dynamo
from torch.fx import GraphModule
from torch.fx.experimental.proxy_tensor import make_fx

from pyfuser.integrations.torch_compile import PyfuserBackend
from pyfuser.integrations.torch_compile.constructor_device import move_constructors_to_device, target_device
from tests.conftest import devices

aten = torch.ops.aten


def buckets(q: int, k: int, device: torch.device | str) -> torch.Tensor:
    """WavLM's relative-position buckets, built on the CPU as its code does, then moved."""
    rel = torch.arange(k)[None, :] - torch.arange(q)[:, None]
    far = 4 + (torch.log(rel.abs().float().clamp(min=1) / 4) / math.log(16 / 4) * 4).long()
    return torch.where(rel.abs() < 4, rel.abs(), torch.clamp(far, max=7)).to(device)


def trace(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> GraphModule:
    return make_fx(fn, tracing_mode="fake")(*args)


def on_cpu(gm: GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)
            and n.meta["val"].device.type == "cpu"]


def test_a_table_built_on_the_cpu_for_the_device_is_built_there() -> None:
    """Every op of the table moves (its factories get the device), the ``.to(device)`` is dropped, and
    the graph computes the same shapes on the device."""
    x = torch.empty(7, 5, device="meta")
    gm = trace(lambda x: x + buckets(7, 5, x.device), x)
    assert target_device(gm) == torch.device("meta")
    assert on_cpu(gm)
    moved = move_constructors_to_device(gm)
    assert on_cpu(gm) == []
    aranges = [n for n in gm.graph.nodes if n.target in (aten.arange.default, aten.arange.start)]
    assert aranges and all(n in moved and n.kwargs["device"] == torch.device("meta") for n in aranges)
    assert not any(n.target is aten._to_copy.default and n.kwargs.get("device") is not None for n in gm.graph.nodes)
    assert gm(x).shape == (7, 5) and gm(x).device.type == "meta"


@pytest.mark.parametrize("case", ["returned on the cpu", "read on the host", "random", "a cpu input"])
def test_what_the_cpu_still_reads_stays_there(case: str) -> None:
    """A table the graph also returns on the CPU, one read on the host (``nonzero``: a device would
    synchronize), a random draw (eager's CPU generator), and one mixed with a CPU input keep their ops
    on the CPU: nothing moves."""
    x = torch.empty(7, 5, device="meta")
    cpu = torch.randn(7, 5)

    def fn(x: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        table = torch.arange(5)[None, :] - torch.arange(7)[:, None]
        if case == "returned on the cpu":
            return x + table.to(x.device), table
        if case == "read on the host":
            return x + table.to(x.device), table.nonzero().to(x.device)
        if case == "random":
            return (x + (torch.rand(7, 5) * table).to(x.device),)
        return (x + (c * table).to(x.device),)

    gm = trace(fn, x, cpu)
    before = on_cpu(gm)
    moved = move_constructors_to_device(gm)
    if case == "random":  # (the aranges' table is multiplied by the draw: neither moves)
        assert moved == []
    else:
        assert moved == [], [n.name for n in moved]
    assert on_cpu(gm) == before


def test_a_cpu_scalar_read_by_the_table_moves_with_it() -> None:
    """A 0-dim CPU tensor among the table's operands (a model's ``torch.tensor(c)``) does not hold it on the
    CPU: ATen and the kernels read it as a scalar on any device."""
    x = torch.empty(7, 5, device="meta")

    def fn(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        table = (torch.arange(5)[None, :] - torch.arange(7)[:, None]) * c
        return x + table.to(x.device)

    gm = trace(fn, x, torch.tensor(2.5))
    moved = move_constructors_to_device(gm)
    assert moved and on_cpu(gm) == []
    assert gm(x, torch.tensor(2.5)).device.type == "meta"


def test_graphs_of_one_device_are_left_alone() -> None:
    gm = trace(lambda x: x + buckets(7, 5, x.device), torch.randn(7, 5))
    assert target_device(gm) is None and move_constructors_to_device(gm) == []


@pytest.mark.parametrize("device", devices())
def test_relative_position_buckets_compile_on_the_device(device: str) -> None:
    """Through the backend: a region of the bucket table's ops on the device, no region or op left on
    the CPU, and eager's values (on a CUDA device; on the CPU the graph is already on one device)."""
    torch._dynamo.reset()

    def fn(x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x + emb[buckets(x.shape[-2], x.shape[-1], x.device)].squeeze(-1), dim=-1)

    backend = PyfuserBackend(triton_interpreter=device == "cpu")
    compiled = torch.compile(fn, backend=backend)
    x, emb = torch.randn(2, 9, 11, device=device), torch.randn(8, 1, device=device)
    for _ in range(3):
        torch.testing.assert_close(compiled(x, emb), fn(x, emb))
    (graph,) = backend.graphs
    assert {r.device.type for r in graph.regions} == {device}
    if device != "cpu":
        assert on_cpu(graph.graph_module) == []
