"""Compiled graphs specialized to their recorded call (``bound_graph.py``): one generated function with
the regions' straight-line bodies in place of their calls, eager views as reinterpretations; anything
else runs the graph as compiled."""

from __future__ import annotations

import copy
import dataclasses
import warnings
from typing import Any

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from pyfuser.host_ir import specialization
from pyfuser.integrations.torch_compile import PyfuserBackend
from pyfuser.integrations.torch_compile.bound_graph import WARM_CALLS, BoundGraph, direct_function
from pyfuser.integrations.torch_compile.region import FusionRegion, RegionFunction
from pyfuser.integrations.torch_compile.view_chains import ViewChain


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


class AttentionBlock(torch.nn.Module):
    """Norm, projections, head views around attention (left in eager), an MLP: the views and regions of
    a Llama layer in small."""

    def __init__(self, hidden: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.RMSNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = torch.nn.Linear(hidden, hidden, bias=False)
        self.up = torch.nn.Linear(hidden, 2 * hidden, bias=False)
        self.down = torch.nn.Linear(2 * hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in self.qkv(self.norm(x)).chunk(3, -1))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attention.transpose(1, 2).reshape(batch, seq, hidden))
        return x + self.down(F.silu(self.up(x)))


def _bound_graphs(backend: PyfuserBackend) -> list[BoundGraph]:
    bound = [g.bound for g in backend.graphs]
    assert all(b is not None for b in bound), backend.graphs
    return bound  # type: ignore[return-value]


def _region_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the regions called through ``FusionRegion.__call__`` from now on."""
    calls: list[str] = []
    call = FusionRegion.__call__

    def counted(self: FusionRegion, *args: Any) -> list[torch.Tensor]:
        calls.append(self.name)
        return call(self, *args)

    monkeypatch.setattr(FusionRegion, "__call__", counted)
    return calls


def test_a_training_block_runs_its_specialized_graphs(device: str, kernel_options: list[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward and backward, on new data every step: after the warm-up calls and the recorded one, each
    graph runs its specialized copy (no region's call, no view method or chain left), and matches
    eager's outputs and gradients every step."""
    block = AttentionBlock().to(device)
    backend = PyfuserBackend(enable_options=kernel_options)
    compiled = torch.compile(block, backend=backend)
    calls = _region_calls(monkeypatch)
    for step in range(WARM_CALLS + 3):
        x = torch.randn(2, 6, 16, device=device)
        xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
        out = compiled(xc)
        out.backward(torch.ones_like(out))
        got = [xc.grad, *(p.grad.clone() for p in block.parameters())]
        block.zero_grad()
        want = block(xe)
        want.backward(torch.ones_like(want))
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
        for g, w in zip(got, [xe.grad, *(p.grad for p in block.parameters())], strict=True):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
        block.zero_grad()
        if step == WARM_CALLS:  # the recorded call
            calls.clear()
    assert [g.kind for g in backend.graphs] == ["forward", "backward"]
    assert not calls, calls  # two specialized steps: no region was called as a region
    for bound in _bound_graphs(backend):
        assert bound.specialized is not None and bound.declined is None
        nodes = list(bound.specialized.graph.nodes)
        assert not any(isinstance(n.target, FusionRegion | ViewChain) for n in nodes), bound.code
        assert "_reinterpret_tensor" in bound.code, bound.code
    # The forward's head views around attention (not returned to autograd) are reinterpretations.
    assert not any(n.op == "call_method" for n in _bound_graphs(backend)[0].specialized.graph.nodes), \
        _bound_graphs(backend)[0].code


def _one_kernel_regions(x: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(x) * 3
    return torch.exp(F.scaled_dot_product_attention(s, s, s)) + 1


def test_regions_of_one_kernel_are_specialized_too(device: str, kernel_options: list[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A region whose program is one launch has a straight-line function like any other: a graph of
    such regions (a ConvNeXt block's first norm) is specialized, not run region by region for good."""
    backend = PyfuserBackend(enable_options=kernel_options)
    compiled = torch.compile(_one_kernel_regions, backend=backend)
    calls = _region_calls(monkeypatch)
    for _ in range(WARM_CALLS + 3):
        x = torch.randn(2, 3, 5, 8, device=device)
        torch.testing.assert_close(compiled(x), _one_kernel_regions(x))
    (bound,) = _bound_graphs(backend)
    assert bound.specialized is not None, bound.declined
    assert [r.summary().count(" kernel ") for r in backend.graphs[0].regions] == [1, 1]
    assert calls == ["pyfuser_region_0", "pyfuser_region_1"] * (WARM_CALLS + 1)  # none once specialized


def test_the_graph_runs_as_one_function_with_its_regions_bodies_in_place(
        device: str, kernel_options: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A specialized graph is one generated function: each region's body is written in place of its call
    (its straight-line function, which the region would call, is never called), and a launch reading a
    value the graph computed itself (attention's output) has no alignment check, unlike one reading the
    graph's input, whose offset may change."""
    straight_line = FusionRegion.straight_line

    def uncallable(self: FusionRegion, arguments: Any) -> RegionFunction | None:
        function = straight_line(self, arguments)

        def called(*args: Any) -> Any:
            raise AssertionError(f"{self.name}'s straight-line function was called")

        return function if function is None else dataclasses.replace(function, run=called)

    monkeypatch.setattr(FusionRegion, "straight_line", uncallable)
    backend = PyfuserBackend(enable_options=kernel_options)
    compiled = torch.compile(_one_kernel_regions, backend=backend)
    for _ in range(WARM_CALLS + 3):
        x = torch.randn(2, 3, 5, 8, device=device)
        torch.testing.assert_close(compiled(x), _one_kernel_regions(x))
    (bound,) = _bound_graphs(backend)
    assert bound.declined is None and bound.specialized is not None, bound.declined
    code = bound.code
    assert code.count("def ") == 1 and "r0_v" in code and "r1_v" in code, code
    checked = [line for line in code.splitlines() if "data_ptr()" in line]
    assert len(checked) == 1 and "r0_v" in checked[0], code  # the input's read, not attention's output


def _attention_of_input(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Eager views of the graph's input (feeding attention), a region after it, and a returned view of
    an intermediate (aliasing AOTAutograd tracks: it stays a view)."""
    s = torch.sigmoid(x)
    q = x.view(x.shape[0], 6, 2, 4).transpose(1, 2)
    attention = F.scaled_dot_product_attention(q, q, q)
    return torch.exp(attention.transpose(1, 2).reshape(x.shape)).sum(-1), s.transpose(0, 2)


def _check(compiled: Any, x: torch.Tensor) -> None:
    for got, want in zip(compiled(x), _attention_of_input(x), strict=True):
        assert got.shape == want.shape and got.stride() == want.stride()
        torch.testing.assert_close(got, want)


def test_inputs_at_other_offsets_or_strides() -> None:
    """A specialized graph reinterprets views of its input relative to the input's storage offset (an
    input sliced from a larger buffer); a call whose input has other strides (a size-1 axis's, which
    an incoming gradient may have) runs the graph as compiled, and the specialized copy stays."""
    backend = PyfuserBackend(triton_interpreter=True)
    compiled = torch.compile(_attention_of_input, backend=backend)
    for _ in range(WARM_CALLS + 1):
        _check(compiled, torch.randn(1, 6, 8))
    (bound,) = _bound_graphs(backend)
    assert bound.specialized is not None, bound.declined
    assert "transpose" in bound.code, bound.code  # the returned view of ``s`` stays a view
    assert bound.code.count("_reinterpret_tensor(") == 2, bound.code  # the head views before and after attention
    big = torch.randn(200)
    for offset in (5, 17):
        _check(compiled, big[offset:offset + 48].view(1, 6, 8))
    other = torch.randn(6, 1, 8).transpose(0, 1)
    assert other.shape == (1, 6, 8) and other.stride() != (48, 8, 1)
    got = bound([other])
    for g, w in zip(got, _attention_of_input(other), strict=True):
        torch.testing.assert_close(g, w)
    assert bound.specialized is not None and bound.declined is None


def _check_bound(bound: BoundGraph, x: torch.Tensor) -> None:
    for got, want in zip(bound([x]), _attention_of_input(x), strict=True):
        torch.testing.assert_close(got, want)


def _strided(stride: int) -> torch.Tensor:
    """An input of the graph's sizes whose size-1 axis has the stride ``stride`` (another signature)."""
    return torch.randn(48).as_strided((1, 6, 8), (stride, 8, 1))


def test_a_second_signature_gets_its_own_specialized_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inputs of other strides than the recorded call's (an incoming gradient may have them) are warmed
    up, recorded and specialized on their own: then calls of either signature run their copy."""
    backend = PyfuserBackend(triton_interpreter=True)
    compiled = torch.compile(_attention_of_input, backend=backend)
    for _ in range(WARM_CALLS + 1):
        _check(compiled, torch.randn(1, 6, 8))
    (bound,) = _bound_graphs(backend)
    calls = _region_calls(monkeypatch)
    for _ in range(WARM_CALLS + 1):
        _check_bound(bound, _strided(5))
    assert calls, "the second signature's warm-up calls run the graph as compiled"
    calls.clear()
    for x in (torch.randn(1, 6, 8), _strided(5), torch.randn(1, 6, 8), _strided(5)):
        _check_bound(bound, x)
    assert not calls, calls
    assert [s.graph is not None for s in bound.signatures.values()] == [True, True], bound.signatures
    assert bound.declined is None


def test_signatures_beyond_the_limit_forget_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    """One signature more than ``SPECIALIZATION_LIMIT`` forgets the graph's specialized copies and its
    regions' bindings (a caller cycling through strides costs recordings, not memory); a forgotten
    signature is warmed up and specialized again."""
    monkeypatch.setattr(specialization, "SPECIALIZATION_LIMIT", 2)
    backend = PyfuserBackend(triton_interpreter=True)
    compiled = torch.compile(_attention_of_input, backend=backend)
    _check(compiled, torch.randn(1, 6, 8))
    (bound,) = _bound_graphs(backend)
    for stride in (48, 5, 7):
        for _ in range(WARM_CALLS + 1):
            _check_bound(bound, _strided(stride))
        assert all(s.graph is not None for s in bound.signatures.values()), bound.signatures
    assert len(bound.signatures) == 1
    assert all(len(r._bound) == 1 for r in backend.graphs[0].regions)
    calls = _region_calls(monkeypatch)
    for _ in range(WARM_CALLS + 2):
        _check_bound(bound, _strided(48))
    assert len(calls) == WARM_CALLS + 1 and len(bound.signatures) == 2, calls


def test_a_failing_specialized_graph_runs_as_compiled() -> None:
    """An error inside the specialized copy: the call runs the graph as compiled (whose regions report
    errors naming their FX nodes), with a warning, and so do the calls after it."""
    backend = PyfuserBackend(triton_interpreter=True)
    compiled = torch.compile(_attention_of_input, backend=backend)
    for _ in range(WARM_CALLS + 1):
        _check(compiled, torch.randn(1, 6, 8))
    (bound,) = _bound_graphs(backend)

    def failing(*args: Any) -> Any:
        raise RuntimeError("injected")

    bound._run = failing
    with pytest.warns(UserWarning, match="the specialized graph failed .*injected.*runs as compiled from now on"):
        _check(compiled, torch.randn(1, 6, 8))
    assert bound.specialized is None and "injected" in (bound.declined or "")
    _check(compiled, torch.randn(1, 6, 8))


def test_graphs_of_symbolic_sizes_are_specialized_per_concrete_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Symbolic sizes (the size symbols are graph inputs, the regions take them as scalars): each
    concrete call's sizes get their own warm-up, recording and specialized copy, in which regions run
    bound to those sizes; calls alternating between sizes match eager's outputs and strides."""
    backend = PyfuserBackend(triton_interpreter=True)
    compiled = torch.compile(_attention_of_input, backend=backend, dynamic=True)
    calls = _region_calls(monkeypatch)
    sizes = [2, 3]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(WARM_CALLS + 1):
            for batch in sizes:
                _check(compiled, torch.randn(batch, 6, 8))
        calls.clear()
        for _ in range(2):
            for batch in sizes:
                _check(compiled, torch.randn(batch, 6, 8))
    (bound,) = _bound_graphs(backend)
    assert bound.declined is None and len(bound.signatures) == len(sizes), bound.declined
    assert all(s.function is not None for s in bound.signatures.values()), [s.why for s in bound.signatures.values()]
    assert not calls, calls  # every call ran a specialized copy


def test_views_of_data_dependent_results_follow_the_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """A value whose sizes depend on the data (``nonzero``) and a view of it: new data every call gives
    eager's results (the graph is never specialized to one call's sizes)."""
    monkeypatch.setattr(torch._dynamo.config, "capture_dynamic_output_shape_ops", True)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.nonzero(x > 0).t()
        return torch.sigmoid(x) * 2, torch.sort(positions.float() * 3, dim=1).values

    backend = PyfuserBackend(triton_interpreter=True)
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    for _ in range(WARM_CALLS + 3):
        x = torch.randn(4, 5)
        for got, want in zip(compiled(x), fn(x), strict=True):
            torch.testing.assert_close(got, want)
    assert _bound_graphs(backend)[0].specialized is None


def test_ops_left_in_eager_call_torchs_own_function() -> None:
    """An ATen op whose torch function means that op alone runs through it in the specialized graph
    (``torch.convolution``, as Inductor's extern call); ops whose function could pick another overload
    (``add``: Tensor or Scalar; ``mm``: an ``out_dtype`` overload) or that torch exposes no function of
    keep their overload."""
    aten = torch.ops.aten
    assert direct_function(aten.convolution.default) is torch.convolution
    assert direct_function(aten.topk.default) is torch.topk  # its other overload, ``values``, is out=
    assert direct_function(aten.add.Tensor) is None and direct_function(aten.mm.default) is None
    assert direct_function(aten.convolution_backward.default) is None
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1))
    backend = PyfuserBackend()
    compiled = torch.compile(conv, backend=backend)
    with torch.no_grad():
        for _ in range(WARM_CALLS + 2):
            x = torch.randn(2, 3, 9, 7)
            torch.testing.assert_close(compiled(x), conv(x))
    (bound,) = _bound_graphs(backend)
    assert bound.code.count("torch_convolution(") == 2 and "aten_convolution" not in bound.code, bound.code


def test_batch_norm_statistics_saved_for_the_backward_are_reinterpretations() -> None:
    """Batch norm in training saves its mean and inverse deviation squeezed over several axes
    (``squeeze.dims``): in the specialized forward each is a reinterpretation, not an ATen call a step
    (53 a ResNet-50 step), and the step matches eager's, running statistics included."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    reference = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    reference.load_state_dict(model.state_dict())
    exact = copy.deepcopy(reference).double()
    backend = PyfuserBackend(triton_interpreter=True)
    compiled = torch.compile(model, backend=backend)
    for _ in range(WARM_CALLS + 2):
        x = torch.randn(2, 3, 6, 6)
        compiled(x).square().sum().backward()
        reference(x).square().sum().backward()
        exact(x.double()).square().sum().backward()
    for (name, got), want in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        torch.testing.assert_close(got, want, msg=name)
    # The conv's bias gradient is 0 through a training batch norm: both float32 steps give rounding noise
    # of a few 1e-6, so each gradient is held to its distance from the float64 step beside eager's.
    for p, q, e in zip(model.parameters(), reference.parameters(), exact.parameters(), strict=True):
        ours, eagers = (p.grad.double() - e.grad).abs().max(), (q.grad.double() - e.grad).abs().max()
        assert ours <= 4 * eagers + 1e-6 * e.grad.abs().max(), (ours, eagers)
    forward = _bound_graphs(backend)[0].specialized
    assert forward is not None
    squeezes = [n for n in forward.graph.nodes if n.target in (torch.ops.aten.squeeze.dims, "squeeze")]
    assert not squeezes, _bound_graphs(backend)[0].code  # (a view chain of a weight stays: autograd sees it)


class FusedProjections(torch.nn.Module):
    """Phi-3's and GPT-2's fused projection: one GEMM whose output is split into q, k and v in eager, each
    piece viewed into heads for attention (which reads them from memory)."""

    def __init__(self, hidden: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(hidden, dim=-1))
        return F.scaled_dot_product_attention(q, k, v).sigmoid()


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_pieces_of_a_split_are_reinterpretations(training: bool) -> None:
    """A split left in eager (its pieces taken by index) is, in the specialized graph, one
    reinterpretation per piece and no split call; results and gradients match eager's."""
    torch.manual_seed(0)
    model, reference = FusedProjections(), FusedProjections()
    reference.load_state_dict(model.state_dict())
    backend = PyfuserBackend(triton_interpreter=True)
    compiled = torch.compile(model, backend=backend)
    for _ in range(WARM_CALLS + 2):
        x = torch.randn(2, 5, 8)
        with torch.set_grad_enabled(training):
            got, want = compiled(x), reference(x)
        torch.testing.assert_close(got, want)
        if training:
            got.sum().backward()
            want.sum().backward()
    if training:
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)
    forward = _bound_graphs(backend)[0]
    assert forward.specialized is not None, forward.declined
    splits = [n for n in forward.specialized.graph.nodes if "split" in str(n.target)]
    assert not splits, forward.code
