"""The torch.compile backend's behaviour: layouts, dynamic sizes without recompilation, graph breaks,
ops left in eager (with why), errors naming FX nodes, options, and the fx_graph dump."""

from __future__ import annotations

import copy
import importlib.metadata
import re

import pytest
import torch
import torch._dynamo
from torch.fx.experimental.proxy_tensor import make_fx

from pyfuser.codegen import launcher as launcher_module
from pyfuser.codegen.kernel_source import KernelLaunchError
from pyfuser.host_ir.evaluator import HostIrEvaluator
from pyfuser.host_ir.nodes import AtenCall
from pyfuser.integrations.torch_compile import LOWERINGS, PyfuserBackend, pyfuser_backend
from pyfuser.integrations.torch_compile.backend import CompiledGraph
from pyfuser.integrations.torch_compile.bound_graph import WARM_CALLS
from pyfuser.integrations.torch_compile.eager_methods import METHODS
from pyfuser.integrations.torch_compile.graph_replay import capturable
from pyfuser.integrations.torch_compile.lowering import Lowering
from pyfuser.integrations.torch_compile.region import FusionRegion, KernelFallbackWarning
from pyfuser.integrations.torch_compile.view_chains import ViewChain, collapse_view_chains
from pyfuser.integrations.torch_compile.view_pairs import drop_detaches, drop_transpose_pairs
from pyfuser.runtime import executor as executor_module
from pyfuser.runtime.executor import FusionExecutorCache
from tests.conftest import devices

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


def pointwise_and_reduce(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    z = torch.sigmoid(x * y + 1)
    return z - z.sum(-1, keepdim=True) / 3


def compile_counts(backend: PyfuserBackend) -> list[int]:
    return [r.fec.compile_count for g in backend.graphs for r in g.regions]


@pytest.mark.parametrize("device", devices())
def test_layouts_match_eager(device: str) -> None:
    """Permuted, sliced, expanded, broadcast, non-divisible and empty inputs, each through the backend."""
    base = torch.randn(13, 7, device=device)
    cases = {
        "contiguous": (torch.randn(7, 13, device=device), torch.randn(13, device=device)),
        "permuted": (base.t(), torch.randn(13, device=device)),
        "sliced": (torch.randn(7, 30, device=device)[:, 3:16], torch.randn(13, device=device)),
        "expanded": (torch.randn(7, 1, device=device).expand(7, 13), torch.randn(1, 13, device=device)),
        "empty": (torch.randn(0, 13, device=device), torch.randn(13, device=device)),
    }
    for name, (x, y) in cases.items():
        torch._dynamo.reset()
        got = torch.compile(pointwise_and_reduce, backend=PyfuserBackend())(x, y)
        torch.testing.assert_close(got, pointwise_and_reduce(x, y), msg=lambda m, name=name: f"{name}: {m}")


def test_region_outputs_keep_traced_strides() -> None:
    """A region's output has the strides torch's meta functions gave it (a transpose stays a transpose)."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).t().contiguous() * 3 + (x + 1).t()

    x = torch.randn(5, 6)
    got = torch.compile(fn, backend=PyfuserBackend())(x)
    want = fn(x)
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride()


def test_dynamic_sizes_compile_once() -> None:
    """Sizes dynamo marks dynamic become symbolic fusion sizes: new sizes neither re-trace nor
    recompile a region, forward or backward."""
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        flat = (x * y).reshape(x.shape[0] * 2, -1)
        return torch.tanh(flat).sum(0) + flat.mean()

    backend = PyfuserBackend()
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for rows, cols in ((4, 6), (6, 10), (10, 4)):
        x = torch.randn(rows, cols, dtype=torch.float64, requires_grad=True)
        y = torch.randn(cols, dtype=torch.float64, requires_grad=True)
        got = compiled(x, y)
        got.sum().backward()
        gx, gy = x.grad, y.grad
        x.grad = y.grad = None
        want = fn(x, y)
        want.sum().backward()
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(gx, x.grad)
        torch.testing.assert_close(gy, y.grad)
    assert [g.kind for g in backend.graphs] == ["forward", "backward"]
    assert compile_counts(backend) and all(c == 1 for c in compile_counts(backend))


def test_automatic_dynamic_recompiles_once() -> None:
    """Without dynamic=True dynamo specializes the first sizes, then marks them dynamic: two
    compilations, then none."""
    backend = PyfuserBackend()
    compiled = torch.compile(pointwise_and_reduce, backend=backend)
    for n in (5, 8, 11, 3):
        x, y = torch.randn(n, 6), torch.randn(6)
        torch.testing.assert_close(compiled(x, y), pointwise_and_reduce(x, y))
    assert len(backend.graphs) == 2
    assert all(c == 1 for c in compile_counts(backend))


def test_python_int_is_a_scalar_input() -> None:
    """An int argument dynamo makes symbolic is a scalar input of the fusion: new values reuse the program."""
    def fn(x: torch.Tensor, n: int) -> torch.Tensor:
        return torch.relu(x * n - 3)

    backend = PyfuserBackend()
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    x = torch.randn(4, 5)
    for n in (2, 3, 7):
        torch.testing.assert_close(compiled(x, n), fn(x, n))
    assert len(backend.graphs) == 1
    region = backend.graphs[0].regions[0]
    assert any(v.__class__.__name__ == "Scalar" for v in region.fd.fusion.inputs())
    assert region.fec.compile_count == 1


def test_python_float_is_an_input() -> None:
    """A float argument (dynamo passes it as a 0-dim tensor) is an input too: new values recompile nothing."""
    backend = PyfuserBackend()
    compiled = torch.compile(lambda x, a: torch.relu(x * a - 1), backend=backend, dynamic=True)
    x = torch.randn(4, 5)
    for a in (0.5, 1.5, 2.5):
        torch.testing.assert_close(compiled(x, a), torch.relu(x * a - 1))
    assert len(backend.graphs) == 1 and backend.graphs[0].regions[0].fec.compile_count == 1


def test_graph_break_compiles_each_graph() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = torch.exp(x) * 2
        torch._dynamo.graph_break()
        return torch.sin(y) + y.sum()

    backend = PyfuserBackend()
    x = torch.randn(3, 4)
    torch.testing.assert_close(torch.compile(fn, backend=backend)(x), fn(x))
    assert len(backend.graphs) == 2 and all(g.regions for g in backend.graphs)


def test_unsupported_op_stays_eager_with_a_reason(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = torch.cumprod(x * 2, 1)  # not in the op table
        return torch.sort(y, 1).values + y.exp()

    monkeypatch.setenv("PYFUSER_DUMP", "fx_graph")
    backend = PyfuserBackend()
    x = torch.randn(3, 4)
    torch.testing.assert_close(torch.compile(fn, backend=backend)(x), fn(x))
    graph = backend.graphs[0]
    assert graph.eager["cumprod"] == "aten.cumprod.default is not in the backend's op table"
    assert graph.eager["sort"] == "aten.sort.default is not in the backend's op table"
    assert len(graph.regions) == 2  # x * 2 before cumprod; exp and add after it
    dumped = capsys.readouterr().out
    assert "=== pyfuser fx_graph: inference graph 0: 2 region(s)" in dumped
    assert re.search(r"eager +cumprod: float32\[3, 4\] = aten\.cumprod\.default\(mul, 1\) +# aten\.cumprod\.default "
                     r"is not in the backend's op table", dumped)
    assert re.search(r"region 0 +mul: float32\[3, 4\] = aten\.mul\.Tensor\(arg0_1, 2\)", dumped)
    assert "region 1: fusion inputs (" in dumped


def test_nothing_to_fuse_stays_eager() -> None:
    """Views alone are free in eager and a lone matmul is an ATen call either way: no region."""
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x.t().reshape(-1, 2) @ w).t()

    backend = PyfuserBackend()
    x, w = torch.randn(4, 3), torch.randn(2, 5)
    torch.testing.assert_close(torch.compile(fn, backend=backend)(x, w), fn(x, w))
    graph = backend.graphs[0]
    assert not graph.regions
    assert any("nothing to fuse" in why or "region's edge" in why for why in graph.eager.values())


def test_transposed_weights_are_read_in_place() -> None:
    """``mm(x, w.t())`` is ``linear(x, w)``: the weight is read as it is laid out, never copied
    transposed (also for a ``w`` the region computes)."""
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(torch.relu(x), w) * 2 + torch.nn.functional.linear(x, torch.sin(w))

    backend = PyfuserBackend()
    x, w = torch.randn(6, 4), torch.randn(5, 4)
    torch.testing.assert_close(torch.compile(fn, backend=backend)(x, w), fn(x, w))
    (region,) = backend.graphs[0].regions
    definition = repr(region.fd)
    assert "permute(" not in definition and definition.count("linear(") == 2


def test_translation_failure_leaves_the_node_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lowering that raises, or one that computes another dtype than torch, costs a region
    boundary and a reason, never an exception."""
    def broken(ctx: object, x: object) -> object:
        raise ValueError("no sine today")

    def wrong_dtype(ctx: object, x: object) -> object:
        return ctx.ops.cast(ctx.ops.cos(x), torch.float64)  # type: ignore[attr-defined]

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.cos(torch.sin(x * 2) + 1) * 3

    x = torch.randn(3, 4)
    monkeypatch.setitem(LOWERINGS, aten.sin.default, Lowering(broken))
    monkeypatch.setitem(LOWERINGS, aten.cos.default, Lowering(wrong_dtype))
    backend = PyfuserBackend()
    torch.testing.assert_close(torch.compile(fn, backend=backend)(x), fn(x))
    eager = backend.graphs[0].eager
    assert eager["sin"] == "translation failed: ValueError: no sine today"
    assert eager["cos"] == "translation failed: translated to dtype torch.float64, but torch computes torch.float32"

    def unforeseen(node: object) -> str | None:
        raise IndexError("tuple index out of range")

    torch._dynamo.reset()
    monkeypatch.setitem(LOWERINGS, aten.sin.default, Lowering(lambda ctx, x: ctx.ops.sin(x), check=unforeseen))
    backend = PyfuserBackend()
    torch.testing.assert_close(torch.compile(fn, backend=backend)(x), fn(x))
    assert backend.graphs[0].eager["sin"] == "its check failed: IndexError: tuple index out of range"


def test_runtime_error_names_region_and_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(self: HostIrEvaluator, *args: object, **kwargs: object) -> object:
        raise ValueError("input 0 (T0) axis 1: something is off with T1")

    x = torch.randn(3, 4)
    compiled = torch.compile(lambda x: torch.sin(x) * 2, backend=PyfuserBackend())
    compiled(x)
    # The program fails: on the region's second call it runs bound to its sizes, without the cache.
    monkeypatch.setattr(HostIrEvaluator, "run", fail)
    with pytest.raises(ValueError, match=r"pyfuser region pyfuser_region_0 \(FX nodes: sin \(aten\.sin\.default\), "
                                         r"mul \(aten\.mul\.Tensor\)\) failed: input 0 \(T0\) axis 1: something is "
                                         r"off with T1 \[T0 is arg0_1 \(input\); T1 is sin \(aten\.sin\.default\)\]"):
        compiled(x)


def test_kernel_failure_falls_back_to_aten_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """A region whose generated kernels fail runs its ops as ATen calls, with a warning naming it."""
    run = FusionExecutorCache.run

    def kernels_fail(self: FusionExecutorCache, args: object, **kwargs: object) -> object:
        if "kernel_codegen" not in kwargs.get("disable_options", ()):  # type: ignore[operator]
            raise ValueError("T2 loop domain does not cover logical IDs")
        return run(self, args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(FusionExecutorCache, "run", kernels_fail)
    compiled = torch.compile(lambda x: torch.sin(x) * 2, backend=PyfuserBackend(triton_interpreter=True))
    x = torch.randn(3, 4)
    with pytest.warns(KernelFallbackWarning, match=r"pyfuser region pyfuser_region_0 \(FX nodes: sin .*\) failed: T2 loop "
                                                   r"domain does not cover logical IDs \[T2 is mul \(aten\.mul\.Tensor\)\]; "
                                                   r"the region runs its ops as ATen calls from now on"):
        torch.testing.assert_close(compiled(x), torch.sin(x) * 2)
    torch.testing.assert_close(compiled(x), torch.sin(x) * 2)  # no second warning: the region stays on ATen


def test_fallback_warning_carries_the_refused_kernels_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel Triton refuses (a compile or launch error on a GPU) is reported with its source."""
    run = FusionExecutorCache.run

    def triton_refuses(self: FusionExecutorCache, args: object, **kwargs: object) -> object:
        if "kernel_codegen" not in kwargs.get("disable_options", ()):  # type: ignore[operator]
            cause = ValueError("Pointer argument (at 1) cannot be accessed from Triton (cpu tensor?)")
            raise KernelLaunchError("pointwise_kernel", "def pointwise_kernel(T0, T1):\n    pass\n", cause)
        return run(self, args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(FusionExecutorCache, "run", triton_refuses)
    compiled = torch.compile(lambda x: torch.sin(x) * 2, backend=PyfuserBackend(triton_interpreter=True))
    x = torch.randn(3, 4)
    with pytest.warns(KernelFallbackWarning) as caught:
        torch.testing.assert_close(compiled(x), torch.sin(x) * 2)
    (message,) = [str(w.message) for w in caught if w.category is KernelFallbackWarning]
    assert "generated kernel pointwise_kernel failed to compile or launch: ValueError: Pointer argument (at 1)" in message
    assert message.endswith("--- the source of pointwise_kernel ---\ndef pointwise_kernel(T0, T1):\n    pass\n")


def test_backend_options_are_checked() -> None:
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['cuda_graphs'\]; known: \['cuda_graph'"):
        PyfuserBackend.from_options({"cuda_graphs": True})
    with pytest.raises(ValueError, match=r"mode 'max-autotune' is not supported"):
        PyfuserBackend.from_options({}, mode="max-autotune")
    with pytest.raises(ValueError, match=r"_enable_options: unknown option\(s\) \['fast'\]"):
        PyfuserBackend(enable_options=["fast"])
    assert PyfuserBackend.from_options(None, mode="reduce-overhead").cuda_graph
    assert PyfuserBackend(enable_options=["cuda_graph"]).cuda_graph
    assert PyfuserBackend(triton_interpreter=True).enable_options == ("triton_interpreter",)


def test_options_reach_the_backend() -> None:
    x = torch.randn(3, 4)
    compiled = torch.compile(lambda x: torch.exp(x) + 1, backend=pyfuser_backend,
                             options={"triton_interpreter": True})
    torch.testing.assert_close(compiled(x), torch.exp(x) + 1)


def test_cuda_graph_option_is_plain_execution_on_cpu() -> None:
    backend = PyfuserBackend(cuda_graph=True)
    x = torch.randn(3, 4)
    torch.testing.assert_close(torch.compile(lambda x: torch.exp(x) + 1, backend=backend)(x), torch.exp(x) + 1)
    assert backend.graphs[0].regions[0].captures == 0


def test_inference_graph_under_no_grad() -> None:
    backend = PyfuserBackend()
    x = torch.randn(3, 4, requires_grad=True)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(lambda x: x.sin() * 2, backend=backend)(x), x.sin() * 2)
    assert [g.kind for g in backend.graphs] == ["inference"]


def test_registered_as_a_dynamo_backend() -> None:
    names = {e.name for e in importlib.metadata.entry_points(group="torch_dynamo_backends")}
    if "pyfuser" not in names:
        pytest.skip("pyfuser is not pip-installed with its torch_dynamo_backends entry point (scripts/dev.sh installs it)")
    x = torch.randn(3, 4)
    torch.testing.assert_close(torch.compile(lambda x: torch.cos(x) * 2, backend="pyfuser")(x), torch.cos(x) * 2)
    assert "pyfuser" in torch._dynamo.list_backends()


def _aten_calls(graph: CompiledGraph) -> list[str]:
    """The exprs a compiled graph's regions ran as ATen calls, by class name."""
    return [type(n.expr).__name__ for r in graph.regions for n in r.fec.last_program.container.walk()
            if isinstance(n, AtenCall)]


@pytest.mark.parametrize("bias", [False, True])
def test_linear_on_a_3d_input_reads_it_without_reshapes(bias: bool) -> None:
    """AOTAutograd lowers ``linear`` of a ``[B, S, K]`` input to ``view -> mm -> _unsafe_view`` (or
    ``addmm``'s decomposition): the region's GEMM reads the 3-D tensor and no reshape runs around it,
    forward and backward, and the results match eager."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 6, bias=bias)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(layer(torch.sigmoid(x)) * 2)

    x = torch.randn(2, 5, 8, requires_grad=True)
    backend = PyfuserBackend()
    got = torch.compile(fn, backend=backend)(x)
    want = fn(x)
    torch.testing.assert_close(got, want)
    grad = torch.randn_like(want)
    (got_dx,) = torch.autograd.grad(got, x, grad)
    (want_dx,) = torch.autograd.grad(want, x, grad)
    torch.testing.assert_close(got_dx, want_dx)
    (forward,) = [g for g in backend.graphs if g.kind == "forward"]
    calls = _aten_calls(forward)
    assert calls.count("ReshapeOp") <= 1, f"at most the flattened input saved for the weight's gradient: {calls}"
    assert any(c in ("MatmulOp", "LinearOp") for c in calls), calls
    with torch.no_grad():
        torch._dynamo.reset()
        backend = PyfuserBackend()
        torch.testing.assert_close(torch.compile(fn, backend=backend)(x), want)
    (inference,) = backend.graphs
    assert "ReshapeOp" not in _aten_calls(inference), _aten_calls(inference)


def test_a_graph_with_a_cpu_tensor_is_not_captured_whole() -> None:
    """A CPU tensor in a graph would be computed once, at capture: the backend does not replay such a
    graph whole (its regions replay graphs of their own), and the reason names the node."""
    gm = make_fx(lambda x: x * 2, tracing_mode="fake")(torch.randn(2))
    assert capturable(gm) == "x_1 is a cpu tensor"


def test_the_compiled_graph_is_called_without_module_dispatch() -> None:
    """The forward AOTAutograd calls is the graph's generated code itself: torch.fx's lazily
    recompiled module would route every call through ``nn.Module.__call__`` (14 of 47 us of host
    time per call of a one-kernel graph)."""
    backend = PyfuserBackend()
    compiled = torch.compile(lambda t: t * 2 + 1, backend=backend)
    x = torch.randn(16)
    torch.testing.assert_close(compiled(x), x * 2 + 1)
    gm = backend.graphs[0].graph_module
    assert type(gm).forward is not getattr(type(gm), "_lazy_forward", None)
    calls = []
    gm.register_forward_pre_hook(lambda module, args: calls.append(1))
    torch.testing.assert_close(compiled(x), x * 2 + 1)
    assert calls == []


def _count_cache_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Calls of ``FusionExecutorCache.run`` from now on (one element each)."""
    calls: list[int] = []
    run = FusionExecutorCache.run

    def counted(self: FusionExecutorCache, *args: object, **kwargs: object) -> object:
        calls.append(1)
        return run(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(FusionExecutorCache, "run", counted)
    return calls


def test_static_regions_run_their_bound_program(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a graph of static shapes, a region's calls after the first skip the executor cache (its
    signature, lookup and binding) and still match eager, forward and backward; inputs of other
    strides go back through the cache, which validates them."""
    calls = _count_cache_runs(monkeypatch)
    backend = PyfuserBackend()
    compiled = torch.compile(pointwise_and_reduce, backend=backend)
    x, y = torch.randn(5, 6), torch.randn(6)
    for grad in (torch.randn(5, 6), torch.randn(5, 6), torch.randn(6, 5).t()):
        xs, ys = x.clone().requires_grad_(), y.clone().requires_grad_()
        got = compiled(xs, ys)
        got.backward(grad)
        xe, ye = x.clone().requires_grad_(), y.clone().requires_grad_()
        want = pointwise_and_reduce(xe, ye)
        want.backward(grad)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(xs.grad, xe.grad)
        torch.testing.assert_close(ys.grad, ye.grad)
    regions = [r for g in backend.graphs for r in g.regions]
    assert [g.kind for g in backend.graphs] == ["forward", "backward"] and len(regions) == 2
    assert all(r._bound for r in regions)
    # Forward: the first call only. Backward: the first, and the transposed gradient's unless AOTAutograd
    # made it contiguous as traced.
    assert 2 <= len(calls) <= 3, len(calls)
    graph = backend.graphs[0]
    (call,) = [n for n in graph.graph_module.graph.nodes if n.target is graph.regions[0]]
    values = [a.meta["val"] for a in call.args]
    column_major = [torch.randn(v.shape[::-1]).t() if v.dim() == 2 else torch.randn(v.shape) for v in values]
    assert any(t.stride() != v.stride() for t, v in zip(column_major, values, strict=True))
    before = len(calls)
    with pytest.raises(ValueError, match=r"input 0 \(T0\) axis 1: declared contiguous, so its stride must be 1"):
        graph.regions[0](*column_major)  # the cache's path validates what the bound program would misread
    assert len(calls) > before


def test_dynamic_regions_bind_each_concrete_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    """With symbolic sizes a region binds each call's concrete sizes (and size scalars): the first call
    of each goes through the executor cache, a later call of the same sizes runs its bound program."""
    calls = _count_cache_runs(monkeypatch)
    backend = PyfuserBackend()
    compiled = torch.compile(pointwise_and_reduce, backend=backend, dynamic=True)
    for n in (4, 7, 7, 4, 9):
        x, y = torch.randn(n, 6), torch.randn(6)
        torch.testing.assert_close(compiled(x, y), pointwise_and_reduce(x, y))
    (region,) = backend.graphs[0].regions
    assert len(region._bound) == 3 and len(calls) == 3


def test_eager_views_are_tensor_method_calls_and_chains_one_call() -> None:
    """Views left in eager between regions are called as tensor methods (the same ATen ops, without
    ``OpOverload.__call__``), a chain of them (the head reshape around attention) as one ``ViewChain``
    call; the graph still matches eager, call after call."""
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # attention stays eager: the head views around it too
        s = torch.sigmoid(x)
        q = s.view(2, 6, 2, 4).transpose(1, 2)
        attention = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        return torch.exp(attention.transpose(1, 2).reshape(2, 6, 8)).sum(-1), s.transpose(0, 2)

    backend = PyfuserBackend()
    compiled = torch.compile(fn, backend=backend)
    for _ in range(3):
        x = torch.randn(2, 6, 8)
        for got, want in zip(compiled(x), fn(x), strict=True):
            torch.testing.assert_close(got, want)
    gm = backend.graphs[0].graph_module
    chains = [n.target for n in gm.graph.nodes if isinstance(n.target, ViewChain)]
    assert len(chains) == 2 and all(c._root is not None for c in chains), gm.code
    assert [n.target for n in gm.graph.nodes if n.op == "call_method"] == ["transpose"], gm.code
    assert not any(n.target in METHODS for n in gm.graph.nodes if n.op == "call_function"), gm.code


def test_a_view_chain_reinterprets_its_root_or_runs_its_views() -> None:
    """After its first call a chain makes its result as one reinterpretation of a root of the same
    sizes and strides (at any storage offset); a root of other strides runs the views; a chain whose
    result copied (a reshape of a transpose) runs its views on every call."""
    chain = ViewChain("c", [(aten.view.default, ([2, 3, 4],)), (aten.transpose.int, (0, 2)),
                            (aten.select.int, (1, 1))])
    big = torch.randn(40)
    for offset in (0, 3, 16):
        root = big[offset:offset + 24].view(6, 4)
        got = chain(root)
        want = root.view(2, 3, 4).transpose(0, 2).select(1, 1)
        assert (got.shape, got.stride(), got.storage_offset()) == (want.shape, want.stride(), want.storage_offset())
        assert got.untyped_storage().data_ptr() == root.untyped_storage().data_ptr()
        torch.testing.assert_close(got, want)
    assert chain._root is not None
    other = torch.randn(6, 8)[:, 2:6]  # other strides: the views run
    got, want = chain(other), other.view(2, 3, 4).transpose(0, 2).select(1, 1)
    assert got.stride() == want.stride() != chain._result[1]
    torch.testing.assert_close(got, want)
    copying = ViewChain("c", [(aten.t.default, ()), (aten.reshape.default, ([24],))])
    for _ in range(2):
        root = torch.randn(6, 4)
        torch.testing.assert_close(copying(root), root.t().reshape(24))
    assert copying._root is None


def test_view_chains_end_where_a_value_has_other_readers_or_is_returned() -> None:
    """A chain ends at a view something else reads too; one ending in a protected output (whose
    aliasing AOTAutograd tracks) stays as its views; the graph computes what it did."""
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = aten.view.default(x, [4, 6])
        b = aten.t.default(a)
        c = aten.unsqueeze.default(b, 0)
        return aten.expand.default(c, [2, 6, 4]) + 1, b * 2, aten.permute.default(aten.view.default(x, [6, 4]), [1, 0])

    x = torch.randn(24)
    want = fn(x)
    gm = make_fx(fn, tracing_mode="fake")(x)
    protected = {n for n in gm.graph.nodes if n.target is aten.permute.default}
    assert collapse_view_chains(gm, protected) == 2, gm.code
    gm.recompile()
    chains = [n.target for n in gm.graph.nodes if isinstance(n.target, ViewChain)]
    assert sorted(len(c.ops) for c in chains) == [2, 2], gm.code  # view -> t, then unsqueeze -> expand
    for _ in range(2):
        for got, expected in zip(gm(x), want, strict=True):
            torch.testing.assert_close(got, expected)
    assert any(n.target is aten.permute.default for n in gm.graph.nodes), gm.code


@pytest.mark.parametrize("op, args", [
    (aten.view.default, ([3, 4],)), (aten.t.default, ()), (aten.transpose.int, (0, 1)),
    (aten.permute.default, ([1, 0],)), (aten.unsqueeze.default, (1,)), (aten.squeeze.dim, (1,)),
    (aten.select.int, (1, 2)), (aten.expand.default, ([2, 12, 4],)), (aten.detach.default, ()),
])
def test_view_methods_are_their_ops(op: torch._ops.OpOverload, args: tuple[object, ...]) -> None:
    """Each method the rewrite calls gives what its ATen op gives: values, sizes, strides, offset, storage."""
    base = torch.randn(3, 12, 4)[1:, :, 1] if op is not aten.expand.default else torch.randn(12, 4)[::1]
    if op is aten.view.default:
        base = torch.randn(12)
    if op is aten.squeeze.dim:
        base = torch.randn(6, 1, 2)
    want = op(base, *args)
    got = getattr(base, METHODS[op])(*args)
    assert (got.shape, got.stride(), got.storage_offset()) == (want.shape, want.stride(), want.storage_offset())
    assert got.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    torch.testing.assert_close(got, want)


def test_transposes_that_undo_each_other_are_dropped() -> None:
    """``t(t(w))`` and ``transpose(transpose(x, 0, -1), 2, 0)`` read ``w`` and ``x``; a pair the graph
    returns stays when outputs are kept; a single transpose stays."""
    def fn(w: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.transpose(0, -1).transpose(2, 0) + 1, w.t().t() * 2, w.t().t(), w.t())

    w, x = torch.randn(3, 4), torch.randn(2, 3, 5)
    want = fn(w, x)
    for outputs in (True, False):
        gm = make_fx(fn, tracing_mode="fake")(w, x)
        dropped = drop_transpose_pairs(gm, outputs=outputs)
        gm.recompile()
        assert dropped == (3 if outputs else 2), gm.code
        for got, expected in zip(gm(w, x), want, strict=True):
            torch.testing.assert_close(got, expected)
            assert got.stride() == expected.stride()
        transposes = [n for n in gm.graph.nodes if n.target in (aten.t.default, aten.transpose.int)]
        assert len(transposes) == (1 if outputs else 3), gm.code


def test_detaches_are_dropped_and_a_returned_one_reads_the_tensor_itself() -> None:
    """Uses of ``detach(detach(x))`` read ``x``; a returned ``detach`` stays when outputs are kept,
    as one ``detach`` of ``x``."""
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        d = aten.detach.default(aten.detach.default(x * 2))
        return d + 1, aten.detach.default(d)

    x = torch.randn(3, 4)
    want = fn(x)
    for outputs in (True, False):
        gm = make_fx(fn, tracing_mode="fake")(x)
        dropped = drop_detaches(gm, outputs=outputs)
        gm.recompile()
        detaches = [n for n in gm.graph.nodes if n.target is aten.detach.default]
        assert dropped == (3 if outputs else 2) and len(detaches) == (0 if outputs else 1), gm.code
        assert all(n.args[0].target is aten.mul.Tensor for n in detaches), gm.code
        for got, expected in zip(gm(x), want, strict=True):
            torch.testing.assert_close(got, expected)


def test_a_training_step_keeps_no_transpose_pairs_in_eager() -> None:
    """The backward of linear layers reads the weights the forward transposed without transposing
    them back in eager, and its gradients match eager's."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.GELU(), torch.nn.Linear(16, 8))
    backend = PyfuserBackend()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(4, 8)
    compiled(x).square().sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().sum().backward()
    for g, p in zip(got, model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad)
    backward = next(g for g in backend.graphs if g.kind == "backward").graph_module
    transposes = [n for n in backward.graph.nodes if n.op == "call_method" and n.target == "t"]
    pairs = [n for n in transposes if isinstance(n.args[0], torch.fx.Node) and n.args[0] in transposes]
    assert not pairs, backward.code


def test_views_of_returned_values_are_taken_in_eager() -> None:
    """A region that would return a value and views of it (a chain, too) returns the value only: the
    views are taken outside from it, share its memory as in eager, and its program copies nothing."""
    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.sigmoid(x) * w + 1
        flat = y.view(12, 4)
        return y, flat, flat.t(), (flat * 2).sum(0)

    backend = PyfuserBackend()
    x, w = torch.randn(3, 4, 4), torch.randn(4)
    compiled = torch.compile(fn, backend=backend)
    for _ in range(2):
        got, want = compiled(x, w), fn(x, w)
        for g, e in zip(got, want, strict=True):
            torch.testing.assert_close(g, e)
            assert g.stride() == e.stride()
        assert len({t.untyped_storage().data_ptr() for t in got[:3]}) == 1  # as eager's views
    (graph,) = backend.graphs
    (region,) = graph.regions
    assert not region.fec.last_program._check_sharing, str(region.fec.last_program)
    eager = [n.target for n in graph.graph_module.graph.nodes if n.op == "call_method"]
    assert "view" in eager and "t" in eager, graph.graph_module.code


def test_a_weight_transposed_at_a_region_edge_is_read_by_the_region() -> None:
    """The weight's ``t`` (and the input's flattening view) at a region's edge that only the region's
    matmul reads stay in the region, whose translation folds them (``linear(x, w)``): no eager op runs
    for them, and the layer matches eager, with and without a bias."""
    torch.manual_seed(0)
    for bias in (False, True):
        torch._dynamo.reset()
        layer = torch.nn.Linear(8, 6, bias=bias)
        x = torch.randn(2, 5, 8)
        backend = PyfuserBackend()
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(lambda t, f=layer: torch.relu(f(t)), backend=backend)(x),
                                       torch.relu(layer(x)))
        (graph,) = backend.graphs
        assert not graph.eager, graph.graph_module.code
        (region,) = graph.regions
        assert "linear(" in repr(region.fd) and "permute(" not in repr(region.fd), repr(region.fd)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_batch_norm_training_steps_match_eager(dtype: torch.dtype) -> None:
    """Conv, BatchNorm and ReLU in train mode, forward and backward, four steps: outputs, gradients and
    running statistics as eager's. Batch norm in training is decomposed (statistics as reductions, the
    normalization and the running statistics' update fused with their neighbours, no ATen batch-norm
    call); in bfloat16 its rounding differs from ATen's kernel, so each result's error against a float64
    copy of the model is held to a few times eager's own."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).to(dtype).train()
    reference = copy.deepcopy(model)
    exact = copy.deepcopy(model).double()
    backend = PyfuserBackend()
    compiled = torch.compile(model, backend=backend)

    def close(got: torch.Tensor, want: torch.Tensor, truth: torch.Tensor, what: str) -> None:
        if dtype == torch.float32:
            torch.testing.assert_close(got, want, msg=lambda m: f"{what}: {m}")
            return
        assert got.dtype == want.dtype, what
        error = (got.double() - truth).abs().max().item()
        eager = (want.double() - truth).abs().max().item()
        scale = truth.abs().max().item()
        assert error <= 4 * eager + 1e-3 * scale, f"{what}: error {error:.3g} against eager's {eager:.3g} (scale {scale:.3g})"

    for step in range(WARM_CALLS + 2):
        x = torch.randn(2, 3, 10, 9, dtype=dtype)
        xs = [x.clone().requires_grad_(), x.clone().requires_grad_(), x.double().requires_grad_()]
        got, want, truth = compiled(xs[0]), reference(xs[1]), exact(xs[2])
        grad = torch.randn_like(want)
        got.backward(grad)
        want.backward(grad)
        truth.backward(grad.double())
        close(got, want, truth, f"step {step} output")
        close(xs[0].grad, xs[1].grad, xs[2].grad, f"step {step} input gradient")
        for (name, p), q, r in zip(model.named_parameters(), reference.parameters(), exact.parameters(), strict=True):
            close(p.grad, q.grad, r.grad, f"step {step} gradient of {name}")
        for (name, b), c, d in zip(model.named_buffers(), reference.buffers(), exact.buffers(), strict=True):
            close(b, c, d, f"step {step} buffer {name}")
    calls = [n.target for g in backend.graphs for n in g.graph_module.graph.nodes if n.op == "call_function"]
    assert not any("batch_norm" in str(t) for t in calls), calls


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_batch_norm_in_eval_mode_is_pointwise_math_in_a_kernel(dtype: torch.dtype) -> None:
    """A ResNet block in eval mode: each batch norm is pointwise math with the running statistics,
    fused with the ReLU and the residual add into generated kernels (no ATen batch norm)."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4, 4, 3, padding=1)
    norm = torch.nn.BatchNorm2d(4)
    with torch.no_grad():
        norm.running_mean.uniform_(-1, 1)
        norm.running_var.uniform_(0.5, 2)
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    conv, norm = conv.to(dtype).eval(), norm.to(dtype).eval()

    def block(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(norm(conv(x)) + x)

    backend = PyfuserBackend()
    x = torch.randn(2, 4, 7, 5, dtype=dtype).permute(0, 1, 3, 2)
    with torch.no_grad():
        got = torch.compile(block, backend=backend)(x)
        want = block(x)
    torch.testing.assert_close(got, want, **({"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {}))
    eager = [str(n) for g in backend.graphs for n in g.eager]
    regions = "".join(repr(r.fd) for g in backend.graphs for r in g.regions)
    assert not any("batch_norm" in e for e in eager), eager
    assert "batch_norm" not in regions and "rsqrt(" in regions, regions


@torch.library.custom_op("pyfuser_test::halve_to_bfloat16", mutates_args=())
def _halve_to_bfloat16(x: torch.Tensor) -> torch.Tensor:
    return (x / 2).to(torch.bfloat16)


@_halve_to_bfloat16.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)  # promises x's dtype: the kernel returns bfloat16


@torch.library.custom_op("pyfuser_test::halve_to_int", mutates_args=())
def _halve_to_int(x: torch.Tensor) -> torch.Tensor:
    return (x / 2).to(torch.int64)


@_halve_to_int.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)  # promises x's dtype: the kernel returns int64


@torch.library.custom_op("pyfuser_test::double_column_major", mutates_args=())
def _double_column_major(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).t().contiguous().t()


@_double_column_major.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)  # promises row-major


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_eager_result_of_other_strides_than_traced_is_restrided(dtype: torch.dtype) -> None:
    """An op left in eager whose kernel lays its result out otherwise than its fake implementation
    promised (torch's convolution of a one-channel input: traced channels-last, computed contiguous):
    the region reading it, built for the traced strides, gets a copy in them on every call, also once
    the graph is specialized; its outputs are eager's."""
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.ops.pyfuser_test.double_column_major(x) * 3 + x
        return y, torch.softmax(y.float(), dim=-1)

    backend = PyfuserBackend()
    compiled = torch.compile(fn, backend=backend)
    for _ in range(WARM_CALLS + 2):
        x = torch.randn(6, 37, dtype=dtype)
        got = compiled(x)
        want = fn(x)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)
    (graph,) = backend.graphs
    (region,) = graph.regions
    assert region.converted_inputs == ["double_column_major: strides (1, 6) -> (37, 1)"]
    assert graph.bound is not None and graph.bound.specialized is not None, graph.bound.declined


def test_an_eager_result_of_another_dtype_than_traced_is_converted_to_it() -> None:
    """An op left in eager whose kernel returns another floating-point dtype than its fake
    implementation promised: the region reading it converts the value to the traced dtype (the graph
    after it expects what the traced dtypes compute), on every call, also once the graph is
    specialized. Another kind of mismatch (an integer for a float) is an error naming the FX node."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.pyfuser_test.halve_to_bfloat16(x) * 3 + x

    backend = PyfuserBackend()
    compiled = torch.compile(fn, backend=backend)
    for _ in range(WARM_CALLS + 2):
        x = torch.randn(5, 7)
        got = compiled(x)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, (x / 2).to(torch.bfloat16).float() * 3 + x, rtol=0, atol=0)
    (graph,) = backend.graphs
    (region,) = graph.regions
    assert region.converted_inputs == ["halve_to_bfloat16: torch.bfloat16 -> torch.float32"]
    assert graph.bound is not None and graph.bound.specialized is not None, graph.bound.declined

    def integer(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.pyfuser_test.halve_to_int(x) * 3 + x

    torch._dynamo.reset()
    with pytest.raises(TypeError, match=r"pyfuser region pyfuser_region_0: its input halve_to_int was traced as "
                                        r"torch\.float32, but the value computed for it is torch\.int64"):
        torch.compile(integer, backend=PyfuserBackend())(torch.randn(5, 7))


def test_only_a_0_dim_cpu_tensor_moves_to_the_device_inside_a_region() -> None:
    """``torch.tensor(c).to(x)`` in a model's code is a ``_to_copy`` of a 0-dim CPU tensor to the
    device: a region takes it (its kernels read the scalar as an argument), where ATen would copy from
    pageable memory and wait for the stream on every call. A larger CPU tensor still moves as ATen's."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    check = LOWERINGS[torch.ops.aten._to_copy.default].check
    assert check is not None
    graph = torch.fx.Graph()
    scalar, vector = graph.placeholder("scalar"), graph.placeholder("vector")
    moves = [graph.call_function(torch.ops.aten._to_copy.default, (src,), {"dtype": torch.float32, "device": "cuda"})
             for src in (scalar, vector)]
    with FakeTensorMode():
        scalar.meta["val"] = torch.empty((), dtype=torch.int64)
        vector.meta["val"] = torch.empty(3, dtype=torch.int64)
        moves[0].meta["val"] = torch.empty((), device="cuda")
        moves[1].meta["val"] = torch.empty(3, device="cuda")
    assert check(moves[0]) is None
    assert check(moves[1]) == "_to_copy moves cpu -> cuda"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a device move needs a GPU")
def test_a_constant_moved_to_the_device_never_waits_for_it() -> None:
    """A model's constant made on the CPU and moved to its input's device (DeBERTa's relative-position
    buckets, ``torch.tensor(mid - 1).type_as(relative_pos)``) is a scalar of the region: no ATen copy is
    left in the graph and a call queues its work without waiting for the device."""
    def f(x: torch.Tensor) -> torch.Tensor:
        c = torch.tensor(3).to(x.device)
        return torch.where(x > 0, x * c, c.to(x.dtype) - x)

    backend = PyfuserBackend()
    compiled = torch.compile(f, backend=backend)
    x = torch.randn(4, 33, device="cuda")
    for _ in range(WARM_CALLS + 1):
        compiled(x)
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = compiled(x)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.testing.assert_close(got, f(x))
    reasons = [r for g in backend.graphs for r in g.eager.values()]
    assert not any("_to_copy" in r for r in reasons), reasons


class _Block(torch.nn.Module):
    """A convolution (left in eager), then group norm, GELU and the residual: a region between two
    convolutions."""

    def __init__(self, channels: int, eps: float) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(channels, channels, 3, padding=1)
        self.norm = torch.nn.GroupNorm(2, channels, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.gelu(self.norm(self.conv(x)))


@pytest.mark.parametrize("training", [False, True])
def test_equal_regions_are_compiled_once(monkeypatch: pytest.MonkeyPatch, training: bool) -> None:
    """Repeated blocks make equal regions (forward and backward alike): they share one executor cache,
    so each distinct region is segmented, scheduled and compiled once; a block that differs (another
    epsilon, another width) is a fusion of its own. Results match eager."""
    compiles = []
    compile_fusion = executor_module.compile_fusion
    monkeypatch.setattr(executor_module, "compile_fusion",
                        lambda fusion, options: compiles.append(1) or compile_fusion(fusion, options))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[_Block(6, 1e-5) for _ in range(4)], _Block(6, 1e-3),
                                torch.nn.Conv1d(6, 4, 1), *[_Block(4, 1e-5) for _ in range(3)]).train(training)
    reference = copy.deepcopy(model)
    backend = PyfuserBackend()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(3, 6, 5)
    xs, xe = x.clone().requires_grad_(training), x.clone().requires_grad_(training)
    got, want = compiled(xs), reference(xe)
    torch.testing.assert_close(got, want)
    if training:
        grad = torch.randn_like(want)
        got.backward(grad)
        want.backward(grad)
        torch.testing.assert_close(xs.grad, xe.grad)
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
    regions = [r for g in backend.graphs for r in g.regions]
    distinct = {id(r.fec) for r in regions}
    assert len(distinct) == backend.fusions.num_fusions() == len(compiles)
    assert len(distinct) <= len(regions) // 2, (len(distinct), len(regions))
    forward = backend.graphs[0].regions
    per = len(forward) // 8  # each block's regions (a block's norm may span two)
    assert len(forward) == 8 * per
    blocks = [forward[k * per:(k + 1) * per] for k in range(8)]
    fecs = [[r.fec for r in b] for b in blocks]
    assert fecs[0] == fecs[1] == fecs[2] == fecs[3] and fecs[5] == fecs[6] == fecs[7]
    assert fecs[4] != fecs[3] and not set(map(id, fecs[5])) & set(map(id, fecs[0]))


@pytest.mark.parametrize("device", devices())
def test_regions_compile_before_the_graphs_first_call(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """A graph's regions compile their programs from the traced sizes when the graph compiles (on a GPU,
    their kernels in compile threads from a rehearsal on meta tensors): every region's first call finds
    its program compiled, no region compiles twice, and a training step matches eager."""
    programs_at_first_call = []
    execute = FusionRegion._execute

    def first_call(region: FusionRegion, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        programs_at_first_call.append(region.fec.compile_count)
        return execute(region, inputs)

    monkeypatch.setattr(FusionRegion, "_execute", first_call)
    torch.manual_seed(0)
    model = torch.nn.Sequential(_Block(6, 1e-5), torch.nn.Conv1d(6, 4, 1), _Block(4, 1e-3)).to(device)
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend=(backend := PyfuserBackend()))
    x = torch.randn(3, 6, 5, device=device)
    xs, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    ahead = launcher_module.variants_compiled_ahead
    got, want = compiled(xs), reference(xe)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(xs.grad, xe.grad)
    regions = [r for g in backend.graphs for r in g.regions]
    assert {g.kind for g in backend.graphs} == {"forward", "backward"}
    assert len(programs_at_first_call) == len(regions) and all(programs_at_first_call), programs_at_first_call
    assert all(r.fec.compile_count == 1 for r in regions)
    if device == "cuda":  # the kernels' first launches took variants compiled in threads
        assert launcher_module.variants_compiled_ahead > ahead


def test_equal_regions_of_symbolic_sizes_share_a_program_for_every_size() -> None:
    """Under dynamic shapes equal regions still share one executor cache, which binds each call's sizes:
    results match eager for every batch size, and each distinct region compiled one program."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[_Block(6, 1e-5) for _ in range(3)]).eval()
    backend = PyfuserBackend()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for batch in (2, 5, 3):
            x = torch.randn(batch, 6, 7)
            torch.testing.assert_close(compiled(x), model(x))
    regions = [r for g in backend.graphs for r in g.regions]
    assert len({id(r.fec) for r in regions}) < len(regions)
    assert all(r.fec.compile_count == 1 for r in regions)
