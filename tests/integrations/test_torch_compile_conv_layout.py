"""Channels-last activations in graphs of convolutions (``conv_layout.py``): the convolutions read
channels-last operands, the fused regions between them keep that layout, and what the user sees (outputs,
gradients of inputs and weights) has eager's values and strides; the rule that decides it."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._dynamo
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from pyfuser.integrations.torch_compile import PyfuserBackend
from pyfuser.integrations.torch_compile.conv_layout import layout_refusal, relayout_activations, split_convolution_biases

pytest.importorskip("transformers")

from benchmarks.model_zoo import build_model, make_batch  # after the skip: it imports transformers
from tests.integrations.test_model_zoo import training_step

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


class ConvNet(torch.nn.Module):
    """conv -> batch norm -> relu -> conv -> batch norm -> residual add -> relu, pooled into a linear head;
    returns the logits and the last activation (a user-visible 4-D output)."""

    def __init__(self, channels: int = 96, groups: int = 1) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(channels)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, padding=1, groups=groups)
        self.bn2 = torch.nn.BatchNorm2d(channels)
        self.head = torch.nn.Linear(channels, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.bn1(self.conv1(x)))
        z = torch.relu(self.bn2(self.conv2(y)) + y)
        return self.head(z.mean((2, 3))), z


def convolution_operands(backend: PyfuserBackend) -> list[tuple[str, bool]]:
    """For every convolution (forward and backward) of the compiled graphs, whether each of its 4-D operands
    is channels-last as the graph passes it (what the regions write, each its outputs in these layouts, and
    ATen returns); one whose layouts coincide (1 x 1 images or kernels) counts as NCHW for none."""
    seen = []
    for graph in backend.graphs:
        for node in graph.graph_module.graph.nodes:
            if node.target in (aten.convolution.default, aten.convolution_backward.default):
                count = 3 if node.target is aten.convolution_backward.default else 2
                for operand in node.args[:count]:
                    t = operand.meta["val"]
                    if t.is_contiguous(memory_format=torch.channels_last) and t.is_contiguous():
                        continue
                    seen.append((f"{graph.kind} {node.name}", t.is_contiguous(memory_format=torch.channels_last)))
    return seen


def _inputs(dtype: torch.dtype, requires_grad: bool = False) -> tuple[torch.nn.Module, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    model = ConvNet().to(dtype)
    with torch.no_grad():
        for bn in (model.bn1, model.bn2):
            bn.running_mean.copy_(torch.randn(bn.num_features, generator=g))
            bn.running_var.copy_(torch.rand(bn.num_features, generator=g) + 0.5)
    # odd spatial sizes; a non-contiguous input (a slice of a wider image)
    x = torch.randn(2, 3, 7, 11, generator=g).to(dtype)[..., 1:10]
    return model, x.requires_grad_(requires_grad)


def _run(run: Callable[..., Any], x: torch.Tensor, training: bool) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    logits, z = run(x)
    if not training:
        return [logits, z], None
    (logits.square().sum() + (z * z.detach().flip(-1)).sum()).backward()
    return [logits, z], x.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_inference_convolutions_read_channels_last(dtype: torch.dtype) -> None:
    """Inference through generated kernels: both convolutions read channels-last inputs and weights, the
    region between them writes channels-last in one kernel, and the outputs have eager's values and
    strides."""
    model, x = _inputs(dtype)
    model.eval()
    backend = PyfuserBackend(triton_interpreter=True)
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(3):  # warm-up calls, then the specialized graph
            got, _ = _run(compiled, x, training=False)
        want, _ = _run(model, x, training=False)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **({"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {}))
        assert g.stride() == w.stride()
    seen = convolution_operands(backend)
    assert len(seen) == 4 and all(channels_last for _, channels_last in seen), seen
    (graph,) = backend.graphs
    # each batch norm's per-channel scale (weight * rsqrt(var + eps), viewed as [1, C, 1, 1]) is computed
    # inside the kernel that applies it, not written by a kernel of its own
    # (a region's copy kernels, transposes or for axes too short to tile 1-D copies, convert the next
    # convolution's weight to channels-last)
    norms = [r for r in graph.regions if any("(aten.rsqrt.default)" in n for n in r.nodes)]
    assert len(norms) == 2
    copies = (" kernel transpose_kernel ", " kernel pointwise_kernel ")
    for region in norms:
        summary = region.summary()
        computing = [line for line in summary.splitlines() if " kernel " in line and not any(c in line for c in copies)]
        assert len(computing) == 1 and "Reshape" not in summary, summary
    assert graph.layout is None
    convolutions = [n for n in graph.graph_module.graph.nodes if n.target is aten.convolution.default]
    assert len(convolutions) == 2
    # the second convolution reads the first region's output as it is: written channels-last there
    assert convolutions[1].args[0].meta["val"].is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_training_convolutions_read_channels_last(dtype: torch.dtype) -> None:
    """A training step without grouped convolutions (the default rule applies channels-last there):
    forward and backward convolutions read channels-last operands (the backward's saved activations
    arrive channels-last, as the forward reported them), and the outputs and gradients of the input and
    every parameter have eager's values and strides."""
    model, x = _inputs(dtype, requires_grad=True)
    backend = PyfuserBackend(triton_interpreter=dtype == torch.float32)
    compiled = torch.compile(model, backend=backend)
    got, got_dx = _run(compiled, x, training=True)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    dx = got_dx.clone()  # type: ignore[union-attr]
    model.zero_grad(set_to_none=True)
    x.grad = None
    want, want_dx = _run(model, x, training=True)
    # float32: channels-last convolutions sum in another order (batch norm's backward amplifies it)
    tolerance = {"rtol": 1e-3, "atol": 1e-3} if dtype == torch.float32 else {}
    pairs = [*zip(got, want, strict=True), (dx, want_dx),
             *((grads[n], p.grad) for n, p in model.named_parameters())]
    for g, w in pairs:
        torch.testing.assert_close(g, w, **tolerance)
        assert g.stride() == w.stride()  # type: ignore[union-attr]
    seen = convolution_operands(backend)
    assert len(seen) == 2 * 2 + 2 * 3 and all(channels_last for _, channels_last in seen), seen
    assert [g.layout for g in backend.graphs] == [None, None]


def test_a_training_step_with_a_grouped_convolution_keeps_its_layouts_by_default() -> None:
    """The default rule leaves a training step's graphs with a grouped (here depthwise) convolution as
    traced: no convolution operand is converted, values and strides are eager's."""
    g = torch.Generator().manual_seed(0)
    model = ConvNet(groups=96).double()
    x = torch.randn(2, 3, 7, 11, generator=g).double()[..., 1:10].requires_grad_()
    backend = PyfuserBackend()
    got, got_dx = _run(torch.compile(model, backend=backend), x, training=True)
    dx = got_dx.clone()  # type: ignore[union-attr]
    x.grad = None
    want, want_dx = _run(model, x, training=True)
    for g_, w in [*zip(got, want, strict=True), (dx, want_dx)]:
        torch.testing.assert_close(g_, w)
        assert g_.stride() == w.stride()  # type: ignore[union-attr]
    assert not any(channels_last for _, channels_last in convolution_operands(backend))
    why = " is a grouped convolution in a training step's graph (channels_last=True to apply it there)"
    assert [g.layout for g in backend.graphs] == ["convolution_1" + why, "convolution_backward" + why]


def inference_graph(model: torch.nn.Module, x: torch.Tensor) -> torch.fx.GraphModule:
    """The ATen inference graph AOTAutograd makes of ``model`` (eval mode, no grad) called on ``x``."""
    captured: list[torch.fx.GraphModule] = []

    def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        captured.append(gm)
        return gm
    torch._dynamo.reset()
    backend = torch._dynamo.backends.common.aot_autograd(fw_compiler=compiler)
    with torch.no_grad():
        torch.compile(model.eval(), backend=backend)(x)
    return captured[0]


def test_rule() -> None:
    """Channels-last where convolutions gain: not when every convolution has at most 64 channels (unless
    forced), nor with a grouped convolution of several input channels per group, nor when turned off."""
    def graph(model: torch.nn.Module) -> torch.fx.GraphModule:
        return inference_graph(model, torch.randn(2, 3, 8, 8))

    assert layout_refusal(graph(ConvNet())) is None
    assert layout_refusal(graph(ConvNet()), force=False) == "channels_last=False"
    assert layout_refusal(graph(ConvNet()), training=True) is None
    assert "grouped convolution in a training step" in str(layout_refusal(graph(ConvNet(groups=96)), training=True))
    assert layout_refusal(graph(ConvNet(groups=96)), force=True, training=True) is None
    small = graph(ConvNet(channels=32))
    assert layout_refusal(small) == "every convolution has at most 64 channels"
    assert layout_refusal(small, force=True) is None
    assert "grouped convolution of 24 input channels per group" in str(layout_refusal(graph(ConvNet(groups=4))))
    depthwise = graph(ConvNet(groups=96))
    assert layout_refusal(depthwise) is None

    linear = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 4))
    assert layout_refusal(graph(linear)) == "no 2-D or 3-D convolutions"


def test_small_channels_stay_in_traced_layout() -> None:
    """A graph the rule refuses keeps eager's layouts: its convolutions read NCHW."""
    model = ConvNet(channels=16).eval()
    backend = PyfuserBackend()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(x)
    torch.testing.assert_close(got, model(x))
    seen = convolution_operands(backend)
    assert len(seen) == 4 and not any(channels_last for _, channels_last in seen), seen
    assert backend.graphs[0].layout == "every convolution has at most 64 channels"


#: (architecture, dtype, training, through generated kernels); the zoo's tiny sizes have at most 64
#: channels, so channels-last is forced (``channels_last=True``). Slow: the generated kernels of these
#: graphs are covered in the default run by ``ConvNet``'s.
ZOO_CASES = [
    ("resnet", torch.float64, True, False),
    ("convnext", torch.float64, True, False),
    pytest.param("resnet", torch.bfloat16, False, True, marks=pytest.mark.slow),
    pytest.param("resnet", torch.float32, True, True, marks=pytest.mark.slow),
    pytest.param("convnext", torch.float32, False, True, marks=pytest.mark.slow),
]


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize(("name", "dtype", "training", "generated"), ZOO_CASES)
def test_zoo_channels_last(name: str, dtype: torch.dtype, training: bool, generated: bool) -> None:
    """The zoo's ResNet and ConvNeXt (depthwise convolutions, layer norms over channels-last permutes) with
    channels-last activations: every convolution reads channels-last operands; logits, loss and every
    parameter's gradient have eager's values and strides."""
    model = build_model(name, "tiny").to(dtype).train(training)
    batch = make_batch(name, "tiny", dtype=dtype)
    backend = PyfuserBackend(channels_last=True, triton_interpreter=generated)
    tolerance = {torch.float64: {}, torch.float32: {"rtol": 1e-3, "atol": 1e-3},
                 torch.bfloat16: {"rtol": 5e-2, "atol": 5e-2}}[dtype]
    if training:
        got = training_step(torch.compile(model, backend=backend), model, batch)
        want = training_step(model, model, batch)
        pairs = [(got[0], want[0]), (got[1], want[1]), *((got[2][n], g) for n, g in want[2].items())]
        assert got[2].keys() == want[2].keys()
    else:
        with torch.no_grad():
            pairs = [(torch.compile(model, backend=backend)(**batch.inference).logits,
                      model(**batch.inference).logits)]
    for g, w in pairs:
        torch.testing.assert_close(g, w, **tolerance)
        assert g.stride() == w.stride()
    seen = convolution_operands(backend)
    assert seen and all(channels_last for _, channels_last in seen), seen
    assert all(g.layout is None for g in backend.graphs)


class FlattenNet(torch.nn.Module):
    """A convolution whose output is flattened with ``view`` (which channels-last strides do not allow: the
    view reads the activation converted back to NCHW) and also returned as it is."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 80, 3, padding=1)
        self.head = torch.nn.Linear(80 * 5 * 6, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.conv(x))
        return self.head(y.view(y.shape[0], -1)), y * 2


def test_view_refused_by_channels_last_reads_traced_layout() -> None:
    """float64 training step: the flattening view reads its operand converted back to its traced layout;
    values and strides of outputs and gradients are eager's."""
    torch.manual_seed(0)
    model = FlattenNet().double()
    x = torch.randn(2, 3, 5, 6, dtype=torch.float64, requires_grad=True)
    backend = PyfuserBackend(channels_last=True)
    logits, y = torch.compile(model, backend=backend)(x)
    (logits.sum() + y.square().sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    dx = x.grad.clone()  # type: ignore[union-attr]
    model.zero_grad(set_to_none=True)
    x.grad = None
    want_logits, want_y = model(x)
    (want_logits.sum() + want_y.square().sum()).backward()
    for g, w in [(logits, want_logits), (y, want_y), (dx, x.grad),
                 *((grads[n], p.grad) for n, p in model.named_parameters())]:
        torch.testing.assert_close(g, w)
        assert g.stride() == w.stride()  # type: ignore[union-attr]
    assert [g.layout for g in backend.graphs] == [None, None]
    seen = convolution_operands(backend)
    assert seen and all(channels_last for _, channels_last in seen), seen
    # in the ATen graph: the view reads the activation converted back; the returned activation is converted
    # back; the convolution's output is channels-last
    gm = inference_graph(FlattenNet().double(), x.detach())
    assert relayout_activations(gm) is None
    (view,) = [n for n in gm.graph.nodes if n.target is aten.view.default and n.args[0].meta["val"].dim() == 4]
    assert view.args[0].target is aten._to_copy.default
    assert view.args[0].kwargs["memory_format"] is torch.contiguous_format
    (convolution,) = [n for n in gm.graph.nodes if n.target is aten.convolution.default]
    assert convolution.meta["val"].is_contiguous(memory_format=torch.channels_last)
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    assert all(v.meta["val"].is_contiguous() for v in output.args[0])


class DepthwiseBlock(torch.nn.Module):
    """ConvNeXt's block head: a depthwise 7x7 convolution with a bias, then a permute and a layer norm."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.norm = torch.nn.LayerNorm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x).permute(0, 2, 3, 1))


def _convolution_graph(device: str, dims: int = 2) -> torch.fx.GraphModule:
    """An ATen graph (fake example values on ``device``) of a biased convolution read by a ReLU."""
    with FakeTensorMode():
        x, w, b = (torch.empty(*shape, device=device) for shape in ((2, 3, *[7] * dims), (4, 3, *[3] * dims), (4,)))
        return make_fx(lambda x, w, b: torch.relu(aten.convolution.default(x, w, b, [1] * dims, [1] * dims, [1] * dims,
                                                                               False, [0] * dims, 1)))(x, w, b)


def test_a_cuda_convolutions_bias_becomes_an_add_of_the_graph() -> None:
    """On CUDA (fake values: no GPU needed) the convolution loses its bias and an add of the bias viewed
    over the output channels takes its place, with the convolution's example value; on the CPU (oneDNN
    adds the bias inside the convolution) and for a 1-D convolution the graph stays."""
    gm = _convolution_graph("cuda")
    traced = next(n for n in gm.graph.nodes if n.target is aten.convolution.default).meta["val"]
    assert split_convolution_biases(gm) == 1
    (convolution,) = [n for n in gm.graph.nodes if n.target is aten.convolution.default]
    (add,) = convolution.users
    assert convolution.args[2] is None and add.target is aten.add.Tensor
    assert add.args[1].target is aten.view.default and add.args[1].args[1] == [4, 1, 1]
    value = add.meta["val"]
    assert (value.shape, value.stride(), value.dtype) == (traced.shape, traced.stride(), traced.dtype)
    assert [u.target for u in add.users] == [aten.relu.default]
    assert split_convolution_biases(_convolution_graph("cpu")) == 0
    assert split_convolution_biases(_convolution_graph("cuda", dims=1)) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="convolution biases are split on CUDA")
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_convolution_bias_is_added_by_the_region_reading_it(dtype: torch.dtype, training: bool) -> None:
    """A forward CUDA convolution runs without its bias, and the bias add (ATen's separate kernel after
    the convolution's) is a pointwise op of the region that reads the convolution, fused with the layer
    norm there; outputs and input gradients are as close to a float64 run as eager's are."""
    g = torch.Generator().manual_seed(0)
    reference = DepthwiseBlock().double()
    model = copy.deepcopy(reference).to("cuda", dtype)
    x64 = torch.randn(2, 8, 9, 5, generator=g, dtype=torch.float64)
    backend = PyfuserBackend()
    compiled = torch.compile(model, backend=backend)

    def step(run: Callable[..., Any], x: torch.Tensor) -> list[torch.Tensor]:
        x = x.detach().requires_grad_(training)
        with torch.set_grad_enabled(training):
            out = run(x)
            return [out, *torch.autograd.grad(out.square().sum(), x)] if training else [out]

    want = step(reference, x64)
    x = x64.to("cuda", dtype)
    for got, eager, exact in zip(step(compiled, x), step(model, x), want, strict=True):
        error = (got.double().cpu() - exact).abs().max().item()
        assert error <= 2 * (eager.double().cpu() - exact).abs().max().item() + 1e-5, error
    forward = backend.graphs[0]
    (convolution,) = [n for n in forward.graph_module.graph.nodes if n.target is aten.convolution.default]
    assert convolution.args[2] is None
    assert any("(aten.add.Tensor)" in n for r in forward.regions for n in r.nodes)


def test_an_input_come_in_another_layout_is_converted_back_for_a_stride_dependent_op() -> None:
    """A graph whose input arrives row-major where it was traced transposed (a backward's saved value that
    its forward wrote row-major): an ``as_strided`` of it, which depends on strides, reads a copy in the
    traced layout (no memory format gives it: a permute, a row-major copy, the inverse permute), and so does
    the returned pointwise result (the user sees traced strides). Results as the traced graph's on the
    traced layout."""
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return aten.as_strided.default(x, [2, 3], [1, 4]) * 2, x + 1

    traced = torch.randn(2, 5, 4).permute(0, 2, 1)  # [2, 4, 5], strides (20, 1, 4)
    gm = make_fx(f, tracing_mode="fake")(traced)
    row_major = traced.contiguous()
    assert relayout_activations(gm, example_inputs=[row_major]) == "no 2-D or 3-D convolutions"
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(aten.clone.default) == 2 and targets.count(aten.permute.default) == 4, gm.code
    strided, added = gm(row_major)
    want_strided, want_added = f(traced)
    torch.testing.assert_close(strided, want_strided)
    torch.testing.assert_close(added, want_added)
    assert added.stride() == want_added.stride()
