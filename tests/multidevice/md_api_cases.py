"""Multi-device cases of nvFuser's API (issue 13), run under ``torchrun --nproc-per-node 2`` by
test_multidevice_api.py: all-to-all resharding, sharding through an inner split, execute_with_dtensors,
head- and context-parallel SDPA."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from harness import assert_close, case, comm, device, expect_error, main, randn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from pyfuser import FusionDefinition, ParallelType, execute_with_dtensors
from pyfuser.multidevice import DeviceMesh, shard_tensor

X = ParallelType.mesh_x


def world() -> tuple[int, int, DeviceMesh]:
    c = comm()
    return c.size(), c.rank(), DeviceMesh(range(c.size()))


@case()
def all_to_all_dispatch_and_combine() -> None:
    d, rank, mesh = world()
    for inp_axis, out_axis in ((0, 1), (1, 0)):
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1])
            y = fd.ops.set(x)
            fd.add_output(y)
            for tv, axis in ((x, inp_axis), (y, out_axis)):
                tv.set_device_mesh(mesh)
                tv.outer_split(axis, d)
                tv.axis(axis).parallelize(X)
        full = randn(2 * d, 3 * d)
        (out,) = fd.execute([shard_tensor(full, x)])
        assert_close(out, full.chunk(d, out_axis)[rank], f"all-to-all {inp_axis} -> {out_axis}")
        if "type=AllToAll" not in str(fd.fec.last_program):
            raise AssertionError(f"expected an AllToAll:\n{fd.fec.last_program}")
    with FusionDefinition() as fd:  # a non-contiguous shard, three axes
        x = fd.define_tensor([-1, -1, -1])
        y = fd.ops.set(x)
        fd.add_output(fd.ops.mul(y, 2.0))
        for tv, axis in ((x, 2), (y, 0)):
            tv.set_device_mesh(mesh)
            tv.outer_split(axis, d)
            tv.axis(axis).parallelize(X)
    full = randn(d, 3, 2 * d)
    (out,) = fd.execute([shard_tensor(full, x).transpose(0, 1).contiguous().transpose(0, 1)])
    assert_close(out, (full * 2).chunk(d, 0)[rank], "all-to-all of a transposed shard")


@case()
def sharding_through_an_inner_split() -> None:
    d, rank, mesh = world()
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.ops.exp(x)
        z = fd.ops.set(y)
        fd.add_output(y)
        fd.add_output(z)
        for tv in (x, z):  # y takes x's sharding (propagated); z is replicated: an Allgather
            tv.set_device_mesh(mesh)
        x.split(0, 3)  # nvFuser's split: inner factor 3, outer extent = mesh size
        x.axis(0).parallelize(X)
    full = randn(3 * d, 4)
    local, gathered = fd.execute([full[3 * rank:3 * rank + 3]])
    assert_close(local, full.exp()[3 * rank:3 * rank + 3], "inner-split shard")
    assert_close(gathered, full.exp(), "all-gathered from inner-split shards")
    expect_error(lambda: fd.execute([randn(2, 4)]), ValueError, "T0", "axis 0", "static size 3", "shard")


@case()
def dtensors_in_and_out() -> None:
    d, _, mesh = world()
    torch_mesh = init_device_mesh(device().type, (d,))
    with FusionDefinition() as fd:
        x, w = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        out = fd.ops.linear(x, w)
        fd.add_output(fd.ops.relu(out))
        for tv in (x, w):
            tv.set_device_mesh(mesh)
        w.outer_split(0, d)
        w.axis(0).parallelize(X)
    xf, wf = randn(3, 8), randn(2 * d, 8)
    (got,) = execute_with_dtensors(fd, [distribute_tensor(xf, torch_mesh, [Replicate()]),
                                        distribute_tensor(wf, torch_mesh, [Shard(0)])])
    if got.placements != (Shard(1),):
        raise AssertionError(f"the output is sharded on its last dim by propagation, got {got.placements}")
    assert_close(got.full_tensor(), torch.relu(F.linear(xf, wf)), "execute_with_dtensors")
    shardings = fd.fec.get_output_shardings()
    if shardings[0].axis_sharded_on(X) != 1 or shardings[0].axis_sharded_on(ParallelType.mesh_y) != -1:
        raise AssertionError(f"unexpected output sharding {shardings[0]}")
    sharded_x = distribute_tensor(randn(2 * d, 8), torch_mesh, [Shard(0)])  # the fusion's x is replicated
    expect_error(lambda: execute_with_dtensors(fd, [sharded_x, distribute_tensor(wf, torch_mesh, [Shard(0)])]),
                 ValueError, "T0 is sharded [replicated]", "Shard(dim=0)", "axis 0 on")


@case()
def sdpa_head_and_context_parallel() -> None:
    d, rank, mesh = world()
    b, h, s, e = 2, 2 * d, 4 * d, 8
    q, k, v = randn(b, h, s, e), randn(b, h, s, e) * 0.5, randn(b, h, s, e)
    for axis, causal in ((1, True), (2, False)):  # heads (causal), then the sequence of q (context parallel)
        with FusionDefinition() as fd:
            tq, tk, tv = (fd.define_tensor([-1, -1, -1, -1]) for _ in range(3))
            out = fd.ops.sdpfa_fwd(tq, tk, tv, is_causal=causal)[0]
            fd.add_output(out)
            for t in (tq, tk, tv, out):
                t.set_device_mesh(mesh)
            for t in ((tq, tk, tv, out) if axis == 1 else (tq, out)):
                t.outer_split(axis, d)
                t.axis(axis).parallelize(X)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        args = [shard_tensor(q, tq), shard_tensor(k, tk), shard_tensor(v, tv)]
        (got,) = fd.execute(args)
        assert_close(got, want.chunk(d, axis)[rank], f"sdpa sharded on axis {axis}")



@case()
def sdpa_training_head_parallel_runs_on_the_shards() -> None:
    """Forward and backward of a head-sharded attention (nvFuser's ``test_sdpa`` pattern: only the inputs
    placed and sharded): the results are torch's on the full tensors, and the program moves nothing between
    ranks (each rank attends over its heads)."""
    d, rank, mesh = world()
    b, h, s, e = 2, 2 * d, 8, 8
    q, k, v, grad = (randn(b, h, s, e) * scale for scale in (1.0, 0.5, 1.0, 1.0))
    with FusionDefinition() as fd:
        tq, tk, tv, tg = (fd.define_tensor([-1, -1, -1, -1]) for _ in range(4))
        out, lse, seed, offset = fd.ops.sdpfa_fwd(tq, tk, tv, dropout_p=None, is_causal=True)
        grads = fd.ops.sdpfa_bwd(tg, tq, tk, tv, out, lse, None, True, seed, offset)
        for t in (out, *grads):
            fd.add_output(t)
        for t in (tq, tk, tv, tg):
            t.set_device_mesh(mesh)
            t.outer_split(1, d)
            t.axis(1).parallelize(X)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*leaves, is_causal=True)
    want.backward(grad)
    got = fd.execute([shard_tensor(q, tq), shard_tensor(k, tk), shard_tensor(v, tv), shard_tensor(grad, tg)])
    for g, w, what in zip(got, [want.detach(), *(t.grad for t in leaves)], ("out", "dq", "dk", "dv"), strict=True):
        assert w is not None
        assert_close(g, w.chunk(d, 1)[rank], f"head-parallel sdpa {what}", atol=1e-4)
    program = str(fd.fec.last_program)
    if "Communication" in program:
        raise AssertionError(f"head-parallel attention should move nothing between ranks:\n{program}")



@case()
def fused_qkv_heads_sharded_through_a_reshape() -> None:
    """nvFuser's transformer forward: a column-parallel fused QKV projection ``[b, s, 3e]`` reshaped to
    ``[b, s, h, 3e / h]``, sliced into q, k, v, attended and projected back by a row-parallel linear. The
    sharding of ``3e`` moves to the heads (the outermost axis of the reshape's group, a multiple of the
    ranks): the attention's output is this rank's heads, the projection the full result. Heads that are not
    a multiple of the ranks stay replicated (the same values), gathered before the reshape."""
    d, rank, mesh = world()
    for heads in (2 * d, 2 * d + 1):
        b, s, e = 2, 8, 4 * heads
        x, w, bias, w1 = randn(b, s, e), randn(3 * e, e) * 0.25, randn(3 * e), randn(e, e) * 0.25
        with FusionDefinition() as fd:
            tx, tw, tb, tw1 = (fd.define_tensor(list(t.shape)) for t in (x, w, bias, w1))
            qkv = fd.ops.reshape(fd.ops.linear(tx, tw, tb), [b, s, heads, 12])
            q, k, v = (fd.ops.permute(fd.ops.slice(qkv, [0, 0, 0, 4 * i], [b, s, heads, 4 * i + 4]), [0, 2, 1, 3])
                       for i in range(3))
            out = fd.ops.sdpfa_fwd(q, k, v, is_causal=True)[0]
            y = fd.ops.linear(fd.ops.reshape(fd.ops.permute(out, [0, 2, 1, 3]), [b, s, e]), tw1)
            fd.add_output(out)
            fd.add_output(y)
            for t in (tx, tw, tb, tw1):
                t.set_device_mesh(mesh)
            for t in (tw, tb):
                t.outer_split(0, d)
                t.axis(0).parallelize(X)
            if heads % d == 0:  # the row-parallel projection's weight: sharded on its input features
                tw1.outer_split(1, d)
                tw1.axis(1).parallelize(X)
        ref = F.linear(x, w, bias).view(b, s, heads, 12)
        want = F.scaled_dot_product_attention(*(ref[..., 4 * i:4 * i + 4].transpose(1, 2) for i in range(3)),
                                              is_causal=True)
        got_out, got_y = fd.execute([x, shard_tensor(w, tw), shard_tensor(bias, tb), shard_tensor(w1, tw1)])
        sharded = heads % d == 0
        assert_close(got_out, want.chunk(d, 1)[rank] if sharded else want, f"attention of {heads} heads")
        assert_close(got_y, F.linear(want.transpose(1, 2).reshape(b, s, e), w1), f"projection of {heads} heads",
                     atol=1e-4)
        # Sharded heads: the reshape, the slices into q, k, v and the attention run on the shards, and the
        # row-parallel projection's partial sums are the only thing that moves. Otherwise the projection is
        # gathered before the reshape.
        program = str(fd.fec.last_program)
        communications = re.findall(r"type=(\w+)", program)
        if communications != (["Allreduce"] if sharded else ["Allgather"]):
            raise AssertionError(f"{heads} heads: unexpected communications {communications}:\n{program}")

if __name__ == "__main__":
    main()
