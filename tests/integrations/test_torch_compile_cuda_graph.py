"""The backend's ``cuda_graph`` option on a GPU: regions replayed from CUDA graphs give what plain
regions give, parameters are read in place (an optimizer step needs no re-capture), and an
uncapturable region falls back to plain execution."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch
import torch._dynamo

from pyfuser import DataType, FusionDefinition
from pyfuser.integrations.torch_compile import PyfuserBackend
from pyfuser.integrations.torch_compile.graph_replay import GraphReplay

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x)), approximate="tanh"))


def steps(model: torch.nn.Module, run: torch.nn.Module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Forward, backward and an SGD step per input; the losses and the final parameters."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x in inputs:
        optimizer.zero_grad()
        loss = run(x).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses + [p.detach().clone() for p in model.parameters()]


def test_training_steps_match_plain_regions() -> None:
    torch.manual_seed(0)
    inputs = [torch.randn(16, 32, device="cuda") for _ in range(4)]
    plain_model = Mlp().cuda()
    graph_model = Mlp().cuda()
    graph_model.load_state_dict(plain_model.state_dict())
    backend = PyfuserBackend(cuda_graph=True)
    got = steps(graph_model, torch.compile(graph_model, backend=backend), inputs)
    want = steps(plain_model, torch.compile(plain_model, backend=PyfuserBackend()), inputs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    assert {g.kind for g in backend.graphs} == {"forward", "backward"}
    for graph in backend.graphs:  # each graph whole, one capture: in-place parameter updates need none
        assert graph.replay is not None and graph.replay.captures == 1, graph.kind
        assert graph.regions and all(r.captures == 0 for r in graph.regions)  # captured in the graph's
        runner = graph.replay.runner
        assert runner is not None and runner.plain_runs == 0 and runner.graphs_captured == 1
        (captured,) = (g for replicas in runner._graphs.values() for g in replicas)
        if graph.kind == "backward":
            # Only the incoming gradient is copied in: the activations the forward saved (small ones
            # too) are its graph's buffers, the saved weights are parameters' storage, read in place.
            assert len(captured.copies) == 1, [tuple(b.view.shape) for _, b in captured.copies]


def test_new_size_captures_a_new_graph() -> None:
    backend = PyfuserBackend(cuda_graph=True)
    compiled = torch.compile(lambda x: torch.sigmoid(x) * x + 1, backend=backend, dynamic=True)
    for rows in (8, 8, 24, 8):
        x = torch.randn(rows, 16, device="cuda")
        torch.testing.assert_close(compiled(x), torch.sigmoid(x) * x + 1)
    (region,) = backend.graphs[0].regions
    replay = backend.graphs[0].replay
    assert replay is not None and replay.captures == 2 and region.fec.compile_count == 1


def test_tiny_llama_with_cuda_graphs_matches_eager() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).cuda()
    ids = torch.randint(0, 128, (2, 16), device="cuda")
    backend = PyfuserBackend(cuda_graph=True)
    compiled = torch.compile(model, backend=backend)
    for _ in range(2):
        model.zero_grad()
        out = compiled(ids, labels=ids, use_cache=False)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    # Every graph captured whole: the embedding's index check is a device-side assert there, not a
    # read of the indices' range on the host.
    assert backend.graphs and all(g.replay is not None and g.replay.captures == 1 for g in backend.graphs), [
        (g.kind, g.replay and g.replay.captures) for g in backend.graphs]
    model.zero_grad()
    ref = model(ids, labels=ids, use_cache=False)
    ref.loss.backward()
    torch.testing.assert_close(out.logits, ref.logits, rtol=1e-4, atol=1e-4)
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-4, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["plain", "graphs"])
def test_region_without_inputs_runs_on_its_device(cuda_graph: bool) -> None:
    """A region of factory ops only (a model's position ids) has no input to take a device from: it
    runs where its FX nodes say, not on the CPU."""
    backend = PyfuserBackend(cuda_graph=cuda_graph)
    compiled = torch.compile(lambda n: torch.arange(16, device="cuda").view(2, 8) * n, backend=backend)
    out = compiled(3)
    assert out.device.type == "cuda"
    torch.testing.assert_close(out, torch.arange(16, device="cuda").view(2, 8) * 3)


def test_uncapturable_graph_runs_its_ops_as_they_come() -> None:
    """An op that waits for the host (``nonzero``) cannot be captured: the graph runs its ops as they
    come (each region replayed from CUDA graphs of its own), with a warning, and the process's random
    numbers are unharmed."""
    replay = GraphReplay(lambda x: (x.nonzero(), x * 2), [], "a graph")
    x = torch.randn(4, 4, device="cuda")
    with pytest.warns(UserWarning, match="cannot be captured"):
        nonzero, doubled = replay([x])
    assert replay.runner is None and replay.captures == 0
    for _ in range(2):
        nonzero, doubled = replay([x])
        assert torch.equal(nonzero, x.nonzero()) and torch.equal(doubled, x * 2)
    # Refused before the capture began: a capture failing midway leaves torch's CUDA generator in
    # capture mode, and random ops raised from then on.
    torch.manual_seed(3)
    first = torch.rand(4, device="cuda")
    torch.manual_seed(3)
    assert torch.equal(first, torch.rand(4, device="cuda"))


def test_index_check_waits_for_nothing() -> None:
    """On a GPU the embedding's index check is a device-side assert: an in-range call reads nothing back
    to the host (no ``_local_scalar_dense``), under torch's sync debug mode or not, as ATen's own
    CUDA indexing does."""
    with FusionDefinition() as fd:
        ids = fd.define_tensor([-1], dtype=DataType.Int)
        weight = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.embedding_fwd(ids, weight))
    ids, weight = torch.tensor([0, 5, 9], device="cuda"), torch.randn(10, 4, device="cuda")
    fd.execute([ids, weight])  # compiled outside the profile
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        (out,) = fd.execute([ids, weight])
    assert not [e.name for e in prof.events() if e.name in ("aten::_local_scalar_dense", "aten::item")]
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        (out,) = fd.execute([ids, weight])
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.testing.assert_close(out, weight[ids])


@pytest.mark.parametrize("op", ["gather", "index_select", "embedding", "index_put_accumulate",
                                "index_put_accumulate_bf16"])
def test_aten_indexing_kernels_are_their_own_index_check(op: str) -> None:
    """Where ATen's CUDA kernel asserts each index it reads (gather, index_select, embedding), pyfuser
    adds no check of its own (it read the whole index tensor once more), nor where the generated
    scatter kernel asserts its indices (an accumulating index_put into float32); CUDA's accumulating
    index_put reads without one (a bfloat16 table stays ATen's), so pyfuser asserts its indices."""
    dtype = torch.bfloat16 if op.endswith("bf16") else torch.float32
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16 if dtype == torch.bfloat16 else DataType.Float)
        idx = fd.define_tensor([-1, -1] if op == "gather" else [-1], dtype=DataType.Int)
        if op == "gather":
            out = fd.ops.gather(x, idx, 1)
        elif op == "index_select":
            out = fd.ops.index_select(x, idx, 0)
        elif op == "embedding":
            out = fd.ops.embedding_fwd(idx, x)
        else:
            values = fd.define_tensor([-1, -1], dtype=DataType.BFloat16 if dtype == torch.bfloat16 else DataType.Float)
            out = fd.ops.index_put_accumulate(x, idx, values)
        fd.add_output(out)
    x0 = torch.randn(6, 5, device="cuda", dtype=dtype)
    idx0 = torch.tensor([[0, 4], [3, 1], [2, 2], [4, 0], [1, 1], [0, 3]] if op == "gather" else [5, 0, 3], device="cuda")
    inputs = [x0, idx0] + ([torch.randn(3, 5, device="cuda", dtype=dtype)] if op.startswith("index_put") else [])
    fd.execute(inputs)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = fd.execute(inputs)[0]
    asserts = [e.name for e in prof.events() if e.name.startswith("aten::_assert_async")]
    assert bool(asserts) == (op == "index_put_accumulate_bf16"), asserts
    if op.startswith("index_put"):
        torch.testing.assert_close(got, x0.index_put((idx0,), inputs[2], accumulate=True))


def test_index_out_of_range_is_a_device_assert(tmp_path: pathlib.Path) -> None:
    """Out of range on a GPU stops the program with a device-side assert, as ATen's CUDA indexing does
    (in a child process: a device assert leaves the CUDA context unusable)."""
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent("""
        import torch
        from pyfuser import DataType, FusionDefinition
        with FusionDefinition() as fd:
            ids = fd.define_tensor([-1], dtype=DataType.Int)
            weight = fd.define_tensor([-1, -1])
            fd.add_output(fd.ops.embedding_fwd(ids, weight))
        inputs = [torch.tensor([0, 10], device="cuda"), torch.randn(10, 4, device="cuda")]
        torch.cuda.synchronize()
        fd.execute(inputs)
        torch.cuda.synchronize()
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode != 0 and "device-side assert" in done.stderr, (done.returncode, done.stderr[-3000:])
