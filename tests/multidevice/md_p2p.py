"""P2P pipelines (``CommunicatorBackend.cuda``), run under ``torchrun --nproc-per-node N`` by test_multidevice.py.

All-gather + GEMM and GEMM + reduce-scatter, with and without a stream loop, compared with torch on the full
tensors, and the Host IR they lower to. On CPUs the transfers fall back to gloo (one warning says why); on
GPUs with peer access they run over the copy engines in symmetric memory (the dump says ``backend=CUDA``).
"""

from __future__ import annotations

import os
import re
import warnings

import torch
import torch.nn.functional as F
from harness import assert_close, case, comm, device, expect_error, main, randn

from pyfuser import FusionDefinition, ParallelType, TensorView
from pyfuser.host_ir.cuda_graph import CudaGraphRunner, GraphStep
from pyfuser.host_ir.evaluator import HostIrEvaluator
from pyfuser.host_ir.nodes import CaptureGraph
from pyfuser.multidevice import (
    CommunicatorBackend,
    DeviceMesh,
    MultiDeviceExecutor,
    MultiDeviceExecutorParams,
    shard_tensor,
)

X = ParallelType.mesh_x
STREAM = ParallelType.stream
P2P = MultiDeviceExecutorParams(backend_type=CommunicatorBackend.cuda)


def world() -> tuple[int, int, DeviceMesh]:
    c = comm()
    return c.size(), c.rank(), DeviceMesh(range(c.size()))


def transport() -> str:
    """The backend the P2P nodes must print: the copy engines on GPUs, gloo send / recv on CPUs."""
    return "CUDA" if device().type == "cuda" else "GLOO"


def place(mesh: DeviceMesh, *tvs: TensorView) -> None:
    for tv in tvs:
        tv.set_device_mesh(mesh)


def _operands(fd: FusionDefinition, streams: int | None, sizes: tuple[list[int], int] | None,
              ) -> tuple[TensorView, TensorView]:
    """``x`` and ``w`` of a linear: symbolic, or with every size given (``sizes``: global ``x``'s shape and
    ``w``'s rows), the sizes the decision between pipeline and collective reads at compile time."""
    if sizes is None:
        return fd.define_tensor([-1] * (4 if streams else 3)), fd.define_tensor([-1, -1])
    shape, n = sizes
    return fd.define_tensor(shape), fd.define_tensor([n, shape[-1]])


def allgather_linear(streams: int | None, bias: bool = True, sizes: tuple[list[int], int] | None = None,
                     ) -> tuple[FusionDefinition, TensorView]:
    """Seed 004: ``x [S, D, m, K]`` sharded on axis 1, output stream-parallel on axis 0 (no loop: ``[D, m, K]``);
    returns the fusion and ``x``."""
    _, _, mesh = world()
    with FusionDefinition() as fd:
        x, w = _operands(fd, streams, sizes)
        b = fd.define_tensor([-1]) if bias else None
        out = fd.ops.linear(x, w, b)
        fd.add_output(out)
        place(mesh, x, w, *([b] if b is not None else []), out)
        x.axis(1 if streams else 0).parallelize(X)
        if streams:
            out.axis(0).parallelize(STREAM)
    return fd, x


def linear_reduce_scatter(streams: int | None, sizes: tuple[list[int], int] | None = None,
                          ) -> tuple[FusionDefinition, TensorView, TensorView]:
    """Row-parallel linear into ``out [S, D, m, N]`` sharded on axis 1 (no loop: ``[D, m, N]``): K is sharded.
    Returns the fusion, ``x`` and ``w``."""
    d, _, mesh = world()
    rank_axis = 1 if streams else 0
    with FusionDefinition() as fd:
        x, w = _operands(fd, streams, sizes)
        out = fd.ops.linear(x, w)
        fd.add_output(out)
        place(mesh, x, w, out)
        x.outer_split(x.ndim - 1, d)
        x.axis(x.ndim - 1).parallelize(X)
        w.outer_split(1, d)
        w.axis(1).parallelize(X)
        out.axis(rank_axis).parallelize(X)
        if streams:
            out.axis(0).parallelize(STREAM)
    return fd, x, w


def check_pipeline(text: str, rank: int, d: int, kind: str) -> None:
    """The P2P program: a symmetric buffer, d - 1 sends and receives in rotated order, no collective left."""
    sends = re.findall(r"P2PCommunication [\d.]+ \(type=send, .*peer=(\d+), backend=(\w+)\)", text)
    recvs = re.findall(r"P2PCommunication [\d.]+ \(type=recv, .*peer=(\d+), backend=(\w+)\)", text)
    first_send, first_recv = (rank - 1) % d, (rank + 1) % d
    if kind == "reduce_scatter":
        first_send, first_recv = first_recv, first_send  # the next peer's partial sums are computed first
    problems = []
    if "mem_type=symmetric" not in text or "ReleaseSymmetricBuffer" not in text:
        problems.append("a symmetric buffer and its release")
    if len(sends) != d - 1 or len(recvs) != d - 1:
        problems.append(f"{d - 1} sends and receives, got {len(sends)} and {len(recvs)}")
    elif int(sends[0][0]) != first_send or int(recvs[0][0]) != first_recv:
        problems.append(f"first send to {first_send} and first receive from {first_recv} (rotated order)")
    if {b for _, b in sends + recvs} != {transport()}:
        problems.append(f"backend={transport()} on every transfer")
    if re.search(r"type=(Allgather|ReduceScatter)", text):
        problems.append("no collective left")
    if kind == "all-gather" and sends:
        # This rank's GEMM is issued before the sends, which wait only for the fork before it.
        first_gemm = re.search(r"= (linear|matmul)\(", text)
        gemm = first_gemm.start() if first_gemm else -1
        fork, send = text.find("Fork P2PCommunication"), text.find("type=send")
        if not 0 <= fork < gemm < send or text.count("after=fork") != text.count("type=send"):
            problems.append("a fork, then this rank's GEMM, then sends that wait for the fork")
    if problems:
        raise AssertionError(f"P2P {kind} program lacks {'; '.join(problems)}:\n{text}")


@case()
def p2p_transport_falls_back_with_one_warning() -> None:
    """The first P2P program of the process decides the transport of its team: on CPUs one warning says why
    gloo carries the transfers; on GPUs with peer access there is none."""
    d, _, _ = world()
    fd, x = allgather_linear(2)
    xf, wf, bf = randn(2, d, 3, 8), randn(5, 8), randn(5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (got,) = MultiDeviceExecutor(fd.fusion, P2P).run([shard_tensor(xf, x), wf, bf])
    assert_close(got, F.linear(xf, wf, bf), "P2P all-gather + linear")
    fallbacks = [str(w.message) for w in caught if "CommunicatorBackend.cuda cannot run" in str(w.message)]
    if device().type == "cuda":
        if fallbacks:
            raise AssertionError(f"the CUDA transport fell back on a GPU machine: {fallbacks}")
    elif len(fallbacks) != 1 or "cpu tensors" not in fallbacks[0] or "GLOO" not in fallbacks[0]:
        raise AssertionError(f"expected one warning naming why gloo carries the transfers, got {fallbacks}")


@case()
def p2p_allgather_linear_pipeline() -> None:
    d, rank, _ = world()
    for streams in (1, 2, 4):
        fd, x = allgather_linear(streams)
        executor = MultiDeviceExecutor(fd.fusion, P2P)
        for attempt in range(2):  # the symmetric buffer is set up once and reused
            xf, wf, bf = randn(streams, d, 3 + attempt, 8), randn(5, 8), randn(5)
            (got,) = executor.run([shard_tensor(xf, x), wf, bf])
            assert_close(got, F.linear(xf, wf, bf), f"P2P all-gather + linear, S={streams}, run {attempt}")
        text = executor.host_ir()
        check_pipeline(text, rank, d, "all-gather")
        # Own block first: the GEMM on this rank's shard comes before any receive.
        if text.index("= linear(") > text.index("type=recv") or text.count("= linear(") != d:
            raise AssertionError(f"expected this rank's GEMM first, then one per peer block:\n{text}")


@case()
def p2p_linear_reduce_scatter_pipeline() -> None:
    d, rank, _ = world()
    for streams in (1, 2, 4):
        fd, x, w = linear_reduce_scatter(streams)
        executor = MultiDeviceExecutor(fd.fusion, P2P)
        for attempt in range(2):
            xf, wf = randn(streams, d, 2 + attempt, 4 * d), randn(5, 4 * d)
            (got,) = executor.run([shard_tensor(xf, x), shard_tensor(wf, w)])
            assert_close(got, F.linear(xf, wf)[:, rank:rank + 1], f"P2P linear + reduce-scatter, S={streams}",
                         atol=1e-4)
        text = executor.host_ir()
        check_pipeline(text, rank, d, "reduce_scatter")
        if text.count("= linear(") != d or len(re.findall(r"^ +\+ T\d+", text, re.M)) != d - 1:
            raise AssertionError(f"expected d GEMMs and d - 1 accumulations of received partial sums:\n{text}")


@case()
def p2p_without_stream_loop() -> None:
    """No stream loop: the pipeline runs over the peers' blocks at the top level (S = 1)."""
    d, rank, mesh = world()
    fd, x = allgather_linear(None, bias=False)
    xf, wf = randn(d, 4, 8), randn(6, 8)
    executor = MultiDeviceExecutor(fd.fusion, P2P)
    (got,) = executor.run([shard_tensor(xf, x), wf])
    assert_close(got, F.linear(xf, wf), "top-level P2P all-gather + linear")
    check_pipeline(executor.host_ir(), rank, d, "all-gather")

    fd, x, w = linear_reduce_scatter(None)
    xf, wf = randn(d, 3, 2 * d), randn(4, 2 * d)
    executor = MultiDeviceExecutor(fd.fusion, P2P)
    (got,) = executor.run([shard_tensor(xf, x), shard_tensor(wf, w)])
    assert_close(got, F.linear(xf, wf)[rank:rank + 1], "top-level P2P linear + reduce-scatter")
    check_pipeline(executor.host_ir(), rank, d, "reduce_scatter")

    with FusionDefinition() as fd:  # a [M, K] rows sharded, b [K, N] and the output replicated: gather a
        a, b = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        c = fd.ops.matmul(a, b)
        fd.add_output(c)
        place(mesh, a, b, c)
        a.outer_split(0, d)
        a.axis(0).parallelize(X)
    af, bf = randn(2 * d, 5), randn(5, 3)
    executor = MultiDeviceExecutor(fd.fusion, P2P)
    (got,) = executor.run([shard_tensor(af, a), bf])
    assert_close(got, af @ bf, "P2P all-gather + matmul")
    check_pipeline(executor.host_ir(), rank, d, "all-gather")


@case()
def p2p_allgather_several_gemms_and_gathered_output() -> None:
    """The gathered tensor read by two GEMMs and returned (a training forward saves it for the weight
    gradients): one pipeline, each landed block copied into the gathered output and multiplied by both."""
    d, rank, mesh = world()
    with FusionDefinition() as fd:
        x, w1, w2 = fd.define_tensor([-1, -1, -1]), fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        gathered = fd.ops.set(x)
        fd.add_output(fd.ops.linear(gathered, w1))
        fd.add_output(fd.ops.matmul(gathered, w2))
        fd.add_output(gathered)
        place(mesh, x, w1, w2, gathered)
        x.axis(0).parallelize(X)
    executor = MultiDeviceExecutor(fd.fusion, P2P)
    for attempt in range(2):  # the second run reuses the channel: the returned tensors stay the first run's
        xf, w1f, w2f = randn(d, 3 + attempt, 8), randn(5, 8), randn(8, 4)
        got = executor.run([shard_tensor(xf, x), w1f, w2f])
        for value, want, what in ((got[0], F.linear(xf, w1f), "linear"), (got[1], xf @ w2f, "matmul"),
                                  (got[2], xf, "gathered")):
            assert_close(value, want, f"P2P all-gather + two GEMMs, {what}, run {attempt}")
        if attempt == 0:
            first, first_want = got[2], xf
    assert_close(first, first_want, "the first run's gathered output after the second run (its own memory)")
    text = executor.host_ir()
    check_pipeline(text, rank, d, "all-gather")
    if text.count("= linear(") != d or text.count("= matmul(") != d or text.count("= copy of") != d:
        raise AssertionError(f"expected each GEMM and a copy into the gathered output per block:\n{text}")


@case()
def p2p_noncontiguous_and_empty_shards() -> None:
    d, _, _ = world()
    fd, x = allgather_linear(2)
    executor = MultiDeviceExecutor(fd.fusion, P2P)
    xf, wf, bf = randn(2, d, 3, 8), randn(5, 8), randn(5)
    shard = shard_tensor(xf, x)
    permuted = shard.permute(3, 0, 1, 2).contiguous().permute(1, 2, 3, 0)  # same values, K outermost in memory
    assert not permuted.is_contiguous()
    (got,) = executor.run([permuted, wf, bf])
    assert_close(got, F.linear(xf, wf, bf), "P2P all-gather of a permuted shard")
    empty = randn(2, d, 0, 8)
    (got,) = executor.run([shard_tensor(empty, x), wf, bf])
    assert_close(got, F.linear(empty, wf, bf), "P2P all-gather of empty shards")


@case()
def p2p_only_when_asked() -> None:
    """Without ``backend_type=cuda`` the process group's collectives run; ``PYFUSER_COMM_BACKEND`` asks for it
    process-wide (fd.execute too); a name that is no backend is an error naming the known ones."""
    d, rank, _ = world()
    fd, x = allgather_linear(2)
    xf, wf, bf = randn(2, d, 3, 8), randn(5, 8), randn(5)
    executor = MultiDeviceExecutor(fd.fusion)
    (got,) = executor.run([shard_tensor(xf, x), wf, bf])
    assert_close(got, F.linear(xf, wf, bf), "collective all-gather + linear")
    if "type=Allgather" not in executor.host_ir() or "P2PCommunication" in executor.host_ir():
        raise AssertionError(f"expected the Allgather collective by default:\n{executor.host_ir()}")
    os.environ["PYFUSER_COMM_BACKEND"] = "cuda"
    try:
        (got,) = fd.execute([shard_tensor(xf, x), wf, bf])
    finally:
        del os.environ["PYFUSER_COMM_BACKEND"]
    assert_close(got, F.linear(xf, wf, bf), "P2P all-gather + linear through fd.execute")
    check_pipeline(str(fd.fec.last_program), rank, d, "all-gather")
    expect_error(lambda: MultiDeviceExecutor(fd.fusion, MultiDeviceExecutorParams(backend_type="ucx")),  # type: ignore[arg-type]
                 ValueError, "backend_type", "'ucx'", "cuda")


def static_pattern(kind: str, streams: int | None, shape: list[int], n: int) -> FusionDefinition:
    """``allgather_linear`` / ``linear_reduce_scatter`` with every size given (global ``x`` of ``shape``,
    ``w [n, K]``)."""
    if kind == "all-gather":
        return allgather_linear(streams, bias=False, sizes=(shape, n))[0]
    return linear_reduce_scatter(streams, sizes=(shape, n))[0]


@case()
def p2p_chosen_by_size() -> None:
    """With every size known, ``comm/overlap_model.py`` picks the pipeline or the plain collective then GEMM:
    at these small sizes the CPU model says the collective; a model with a slow link says the pipeline; the
    options force either (from the environment or the executor's params). Every choice gives torch's
    result, with P2P transfers or one collective."""
    d, rank, _ = world()
    model = os.environ.pop("PYFUSER_OVERLAP_MODEL", None)
    slow_link = "0.000001,0.001,0,0,0"  # 1 MFLOP/s, 1 MB/s, no latencies: GEMMs as long as transfers, hidden
    try:
        for kind, collective in (("all-gather", "Allgather"), ("reduce_scatter", "ReduceScatter")):
            for streams in (None, 2):
                k = 4 * d
                shape = ([streams] if streams else []) + [d, 3, k]
                fd = static_pattern(kind, streams, shape, 5)
                xf, wf = randn(*shape), randn(5, k)
                expected = F.linear(xf, wf)
                if kind == "reduce_scatter":
                    expected = expected[:, rank:rank + 1] if streams else expected[rank:rank + 1]
                forced_on = MultiDeviceExecutorParams(backend_type=CommunicatorBackend.cuda,
                                                      enable_options=("p2p_pipelines_always",))
                forced_off = MultiDeviceExecutorParams(backend_type=CommunicatorBackend.cuda,
                                                       disable_options=("p2p_pipelines",))
                for env, params, pipelined in (
                        (None, P2P, False), ({"PYFUSER_OVERLAP_MODEL": slow_link}, P2P, True),
                        ({"PYFUSER_ENABLE": "p2p_pipelines_always"}, P2P, True),
                        ({"PYFUSER_OVERLAP_MODEL": slow_link, "PYFUSER_DISABLE": "p2p_pipelines"}, P2P, False),
                        (None, forced_on, True), ({"PYFUSER_OVERLAP_MODEL": slow_link}, forced_off, False)):
                    os.environ.update(env or {})
                    try:
                        executor = MultiDeviceExecutor(fd.fusion, params)  # options and model are read per compile
                        inputs = [xf[:, rank:rank + 1] if streams else xf[rank:rank + 1], wf]
                        if kind == "reduce_scatter":
                            inputs = [xf.chunk(d, -1)[rank], wf.chunk(d, -1)[rank]]
                        (got,) = executor.run(inputs)
                    finally:
                        for name in env or {}:
                            del os.environ[name]
                    what = f"{kind}, S={streams}, {env or 'CPU model'}, {params.enable_options or params.disable_options}"
                    assert_close(got, expected, what, atol=1e-4)
                    text = executor.host_ir()
                    if pipelined:
                        check_pipeline(text, rank, d, kind)
                    elif f"type={collective}" not in text or "P2PCommunication" in text:
                        raise AssertionError(f"{what}: expected the {collective} collective and no P2P transfer:\n{text}")
        misspelt = MultiDeviceExecutorParams(enable_options=("p2p_pipeline_always",))
        expect_error(lambda: MultiDeviceExecutor(fd.fusion, misspelt), ValueError, "unknown option",
                     "p2p_pipeline_always", "p2p_pipelines_always")
    finally:
        if model is not None:
            os.environ["PYFUSER_OVERLAP_MODEL"] = model


@case()
def p2p_shards_of_different_shapes_raise() -> None:
    """A rank whose shard has another shape than its peers': every rank raises before any transfer."""
    d, rank, _ = world()
    fd, x = allgather_linear(2)
    rows = 3 if rank == 0 else 2
    xf, wf, bf = randn(2, d, rows, 8), randn(5, 8), randn(5)
    executor = MultiDeviceExecutor(fd.fusion, P2P)
    expect_error(lambda: executor.run([shard_tensor(xf, x), wf, bf]), ValueError, "the P2P buffer of the all-gather",
                 "axis 2 has extent", "must pass shards of the same shape")
    xf = randn(2, d, 2, 8)  # consistent again: the same executor works
    (got,) = executor.run([shard_tensor(xf, x), wf, bf])
    assert_close(got, F.linear(xf, wf, bf), "P2P all-gather after a rejected run")
    torch.testing.assert_close(got.shape, torch.Size([2, d, 2, 5]))



def _graph_runner(executor: MultiDeviceExecutor) -> CudaGraphRunner:
    """The CUDA-graph runner of an executor's last program (its one ``CaptureGraph`` block)."""
    program = executor._cache.last_program
    assert isinstance(program, HostIrEvaluator)
    (node,) = program.container.nodes
    step = program.step_of(node)
    if not isinstance(node, CaptureGraph) or not isinstance(step, GraphStep) or not node.collective:
        raise AssertionError(f"expected one collective CaptureGraph block:\n{program.container}")
    return step.runner


@case()
def pipelines_replayed_from_cuda_graphs() -> None:
    """``cuda_graph``: the P2P pipelines (with and without a stream loop) and the programs of the process
    group's collectives are captured with their transfers and replayed on every rank with new values: the
    results are torch's; one capture per signature, whose first call runs without a graph (set-up). On CPUs
    the option leaves the programs as they are (its warning is the CPU's)."""
    d, rank, _ = world()
    nccl = MultiDeviceExecutorParams(cuda_graph=True)
    p2p = MultiDeviceExecutorParams(backend_type=CommunicatorBackend.cuda, cuda_graph=True)
    for params, streams in ((p2p, None), (p2p, 2), (nccl, None), (nccl, 2)):
        what = f"{params.backend_type or 'process group'}, S={streams or 1}"
        ag, x = allgather_linear(streams)
        rs, xr, wr = linear_reduce_scatter(streams)
        ag_executor, rs_executor = MultiDeviceExecutor(ag.fusion, params), MultiDeviceExecutor(rs.fusion, params)
        wf, bf, wrf = randn(5, 8), randn(5), randn(5, 4 * d)
        lead = (streams, d) if streams else (d,)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "_enable_options=.*CUDA graphs capture CUDA work only")
            for attempt in range(4):
                xf = randn(*lead, 3, 8) * (attempt + 1)
                (got,) = ag_executor.run([shard_tensor(xf, x), wf, bf])
                assert_close(got, F.linear(xf, wf, bf), f"all-gather + linear from a CUDA graph, {what}, run {attempt}")
                xrf = randn(*lead, 2, 4 * d) * (attempt + 1)
                (got,) = rs_executor.run([shard_tensor(xrf, xr), shard_tensor(wrf, wr)])
                want = F.linear(xrf, wrf)[:, rank:rank + 1] if streams else F.linear(xrf, wrf)[rank:rank + 1]
                assert_close(got, want, f"linear + reduce-scatter from a CUDA graph, {what}, run {attempt}", atol=1e-4)
        if device().type == "cuda":
            for name, executor in (("all-gather", ag_executor), ("reduce-scatter", rs_executor)):
                runner = _graph_runner(executor)
                if runner.captures != 1 or runner.plain_runs != 1:
                    raise AssertionError(f"{name}, {what}: expected one capture and one plain first run, got "
                                         f"{runner.captures} and {runner.plain_runs}")


if __name__ == "__main__":
    main()
