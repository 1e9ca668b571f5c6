"""One-element values that depend on no input are computed once, when the graph compiles
(``constant_folding.py``), and read by the regions as literals of their kernels; larger input-free
values, returned values and random ones stay computed. Results equal eager's."""

from __future__ import annotations

import pytest
import torch

from pyfuser.integrations.torch_compile import PyfuserBackend
from pyfuser.integrations.torch_compile.constant_folding import FOLDED_PREFIX, fold_scalar_constants


class ScaledScores(torch.nn.Module):
    """DeBERTa-v2's pattern: an attention scale and a log-bucket denominator computed from tensor
    literals, beside a relative-position table built from ``arange``s (input-free, many elements)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.sqrt(torch.tensor(x.size(-1), dtype=torch.float) * 3)
        positions = torch.arange(x.size(1), device=x.device)
        relative = (positions[None, :] - positions[:, None]).abs().clamp(min=1)
        bucket = torch.log(relative.float()) / torch.log(torch.tensor(7.0))
        scores = self.proj(x) @ x.transpose(-1, -2) / scale.to(x.dtype)
        return (scores + bucket.to(x.dtype)).softmax(-1)


def _folded(backend: PyfuserBackend) -> list[torch.Tensor]:
    """The values the backend's graphs read as folded constants."""
    return [getattr(g.graph_module, str(n.target)) for g in backend.graphs for n in g.graph_module.graph.nodes
            if n.op == "get_attr" and str(n.target).startswith(FOLDED_PREFIX)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_literal_scales_are_folded_and_read_as_kernel_literals(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = ScaledScores().to(dtype)
    x = torch.randn(2, 5, 8, dtype=dtype)
    backend = PyfuserBackend(triton_interpreter=True)
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(x)
        want = model(x)
    torch.testing.assert_close(got, want, **({"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}))
    folded = _folded(backend)
    # log(7), and sqrt(8 * 3) as x's dtype; the [5, 5] bucket table is computed inside the kernel that reads it
    want_values = [float(torch.tensor(7.0).log()), float(torch.tensor(24.0).sqrt().to(dtype))]
    assert sorted(float(v) for v in folded) == pytest.approx(want_values, rel=1e-6), folded
    assert all(v.numel() == 1 for v in folded)
    graph = backend.graphs[0]
    # no ATen call left for the scalars' arithmetic (only views at the region's edges)
    assert all("view" in why for why in graph.eager.values()), graph.eager
    constants = [name for r in graph.regions for name in r.names.values() if name.endswith("(constant)")]
    assert len(constants) == 2, [r.names for r in graph.regions]


def test_training_step_folds_forward_and_backward() -> None:
    torch.manual_seed(0)
    model = ScaledScores()
    reference = ScaledScores()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 5, 8)
    backend = PyfuserBackend(triton_interpreter=True)
    torch.compile(model, backend=backend)(x).square().sum().backward()
    reference(x).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert {g.kind for g in backend.graphs} == {"forward", "backward"}
    assert _folded(backend)


def _graph_of(fn: object, *args: torch.Tensor) -> torch.fx.GraphModule:
    """The inference ATen graph of ``fn`` as AOTAutograd hands it to a backend."""
    from torch._dynamo.backends.common import aot_autograd

    seen: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        seen.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=aot_autograd(fw_compiler=keep, inference_compiler=keep))(*args)
    return seen[0]


def test_returned_random_and_large_values_stay_computed() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        returned = torch.tensor(2.0) * 3  # the caller may write into what it gets
        noise = torch.rand(()) * 2  # a new value on every call
        table = torch.arange(4.0) * torch.tensor(0.5)  # four elements: computed where read
        large = torch.ones(300, 300).sum()  # one element of a large computation: not evaluated here
        return x * noise + table + large, returned, x * torch.exp(torch.tensor(1.0))

    x = torch.randn(3, 4)
    gm = _graph_of(fn, x)
    assert fold_scalar_constants(gm) == 2  # exp(1.0), and 0.5 as the table reads it
    folded = {str(n.target): getattr(gm, str(n.target)) for n in gm.graph.nodes if n.op == "get_attr"
              and str(n.target).startswith(FOLDED_PREFIX)}
    assert sorted(round(float(v), 4) for v in folded.values()) == [0.5, round(float(torch.e), 4)]
    targets = {getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes if n.op == "call_function"}
    assert any("rand" in t for t in targets) and any("arange" in t for t in targets)
    first, second = gm(x), gm(x)
    assert not torch.equal(first[0], second[0])  # the random value is drawn on every call
    assert any("sum" in t for t in targets)
    torch.testing.assert_close(first[1], torch.tensor(6.0))
    first[1].add_(1)  # a returned value is the caller's own
    torch.testing.assert_close(gm(x)[1], torch.tensor(6.0))
    torch.testing.assert_close(first[2], x * torch.e)
