"""Sharding propagation, resharding decomposition and communication selection, in one process.

A fake 4-process world stands in for torchrun: these passes only read the world size and this rank.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pyfuser import DataType, FusionDefinition, ParallelType
from pyfuser.comm.comm_plan import plan_communication
from pyfuser.ir.analysis.sharding import regroups_a_shard
from pyfuser.ir.ops import BinaryOp, BinaryOpType, LinearOp, LoadStoreOp, ReshapeOp
from pyfuser.ir.ops.attention import SdpaBwdOp, SdpaFwdOp
from pyfuser.ir.tensor_view import TensorView
from pyfuser.multidevice import CommunicationType, Communicator, DeviceMesh, sharding_of
from pyfuser.options import LaunchInfo
from pyfuser.preseg.decompose_resharding import decompose_resharding
from pyfuser.preseg.propagate_shardings import propagate_shardings

X, Y = ParallelType.mesh_x, ParallelType.mesh_y
MESH = DeviceMesh(range(4))


@pytest.fixture(autouse=True)
def world_of_four() -> Iterator[None]:
    saved = Communicator._instance
    Communicator._instance = Communicator(LaunchInfo(0, 4, 0, 4, "127.0.0.1", 29500), backend="gloo")
    yield
    Communicator._instance = saved


def shard(tv: TensorView, axis: int, ptype: ParallelType = X, parts: int = 4) -> None:
    tv.outer_split(axis, parts)
    tv.axis(axis).parallelize(ptype)


def axes(tv: TensorView) -> dict[int, ParallelType]:
    return dict(sharding_of(tv).axes)


def sets(fd: FusionDefinition) -> list[LoadStoreOp]:
    return [e for e in fd.fusion.exprs() if isinstance(e, LoadStoreOp)]


def test_linear_follows_the_weight_then_fills_from_the_input() -> None:
    with FusionDefinition() as fd:
        x, w = fd.define_tensor([-1, -1, -1]), fd.define_tensor([-1, -1])
        h = fd.ops.linear(x, w)
        y = fd.ops.relu(h)
        fd.add_output(y)
    mesh = DeviceMesh([[0, 1], [2, 3]])
    for tv in (x, w):
        tv.set_device_mesh(mesh)
    shard(w, 0, X, 2)        # column-parallel weight: output features on mesh_x
    shard(x, 0, Y, 2)        # data parallel batch on mesh_y
    propagate_shardings(fd.fusion)
    assert axes(h) == {0: Y, 2: X} and axes(y) == {0: Y, 2: X}
    assert h.device_mesh == mesh == y.device_mesh


def test_reduced_axis_does_not_propagate_and_user_annotations_win() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        s = fd.ops.sum(x, [1])
        t = fd.ops.neg(x)
        fd.add_output(s)
        fd.add_output(t)
    x.set_device_mesh(MESH)
    shard(x, 1)
    t.set_device_mesh(MESH)
    shard(t, 0)              # the user wants t sharded by rows instead
    propagate_shardings(fd.fusion)
    assert axes(s) == {} and axes(t) == {0: X}


def test_placing_a_tensor_on_a_mesh_without_device_ids_means_replicated() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y, z = fd.ops.neg(x), fd.ops.abs(x)
        fd.add_output(y)
        fd.add_output(z)
    x.set_device_mesh(MESH)
    shard(x, 0)
    y.set_device_mesh(MESH)
    propagate_shardings(fd.fusion)
    assert axes(y) == {} and axes(z) == {0: X}
    decompose_resharding(fd.fusion)
    (gather,) = sets(fd)
    assert gather.output is not y and y.definition is not None and y.definition.inputs[0] is gather.output


def test_sequence_parallel_linear_inserts_an_allgather() -> None:
    with FusionDefinition() as fd:
        x, w = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        out = fd.ops.linear(x, w)
        fd.add_output(out)
    for tv in (x, w):
        tv.set_device_mesh(MESH)
        shard(tv, 0)
    propagate_shardings(fd.fusion)
    decompose_resharding(fd.fusion)
    (gather,) = sets(fd)
    assert gather.inputs[0] is x and axes(gather.output) == {}
    assert isinstance(out.definition, LinearOp) and out.definition.inputs[0] is gather.output
    plan = plan_communication(gather, rank=2)
    assert plan is not None and (plan.type, plan.team, plan.dim) == (CommunicationType.Allgather, (0, 1, 2, 3), 0)


@pytest.mark.parametrize("scatter", [False, True])
def test_row_parallel_linear_makes_partial_sums_and_adds_the_bias_once(scatter: bool) -> None:
    with FusionDefinition() as fd:
        x, w, b = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1]), fd.define_tensor([-1])
        out = fd.ops.linear(x, w, b)
        fd.add_output(out)
    for tv in (x, w, b, out):
        tv.set_device_mesh(MESH)
    shard(x, 1)
    shard(w, 1)
    if scatter:
        shard(out, 0)
    propagate_shardings(fd.fusion)
    decompose_resharding(fd.fusion)
    assert isinstance(out.definition, BinaryOp) and out.definition.kind is BinaryOpType.add
    (reduce,) = sets(fd)
    partial = reduce.inputs[0]
    assert isinstance(partial.definition, LinearOp) and not partial.definition.has_bias
    assert axes(partial) == {2: X}  # [M, N, rK]: the reduction ID is sharded -> partial sums
    plan = plan_communication(reduce, rank=1)
    expected = CommunicationType.ReduceScatter if scatter else CommunicationType.Allreduce
    assert plan is not None and plan.type is expected and plan.reduce_op == "sum"
    if scatter:
        assert plan.dim == 0


def test_replicated_to_sharded_on_one_mesh_is_a_local_slice() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.ops.set(x)
        fd.add_output(y)
    for tv in (x, y):
        tv.set_device_mesh(MESH)
    shard(y, 1)
    plan = plan_communication(y.definition, rank=3)  # type: ignore[arg-type]
    assert plan is not None and plan.is_local and plan.dim == 1


@pytest.mark.parametrize("src_ranks, dst_ranks, shard_src, shard_dst, rank, expected", [
    ([0], [1], False, False, 0, (CommunicationType.SendRecv, (0, 1), 0)),
    ([0], [0, 1, 2, 3], False, False, 2, (CommunicationType.Broadcast, (0, 1, 2, 3), 0)),
    ([0, 1, 2, 3], [2], True, False, 1, (CommunicationType.Gather, (0, 1, 2, 3), 2)),
    ([3], [0, 1, 2, 3], False, True, 0, (CommunicationType.Scatter, (0, 1, 2, 3), 3)),
])
def test_moves_between_meshes(src_ranks: list[int], dst_ranks: list[int], shard_src: bool, shard_dst: bool,
                              rank: int, expected: tuple[CommunicationType, tuple[int, ...], int]) -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.ops.set(x)
        fd.add_output(y)
    x.set_device_mesh(DeviceMesh(src_ranks))
    y.set_device_mesh(DeviceMesh(dst_ranks))
    if shard_src:
        shard(x, 0, parts=len(src_ranks))
    if shard_dst:
        shard(y, 0, parts=len(dst_ranks))
    plan = plan_communication(y.definition, rank)  # type: ignore[arg-type]
    assert plan is not None and (plan.type, plan.team, plan.root) == expected


def test_rank_outside_the_team_takes_no_part() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.ops.set(x)
        fd.add_output(y)
    x.set_device_mesh(DeviceMesh([0]))
    y.set_device_mesh(DeviceMesh([1]))
    assert plan_communication(y.definition, rank=3) is None  # type: ignore[arg-type]


def test_reduce_of_partial_sums_onto_one_rank() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        s = fd.ops.sum(x, [0])
        fd.add_output(s)
    x.set_device_mesh(MESH)
    shard(x, 0)
    s.set_device_mesh(DeviceMesh([1]))
    propagate_shardings(fd.fusion)
    decompose_resharding(fd.fusion)
    (reduce,) = sets(fd)
    plan = plan_communication(reduce, rank=0)
    assert plan is not None and (plan.type, plan.root) == (CommunicationType.Reduce, 1)


def test_no_resharding_path_names_both_tensors() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.ops.set(x)
        fd.add_output(y)
    mesh = DeviceMesh([[0, 1], [2, 3]])
    x.set_device_mesh(mesh)
    y.set_device_mesh(mesh)
    shard(x, 0, X, 2)
    shard(x, 2, Y, 2)  # loop [X, M/2, N]: N is loop axis 2
    with pytest.raises(ValueError, match=r"no resharding path from T0 .* to T1 .*2 device parallel types"):
        plan_communication(y.definition, rank=0)  # type: ignore[arg-type]


def test_mesh_larger_than_the_world() -> None:
    """Checked by the executor, which knows the world (compiler passes never join the process group)."""
    import torch

    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        fd.add_output(fd.ops.neg(x))
    x.set_device_mesh(DeviceMesh(range(6)))
    with pytest.raises(ValueError, match=r"T0 is on DeviceMesh\{0 1 2 3 4 5\}, which needs rank 5, but the world "
                                         r"has only 4 processes"):
        fd.execute([torch.randn(3)])


def test_one_rank_mesh_runs_locally_with_a_stream_loop() -> None:
    """Everything on mesh [0] of a (fake) 4-process world: the Allgather of a tensor split over one rank is
    a team of one -- a local copy, no process group (creating one would wait for the absent peers) -- and a
    stream loop may take chunks of an axis "sharded" over a single rank."""
    import torch
    import torch.nn.functional as F

    Communicator._instance = Communicator(LaunchInfo(0, 4, 0, 4, "127.0.0.1", 29500), backend="gloo", timeout_s=5)
    with FusionDefinition() as fd:
        x, w = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        gathered = fd.ops.set(x)
        out = fd.ops.linear(gathered, w)
        fd.add_output(out)
        for tv in (x, w, gathered, out):
            tv.set_device_mesh(DeviceMesh([0]))
        shard(x, 0, parts=1)
        for tv in (gathered, out):
            tv.outer_split(0, 2)
            tv.axis(0).parallelize(ParallelType.stream)
    a, b = torch.randn(5, 8), torch.randn(3, 8)
    (got,) = fd.execute([a, b])
    torch.testing.assert_close(got, F.linear(a, b))
    assert "type=Allgather, team=(0)" in str(fd.fec.last_program)
    assert not Communicator._instance._groups



def _sdpa_training(axis: int) -> tuple[FusionDefinition, list[TensorView]]:
    """sdpa forward and backward with q, k, v and the output's gradient ``[B, H, S, E]`` sharded on ``axis``
    and propagated; returns the fusion and the three gradients."""
    with FusionDefinition() as fd:
        q, k, v, grad = (fd.define_tensor([-1, -1, -1, -1]) for _ in range(4))
        out, lse, seed, offset = fd.ops.sdpfa_fwd(q, k, v, dropout_p=None, is_causal=True)
        grads = fd.ops.sdpfa_bwd(grad, q, k, v, out, lse, None, True, seed, offset)
        for g in grads:
            fd.add_output(g)
    for tv in (q, k, v, grad):
        tv.set_device_mesh(MESH)
        shard(tv, axis)
    propagate_shardings(fd.fusion)
    decompose_resharding(fd.fusion)
    return fd, list(grads)


def test_sdpa_on_head_sharded_operands_runs_on_the_shards() -> None:
    """sdpa attends head by head: with q, k, v and the output's gradient sharded on the heads, forward and
    backward run on the shards with no communication (nvFuser's head-parallel attention): the attention,
    its log-sum-exp and every gradient are sharded on the heads, the philox seed and offset replicated."""
    fd, grads = _sdpa_training(1)
    forward = next(e for e in fd.fusion.exprs() if isinstance(e, SdpaFwdOp))
    backward = next(e for e in fd.fusion.exprs() if isinstance(e, SdpaBwdOp))
    assert [axes(t) for t in forward.tensor_outputs] == [{1: X}, {1: X}, {}, {}]
    assert [axes(t) for t in backward.tensor_inputs] == [{1: X}] * 6 + [{}, {}]
    assert [axes(g) for g in grads] == [{1: X}] * 3 and all(g.definition is backward for g in grads)
    assert not sets(fd)


def test_sdpa_on_sequence_sharded_operands_gathers_and_slices_each_gradient() -> None:
    """A causal attention's query positions read every key before them: sharded on the sequence, the
    operands are gathered, the ops run whole and each gradient (one output each, ``k`` to ``grad_k``) is
    sliced back to this rank's positions."""
    fd, grads = _sdpa_training(2)
    backward = next(e for e in fd.fusion.exprs() if isinstance(e, SdpaBwdOp))
    assert all(axes(t) == {} for t in backward.tensor_inputs)
    assert [axes(g) for g in grads] == [{2: X}] * 3
    for g, computed in zip(grads, backward.tensor_outputs, strict=True):
        assert isinstance(g.definition, LoadStoreOp) and g.definition.inputs[0] is computed


@pytest.mark.parametrize("form", ["groups_along_m", "groups_along_n", "groups_along_k"])
def test_grouped_mm_follows_the_ungrouped_axes(form: str) -> None:
    """A column-parallel weight's N (and a data-parallel M) shards grouped_mm's output as linear's; the
    grouped axis is never sharded from an operand (``offsets`` are positions along all of it)."""
    shapes = {"groups_along_m": ([-1, -1], [4, -1, -1]), "groups_along_n": ([4, -1, -1], [-1, -1]),
              "groups_along_k": ([-1, -1], [-1, -1])}[form]
    with FusionDefinition() as fd:
        a, b = fd.define_tensor(shapes[0]), fd.define_tensor(shapes[1])
        offsets = fd.define_tensor([4], dtype=DataType.Int32)
        out = fd.ops.grouped_mm(a, b, offsets)
        fd.add_output(out)
    for tv in (a, b, offsets):
        tv.set_device_mesh(MESH)
    shard(b, b.ndim - 1)  # the weight's N
    propagate_shardings(fd.fusion)
    assert axes(out) == ({} if form == "groups_along_n" else {out.ndim - 1: X})  # out [G, M, N] or [M, N]
    if form != "groups_along_m":  # M is not grouped: a data-parallel M shards the output's rows
        with FusionDefinition() as fd:
            a, b = fd.define_tensor(shapes[0]), fd.define_tensor(shapes[1])
            out = fd.ops.grouped_mm(a, b, fd.define_tensor([4], dtype=DataType.Int32))
            fd.add_output(out)
        for tv in fd.fusion.inputs():
            tv.set_device_mesh(MESH)
        shard(a, a.ndim - 2)
        propagate_shardings(fd.fusion)
        assert axes(out) == {out.ndim - 2: X}


@pytest.mark.parametrize("shape, new_shape, axis, carried, regrouped", [
    ([2, 48], [2, 4, 12], 1, 1, True),      # split: the outer axis (heads) takes the shard
    ([8, 3, 5], [24, 5], 0, 0, True),       # merge of a sharded outer axis
    ([4, 6, 10], [4, 60], 0, 0, False),     # an axis the reshape leaves alone
    ([4, 6, 10], [4, 60], 1, None, False),  # the inner axis of a merge: strided shards
    ([3, 24], [3, 6, 4], 1, None, False),   # split into an outer axis of 6: not a multiple of the 4 ranks
    ([12, 6], [6, 12], 0, None, False),     # a group of two on each side, outer extents 12 and 6
    ([8, 6], [4, 12], 0, 0, True),          # a group of two on each side, both outer extents multiples of 4
])
def test_reshape_carries_a_shard_of_a_groups_outermost_axis(shape: list[int], new_shape: list[int], axis: int,
                                                              carried: int | None, regrouped: bool) -> None:
    """The output axis a reshape turns an input axis's shard into (the reshape then runs on the shards; a
    generated kernel does not take it where it regroups the shard), or none: the operand is gathered, the
    reshape runs whole and its result is sliced."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape)
        y = fd.ops.reshape(x, new_shape)
        fd.add_output(y)
    x.set_device_mesh(MESH)
    shard(x, axis)
    propagate_shardings(fd.fusion)
    decompose_resharding(fd.fusion)
    reshape = next(e for e in fd.fusion.exprs() if isinstance(e, ReshapeOp))
    if carried is None:
        assert axes(y) == {} and axes(reshape.tensor_input(0)) == {}
        (gather,) = sets(fd)
        assert gather.inputs[0] is x and reshape.shard_factors == ()
        return
    assert axes(y) == {carried: X} and not sets(fd)
    assert reshape.shard_factors == tuple(4 if d == carried else 1 for d in range(len(new_shape)))
    assert regroups_a_shard(reshape) is regrouped


def test_reshape_output_sharded_on_an_inner_axis_is_computed_whole_and_sliced() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([2, 48])
        y = fd.ops.reshape(x, [2, 4, 12])
        fd.add_output(y)
    for tv in (x, y):
        tv.set_device_mesh(MESH)
    shard(x, 1)
    shard(y, 2)  # 12 columns of each head: no block of x's 48 columns
    propagate_shardings(fd.fusion)
    decompose_resharding(fd.fusion)
    gather, local_slice = sets(fd)
    reshape = gather.output.uses[0]
    assert isinstance(reshape, ReshapeOp) and axes(reshape.output) == {} and reshape.shard_factors == ()
    assert local_slice.inputs[0] is reshape.output and local_slice.output is y and axes(y) == {2: X}


def test_sharded_reshape_evaluates_to_local_sizes() -> None:
    """A reshape that runs on shards reshapes to its output's global sizes divided by the shard factors, on
    its static path and on its symbolic one (a batch extent bound at execution)."""
    import torch

    from pyfuser.ir.eval_context import EvalContext

    with FusionDefinition() as fd:
        x, z = fd.define_tensor([2, 48]), fd.define_tensor([-1, 12])
        fd.add_output(fd.ops.reshape(x, [2, 4, 12]))
        fd.add_output(fd.ops.reshape(z, [-1, 3, 4]))
    static, symbolic = (e for e in fd.fusion.exprs() if isinstance(e, ReshapeOp))
    static.run_on_shards([1, 4, 1])
    symbolic.run_on_shards([4, 1, 1])
    (name,) = {i.extent.name for i in z.get_logical_domain()[:1]}
    ctx = EvalContext(env={name: 8})
    assert static.evaluate(ctx, torch.zeros(2, 12))[0].shape == (2, 1, 12)
    assert symbolic.evaluate(ctx, torch.zeros(2, 12))[0].shape == (2, 3, 4)
    with pytest.raises(ValueError, match="not divisible by the 4 ranks"):
        symbolic.evaluate(EvalContext(env={name: 6}), torch.zeros(2, 12))


def test_slice_and_pad_run_on_shards_of_axes_they_keep_whole() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 10])
        sliced = fd.ops.slice(x, [0, 2], [8, 9])
        padded = fd.ops.pad(sliced, [1, 1])
        across = fd.ops.slice(x, [1, 0], [7, 10])
        fd.add_output(padded)
        fd.add_output(across)
    x.set_device_mesh(MESH)
    shard(x, 0)
    propagate_shardings(fd.fusion)
    decompose_resharding(fd.fusion)
    assert axes(sliced) == axes(padded) == {0: X} and axes(across) == {}
    (gather,) = sets(fd)  # only the slice along the sharded rows reads them all
    assert gather.inputs[0] is x and gather.output.uses[0] is across.definition
