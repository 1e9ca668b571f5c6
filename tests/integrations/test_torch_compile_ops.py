"""Every ATen op the backend claims, translated and run against eager: forward on CPU (and CUDA when
present), gradients with ``gradcheck`` in float64, a few through generated kernels (the Triton
interpreter on CPU)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch._functorch import config as functorch_config
from torch.fx.experimental.proxy_tensor import make_fx

from pyfuser.integrations.torch_compile import LOWERINGS, PyfuserBackend
from pyfuser.integrations.torch_compile.bound_graph import WARM_CALLS
from pyfuser.integrations.torch_compile.support import op_name, refusal
from tests.conftest import devices
from tests.integrations.torch_compile_cases import CASES, Case


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


#: Ops that change nothing, which the backend drops from its graphs before partitioning (view_pairs.py):
#: no region claims them (their lowerings serve graphs partitioned without the backend).
DROPPED_BEFORE_PARTITIONING = {torch.ops.aten.detach.default}


def claimed_ops(backend: PyfuserBackend) -> set[str]:
    return {entry.split(" (")[1].rstrip(")") for g in backend.graphs for r in g.regions for entry in r.nodes}


def _on(device: str, values: list[torch.Tensor], grad: bool) -> list[torch.Tensor]:
    moved = [v.detach().to(device) for v in values]
    return [v.requires_grad_() if grad and v.is_floating_point() else v for v in moved]


def _flat(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def test_every_lowering_has_a_case() -> None:
    covered = {c.op for c in CASES}
    missing = sorted(str(op) for op in LOWERINGS if op not in covered)
    assert not missing, f"ops the backend claims without a test case: {missing}"


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_forward_matches_eager(case: Case, device: str) -> None:
    """On new data each call, through the calls that bind the regions, the recorded one and the
    specialized graph's (``bound_graph.py``)."""
    backend = PyfuserBackend()
    compiled = torch.compile(case.fn, backend=backend)
    for _ in range(WARM_CALLS + 2):
        args = _on(device, case.inputs(), grad=False)
        got = _flat(compiled(*args))
        want = _flat(case.fn(*args))
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            torch.testing.assert_close(g, w)
    if case.op in DROPPED_BEFORE_PARTITIONING:  # neither claimed nor left in eager: gone
        assert not any(name.startswith(case.op._opname) for g in backend.graphs for name in g.eager), backend.graphs
        return
    assert op_name_of(case.op) in claimed_ops(backend), f"{case.op} was left in eager: {backend.graphs[0].eager}"


def op_name_of(op: Any) -> str:
    return f"{op.namespace}.{op._opname}.{op._overloadname}"


GRAD_CASES = [c for c in CASES if c.grad]


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.id for c in GRAD_CASES])
def test_gradcheck(case: Case) -> None:
    args = case.inputs()
    compiled = torch.compile(case.fn, backend=PyfuserBackend())
    with functorch_config.patch(donated_buffer=False):  # gradcheck runs the backward more than once
        assert torch.autograd.gradcheck(compiled, args, fast_mode=True)


KERNEL_CASES = [c for c in CASES if c.id in {"exp.default", "mul.Tensor", "where.self", "expand.default",
                                              "permute.default", "slice.Tensor", "cat.default", "sum.dim_IntList",
                                              "_to_copy.default", "gelu.default", "constant_pad_nd.default",
                                              "floor_divide.default", "index_put.default", "index.Tensor",
                                              "tril.default", "baddbmm.default", "slice_scatter.default",
                                              "select_scatter.default", "stack.default", "copy.default",
                                              "fill.Tensor", "_unsafe_index.Tensor", "avg_pool2d.default",
                                              "avg_pool2d_backward.default"}]


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("case", KERNEL_CASES, ids=[c.id for c in KERNEL_CASES])
def test_generated_kernels_match_eager(case: Case) -> None:
    """The same programs with kernels generated (Triton's interpreter on CPU): what CUDA runs."""
    args = _on("cpu", case.inputs(), grad=False)
    backend = PyfuserBackend(triton_interpreter=True)
    got = _flat(torch.compile(case.fn, backend=backend)(*args))
    for g, w in zip(got, _flat(case.fn(*args)), strict=True):
        torch.testing.assert_close(g, w)
    codes = [code for graph in backend.graphs for r in graph.regions for code in r.fec.kernel_codes()]
    assert codes, "no region ran a generated kernel"


def test_slice_writes_and_pools_that_stay_in_eager_say_why() -> None:
    """A strided slice assignment, an average pool with padding or overlapping windows, and a copy across
    devices are refused with their reasons (eager computes them)."""
    def fn(x: torch.Tensor, y: torch.Tensor, img: torch.Tensor) -> Any:
        aten = torch.ops.aten
        return (aten.slice_scatter.default(x, y, 0, 0, 6, 2), aten.avg_pool2d.default(img, [2, 2], [2, 2], [1, 1]),
                aten.avg_pool2d_backward.default(img[..., :2, :2], img, [3, 3], [1, 1], [0, 0], False, True, None),
                aten.copy.default(y, y.to("meta")))

    examples = (torch.randn(6, 3), torch.randn(3, 3), torch.randn(1, 2, 4, 4))
    gm = make_fx(fn, tracing_mode="fake")(*examples)
    reasons = {str(n.target): refusal(n) for n in gm.graph.nodes if n.op == "call_function"}
    assert reasons["aten.slice_scatter.default"] == "slice_scatter with step 2"
    assert reasons["aten.avg_pool2d.default"] == "avg_pool2d with padding"
    assert reasons["aten.avg_pool2d_backward.default"] == "avg_pool2d of overlapping or ragged windows"
    assert reasons["aten.copy.default"] == "mixes devices ['cpu', 'meta']"


def test_op_names() -> None:
    node = torch.fx.Graph().call_function(torch.ops.aten.add.Tensor, ())
    assert op_name(node) == "aten.add.Tensor"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("padding_idx", [None, 3])
def test_an_embeddings_gradient_is_a_scatter_kernel(dtype: torch.dtype, padding_idx: int | None) -> None:
    """An embedding's backward through the backend: rows of repeated indices summed (float32, cast to
    the weight's dtype), the padding row's left zero, by an atomic scatter-add kernel, not ATen's
    sort; with deterministic algorithms on, ATen's."""
    indices = torch.tensor([[1, 3, 3, 10, 0], [0, 1, 5, 3, 3]])
    for deterministic in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(0)
        embedding = torch.nn.Embedding(11, 7, padding_idx=padding_idx).to(dtype)
        backend = PyfuserBackend(triton_interpreter=True)
        compiled = torch.compile(lambda i, e=embedding: (e(i) * 2).float().sum(), backend=backend)
        was = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(deterministic)
        try:
            compiled(indices).backward()
        finally:
            torch.use_deterministic_algorithms(was)
        got, embedding.weight.grad = embedding.weight.grad, None
        (embedding(indices) * 2).float().sum().backward()
        torch.testing.assert_close(got, embedding.weight.grad)
        summaries = "\n".join(r.summary() for g in backend.graphs for r in g.regions)
        eager = [e for g in backend.graphs for e in g.eager]
        assert ("kernel scatter_" in summaries) != deterministic, summaries
        assert any("embedding_dense_backward" in e for e in eager) == deterministic, eager


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_accumulating_index_put_is_a_scatter_kernel(dtype: torch.dtype) -> None:
    """``x[index] += values`` in bfloat16 / float16 (an MoE's combine of expert outputs): rows summed in
    float32 by the atomic scatter-add kernel and rounded once, no ATen index_put (its sort and index
    check); the error against float64 at most ATen's own (repeated and negative indices)."""
    def fn(x: torch.Tensor, idx: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.index_put.default(x * 2, [idx], v * 3, True) + 1

    torch.manual_seed(0)
    x, v = torch.randn(6, 5, 3), torch.randn(40, 5, 3)
    idx = torch.randint(-6, 6, (40,))
    backend = PyfuserBackend(triton_interpreter=True)
    got = torch.compile(fn, backend=backend)(x.to(dtype), idx, v.to(dtype))
    exact = fn(x.to(dtype).double(), idx, v.to(dtype).double())
    aten_error = (fn(x.to(dtype), idx, v.to(dtype)).double() - exact).abs().max()
    assert (got.double() - exact).abs().max() <= aten_error
    summaries = "\n".join(r.summary() for g in backend.graphs for r in g.regions)
    assert "kernel scatter_" in summaries and "IndexPut" not in summaries, summaries


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_index_put_without_accumulation_is_a_scatter_kernel(dtype: torch.dtype) -> None:
    """``x[index] = values`` (an MoE's inverse permutation: the rows of ``values`` put back in token
    order) through the backend: the scatter kernel storing whole rows, negative indices counting from
    the end, rows no index names keeping ``x``'s values; not ATen's index_put."""
    def fn(x: torch.Tensor, idx: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.index_put.default(x * 2, [idx], v + 1) * 3

    for shape in ((7, 3), (7, 2, 5)):
        torch._dynamo.reset()
        x, v = torch.randn(*shape).to(dtype), torch.randn(5, *shape[1:]).to(dtype)
        idx = torch.tensor([4, -1, 0, -5, 5])  # rows 4, 6, 0, 2, 5; 1 and 3 keep x's
        backend = PyfuserBackend(triton_interpreter=True)
        torch.testing.assert_close(torch.compile(fn, backend=backend)(x, idx, v), fn(x, idx, v))
        summaries = "\n".join(r.summary() for g in backend.graphs for r in g.regions)
        assert "_store" in "".join(c for g in backend.graphs for r in g.regions for c in r.fec.kernel_codes())
        assert "IndexPut" not in summaries and not any("index_put" in e for g in backend.graphs for e in g.eager), \
            summaries


def test_indexing_and_floor_division_that_stay_in_eager_say_why() -> None:
    """Boolean indices (a data-dependent size), an index_put of broadcast values and floor division of
    floats (torch's rounding) are refused with their reasons."""
    def fn(x: torch.Tensor, mask: torch.Tensor, idx: torch.Tensor, v: torch.Tensor) -> Any:
        aten = torch.ops.aten
        return (aten.index.Tensor(x, [mask]), aten.index_put.default(x, [idx], v), aten.floor_divide.default(x, 3.0),
                aten.div.Tensor_mode(x, 2.0, rounding_mode="floor"))

    examples = (torch.randn(5, 3), torch.rand(5) > 0.5, torch.tensor([1, 3]), torch.randn(1, 3))
    gm = make_fx(fn, tracing_mode="fake")(*examples)
    reasons = {str(n.target): refusal(n) for n in gm.graph.nodes if n.op == "call_function"}
    assert "index.Tensor by a torch.bool index" in reasons["aten.index.Tensor"]
    assert "(broadcast)" in reasons["aten.index_put.default"]
    assert "floor division of floating tensors" in reasons["aten.floor_divide.default"]
    assert "floor division of floating tensors" in reasons["aten.div.Tensor_mode"]


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_roll_is_read_inside_its_readers_kernel(dtype: torch.dtype) -> None:
    """Swin's shifted windows: ``torch.roll`` over two axes of a permuted tensor, then an activation, is one
    generated kernel reading through the roll (no ATen roll kernel), equal to eager, forward and backward
    (whose roll goes the other way)."""
    def shifted(x: torch.Tensor) -> torch.Tensor:
        return F.gelu(torch.roll(x * 2, shifts=(-3, 2), dims=(1, 2))) + 1

    backend = PyfuserBackend(triton_interpreter=True)
    compiled = torch.compile(shifted, backend=backend)
    for _ in range(WARM_CALLS + 1):
        x = torch.randn(2, 5, 7, 9, dtype=dtype).permute(0, 2, 3, 1)
        xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
        got, want = compiled(xc), shifted(xe)
        torch.testing.assert_close(got, want)
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(xc.grad, xe.grad)
    assert all(not g.eager for g in backend.graphs), [g.eager for g in backend.graphs]
    forward = backend.graphs[0].regions[0].summary()
    assert "1 kernel(s), 0 ATen call(s)" in forward, forward
