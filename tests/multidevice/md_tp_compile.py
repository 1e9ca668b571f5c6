"""Tensor + sequence parallel blocks through ``torch.compile(backend="pyfuser")``, run under ``torchrun`` by
test_tp_compile.py.

Each case parallelizes a small block with torch's plans (``ColwiseParallel`` / ``RowwiseParallel`` /
``SequenceParallel``, as torchtitan does), compiles it with pyfuser, and compares the forward and the
gradients with the unsharded block on one process. Which collectives became pyfuser pipelines is checked
on the compiled programs themselves (their P2P transfer nodes), and which stayed torch's, with why.
"""

from __future__ import annotations

import copy
import os
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
import torch.nn.functional as F
from harness import assert_close, case, comm, device, expect_error, main, randn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from pyfuser.integrations.torch_compile import PyfuserBackend
from pyfuser.integrations.torch_compile.backend import CompiledGraph

# On CPUs every P2P program says once that gloo carries its transfers: expected here.
warnings.filterwarnings("ignore", message="pyfuser: CommunicatorBackend.cuda cannot run")
warnings.filterwarnings("ignore", category=FutureWarning)

HIDDEN, BATCH = 16, 2


def compile_with_pyfuser(fn: object) -> tuple[object, PyfuserBackend]:
    """``fn`` compiled by a fresh backend (dynamo's caches reset: a graph compiled by an earlier case's backend
    is never reused here)."""
    torch._dynamo.reset()
    backend = PyfuserBackend()
    return torch.compile(fn, backend=backend), backend


def mesh() -> DeviceMesh:
    return init_device_mesh(device().type, (comm().size(),))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(HIDDEN)
        self.up = nn.Linear(HIDDEN, 4 * HIDDEN, bias=False)
        self.down = nn.Linear(4 * HIDDEN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.silu(self.up(self.norm(x))))


class Attention(nn.Module):
    def __init__(self, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.RMSNorm(HIDDEN)
        self.q, self.k, self.v = (nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(3))
        self.o = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        b, s, _ = h.shape

        def heads(t: torch.Tensor) -> torch.Tensor:  # -1: the local heads of a column-parallel projection
            return t.view(b, s, -1, HIDDEN // self.heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.q(h)), heads(self.k(h)), heads(self.v(h)), is_causal=True)
        return x + self.o(out.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, heads: int) -> None:
        super().__init__()
        self.attn = Attention(heads)
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.attn(x))


def tp_sp_plan(column: list[str], row: list[str]) -> dict[str, object]:
    """Norm sequence-parallel, ``column`` column-parallel, ``row`` row-parallel back to the sequence sharding."""
    plan: dict[str, object] = {"norm": SequenceParallel()}
    plan.update({name: ColwiseParallel(input_layouts=Shard(1)) for name in column})
    plan.update({name: RowwiseParallel(output_layouts=Shard(1)) for name in row})
    return plan


def run_block(model: nn.Module, plan: dict[str, object], seq: int, what: str) -> PyfuserBackend:
    """Compile the parallelized copy of ``model``, run forward and backward on this rank's slice of the
    sequence, and compare output, input gradient and every weight gradient with ``model`` on one process."""
    d, rank = comm().size(), comm().rank()
    reference = model.to(device())
    sharded = copy.deepcopy(reference)
    parallelize_module(sharded, mesh(), plan)  # type: ignore[arg-type]
    compiled, backend = compile_with_pyfuser(sharded)
    x, grad = randn(BATCH, seq, HIDDEN), randn(BATCH, seq, HIDDEN)
    x_full = x.clone().requires_grad_()
    want = reference(x_full)
    want.backward(grad)
    x_local = x.chunk(d, dim=1)[rank].clone().requires_grad_()
    for attempt in range(2):  # the second call runs the compiled graphs' cached path
        x_local.grad = None
        sharded.zero_grad()
        got = compiled(x_local)
        got.backward(grad.chunk(d, dim=1)[rank])
        assert_close(got, want.chunk(d, dim=1)[rank], f"{what} output, call {attempt}")
        assert_close(x_local.grad, x_full.grad.chunk(d, dim=1)[rank], f"{what} input gradient, call {attempt}")  # type: ignore[union-attr]
        reference_grads = dict(reference.named_parameters())
        for name, p in sharded.named_parameters():
            # Whole gradients: a replicated weight of a sequence-parallel norm has partial sums on each rank
            assert isinstance(p.grad, DTensor), f"{name}: expected a DTensor gradient"
            assert_close(p.grad.full_tensor(), reference_grads[name].grad, f"{what} gradient of {name}, call {attempt}")  # type: ignore[arg-type]
    return backend


def graphs(backend: PyfuserBackend, kind: str) -> list[CompiledGraph]:
    found = [g for g in backend.graphs if g.kind == kind]
    if not found:
        raise AssertionError(f"no {kind} graph was compiled")
    return found


def check_pipelines(backend: PyfuserBackend, kind: str, expected: dict[str, int]) -> None:
    """The ``kind`` graphs ran ``expected`` pipelines of each kind, each as d - 1 sends and d - 1 receives of
    P2P transfers and no collective in its program."""
    d = comm().size()
    found: dict[str, int] = {}
    for graph in graphs(backend, kind):
        for call in graph.collective_matmuls:
            found[call.kind] = found.get(call.kind, 0) + 1
            counts = call.communications()
            if counts != {"P2PCommunication": 2 * (d - 1), "Communication": 0}:
                raise AssertionError(f"{call.name}: expected {2 * (d - 1)} P2P transfers and no collective, got "
                                     f"{counts}:\n{call.host_ir()}")
    if found != expected:
        raise AssertionError(f"{kind}: expected pipelines {expected}, compiled {found}")


def kept(backend: PyfuserBackend, kind: str, op: str) -> list[str]:
    """Why each ``op`` collective of the ``kind`` graphs stayed torch's."""
    return [why for g in graphs(backend, kind) for name, why in g.eager.items() if why.startswith(f"_c10d_functional.{op}")]


@case(min_world=2)
def tp_sp_transformer_block() -> None:
    """An attention block then an MLP block, each a sequence-parallel norm, column-parallel projections and a
    row-parallel one back to the sequence sharding (one compilation for both: the launch stays short)."""
    torch.manual_seed(0)
    d = comm().size()
    plan = {f"attn.{k}": v for k, v in tp_sp_plan(["q", "k", "v"], ["o"]).items()}
    plan.update({f"mlp.{k}": v for k, v in tp_sp_plan(["up"], ["down"]).items()})
    backend = run_block(Block(heads=2 * d), plan, 2 * d, "TP + SP transformer block")
    # Forward: each block's all-gather feeds its column-parallel matmuls (three, then one) and is saved for
    # their weight gradients: an all-gather + matmuls pipeline that returns the gathered activations too;
    # each row-parallel matmul + reduce-scatter is a pipeline. Backward: the gathered output gradient of each
    # row-parallel projection feeds its input gradient's matmul (and, returned, its weight gradient's); the
    # input gradient of every column-parallel projection is a matmul + reduce-scatter (one each: their inputs
    # were gathered one by one). No collective is left to torch.
    check_pipelines(backend, "forward", {"allgather_matmul": 2, "matmul_reduce_scatter": 2})
    check_pipelines(backend, "backward", {"allgather_matmul": 2, "matmul_reduce_scatter": 4})
    forward = [c for g in graphs(backend, "forward") for c in g.collective_matmuls if c.kind == "allgather_matmul"]
    if [len(c.out_shapes) for c in forward] != [4, 2]:
        raise AssertionError(f"expected the q, k, v and up matmuls, each with the gathered value: "
                             f"{[c.out_shapes for c in forward]}")
    left = kept(backend, "forward", "") + kept(backend, "backward", "")
    if left:
        raise AssertionError(f"every collective of the block should be in a pipeline: {left}")


@case(min_world=2)
def allgather_matmul_pipeline_in_inference() -> None:
    """Without gradients the gathered activations feed only the matmul: the all-gather + matmul pipeline,
    for a sequence dim behind a batch dim (the rows of the blocks interleave) and in front of it."""
    d, rank = comm().size(), comm().rank()
    torch.manual_seed(2)
    model = MLP().to(device())
    sharded = copy.deepcopy(model)
    parallelize_module(sharded, mesh(), tp_sp_plan(["up"], ["down"]))  # type: ignore[arg-type]
    compiled, backend = compile_with_pyfuser(sharded)
    x = randn(BATCH, 2 * d, HIDDEN)
    with torch.no_grad():
        for _ in range(2):
            got = compiled(x.chunk(d, dim=1)[rank].contiguous())
            assert_close(got, model(x).chunk(d, dim=1)[rank], "TP + SP MLP inference")
    check_pipelines(backend, "inference", {"allgather_matmul": 1, "matmul_reduce_scatter": 1})
    call = next(c for g in graphs(backend, "inference") for c in g.collective_matmuls if c.kind == "allgather_matmul")
    if call.outer != BATCH:
        raise AssertionError(f"the gathered sequence dim follows the batch dim: expected outer {BATCH}, got {call.outer}")

    # Gathered along dim 0 (the sequence outermost), each rank's rows one block: no reordering.
    mesh_ = mesh()
    w = randn(8, HIDDEN)
    group = mesh_.get_group()

    def column_parallel(x_local: torch.Tensor, w_local: torch.Tensor) -> torch.Tensor:
        gathered = funcol.all_gather_tensor(x_local, 0, group)
        return gathered @ w_local.t()

    fn, backend = compile_with_pyfuser(column_parallel)
    xs = randn(3 * d, HIDDEN)
    w_local = w.chunk(d, 0)[rank]
    assert_close(fn(xs.chunk(d, 0)[rank], w_local), xs @ w_local.t(), "all-gather along dim 0 + matmul")
    check_pipelines(backend, "inference", {"allgather_matmul": 1})
    (graph,) = graphs(backend, "inference")
    (call,) = graph.collective_matmuls
    # A shard laid out column-major (a transposed activation): the program reads it as laid out.
    shard = xs.chunk(d, 0)[rank]
    (got,) = call(shard.t().contiguous().t(), w_local)
    assert_close(got, xs @ w_local.t(), "all-gather + matmul of a column-major shard")
    # A weight of the wrong width on every rank: an error naming the pipeline and its FX nodes, before any
    # transfer (the peers never wait on a rank that failed).
    message = expect_error(lambda: call(xs.chunk(d, 0)[rank], randn(8, HIDDEN + 1)), Exception, call.name, "FX nodes")
    if "all_gather_into_tensor" not in message:
        raise AssertionError(f"the error should name the pipeline's FX nodes: {message}")
    # Another row count: dynamo recompiles with a symbolic size, which the pattern does not take: torch's
    # all-gather runs, with why.
    xs = randn(5 * d, HIDDEN)
    assert_close(fn(xs.chunk(d, 0)[rank], w_local), xs @ w_local.t(), "all-gather + matmul of symbolic size")
    dynamic = graphs(backend, "inference")[-1]
    why = [w for w in dynamic.eager.values() if w.startswith("_c10d_functional.all_gather_into_tensor")]
    if dynamic.collective_matmuls or len(why) != 1 or "symbolic or unknown sizes" not in why[0]:
        raise AssertionError(f"expected torch's all-gather for symbolic sizes, with why: {why}")


@case(min_world=2)
def collective_matmul_chosen_by_size() -> None:
    """The graph's static sizes decide (``comm/overlap_model.py``): at these sizes the CPU model says the plain
    collective with the matmul (one collective in the call's program), a model with a slow link says the P2P
    pipeline; both give torch's result, for the all-gather + matmul and the matmul + reduce-scatter."""
    d, rank = comm().size(), comm().rank()
    group = mesh().get_group()

    def column_parallel(x_local: torch.Tensor, w_local: torch.Tensor) -> torch.Tensor:
        return funcol.all_gather_tensor(x_local, 0, group) @ w_local.t()

    def row_parallel(x_local: torch.Tensor, w_local: torch.Tensor) -> torch.Tensor:
        return funcol.reduce_scatter_tensor(x_local @ w_local.t(), "sum", 0, group)

    xs, w = randn(3 * d, HIDDEN), randn(8, HIDDEN)
    patterns = [(column_parallel, xs.chunk(d, 0)[rank], w.chunk(d, 0)[rank], (xs @ w.chunk(d, 0)[rank].t())),
                (row_parallel, xs.chunk(d, 1)[rank], w.chunk(d, 1)[rank], (xs @ w.t()).chunk(d, 0)[rank])]
    saved = {name: os.environ.pop(name) for name in ("PYFUSER_ENABLE", "PYFUSER_OVERLAP_MODEL") if name in os.environ}
    try:
        for fn, x_local, w_local, expected_value in patterns:
            for env, pipelined in (({}, False), ({"PYFUSER_OVERLAP_MODEL": "0.000001,0.001,0,0,0"}, True)):
                what = f"{fn.__name__}, {env or 'CPU model'}"
                os.environ.update(env)
                try:
                    compiled, backend = compile_with_pyfuser(fn)
                    got = compiled(x_local, w_local)  # type: ignore[operator]
                finally:
                    for name in env:
                        del os.environ[name]
                assert_close(got, expected_value, what, atol=1e-4)
                (call,) = [c for g in graphs(backend, "inference") for c in g.collective_matmuls]
                expected = ({"P2PCommunication": 2 * (d - 1), "Communication": 0} if pipelined
                            else {"P2PCommunication": 0, "Communication": 1})
                if call.decision.pipelined != pipelined or call.communications() != expected:
                    raise AssertionError(f"{what}: expected {expected}, got {call.summary()}:\n{call.host_ir()}")
    finally:
        os.environ.update(saved)


@case(min_world=2)
def collectives_not_fed_by_a_matmul_run_as_they_are() -> None:
    """A reduce-scatter of something else than a matmul, one that averages, an all-reduce and an all-gather
    along the last dim stay torch's collectives, between pyfuser's regions, with why."""
    d, rank = comm().size(), comm().rank()
    group = mesh().get_group()
    w, wide = randn(HIDDEN, HIDDEN), randn(d * HIDDEN, HIDDEN)

    def blocks(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        scattered = funcol.reduce_scatter_tensor(torch.relu(x) * 2, "sum", 0, group)
        averaged = funcol.reduce_scatter_tensor(x @ w, "avg", 0, group)
        reduced = funcol.all_reduce(x.sin() @ w, "sum", group)
        gathered = funcol.all_gather_tensor(x, 1, group)  # along the contracted dim
        return scattered + 1, averaged, reduced, gathered @ wide

    fn, backend = compile_with_pyfuser(blocks)
    x = randn(2 * d, HIDDEN) + rank  # different on every rank: the sums are sums
    got = fn(x)
    xs = [randn(2 * d, HIDDEN) + r for r in range(d)]
    want_scattered = sum(torch.relu(t) * 2 for t in xs).chunk(d, 0)[rank] + 1  # type: ignore[union-attr]
    want_averaged = (sum(t @ w for t in xs) / d).chunk(d, 0)[rank]  # type: ignore[operator]
    want_reduced = sum(t.sin() @ w for t in xs)
    full = torch.cat(xs, 1)
    for value, want, what in ((got[0], want_scattered, "reduce-scatter of a relu"),
                              (got[1], want_averaged, "averaging reduce-scatter"),
                              (got[2], want_reduced, "all-reduce"), (got[3], full @ wide, "all-gather")):
        assert_close(value, want, what, atol=1e-3)
    compiled = graphs(backend, "inference")  # one graph on CPUs; dynamo may split it on GPUs
    patterns = [c.name for graph in compiled for c in graph.collective_matmuls]
    if patterns:
        raise AssertionError(f"nothing here is a pipeline pattern, got {patterns}")
    reasons = " | ".join(kept(backend, "inference", "reduce_scatter_tensor") + kept(backend, "inference", "all_"))
    needles = ["its input is not a matmul's output but mul", "it reduces with 'avg'",
               "_c10d_functional.all_reduce.default is a collective, run by torch between regions"]
    # On CUDA dynamo breaks the graph at the all-gather along dim 1 (torch waits for its result in Python
    # before the cat) and runs it between the graphs: no graph holds it. Where a graph does, it says why.
    if device().type == "cpu" or kept(backend, "inference", "all_gather"):
        needles.append("it gathers along the last dim")
    for needle in needles:
        if needle not in reasons:
            raise AssertionError(f"expected {needle!r} among the reasons: {reasons}")
    if not any(graph.regions for graph in compiled):
        raise AssertionError("the pointwise ops around the collectives should still be pyfuser regions")
    dist.barrier()


if __name__ == "__main__":
    main()
