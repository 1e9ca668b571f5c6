"""Layouts of the values regions pass only to other regions (``boundary_layouts.py``): a residual stream
that eager keeps transposed (a convolution's ``[batch, channels, time]`` output permuted to ``[batch,
time, channels]``, as Whisper's encoder does) is written row-major between regions, so every layer norm
over it reduces contiguous rows (an inner normalization), while the graph's outputs keep eager's
strides. Kernels run through Triton's interpreter; values are compared with eager."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from pyfuser.integrations.torch_compile import PyfuserBackend
from pyfuser.integrations.torch_compile.backend import CompiledGraph
from pyfuser.integrations.torch_compile.translator import (
    ROW_MAJOR_OUTPUT,
    RegionTranslator,
    TranslatedRegion,
    TranslationError,
)

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


class ConvEncoderBlock(torch.nn.Module):
    """conv1d -> gelu -> permute -> + positions, then a pre-norm attention block (attention in eager: a
    region boundary the residual stream crosses) and a layer norm -> linear head. Odd sizes."""

    def __init__(self, mels: int = 6, hidden: int = 24, frames: int = 10, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.conv = torch.nn.Conv1d(mels, hidden, 3, padding=1)
        self.positions = torch.nn.Parameter(torch.randn(frames, hidden))
        self.norm1 = torch.nn.LayerNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.out = torch.nn.Linear(hidden, hidden)
        self.norm2 = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, 7)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv(features)).permute(0, 2, 1) + self.positions
        b, t, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, h)
        residual = x + self.out(attended)
        return self.head(self.norm2(residual))


def _kernels(graphs: list[CompiledGraph]) -> list[str]:
    """Each generated kernel the graphs' regions ran: ``"<kind> -> <FX nodes it writes>"``."""
    return [line.strip().removeprefix("kernel ") for g in graphs for r in g.regions
            for line in r.summary().splitlines() if line.strip().startswith("kernel ")]


def _normalizations(graphs: list[CompiledGraph]) -> list[str]:
    return [k for k in _kernels(graphs) if "persistent" in k]


def _assert_close(got: tuple[Any, ...], want: tuple[Any, ...], dtype: torch.dtype) -> None:
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {}
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **tolerance)


def _run(model: torch.nn.Module, features: torch.Tensor, training: bool) -> tuple[Any, ...]:
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(training):
        head = model(features)
    if not training:
        return (head,)
    head.float().square().mean().backward()
    return head.detach(), *[p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_transposed_residual_stream_matches_eager(dtype: torch.dtype, training: bool) -> None:
    """Values, output strides and gradients equal eager's; in inference the residual stream crosses the
    attention's region boundary row-major, so both layer norms are inner normalizations; in training the
    forward writes it row-major (``conv_layout.normalized_rows``) and saves it so for the backward."""
    torch.manual_seed(0)
    model = ConvEncoderBlock().to(dtype).train(training)
    features = torch.randn(3, 6, 10, dtype=dtype)
    backend = PyfuserBackend(triton_interpreter=True)
    got = _run(torch.compile(model, backend=backend), features, training)
    want = _run(model, features, training)
    _assert_close(got, want, dtype)
    assert got[0].stride() == want[0].stride()
    norms = _normalizations(backend.graphs)
    assert norms, _kernels(backend.graphs)
    if not training:
        assert all(n.startswith("inner_persistent_") for n in norms), norms
        relaid = [n for g in backend.graphs for n in g.graph_module.graph.nodes if n.meta.get(ROW_MAJOR_OUTPUT)]
        assert relaid and all(n.meta["val"].is_contiguous() for n in relaid)
    else:
        (forward,) = [g for g in backend.graphs if g.kind == "forward"]
        (output,) = [n for n in forward.graph_module.graph.nodes if n.op == "output"]
        streams = [v.meta["val"] for v in output.args[0]
                   if isinstance(v, torch.fx.Node) and tuple(v.meta["val"].shape) == (3, 10, 24)]
        assert streams and all(v.is_contiguous() for v in streams), [v.stride() for v in streams]


def test_dynamic_batch_writes_the_stream_row_major() -> None:
    """With a symbolic batch size the stream is relaid out too, and one compiled graph serves two
    batch sizes."""
    torch.manual_seed(0)
    model = ConvEncoderBlock().eval()
    backend = PyfuserBackend(triton_interpreter=True)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for batch in (3, 5):
            features = torch.randn(batch, 6, 10)
            got, want = compiled(features), model(features)
            torch.testing.assert_close(got, want)
            assert got.stride() == want.stride()
    assert len(backend.graphs) == 1
    norms = _normalizations(backend.graphs)
    assert norms and all(n.startswith("inner_persistent_") for n in norms), norms


def test_failed_translation_keeps_eager_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Should a region not translate again with the chosen layouts, every value keeps eager's layout
    (its example value restored) and the regions translated before are used: results stay eager's."""
    original = RegionTranslator.translate
    calls: list[int] = []

    def translate_once_per_region(self: RegionTranslator) -> TranslatedRegion:
        if any(n.meta.get(ROW_MAJOR_OUTPUT) for n in (*self.inputs, *self.outputs)):
            calls.append(1)
            raise TranslationError(self.nodes[0], "refused for the test")
        return original(self)

    monkeypatch.setattr(RegionTranslator, "translate", translate_once_per_region)
    torch.manual_seed(0)
    model, features = ConvEncoderBlock().eval(), torch.randn(3, 6, 10)
    backend = PyfuserBackend(triton_interpreter=True)
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(features)
    torch.testing.assert_close(got, model(features))
    assert calls
    nodes = [n for g in backend.graphs for n in g.graph_module.graph.nodes]
    assert not [n for n in nodes if n.meta.get(ROW_MAJOR_OUTPUT)]
    assert any(n.meta["val"].stride() == (240, 1, 10) for n in nodes if isinstance(n.meta.get("val"), torch.Tensor))


def test_value_an_eager_op_reads_keeps_eager_layout() -> None:
    """A transposed value that an eager op reads too (a convolution, through a permute left in eager)
    keeps eager's strides: nothing is relaid out, and the results are eager's."""
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = torch.nn.Conv1d(5, 12, 3, padding=1)
            self.conv2 = torch.nn.Conv1d(12, 12, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = F.gelu(self.conv1(x)).permute(0, 2, 1) * 2
            z = self.conv2(y.permute(0, 2, 1)).permute(0, 2, 1)
            return F.layer_norm(y + z, (12,))

    torch.manual_seed(0)
    model, x = Model(), torch.randn(2, 5, 9)
    backend = PyfuserBackend(triton_interpreter=True)
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(x)
        want = model(x)
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride()
    assert sum(len(g.regions) for g in backend.graphs) >= 2
    assert not [n for g in backend.graphs for n in g.graph_module.graph.nodes if n.meta.get(ROW_MAJOR_OUTPUT)]


def _whisper(dtype: torch.dtype) -> tuple[torch.nn.Module, dict[str, Any]]:
    zoo = pytest.importorskip("benchmarks.model_zoo")
    model = zoo.build_model("whisper", "tiny").to(dtype).eval()
    return model, zoo.make_batch("whisper", "tiny", dtype=dtype).inference


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_whisper_layer_norms_are_inner_normalizations(dtype: torch.dtype) -> None:
    """The zoo's Whisper (tiny) in inference: logits and encoder output equal eager's, in eager's strides,
    and every layer norm of the encoder, whose residual stream eager keeps transposed, runs as an inner
    (row) normalization."""
    pytest.importorskip("transformers")
    model, inputs = _whisper(dtype)
    backend = PyfuserBackend(triton_interpreter=True)
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(**inputs)
        want = model(**inputs)
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {}
    for name in ("logits", "encoder_last_hidden_state"):
        torch.testing.assert_close(got[name], want[name], **tolerance)
        assert got[name].stride() == want[name].stride(), name
    norms = _normalizations(backend.graphs)
    assert len(norms) >= 5, _kernels(backend.graphs)  # 3 encoder and 3 decoder layer norms, some fused
    assert all(n.startswith("inner_persistent_") for n in norms), norms


class StreamViewedInItsTracedLayout(torch.nn.Module):
    """The transposed residual stream of ``ConvEncoderBlock`` normalized, and also flattened by a view that
    only its traced (transposed) layout allows: ``x.transpose(1, 2).view(b, -1)``."""

    def __init__(self, mels: int = 6, hidden: int = 24, frames: int = 10) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(mels, hidden, 3, padding=1)
        self.positions = torch.nn.Parameter(torch.randn(frames, hidden))
        self.norm = torch.nn.LayerNorm(hidden)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv(features)).permute(0, 2, 1) + self.positions
        flat = x.transpose(1, 2).view(x.shape[0], -1)
        return self.norm(x).sum(-1) * flat[:, :1]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_view_of_the_traced_layout_reads_a_converted_copy(dtype: torch.dtype) -> None:
    """In training the stream is written row-major; the view that needs the traced layout (of the stream's
    transpose, row-major there) reads a copy converted to it: values and gradients as eager's."""
    torch.manual_seed(0)
    model = StreamViewedInItsTracedLayout().to(dtype)
    features = torch.randn(3, 6, 10, dtype=dtype)
    backend = PyfuserBackend(triton_interpreter=True)
    got = _run(torch.compile(model, backend=backend), features, True)
    want = _run(model, features, True)
    _assert_close(got, want, dtype)
    (forward,) = [g for g in backend.graphs if g.kind == "forward"]
    converted = [name for r in forward.regions for name in r.nodes if name.startswith("_to_copy_default")]
    converted += [n.name for n in forward.graph_module.graph.nodes if n.name.startswith("_to_copy_default")]
    assert len(converted) == 2, converted  # the stream's row-major copy, and its transpose's for the view


class ReturnedStream(torch.nn.Module):
    """The transposed stream returned beside its layer norm (Whisper's training step, broken into a graph
    per encoder layer: each graph's output is the stream)."""

    def __init__(self, mels: int = 6, hidden: int = 24, frames: int = 10) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(mels, hidden, 3, padding=1)
        self.positions = torch.nn.Parameter(torch.randn(frames, hidden))
        self.norm = torch.nn.LayerNorm(hidden)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.gelu(self.conv(features)).permute(0, 2, 1) + self.positions
        return self.norm(x), x


def test_a_returned_stream_keeps_its_layout() -> None:
    """A stream the graph returns to the user keeps eager's layout in training: nothing converts it (a copy
    to row-major and one back would gain nothing); values, strides and gradients are eager's."""
    torch.manual_seed(0)
    model = ReturnedStream()
    features = torch.randn(3, 6, 10)
    backend = PyfuserBackend(triton_interpreter=True)
    normed, stream = torch.compile(model, backend=backend)(features)
    (normed.square().sum() + stream.sum()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    want_normed, want_stream = model(features)
    (want_normed.square().sum() + want_stream.sum()).backward()
    torch.testing.assert_close(normed, want_normed)
    torch.testing.assert_close(stream, want_stream)
    assert stream.stride() == want_stream.stride()
    for g, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad)
    (forward,) = [g for g in backend.graphs if g.kind == "forward"]
    copies = [n for n in forward.graph_module.graph.nodes if n.kwargs.get("memory_format") is torch.contiguous_format]
    assert not copies and not any("_to_copy_default" in name or "clone_default" in name
                                  for r in forward.regions for name in r.nodes), forward.graph_module.code
