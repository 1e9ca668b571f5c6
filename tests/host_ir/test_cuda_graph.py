"""``_enable_options=["cuda_graph"]``: a compiled program replayed from CUDA graphs returns what plain
execution returns; one capture per input signature; static buffers refreshed per replay."""

from __future__ import annotations

import warnings

import pytest
import torch

from pyfuser import DataType, FusionDefinition, ParallelType
from pyfuser.comm.communicator import Communicator
from pyfuser.host_ir import cuda_graph, specialization
from pyfuser.host_ir.cuda_graph import CapturedGraph, CaptureError, CudaGraphRunner, GraphStep, _StaticInput
from pyfuser.host_ir.evaluator import HostIrEvaluator
from pyfuser.host_ir.frame import Frame
from pyfuser.host_ir.nodes import CaptureGraph
from pyfuser.host_ir.passes.capture_graph import capture_graph
from pyfuser.ir.eval_context import EvalContext
from pyfuser.options import CompileOptions

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def define(stream_chunks: int = 0) -> FusionDefinition:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])  # no layout promise: permuted and expanded inputs run too
        w = fd.define_tensor([-1, -1], contiguity=True)
        s = fd.define_scalar(None, torch.float64)
        y = fd.ops.linear(fd.ops.mul(fd.ops.sigmoid(x), s), w)
        z = fd.ops.add(y, fd.ops.sum(y, [1], keepdim=True))
        fd.add_output(z)
        fd.add_output(fd.ops.exp(x))
    if stream_chunks:
        z.outer_split(0, stream_chunks)
        z.axis(0).parallelize(ParallelType.stream)
    return fd


def reference(x: torch.Tensor, w: torch.Tensor, s: float) -> list[torch.Tensor]:
    y = torch.nn.functional.linear(torch.sigmoid(x) * s, w)
    return [y + y.sum(1, keepdim=True), torch.exp(x)]


def test_option_runs_plainly_on_cpu() -> None:
    fd = define()
    x, w = torch.randn(6, 4), torch.randn(5, 4)
    for got, want in zip(fd.execute([x, w, 0.5], _enable_options=["cuda_graph"]), reference(x, w, 0.5), strict=True):
        torch.testing.assert_close(got, want)
    assert not any(isinstance(n, CaptureGraph) for n in fd.fec.last_program.container.walk())


def graph_step(program: object) -> GraphStep:
    """The step of a program's ``CaptureGraph`` (what ``cuda_graph`` makes of a CUDA program)."""
    assert isinstance(program, HostIrEvaluator)
    (node,) = program.container.nodes
    assert isinstance(node, CaptureGraph)
    step = program.step_of(node)
    assert isinstance(step, GraphStep)
    return step


def _dumps(fd: FusionDefinition) -> tuple[str, str]:
    return fd.last_kernel_code(), fd.last_scheduled_fusion_ir()


def test_dumps_of_a_program_replayed_from_graphs_are_its_programs() -> None:
    """``last_kernel_code`` and ``last_scheduled_fusion_ir`` both read the kernels a ``CaptureGraph``
    captures (on CPU the option runs plainly: the pass is run here as a GPU compile runs it)."""
    fd = define()
    x, w = torch.randn(6, 4), torch.randn(5, 4)
    fd.execute([x, w, 0.5], _enable_options=["triton_interpreter"])
    plain = _dumps(fd)
    assert "tl.store(" in plain[0] and "loop domain" in plain[1]
    program = fd.fec.last_program
    assert isinstance(program, HostIrEvaluator)
    capture_graph(program.container, CompileOptions(device=torch.device("cuda", 0)))
    assert isinstance(program.container.nodes[0], CaptureGraph)
    assert _dumps(fd) == plain


@cuda
def test_dumps_under_the_cuda_graph_option() -> None:
    fd = define()
    w = torch.randn(16, 8, device="cuda")
    fd.execute([torch.randn(12, 8, device="cuda"), w, 0.5])
    plain = _dumps(fd)
    fd.execute([torch.randn(12, 8, device="cuda"), w, 0.5], _enable_options=["cuda_graph"])
    assert isinstance(graph_step(fd.fec.last_program), GraphStep) and _dumps(fd) == plain


def test_static_input_buffer_of_an_expanded_tensor() -> None:
    """A stride-0 input is copied as the span it addresses and viewed with its own strides."""
    example = torch.randn(3, 1).expand(3, 4)
    buffer = _StaticInput(example)
    other = torch.randn(3, 1).expand(3, 4)
    buffer.flat.copy_(buffer.source(other))
    assert buffer.view.stride() == other.stride()
    torch.testing.assert_close(buffer.view, other)


def test_graph_key_reads_static_addresses_and_scalar_values() -> None:
    runner = CudaGraphRunner(lambda args: [], static_inputs=[0])
    a, b = torch.randn(2, 2), torch.randn(2, 2)
    assert runner.key([a, 1.0]) != runner.key([a, 2.0])  # a scalar is baked into the kernels
    assert runner.key([torch.tensor(1.0), 1.0]) != runner.key([torch.tensor(2.0), 1.0])  # so is a CPU scalar tensor
    assert runner.key([a, 1.0])[1:] == runner.key([b, 1.0])[1:]


@cuda
@pytest.mark.parametrize("stream_chunks", [0, 3, 1], ids=["plain", "stream_loop", "stream_loop_of_one_chunk"])
def test_replay_matches_plain_execution(stream_chunks: int) -> None:
    """(A loop of one chunk runs on the caller's stream: the joins of its workers are not captured.)"""
    fd = define(stream_chunks)
    w = torch.randn(16, 8, device="cuda")
    first_x = torch.randn(12, 8, device="cuda")
    first = fd.execute([first_x, w, 0.5], _enable_options=["cuda_graph"])
    program = graph_step(fd.fec.last_program)
    assert program.captures == 1
    for scale in (0.5, 0.5, 2.0):
        x = torch.randn(12, 8, device="cuda")
        got = fd.execute([x, w, scale], _enable_options=["cuda_graph"])
        for g, want in zip(got, reference(x, w, scale), strict=True):
            torch.testing.assert_close(g, want)
    assert program.captures == 2  # the new scalar value, nothing else
    for g, want in zip(first, reference(first_x, w, 0.5), strict=True):  # earlier results are the caller's
        torch.testing.assert_close(g, want)
    x = torch.randn(20, 8, device="cuda")  # a new size: a new signature, a new graph
    for g, want in zip(fd.execute([x, w, 0.5], _enable_options=["cuda_graph"]), reference(x, w, 0.5), strict=True):
        torch.testing.assert_close(g, want)
    assert fd.fec.compile_count == 1


@cuda
def test_replay_of_permuted_and_expanded_inputs() -> None:
    fd = define()
    w = torch.randn(16, 8, device="cuda")
    for _ in range(2):
        x = torch.randn(8, 12, device="cuda").t()
        got = fd.execute([x, w, 1.5], _enable_options=["cuda_graph"])
        for g, want in zip(got, reference(x, w, 1.5), strict=True):
            torch.testing.assert_close(g, want)
        x = torch.randn(12, 1, device="cuda").expand(12, 8)
        got = fd.execute([x, w, 1.5], _enable_options=["cuda_graph"])
        for g, want in zip(got, reference(x, w, 1.5), strict=True):
            torch.testing.assert_close(g, want)


def test_parameters_views_and_graph_results_are_keyed_by_address() -> None:
    runner = CudaGraphRunner(lambda args: [])
    weight = torch.nn.Parameter(torch.randn(3, 2))
    assert runner.in_place([weight, weight.t(), torch.randn(3), 2.0]) == frozenset({0, 1})
    assert runner.key([weight.t()]) != runner.key([torch.nn.Parameter(torch.randn(3, 2)).t()])
    assert runner.key([torch.randn(2, 3)]) == runner.key([torch.randn(2, 3)])


def test_a_call_fits_the_last_signature_without_building_its_key() -> None:
    """The last call's key is checked against the next call's arguments cheaply: sizes, strides,
    dtypes, scalar values and in-place addresses must match; whether a copied input lasts is not
    asked (it is copied either way)."""
    runner = CudaGraphRunner(lambda args: [])
    weight = torch.nn.Parameter(torch.randn(4, 3))
    x = torch.randn(2, 3)
    key = runner.key([x, weight.t(), 2.0, torch.tensor(1.5)])
    assert runner.fits(key, [torch.randn(2, 3), weight.t(), 2.0, torch.tensor(1.5)])
    assert runner.fits(key, [torch.nn.Parameter(torch.randn(2, 3)), weight.t(), 2.0, torch.tensor(1.5)])
    for other in ([torch.randn(3, 2).t(), weight.t(), 2.0, torch.tensor(1.5)],  # strides
                  [torch.randn(2, 4)[:, :3], weight.t(), 2.0, torch.tensor(1.5)],  # strides again
                  [torch.randn(2, 3, dtype=torch.float64), weight.t(), 2.0, torch.tensor(1.5)],
                  [x, torch.nn.Parameter(torch.randn(4, 3)).t(), 2.0, torch.tensor(1.5)],  # another address
                  [x, weight.t(), 3.0, torch.tensor(1.5)], [x, weight.t(), 2, torch.tensor(1.5)],
                  [x, weight.t(), 2.0, torch.tensor(2.5)], [x, weight.t(), 2.0], [x, weight.t(), x, x]):
        assert not runner.fits(key, other)


def test_a_detached_view_of_a_seen_parameter_is_read_in_place() -> None:
    """The weight transpose a forward saved reaches the backward detached (no ``_base``): it is on the
    storage of a parameter a graph was called with, so it is read in place, not copied per replay
    (7 weight copies per Llama training step, 200 us at seq 128); once the parameter is freed, a
    tensor on the storage that took its address is copied again."""
    forward, backward = CudaGraphRunner(lambda args: []), CudaGraphRunner(lambda args: [])
    weight = torch.nn.Parameter(torch.randn(64, 32))
    saved = weight.t().detach()
    assert saved._base is None and backward.in_place([saved]) == frozenset()  # not seen yet
    assert forward.in_place([weight]) == frozenset({0})
    assert backward.in_place([saved, saved[1:], torch.randn(2)]) == frozenset({0, 1})
    address = weight.data_ptr()
    del weight, saved
    reused = torch.empty(64 * 32)
    assert reused.data_ptr() != address or backward.in_place([reused]) == frozenset()


@cuda
def test_results_are_graph_buffers_replayed_once_let_go() -> None:
    """A result is the graph's buffer, not a copy; while the caller holds it the next call replays a
    second replica, and with both held a call runs without a graph; held results never change."""
    weight = torch.nn.Parameter(torch.randn(64, 64, device="cuda"))
    runner = CudaGraphRunner(lambda args: [args[0] @ args[1].t() + 1, args[0][:, :4]], hand_out_bytes=0)
    xs = [torch.randn(32, 64, device="cuda") for _ in range(6)]
    out = None
    for x in xs:  # a loop: the previous result is alive during the next call
        out = runner([x, weight.t()])
        torch.testing.assert_close(out[0], x @ weight + 1)
        torch.testing.assert_close(out[1], x[:, :4])
    assert (runner.captures, runner.graphs_captured, runner.plain_runs) == (1, 2, 0)
    graph = runner._graphs[runner.key([xs[0], weight.t()])][0]
    assert [k for k, _ in graph.copies] == [0]  # the weight's transpose is read where it lives
    del out
    held = [runner([x, weight.t()]) for x in xs[:3]]  # the third call finds both replicas' results held
    assert runner.plain_runs == 1 and runner.graphs_captured == 2
    for x, (y, head) in zip(xs[:3], held, strict=True):
        torch.testing.assert_close(y, x @ weight + 1)
        torch.testing.assert_close(head, x[:, :4])  # a view of the input's buffer: not overwritten either
    with torch.no_grad():
        weight.mul_(2)  # an in-place update is read by the next replay, with no capture
    del held
    result = runner([xs[0], weight.t()])
    torch.testing.assert_close(result[0], xs[0] @ weight + 1)
    assert runner.graphs_captured == 2
    consumer = CudaGraphRunner(lambda args: [args[0].sum(1)])  # 128 bytes: copied out
    total = consumer([result[0]])
    assert consumer._graphs[consumer.key([result[0]])][0].copies == []  # another graph's result: read in place
    del result
    kept = runner([xs[1], weight.t()])  # the consumer's graph does not pin the buffer it read
    runner([xs[2], weight.t()])  # one replica's results held: the other replays
    assert runner.graphs_captured == 2 and runner.plain_runs == 1
    torch.testing.assert_close(kept[0], xs[1] @ weight + 1)
    torch.testing.assert_close(total[0], (xs[0] @ weight + 1).sum(1))


class _FakeCapture:
    """A capture without a GPU: replays ``run`` and records whether its graph was released."""

    def __init__(self, run: cuda_graph.Run, args: list[object], *rest: object) -> None:
        self.run, self.released = run, False

    def free(self) -> bool:
        return True

    def replay(self, args: list[object]) -> list[torch.Tensor]:
        return self.run(list(args))

    def release(self) -> None:
        self.released = True


def test_captures_are_specializations_forgotten_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner keeps its captures per key as every specialization is kept: one key more than
    ``SPECIALIZATION_LIMIT`` forgets them all (each graph released, its buffers' addresses no longer
    lasting) and captures the new key; a forgotten key captures again."""
    monkeypatch.setattr(specialization, "SPECIALIZATION_LIMIT", 3)
    monkeypatch.setattr(cuda_graph, "CapturedGraph", _FakeCapture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    runner = CudaGraphRunner(lambda args: [args[0] * 2])
    xs = [torch.randn(n + 1, 2) for n in range(4)]
    for x in xs[:3] + xs[:3]:
        torch.testing.assert_close(runner([x])[0], x * 2)
    assert runner.captures == 3 and isinstance(runner._graphs, specialization.Specializations)
    first = [runner._graphs[runner.key([x])][0] for x in xs[:3]]
    runner([xs[3]])
    assert all(g.released for g in first) and list(runner._graphs) == [runner.key([xs[3]])]
    torch.testing.assert_close(runner([xs[0]])[0], xs[0] * 2)
    assert runner.captures == 5


def test_a_collective_runner_runs_a_keys_first_call_plain_and_its_graphs_go_before_the_groups(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner of a multi-device program (``collective``): the first call of each key runs without a graph
    (communicators and P2P buffers are set up there), the second captures; the communicator's teardown
    drops its graphs (every rank's, with the groups' collectives in them) and leaves other runners' alone."""
    monkeypatch.setattr(cuda_graph, "CapturedGraph", _FakeCapture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    collective = CudaGraphRunner(lambda args: [args[0] * 2], collective=True)
    single = CudaGraphRunner(lambda args: [args[0]])
    x, y = torch.randn(3, 2), torch.randn(4, 2)
    for inputs in ([x], [x], [x], [y], [y]):
        torch.testing.assert_close(collective(inputs)[0], inputs[0] * 2)
    single([x])
    assert (collective.plain_runs, collective.captures, single.plain_runs, single.captures) == (2, 2, 0, 1)
    captured = [graph for replicas in collective._graphs.values() for graph in replicas]
    Communicator()._teardown(destroy_world=False)  # a communicator of its own: not the process's
    assert all(g.released for g in captured) and not collective._graphs and len(single._graphs) == 1
    collective([x])
    assert collective.captures == 3  # captured anew (a key's plain first run is not repeated)


@cuda
def test_result_on_an_input_read_in_place_is_that_input() -> None:
    weight = torch.nn.Parameter(torch.randn(8, 4, device="cuda"))
    runner = CudaGraphRunner(lambda args: [args[0] * 2, args[1][2:]], hand_out_bytes=0)
    x = torch.randn(8, 4, device="cuda")
    for _ in range(3):
        doubled, rows = runner([x, weight])
        torch.testing.assert_close(doubled, x * 2)
        assert rows.data_ptr() == weight[2:].data_ptr() and rows.shape == (6, 4)
    assert runner.graphs_captured == 2 and runner.plain_runs == 0


@cuda
def test_small_results_are_copies_with_their_layouts_and_saved_ones_are_buffers() -> None:
    """Small results reach the caller as copies, one batched copy per dtype, each with its output's
    sizes and strides (transposed, expanded, 0-size), independent of one another and of later
    replays; results from ``handed_from`` on (a forward's saved activations) are the graph's buffers."""

    def program(args: list[torch.Tensor]) -> list[torch.Tensor]:
        x = args[0]
        return [x.t() * 2, x.sum(1, keepdim=True).expand(-1, 3), x[:0], (x > 0).int(), x.double().exp(), x + 1]

    def want(x: torch.Tensor) -> list[torch.Tensor]:
        return program([x])

    runner = CudaGraphRunner(program, handed_from=5)
    xs = [torch.randn(4, 6, device="cuda") for _ in range(3)]
    kept = [runner([x]) for x in xs]
    for x, got in zip(xs, kept, strict=True):
        for g, w in zip(got, want(x), strict=True):
            assert g.shape == w.shape and g.stride() == w.stride() and g.dtype == w.dtype
            torch.testing.assert_close(g, w)
    first = kept[0]
    first[0].zero_()  # a copy of its own: the next result of the same dtype is untouched
    torch.testing.assert_close(first[4], xs[0].double().exp())
    (captured, *_) = runner._graphs[runner.key([xs[0]])]
    assert len(captured._staged) == 3 and [j for j, _ in captured._handed] == [5]
    assert first[5].untyped_storage().data_ptr() == captured.outputs[5].untyped_storage().data_ptr()


class _Refused:
    """A capture that every key refuses (as one of a program waiting for the host is)."""

    def __init__(self, *args: object) -> None:
        raise CaptureError("the program of 1 outputs: the program cannot be captured into a CUDA graph: refused")


def _doubling_step(frame: Frame) -> None:
    frame.values[2] = frame.values[1] * 2


def test_a_signature_that_cannot_be_captured_runs_without_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture that fails (an operation the capture refuses) is reported once; its key then runs the
    node's body plainly, never raising the capture's error to the caller; another key tries its own."""
    monkeypatch.setattr(cuda_graph, "CapturedGraph", _Refused)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # a CPU build has no CUDA state
    step = GraphStep([_doubling_step], reads=[1], writes=[2], name="the program of 1 outputs")
    x = torch.randn(3, 2)
    frame = Frame([None, x, None], EvalContext(), None)
    with pytest.warns(UserWarning, match=r"cannot be captured into a CUDA graph: refused; this input signature runs "
                                         r"without CUDA graphs from now on"):
        step(frame)
    torch.testing.assert_close(frame.values[2], x * 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the key is not tried again
        frame = Frame([None, x + 1, None], EvalContext(), None)
        step(frame)
    torch.testing.assert_close(frame.values[2], (x + 1) * 2)
    assert step.captures == 0 and step.runner.plain_runs == 2
    with pytest.warns(UserWarning, match="refused"):  # a new size: a new key, tried once
        step(Frame([None, torch.randn(4, 2), None], EvalContext(), None))


def test_a_graph_step_reads_and_writes_its_slots_per_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``CaptureGraph``'s step keys its captures by the values it reads (a new size captures, the same
    one replays), runs its body on a frame of its own, and writes only its outputs into the program's
    frame; inside a caller's capture it runs the body on the frame, to be captured by the caller."""
    monkeypatch.setattr(cuda_graph, "CapturedGraph", _FakeCapture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    runs: list[Frame] = []

    def body(frame: Frame) -> None:
        runs.append(frame)
        frame.values[3] = frame.values[1] * frame.values[2]
        frame.values[4] = frame.values[3] + 1  # an intermediate the node does not hand on

    step = GraphStep([body], reads=[1, 2], writes=[4], name="the program of 1 outputs")
    for rows, scale in ((3, 2.0), (3, 2.0), (5, 2.0), (3, 0.5)):
        x = torch.randn(rows, 2)
        frame = Frame([None, x, scale, None, None], EvalContext(), None)
        step(frame)
        torch.testing.assert_close(frame.values[4], x * scale + 1)
        assert frame.values[3] is None and runs[-1] is not frame
    assert step.captures == 3  # (3, 2.0), (5, 2.0), (3, 0.5)
    capturing[0] = True
    frame = Frame([None, x, 1.0, None, None], EvalContext(), None)
    step(frame)
    assert runs[-1] is frame and step.captures == 3
    torch.testing.assert_close(frame.values[4], x + 1)


def test_a_graph_step_replays_the_last_key_without_a_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    """``GraphStep.replay`` (what a program of one ``CaptureGraph`` runs without value slots or a frame): the
    last key's free graph replayed for values that fit it; None, with nothing run, before a capture, for another
    size or scalar value, while the graph's results are held, and inside a caller's capture."""

    class Replayed(_FakeCapture):
        def __init__(self, run: cuda_graph.Run, args: list[object], *rest: object) -> None:
            super().__init__(run, args)
            run(list(args))  # the capture's run
            self.held, self.replays = False, 0

        def free(self) -> bool:
            return not self.held

        def replay(self, args: list[object]) -> list[torch.Tensor]:
            self.replays += 1
            x, scale = args
            assert isinstance(x, torch.Tensor) and isinstance(scale, float)
            return [x * scale + 1]

    monkeypatch.setattr(cuda_graph, "CapturedGraph", Replayed)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])

    def body(frame: Frame) -> None:
        frame.values[4] = frame.values[1] * frame.values[2] + 1

    step = GraphStep([body], reads=[1, 2], writes=[4], name="the program of 1 outputs")
    x = torch.randn(3, 2)
    assert step.replay([x, 2.0]) is None  # nothing captured: the step captures from a frame
    step(Frame([None, x, 2.0, None, None], EvalContext(), None))
    (graph,) = step.runner._graphs[step.runner.key([x, 2.0])]
    assert graph.replays == 1  # a capture's call replays it
    y = torch.randn(3, 2)
    replayed = step.replay([y, 2.0])
    assert replayed is not None and graph.replays == 2
    torch.testing.assert_close(replayed[0], y * 2.0 + 1)
    for other in ([torch.randn(5, 2), 2.0], [y, 0.5]):
        assert step.replay(other) is None
    graph.held = True  # the caller holds its last results: another replica is the step's to capture
    assert step.replay([y, 2.0]) is None
    graph.held, capturing[0] = False, True
    assert step.replay([y, 2.0]) is None and graph.replays == 2


@cuda
def test_a_program_of_one_graph_replays_without_its_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``cuda_graph`` program is one ``CaptureGraph``: a call that replays the last call's graph goes from the
    evaluator to the graph (no frame, no ``GraphStep.__call__``); the replica a held result needs and a new
    size take the step, and every result is torch's (the held one too)."""
    fd = define()
    w = torch.randn(600, 8, device="cuda")  # results of 512 x 600 floats: the graph's buffers, handed out
    fd.execute([torch.randn(512, 8, device="cuda"), w, 0.5], _enable_options=["cuda_graph"])
    program = fd.fec.last_program
    assert isinstance(program, HostIrEvaluator) and program._graph is not None
    framed = [0]
    call = GraphStep.__call__

    def counted(self: GraphStep, frame: Frame) -> None:
        framed[0] += 1
        call(self, frame)

    monkeypatch.setattr(GraphStep, "__call__", counted)
    calls = []
    for k in range(4):
        x = torch.randn(512, 8, device="cuda")
        got = fd.execute([x, w, 0.5], _enable_options=["cuda_graph"])
        for g, want in zip(got, reference(x, w, 0.5), strict=True):
            torch.testing.assert_close(g, want)
        calls.append(framed[0])
        if k == 1:
            held, held_x = got, x  # the next call needs another replica: captured through the step
        del got
    assert calls == [0, 0, 1, 1] and graph_step(program).runner.graphs_captured == 2
    for g, want in zip(held, reference(held_x, w, 0.5), strict=True):
        torch.testing.assert_close(g, want)
    x = torch.randn(20, 8, device="cuda")
    for g, want in zip(fd.execute([x, w, 0.5], _enable_options=["cuda_graph"]), reference(x, w, 0.5), strict=True):
        torch.testing.assert_close(g, want)
    assert framed[0] == 2


@cuda
def test_stream_loop_over_an_empty_input_under_cuda_graphs() -> None:
    """Fuzz seed 3000044 (mode cuda_graph): an empty input split over streams failed its capture."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1], contiguity=True, dtype=DataType.Int32)
        s = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.expand(t0, [s]))
    t0.outer_split(0, 3)
    t0.axis(0).parallelize(ParallelType.stream)
    x = torch.zeros(0, dtype=torch.int32, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # whether this program is captured is the runner's call
        (out,) = fd.execute([x, 0], _enable_options=["cuda_graph"])
    assert out.shape == (0,) and out.dtype == torch.int32 and out.is_cuda


@cuda
def test_a_capture_that_fails_midway_leaves_random_numbers_and_the_allocator_working() -> None:
    """A program that synchronizes inside the capture (past the warm-up's check) invalidates it: the
    capture is refused, torch's CUDA generator is not left capturing (every later random op of the
    process raised "Offset increment outside graph capture"), and the caller's stream is current again."""
    calls: list[int] = []

    def syncs_when_captured(args: list[object]) -> list[object]:
        calls.append(1)
        x = args[0]
        assert isinstance(x, torch.Tensor)
        y = torch.rand_like(x) + x
        if len(calls) > 1:  # the capture, not the warm-up
            torch.cuda.synchronize()
        return [y]

    x = torch.randn(8, device="cuda")
    pool = torch.cuda.graph_pool_handle()
    user = torch.cuda.current_stream()
    with pytest.raises(CaptureError, match="cannot be captured"):
        CapturedGraph(syncs_when_captured, [x], frozenset(), pool, "the program")
    assert torch.randn(4, device="cuda").shape == (4,)
    # nor is the capture's stream left current (torch's graph context skips restoring it when ending fails)
    assert torch.cuda.current_stream() == user
    # nor is the allocator left allocating into the graph's pool (the process aborted at exit)
    with pytest.raises(RuntimeError, match="not currently recording"):
        torch._C._cuda_endAllocateToPool(x.device.index, pool)
