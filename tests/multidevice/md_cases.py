"""Multi-device cases, run under ``torchrun --nproc-per-node N`` (N = 2 or 4) by test_multidevice.py.

Every case builds a fusion with global shapes, feeds each rank its shard and compares the local
outputs with single-process torch on the full tensors.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
import torch.nn.functional as F
from harness import assert_close, case, comm, device, expect_error, main, randn

from pyfuser import DataType, FusionDefinition, ParallelType, TensorView
from pyfuser.integrations.dtensor import DTensorFusion
from pyfuser.multidevice import DeviceMesh, MultiDeviceExecutor, MultiDeviceExecutorParams, shard_tensor

X = ParallelType.mesh_x


def world() -> tuple[int, int, DeviceMesh]:
    c = comm()
    return c.size(), c.rank(), DeviceMesh(range(c.size()))


def place(mesh: DeviceMesh, *tvs: TensorView) -> None:
    for tv in tvs:
        tv.set_device_mesh(mesh)


def shard_axis(tv: TensorView, axis: int, parts: int, ptype: ParallelType = X) -> None:
    """Shard loop axis ``axis`` of ``tv`` over ``parts`` ranks along ``ptype``."""
    tv.outer_split(axis, parts)
    tv.axis(axis).parallelize(ptype)


def host_ir(fd: FusionDefinition) -> str:
    return str(fd.fec.last_program)


@case()
def pointwise_sharded_input() -> None:
    d, _, mesh = world()
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.ops.relu(fd.ops.add(fd.ops.mul(x, 2.0), 1.0))
        fd.add_output(y)
        place(mesh, x)
        shard_axis(x, 0, d)
    full = randn(4 * d, 3)
    (out,) = fd.execute([shard_tensor(full, x)])
    assert_close(out, shard_tensor(torch.relu(full * 2 + 1), x), "pointwise")
    if "Communication" in host_ir(fd):
        raise AssertionError(f"a pointwise op on a sharded input needs no communication:\n{host_ir(fd)}")


@case()
def extent_reading_ops_on_sharded_tensors() -> None:
    d, rank, mesh = world()
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        flat = fd.ops.reshape(x, [-1])                            # needs the whole tensor: gathered first
        ones = fd.ops.full([2 * d, 3], 1.0, dtype=torch.float32)  # made whole, then sliced
        fd.add_output(flat)
        fd.add_output(fd.ops.add(ones, x))
        place(mesh, x, ones)
        shard_axis(x, 0, d)
        shard_axis(ones, 0, d)
    full = randn(2 * d, 3)
    got_flat, got_sum = fd.execute([shard_tensor(full, x)])
    assert_close(got_flat, full.reshape(-1), "reshape of a sharded tensor")
    assert_close(got_sum, (full + 1).chunk(d, 0)[rank], "full on a sharded output")


def no_communication(fd: FusionDefinition, what: str) -> None:
    if "Communication" in host_ir(fd):
        raise AssertionError(f"{what} should move nothing between ranks:\n{host_ir(fd)}")


def gathers(fd: FusionDefinition, what: str) -> None:
    if "type=Allgather" not in host_ir(fd):
        raise AssertionError(f"{what} should gather its operand:\n{host_ir(fd)}")


@case()
def fused_qkv_reshape_runs_on_the_shards() -> None:
    """A column-parallel fused QKV projection ``[b, s, 3e]`` reshaped to ``[b, s, h, 3e / h]``: the heads are
    the outermost axis of the regrouped ``3e``, so each rank's columns are whole heads and the reshape runs
    on the shard (no all-gather before it), in fp32 and bf16, with odd sequence and head sizes."""
    d, rank, mesh = world()
    heads, head_dim, b, s = 2 * d, 5, 2, 3
    e = heads * head_dim
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        xf, wf, bf = randn(b, s, e, dtype=dtype), randn(3 * e, e, dtype=dtype), randn(3 * e, dtype=dtype)
        with FusionDefinition() as fd:
            x, w, bias = (fd.define_tensor(list(t.shape), dtype=DataType.from_torch(dtype)) for t in (xf, wf, bf))
            qkv = fd.ops.reshape(fd.ops.linear(x, w, bias), [b, s, heads, 3 * head_dim])
            fd.add_output(fd.ops.mul(fd.ops.sigmoid(qkv), 2.0))
            place(mesh, x, w, bias)
            shard_axis(w, 0, d)
            shard_axis(bias, 0, d)
        (got,) = fd.execute([xf, shard_tensor(wf, w), shard_tensor(bf, bias)])
        full = torch.sigmoid(F.linear(xf.float(), wf.float(), bf.float()).view(b, s, heads, 3 * head_dim)) * 2
        assert_close(got, full.chunk(d, 2)[rank], f"{dtype} QKV heads of a column-parallel linear", atol=tol, rtol=tol)
        no_communication(fd, "a reshape of column-parallel QKV to its heads")


@case()
def reshapes_that_carry_a_shard() -> None:
    """A split whose outer axis is a multiple of the ranks, a merge of a sharded outer axis, and a batch
    axis the reshape leaves alone (symbolic extent) all reshape the shard: no communication."""
    d, rank, mesh = world()
    a, m, bt = randn(3, 12 * d), randn(2 * d, 3, 5), randn(2 * d, 12)
    with FusionDefinition() as fd:
        x, y, z = fd.define_tensor([3, 12 * d]), fd.define_tensor([2 * d, 3, 5]), fd.define_tensor([-1, 12])
        split = fd.ops.reshape(fd.ops.exp(x), [3, 2 * d, 6])
        merged = fd.ops.reshape(fd.ops.neg(y), [6 * d, 5])
        batch = fd.ops.reshape(fd.ops.abs(z), [-1, 3, 4])
        for out in (fd.ops.mul(split, 2.0), merged, fd.ops.add(batch, 1.0)):
            fd.add_output(out)
        place(mesh, x, y, z)
        shard_axis(x, 1, d)
        shard_axis(y, 0, d)
        shard_axis(z, 0, d)
    got_split, got_merged, got_batch = fd.execute([shard_tensor(a, x), shard_tensor(m, y), shard_tensor(bt, z)])
    assert_close(got_split, (a.exp().view(3, 2 * d, 6) * 2).chunk(d, 1)[rank], "split of a sharded axis")
    assert_close(got_merged, (-m).reshape(6 * d, 5).chunk(d, 0)[rank], "merge of a sharded outer axis")
    assert_close(got_batch, (bt.abs().view(2 * d, 3, 4) + 1).chunk(d, 0)[rank], "reshape beside a sharded batch")
    no_communication(fd, "reshapes whose sharded axes are outermost in their groups")


@case()
def resizes_along_unsharded_axes_run_on_the_shards() -> None:
    """A slice (with a step), a pad and a cat along an axis that is not sharded take each rank's rows as
    they are: no communication."""
    d, rank, mesh = world()
    full = randn(3 * d, 11, 2)
    with FusionDefinition() as fd:
        x = fd.define_tensor([3 * d, 11, 2])
        sliced = fd.ops.slice(x, [0, 1, 0], [3 * d, 10, 2], [1, 2, 1])
        padded = fd.ops.pad(fd.ops.exp(sliced), [0, 0, 2, 1], 0.5)
        fd.add_output(fd.ops.cat([padded, fd.ops.neg(sliced)], 1))
        place(mesh, x)
        shard_axis(x, 0, d)
    (got,) = fd.execute([shard_tensor(full, x)])
    part = full[:, 1:10:2]
    want = torch.cat([F.pad(part.exp(), [0, 0, 2, 1], value=0.5), -part], 1)
    assert_close(got, want.chunk(d, 0)[rank], "slice, pad and cat of row shards")
    no_communication(fd, "a slice, pad and cat along an unsharded axis")


@case()
def reshapes_and_slices_that_need_the_whole_axis() -> None:
    """Where a shard is not a block of the result, the operand is gathered, the op runs whole and its result
    is sliced where the output is sharded: a merge of a sharded inner axis, a split whose outer axis is not a
    multiple of the ranks (the output asking for its inner axis sharded), a slice along the sharded axis."""
    d, rank, mesh = world()
    inner, odd, rows = randn(5, 2 * d), randn(3, 6 * d), randn(4 * d, 3)
    cases: list[tuple[str, torch.Tensor, int, Callable[[FusionDefinition, TensorView], TensorView], int | None,
                      torch.Tensor]] = [
        ("merge of a sharded inner axis", inner, 1, lambda fd, x: fd.ops.reshape(x, [10 * d]), None, inner.reshape(-1)),
        ("split into an outer axis of 3", odd, 1, lambda fd, x: fd.ops.reshape(x, [3, 3, 2 * d]), 2,
         odd.view(3, 3, 2 * d).chunk(d, 2)[rank]),
        ("slice along the sharded axis", rows, 0, lambda fd, x: fd.ops.slice(x, [1, 0], [4 * d - 1, 3]), None,
         rows[1:-1]),
    ]
    for name, value, axis, build, out_axis, want in cases:
        with FusionDefinition() as fd:
            x = fd.define_tensor(list(value.shape))
            out = fd.ops.mul(build(fd, x), 3.0)
            fd.add_output(out)
            place(mesh, x)
            shard_axis(x, axis, d)
            if out_axis is not None:  # the output asks for an axis no shard of x carries to
                place(mesh, out)
                shard_axis(out, out_axis, d)
        (got,) = fd.execute([shard_tensor(value, x)])
        assert_close(got, want * 3, name)
        gathers(fd, name)


@case()
def column_parallel_linear() -> None:
    d, rank, mesh = world()
    with FusionDefinition() as fd:
        x, w, b = fd.define_tensor([-1, -1, -1]), fd.define_tensor([-1, -1]), fd.define_tensor([-1])
        fd.add_output(fd.ops.linear(x, w, b))
        place(mesh, x, w, b)
        shard_axis(w, 0, d)
        shard_axis(b, 0, d)
    xf, wf, bf = randn(2, 3, 8), randn(4 * d, 8), randn(4 * d)
    (out,) = MultiDeviceExecutor(fd.fusion, MultiDeviceExecutorParams()).run(
        [xf, shard_tensor(wf, w), shard_tensor(bf, b)])
    assert_close(out, F.linear(xf, wf, bf).chunk(d, -1)[rank], "column-parallel linear")


@case()
def column_parallel_grouped_mm() -> None:
    """A mixture of experts' weights [G, N, K] sharded on N: each rank multiplies every group of rows by its
    slice of each expert's columns (the offsets stay whole), and the output is sharded on N, no gather."""
    d, rank, mesh = world()
    with FusionDefinition() as fd:
        x, w = fd.define_tensor([-1, -1]), fd.define_tensor([4, -1, -1])
        offsets = fd.define_tensor([4], dtype=DataType.Int32)
        fd.add_output(fd.ops.grouped_mm(x, fd.ops.permute(w, [0, 2, 1]), offsets))
        place(mesh, x, w, offsets)
        shard_axis(w, 1, d)
    xf, wf = randn(12, 8), randn(4, 3 * d, 8)
    ends = torch.tensor([2, 5, 5, 12], dtype=torch.int32, device=device())
    (out,) = fd.execute([xf, shard_tensor(wf, w), ends])
    starts = [0, *ends.tolist()[:-1]]
    full = torch.cat([xf[s:e] @ wf[g].t() for g, (s, e) in enumerate(zip(starts, ends.tolist(), strict=True))])
    assert_close(out, full.chunk(d, -1)[rank], "column-parallel grouped_mm")
    assert "Allgather" not in host_ir(fd), host_ir(fd)


@case()
def column_parallel_linear_stream_pipelined() -> None:
    d, rank, mesh = world()
    with FusionDefinition() as fd:
        x, w = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        out = fd.ops.linear(x, w)
        fd.add_output(out)
        place(mesh, x, w, out)
        shard_axis(w, 0, d)
        shard_axis(out, 1, d)  # [M, N, rK]: N sharded like the weight
        out.outer_split(0, 2)
        out.axis(0).parallelize(ParallelType.stream)
    xf, wf = randn(6, 8), randn(3 * d, 8)
    (got,) = fd.execute([xf, shard_tensor(wf, w)])
    assert_close(got, F.linear(xf, wf).chunk(d, -1)[rank], "stream-pipelined column-parallel linear")
    _check_structure(host_ir(fd), [r"ALLOCATE\(", r"FOR StreamIdx", r"= linear\("])


def _row_parallel(scatter_output: bool) -> tuple[FusionDefinition, str]:
    d, rank, mesh = world()
    with FusionDefinition() as fd:
        x, w, b = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1]), fd.define_tensor([-1])
        out = fd.ops.linear(x, w, b)
        fd.add_output(out)
        place(mesh, x, w, b, out)
        shard_axis(x, 1, d)
        shard_axis(w, 1, d)
        if scatter_output:
            shard_axis(out, 0, d)
    xf, wf, bf = randn(2 * d, 4 * d), randn(5, 4 * d), randn(5)
    (got,) = fd.execute([shard_tensor(xf, x), shard_tensor(wf, w), bf])
    ref = F.linear(xf, wf, bf)
    assert_close(got, ref.chunk(d, 0)[rank] if scatter_output else ref, "row-parallel linear")
    return fd, host_ir(fd)


@case()
def row_parallel_linear_allreduce() -> None:
    _, text = _row_parallel(scatter_output=False)
    if "type=Allreduce" not in text:
        raise AssertionError(f"expected an Allreduce:\n{text}")


@case()
def row_parallel_linear_reduce_scatter() -> None:
    _, text = _row_parallel(scatter_output=True)
    if "type=ReduceScatter" not in text:
        raise AssertionError(f"expected a ReduceScatter:\n{text}")


@case()
def residual_sequence_sharding_reaches_the_row_parallel_linear() -> None:
    """A row-parallel linear (its activation and weight sharded on the contracted features) whose output a
    residual add with a sequence-sharded input reads, nothing else annotated (nvFuser's transformer with
    sequence parallelism): the sequence sharding flows back from the add to the linear's output, so the
    partial sums reduce-scatter along the sequence (nvFuser's back-propagation) and the linear's output
    is this rank's rows, not an all-reduce of every row sliced after."""
    d, rank, mesh = world()
    s, k, e = 2 * d, 4 * d, 6
    af, wf, rf = randn(s, k), randn(e, k), randn(s, e)
    with FusionDefinition() as fd:
        a, w, res = fd.define_tensor([s, k]), fd.define_tensor([e, k]), fd.define_tensor([s, e])
        y = fd.ops.linear(a, w)
        fd.add_output(y)
        fd.add_output(fd.ops.add(y, res))
        place(mesh, a, w, res)
        shard_axis(a, 1, d)
        shard_axis(w, 1, d)
        shard_axis(res, 0, d)
    got_y, got_z = fd.execute([shard_tensor(af, a), shard_tensor(wf, w), shard_tensor(rf, res)])
    ref = F.linear(af, wf)
    assert_close(got_y, ref.chunk(d, 0)[rank], "the linear's rows")
    assert_close(got_z, (ref + rf).chunk(d, 0)[rank], "the residual sum's rows")
    text = host_ir(fd)
    if "type=ReduceScatter" not in text or "type=Allreduce" in text:
        raise AssertionError(f"expected a ReduceScatter and no Allreduce:\n{text}")


@case()
def row_parallel_matmul_rfactored_by_hand() -> None:
    """nvFuser's manual row-parallel matmul: K sharded on both operands, the output's K split d ways and
    rfactored, the partial's block axis on mesh_x: each rank's GEMM of its shards, then an Allreduce;
    half precision, a K block of 5 per rank (odd), rows not a multiple of d."""
    d, _, mesh = world()
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 5 * d], contiguity=True, dtype=DataType.Half)
        w = fd.define_tensor([5 * d, 3], contiguity=True, dtype=DataType.Half)
        out = fd.ops.matmul(x, w)
        fd.add_output(out)
        place(mesh, x, w, out)
        shard_axis(x, 1, d)
        shard_axis(w, 0, d)
        out.outer_split(-1, d)  # [i{M}, i{N}, r{d}, r{5}]
        partial = out.rfactor([-1])
        partial.set_device_mesh(mesh)
        partial.axis(-2).parallelize(X)
    xf, wf = randn(7, 5 * d).half(), randn(5 * d, 3).half()
    (got,) = fd.execute([shard_tensor(xf, x), shard_tensor(wf, w)])
    assert_close(got.float(), xf.float() @ wf.float(), "row-parallel matmul, rfactored by hand", atol=1e-2, rtol=1e-3)
    text = host_ir(fd)
    if "type=Allreduce" not in text:
        raise AssertionError(f"expected an Allreduce of the partial sums:\n{text}")


@case()
def row_parallel_linear_stream_pipelined() -> None:
    d, _, mesh = world()
    with FusionDefinition() as fd:
        x, w, b = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1]), fd.define_tensor([-1])
        out = fd.ops.linear(x, w, b)
        fd.add_output(out)
        place(mesh, x, w, b, out)
        shard_axis(x, 1, d)
        shard_axis(w, 1, d)
        out.outer_split(0, 2)  # two row chunks: chunk i's partial sums are reduced while chunk i+1 computes
        out.axis(0).parallelize(ParallelType.stream)
    xf, wf, bf = randn(4, 4 * d), randn(5, 4 * d), randn(5)
    (got,) = fd.execute([shard_tensor(xf, x), shard_tensor(wf, w), bf])
    assert_close(got, F.linear(xf, wf, bf), "stream-pipelined row-parallel linear")
    text = host_ir(fd)
    # the add: an ATen call, or a generated kernel where kernels run (CUDA)
    _check_structure(text, [r"FOR StreamIdx", r"= linear\(", r"type=Allreduce", r"Wait Communication",
                            r"\+|LaunchKernel"])
    if text.count("FOR StreamIdx") != 1:
        raise AssertionError(f"expected linear, Allreduce and bias add in one stream loop:\n{text}")


@case()
def sum_over_sharded_axis() -> None:
    d, _, mesh = world()
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(x, [0]))
        fd.add_output(fd.ops.max(x, [0]))
        place(mesh, x)
        shard_axis(x, 0, d)
    full = randn(3 * d, 5)
    total, largest = fd.execute([shard_tensor(full, x)])
    assert_close(total, full.sum(0), "sum over a sharded axis")
    assert_close(largest, full.amax(0), "max over a sharded axis")


@case()
def matmul_batch_and_contraction_sharding() -> None:
    d, rank, mesh = world()
    with FusionDefinition() as fd:
        a, b = fd.define_tensor([-1, -1, -1]), fd.define_tensor([-1, -1, -1])
        c, e = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        batched = fd.ops.matmul(a, b)      # batch-sharded operands: local matmuls
        contracted = fd.ops.matmul(c, e)   # K-sharded operands: partial products, then Allreduce
        fd.add_output(batched)
        fd.add_output(contracted)
        place(mesh, a, b, c, e)
        shard_axis(a, 0, d)
        shard_axis(b, 0, d)
        shard_axis(c, 1, d)
        shard_axis(e, 0, d)
    af, bf, cf, ef = randn(2 * d, 3, 4), randn(2 * d, 4, 5), randn(3, 2 * d), randn(2 * d, 5)
    got_batched, got_contracted = fd.execute([shard_tensor(t, tv) for t, tv in zip((af, bf, cf, ef), (a, b, c, e),
                                                                                     strict=True)])
    assert_close(got_batched, torch.matmul(af, bf).chunk(d, 0)[rank], "batch-sharded matmul")
    assert_close(got_contracted, cf @ ef, "contraction-sharded matmul")
    if host_ir(fd).count("type=Allreduce") != 1 or "type=Allgather" in host_ir(fd):
        raise AssertionError(f"expected exactly one Allreduce and no Allgather:\n{host_ir(fd)}")


@case()
def matmul_output_sharded_on_its_reduction_and_an_output_axis() -> None:
    """nvFuser's reduce-scatter form: the matmul output's K (a reduction ID) and N both on mesh_x, the
    operands replicated. Each rank multiplies its slice of K (local slices of the operands), then a
    ReduceScatter sums the partial products and leaves each rank its N shard (AlphaFold3's triangle
    update)."""
    d, rank, mesh = world()
    with FusionDefinition() as fd:
        a, b = fd.define_tensor([-1, -1, -1]), fd.define_tensor([-1, -1, -1])
        out = fd.ops.matmul(a, b)  # [B, M, N, rK]
        fd.add_output(fd.ops.mul(out, 2.0))
        place(mesh, a, b, out)
        shard_axis(out, 3, d)      # rK
        shard_axis(out, 2, d)      # N
    af, bf = randn(2, 3, 4 * d), randn(2, 4 * d, 2 * d)
    (got,) = fd.execute([af, bf])
    assert_close(got, (2 * torch.matmul(af, bf)).chunk(d, 2)[rank], "reduce-scattered matmul")
    text = host_ir(fd)
    if text.count("type=ReduceScatter") != 1 or "type=Allgather" in text or "type=Allreduce" in text:
        raise AssertionError(f"expected one ReduceScatter and no other collective:\n{text}")


@case()
def mesh_not_in_rank_order() -> None:
    d, rank, _ = world()
    mesh = DeviceMesh(list(reversed(range(d))))  # rank r holds shard d - 1 - r
    with FusionDefinition() as fd:
        x, w = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        gathered = fd.ops.set(x)   # placed on the mesh without device IDs: replicated, so an Allgather
        out = fd.ops.linear(x, w)  # row-parallel into a row-sharded output: ReduceScatter
        fd.add_output(gathered)
        fd.add_output(out)
        place(mesh, x, w, gathered, out)
        shard_axis(x, 1, d)
        shard_axis(w, 1, d)
        shard_axis(out, 0, d)
    xf, wf = randn(2 * d, 2 * d), randn(3, 2 * d)
    got_gathered, got_out = fd.execute([shard_tensor(xf, x), shard_tensor(wf, w)])
    assert_close(got_gathered, xf, "Allgather over a reversed mesh")
    assert_close(got_out, F.linear(xf, wf).chunk(d, 0)[d - 1 - rank], "ReduceScatter over a reversed mesh")


@case()
def sequence_parallel_allgather_linear() -> None:
    d, rank, mesh = world()
    with FusionDefinition() as fd:
        x, w = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.linear(x, w))
        place(mesh, x, w)
        shard_axis(x, 0, d)  # sequence-sharded activations
        shard_axis(w, 0, d)  # column-parallel weight
    xf, wf = randn(3 * d, 8), randn(2 * d, 8)
    (out,) = fd.execute([shard_tensor(xf, x), shard_tensor(wf, w)])
    assert_close(out, F.linear(xf, wf).chunk(d, -1)[rank], "all-gather + linear")
    if "type=Allgather" not in host_ir(fd):
        raise AssertionError(f"expected an Allgather:\n{host_ir(fd)}")


#: Seed 004's program, in order: the gathered buffer and the output allocated once, then per stream
#: iteration: stream switch, selects of the input chunk (still device-parallel) and the buffer chunk,
#: Allgather, Wait, select of the output chunk, linear into it, switch back and synchronize.
SEED_004 = [
    r"^  T4_g_float\[.*\] \(DeviceMesh\{0 1.*\}\) = ALLOCATE\(buffer=T4_g_float",
    r"^  T3_g_float\[iStreamIdx\d+\{i0\}.* = ALLOCATE\(buffer=T3_g_float",
    r"^  FOR StreamIdx in iStreamIdx\d+\{i0\}:",
    r"SetCurrentStream to Stream \( StreamIdx % numberOfStreams \)",
    r"^    T5_l_float\[ideviceIdx\.x\d+\{i1\}, iS\d+\{i2\}, iS\d+\{i3\}\] \(DeviceMesh\{0 1",
    r"= HirAliasSelect\( T0_g_float\[.*, axis = iS\d+\{i0\}, index = StreamIdx \)",
    r"= HirAliasSelect\( T4_g_float\[.*, axis = iStreamIdx\d+\{i0\}",
    r"^    Communication (\d+) \(type=Allgather, team=\(0 1[ 0-9]*\), input=T5_l_float\[ideviceIdx\.x.*, "
    r"output=T6_l_float\[.*, backend=(GLOO|NCCL)\)$",
    r"^    Wait Communication \d+$",
    r"= HirAliasSelect\( T3_g_float\[iStreamIdx\d+\{i0\}.*, index = StreamIdx \)",
    r"^    T7_l_float\[",
    r"= linear\(T6_l_float",
    r"^    SetCurrentStream to Stream 0$",
    r"^    Synchronize Stream \( StreamIdx % numberOfStreams \)$",
    r"^\} // %HostIrContainer",
]


def _check_structure(text: str, patterns: list[str]) -> None:
    lines = text.splitlines()
    at = 0
    for pattern in patterns:
        while at < len(lines) and not re.search(pattern, lines[at]):
            at += 1
        if at == len(lines):
            raise AssertionError(f"host IR lacks /{pattern}/ in the expected order:\n{text}")
        at += 1


@case()
def seed_004_allgather_linear_pipeline() -> None:
    d, _, mesh = world()
    for streams in (1, 2, 4):
        with FusionDefinition() as fd:
            x, w, b = fd.define_tensor([-1, -1, -1, -1]), fd.define_tensor([-1, -1]), fd.define_tensor([-1])
            out = fd.ops.linear(x, w, b)
            fd.add_output(out)
            place(mesh, x, w, b, out)
            x.axis(1).parallelize(X)
            out.axis(0).parallelize(ParallelType.stream)
        xf, wf, bf = randn(streams, d, 3, 8), randn(5, 8), randn(5)
        # The seed's program: each iteration joins the user's stream (stream overlap off).
        (got,) = fd.execute([shard_tensor(xf, x), wf, bf], _disable_options=["stream_overlap"])
        assert_close(got, F.linear(xf, wf, bf), f"seed 004 pipeline with S={streams}")
        text = host_ir(fd)
        _check_structure(text, SEED_004)
        if text.count("Communication") != 2 or "DeviceMesh{" not in text:
            raise AssertionError(f"expected one Allgather (and its Wait) inside the loop:\n{text}")
        (got,) = fd.execute([shard_tensor(xf, x), wf, bf])  # the default: iterations overlap, joined after the loop
        assert_close(got, F.linear(xf, wf, bf), f"overlapped seed 004 pipeline with S={streams}")
        _check_structure(host_ir(fd), [r"^  GetCurrentStream into Stream", r"^  FOR StreamIdx", r"type=Allgather",
                                       r"= linear\(", r"^  FOR WorkerIdx", r"Synchronize Stream \( WorkerIdx"])


def gathered_linear(mesh: DeviceMesh, d: int, chunks: int, out_on_stream: bool,
                    swizzled: bool = False) -> tuple[FusionDefinition, TensorView]:
    """``linear(set(x), w)`` with x's rows split over the mesh and the gathered rows split into ``chunks`` on
    stream (swizzled along the mesh with ``swizzled``), the output's rows too with ``out_on_stream``; the
    fusion and x."""
    with FusionDefinition() as fd:
        x, w = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        gathered = fd.ops.set(x)
        out = fd.ops.linear(gathered, w)
        fd.add_output(out)
        place(mesh, x, w, gathered, out)
        shard_axis(x, 0, d)
        for tv in (gathered, out) if out_on_stream else (gathered,):
            tv.outer_split(0, chunks)
            if swizzled and tv is gathered:
                tv.swizzle1d(0, X)
            tv.axis(0).parallelize(ParallelType.stream)
    return fd, x


@case()
def stream_loop_over_split_sharded_axis_errors() -> None:
    """A user's set that gathers x[M, K] (rows split over the mesh) inside a loop over row chunks of the
    global M other than the shards (2 d chunks): a rank's shard is not those chunks, so this is an error at
    compile time (it used to feed the all-gather slices of the local shard: a size mismatch, or wrong rows)."""
    d, _, mesh = world()
    fd, _ = gathered_linear(mesh, d, chunks=2 * d, out_on_stream=True)
    expect_error(lambda: fd.execute([randn(4, 8), randn(5, 8)]), ValueError, "T0 axis 0", "sharded on deviceIdx.x",
                 "stream")


@case()
def stream_loop_gathers_the_shards_of_a_split_sharded_axis() -> None:
    """nvFuser's stream-loop all-gathers: x's rows split over the mesh, the gathered tensor's rows split as
    many ways on stream, so iteration i broadcasts rank i's shard (x read whole), or, with the stream ID
    swizzled along the mesh (``swizzle1d``), each rank sends its shard to position (p - i) % d and receives
    position (p + i) % d's, its own first (a ring: d - 1 exchanges, no root). The linear of each chunk runs in
    the same iteration where its output is chunked the same way (it follows a swizzled loop's order), after
    the loop where it is not (only a fusion input's stream axis reaches unscheduled consumers)."""
    d, rank, mesh = world()
    for swizzled, out_on_stream in ((False, True), (False, False), (True, True), (True, False)):
        fd, x = gathered_linear(mesh, d, chunks=d, out_on_stream=out_on_stream, swizzled=swizzled)
        xf, wf = randn(3 * d, 8), randn(5, 8)
        what = f"stream-loop all-gather + linear, swizzled: {swizzled}, out on stream: {out_on_stream}"
        (got,) = fd.execute([shard_tensor(xf, x), wf])
        assert_close(got, F.linear(xf, wf), what)
        text = host_ir(fd)
        moved = (rf"type=CollectivePermute, team=\(.*\), send to team\[\({rank} - StreamIdx\) % {d}\], receive from "
                 rf"team\[\({rank} \+ StreamIdx\) % {d}\], input=T0_" if swizzled else
                 r"type=Broadcast, team=\(.*\), root=team\[StreamIdx\], input=T0_")
        # the chunk of the whole tensor an iteration writes (the gathered one, or the output, when the gathered
        # chunks are a ring buffer's): rank p's iteration i takes chunk (i + p) % d of a swizzled loop
        index = rf"\( StreamIdx \+ {rank} \) % {d}" if swizzled else "StreamIdx"
        chunk = rf"HirAliasSelect\( T{3 if out_on_stream else 2}_.*index = {index} \)"
        loop = [r"FOR StreamIdx", r"HirAliasSelect\( T2_", rf"Communication \d+ \({moved}", r"Wait Communication"]
        _check_structure(text, [*loop, chunk, r"= linear\(", r"SetCurrentStream to Stream 0"] if out_on_stream else
                         [r"FOR StreamIdx", chunk, *loop[2:], r"SetCurrentStream to Stream 0", r"= linear\("])
        if "HirAliasSelect( T0_" in text:
            raise AssertionError(f"{what}: the sharded input must be read whole, not chunked:\n{text}")
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.neg(x))
        place(mesh, x)
        x.swizzle1d(0, X)
    expect_error(lambda: fd.execute([randn(4, 8)]), ValueError, "T0 axis 0", "swizzle1d", "not parallelized on stream")
    expect_error(lambda: x.swizzle1d(0, ParallelType.stream), ValueError, "swizzle1d", "device one")


@case()
def seed_004_shard_outermost() -> None:
    d, _, mesh = world()
    with FusionDefinition() as fd:
        x, w = fd.define_tensor([-1, -1, -1]), fd.define_tensor([-1, -1])
        out = fd.ops.linear(x, w)
        fd.add_output(out)
        place(mesh, x, w, out)
        x.axis(0).parallelize(X)
        out.axis(0).parallelize(ParallelType.stream)
    xf, wf = randn(d, 3, 8), randn(5, 8)
    (got,) = fd.execute([shard_tensor(xf, x), wf])
    assert_close(got, F.linear(xf, wf), "shard-outermost pipeline")
    # Iteration i broadcasts rank i's shard and multiplies it while the next one is in flight.
    _check_structure(host_ir(fd), [r"ALLOCATE\(", r"FOR StreamIdx", r"HirAliasSelect\( T3_",
                                   r"Communication \d+ \(type=Broadcast, team=\(.*\), root=team\[StreamIdx\], "
                                   r"input=T0_", r"Wait Communication", r"= linear\("])
    if "HirAliasSelect( T0_" in host_ir(fd):
        raise AssertionError(f"the sharded input must be read whole, not chunked:\n{host_ir(fd)}")


def mlp_reference(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
                  b2: torch.Tensor) -> torch.Tensor:
    return F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)


@case()
def mlp_tensor_and_sequence_parallel() -> None:
    d, rank, mesh = world()
    seq, hidden = 4 * d, 8
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        w1, b1 = fd.define_tensor([-1, -1]), fd.define_tensor([-1])
        w2, b2 = fd.define_tensor([-1, -1]), fd.define_tensor([-1])
        h = fd.ops.gelu(fd.ops.linear(x, w1, b1), approximate="tanh")
        out = fd.ops.linear(h, w2, b2)
        fd.add_output(out)
        place(mesh, x, w1, b1, w2, b2, out)
        shard_axis(x, 0, d)    # sequence parallel in
        shard_axis(w1, 0, d)   # column parallel
        shard_axis(b1, 0, d)
        shard_axis(w2, 1, d)   # row parallel
        shard_axis(out, 0, d)  # sequence parallel out
    full = [randn(seq, hidden), randn(4 * hidden, hidden), randn(4 * hidden), randn(hidden, 4 * hidden),
            randn(hidden)]
    (got,) = fd.execute([shard_tensor(t, tv) for t, tv in zip(full, (x, w1, b1, w2, b2), strict=True)])
    assert_close(got, mlp_reference(*full).chunk(d, 0)[rank], "MLP under TP + SP", atol=1e-4)
    _check_structure(host_ir(fd), [r"type=Allgather", r"= linear\(", r"gelu|LaunchKernel", r"= linear\(",
                                   r"type=ReduceScatter", r"\+|LaunchKernel"])


@case(min_world=4)
def mesh_2d_data_and_tensor_parallel() -> None:
    _, rank, _ = world()
    mesh = DeviceMesh([[0, 1], [2, 3]])  # mesh_y: data parallel, mesh_x: tensor parallel
    batch, seq, hidden = 4, 3, 8
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1])
        w1, b1 = fd.define_tensor([-1, -1]), fd.define_tensor([-1])
        w2, b2 = fd.define_tensor([-1, -1]), fd.define_tensor([-1])
        out = fd.ops.linear(fd.ops.gelu(fd.ops.linear(x, w1, b1), approximate="tanh"), w2, b2)
        fd.add_output(out)
        place(mesh, x, w1, b1, w2, b2)
        shard_axis(x, 0, 2, ParallelType.mesh_y)
        shard_axis(w1, 0, 2)
        shard_axis(b1, 0, 2)
        shard_axis(w2, 1, 2)
    full = [randn(batch, seq, hidden), randn(4 * hidden, hidden), randn(4 * hidden), randn(hidden, 4 * hidden),
            randn(hidden)]
    (got,) = fd.execute([shard_tensor(t, tv) for t, tv in zip(full, (x, w1, b1, w2, b2), strict=True)])
    assert_close(got, mlp_reference(*full).chunk(2, 0)[rank // 2], "2-D mesh MLP", atol=1e-4)
    text = host_ir(fd)
    team = f"team=({rank - rank % 2} {rank - rank % 2 + 1})"
    if "type=Allreduce" not in text or team not in text or "type=Allgather" in text:
        raise AssertionError(f"expected one Allreduce over the tensor-parallel {team}, no Allgather:\n{text}")


@case(min_world=4)
def reshape_on_a_2d_mesh() -> None:
    """Batch on mesh_y, a column-parallel projection's heads on mesh_x: a reshape that leaves the batch alone
    and splits the columns into heads carries both shards (each mesh axis's size decides its own)."""
    _, rank, _ = world()
    mesh = DeviceMesh([[0, 1], [2, 3]])
    xf, wf = randn(4, 3, 6), randn(12, 6)
    with FusionDefinition() as fd:
        x, w = fd.define_tensor([4, 3, 6]), fd.define_tensor([12, 6])
        fd.add_output(fd.ops.tanh(fd.ops.reshape(fd.ops.linear(x, w), [4, 3, 2, 6])))
        place(mesh, x, w)
        shard_axis(x, 0, 2, ParallelType.mesh_y)
        shard_axis(w, 0, 2)
    (got,) = fd.execute([shard_tensor(xf, x), shard_tensor(wf, w)])
    want = torch.tanh(F.linear(xf, wf).view(4, 3, 2, 6))
    assert_close(got, want.chunk(2, 0)[rank // 2].chunk(2, 2)[rank % 2], "reshape on a 2-D mesh")
    no_communication(fd, "a reshape carrying both shards")


@case(min_world=4)
def resharding_along_two_mesh_axes_at_once() -> None:
    """A tensor sharded on mesh_y and mesh_x met by one replicated along both (and the other way): a
    chain of sets, one mesh axis each (local slices, then all-gathers)."""
    _, rank, _ = world()
    mesh = DeviceMesh([[0, 1], [2, 3]])
    with FusionDefinition() as fd:
        x, y = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        both = fd.ops.add(fd.ops.mul(x, 2.0), y)  # x replicated, y sharded on both axes
        whole = fd.ops.sum(both, [0])             # unsharded output: gathered back
        fd.add_output(both)
        fd.add_output(whole)
        place(mesh, x, y, both, whole)
        shard_axis(y, 0, 2, ParallelType.mesh_y)
        shard_axis(y, 2, 2)
        shard_axis(both, 0, 2, ParallelType.mesh_y)
        shard_axis(both, 2, 2)
    xf, yf = randn(4, 6), randn(4, 6)
    got, got_whole = fd.execute([xf, shard_tensor(yf, y)])
    assert_close(got, (2 * xf + yf).chunk(2, 0)[rank // 2].chunk(2, 1)[rank % 2], "sharded on two mesh axes")
    assert_close(got_whole, (2 * xf + yf).sum(0), "gathered along two mesh axes")


@case()
def mesh_axis_of_size_one() -> None:
    """A 2-D mesh whose tensor-parallel axis has one rank (pure data parallel): reducing over that axis is
    an Allreduce over a team of one, done locally -- creating a one-rank group would need every rank on
    NCCL (ranks outside the team never call it)."""
    d, rank, _ = world()
    mesh = DeviceMesh([[r] for r in range(d)])  # mesh_y: d ranks, mesh_x: 1
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(x, [1]))
        place(mesh, x)
        shard_axis(x, 0, d, ParallelType.mesh_y)
        shard_axis(x, 2, 1)  # loop axis 2 is logical axis 1
    full = randn(2 * d, 5)
    (got,) = fd.execute([shard_tensor(full, x)])
    assert_close(got, full.sum(1).chunk(d, 0)[rank], "sum over a mesh axis of size one")
    solo = [team for team in comm()._groups if len(team) == 1]
    if solo:
        raise AssertionError(f"process groups were created for one-rank teams {solo}:\n{host_ir(fd)}")


@case(min_world=4)
def mesh_on_a_subset_of_ranks() -> None:
    """Only ranks 0 and 1 hold the tensors: their Allreduce group is created by them alone (on NCCL a group
    split from the world communicator would need ranks 2 and 3 to take part, and they never do)."""
    _, rank, _ = world()
    mesh = DeviceMesh([0, 1])
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(fd.ops.mul(x, 2.0), [0]))
        place(mesh, x)
        shard_axis(x, 0, 2)
    full = randn(4, 3)
    (got,) = fd.execute([shard_tensor(full, x) if rank in mesh else torch.empty(0, 3, device=device())])
    if rank in mesh:
        assert_close(got, (2 * full).sum(0), "sum on a mesh of ranks 0 and 1")
        if "team=(0 1)" not in host_ir(fd):
            raise AssertionError(f"expected a communication over team (0 1):\n{host_ir(fd)}")
    elif got.numel() != 0:
        raise AssertionError(f"rank {rank} is off the mesh but returned {tuple(got.shape)}")


@case()
def pipeline_across_meshes() -> None:
    d, rank, _ = world()
    first, last = DeviceMesh([0]), DeviceMesh([d - 1])
    everyone = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.ops.relu(x)          # stage 0 on rank 0
        z = fd.ops.set(y)
        u = fd.ops.mul(z, 3.0)      # stage 1 on the last rank
        v = fd.ops.set(u)
        fd.add_output(u)
        fd.add_output(v)            # broadcast back to every rank
        place(first, x, y)
        place(last, z, u)
        place(everyone, v)
    full = randn(4, 6)
    got_u, got_v = fd.execute([full])
    ref = torch.relu(full) * 3
    if rank == d - 1:
        assert_close(got_u, ref, "stage 1 output")
    elif got_u.numel() != 0:
        raise AssertionError(f"rank {rank} holds no part of the stage-1 output but got {tuple(got_u.shape)}")
    assert_close(got_v, ref, "broadcast output")
    text = host_ir(fd)
    if rank not in (0, d - 1) and ("relu" in text or "*" in text):
        raise AssertionError(f"rank {rank} is on no stage's mesh but computes:\n{text}")


@case()
def gather_scatter_reduce_between_meshes() -> None:
    d, rank, mesh = world()
    first, last = DeviceMesh([0]), DeviceMesh([d - 1])
    with FusionDefinition() as fd:
        x, r = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        gathered = fd.ops.set(x)            # sharded on every rank -> whole on rank 0: Gather
        scattered = fd.ops.set(gathered)    # whole on rank 0 -> sharded on every rank: Scatter
        total = fd.ops.sum(x, [0])          # partial sums on every rank -> reduced on the last: Reduce
        sliced = fd.ops.neg(r)              # replicated in, sharded out: each rank slices locally
        for out in (gathered, scattered, total, sliced):
            fd.add_output(out)
        place(mesh, x, scattered, r, sliced)
        place(first, gathered)
        place(last, total)
        shard_axis(x, 0, d)
        shard_axis(scattered, 1, d)
        shard_axis(sliced, 1, d)
    full, rep = randn(2 * d, 3 * d), randn(4, 2 * d)
    got_gathered, got_scattered, got_total, got_sliced = fd.execute([shard_tensor(full, x), rep])
    if rank == 0:
        assert_close(got_gathered, full, "Gather onto rank 0")
    if rank == d - 1:
        assert_close(got_total, full.sum(0), "Reduce onto the last rank")
    assert_close(got_scattered, full.chunk(d, 1)[rank], "Scatter from rank 0")
    assert_close(got_sliced, (-rep).chunk(d, 1)[rank], "local slice of a replicated input")
    text = host_ir(fd)
    for kind in ("Gather", "Scatter", "Reduce"):
        if f"type={kind}," not in text:
            raise AssertionError(f"expected a {kind}:\n{text}")
    if "LocalSlice" not in text:
        raise AssertionError(f"expected a LocalSlice:\n{text}")


@case()
def dtensor_wrapper() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    d, _, _ = world()
    torch_mesh = init_device_mesh(device().type, (d,))

    def define(fd: FusionDefinition) -> None:
        x, w = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.relu(fd.ops.linear(x, w)))

    xf, wf = randn(3, 8), randn(2 * d, 8)
    fn = DTensorFusion(define)
    (out,) = fn(distribute_tensor(xf, torch_mesh, [Replicate()]), distribute_tensor(wf, torch_mesh, [Shard(0)]))
    if out.placements != (Shard(1),):
        raise AssertionError(f"expected the output sharded on its last dim, got {out.placements}")
    assert_close(out.full_tensor(), torch.relu(F.linear(xf, wf)), "DTensor wrapper")
    xf = randn(2 * d, 8)
    (out,) = fn(distribute_tensor(xf, torch_mesh, [Shard(0)]), distribute_tensor(wf, torch_mesh, [Replicate()]))
    if out.placements != (Shard(0),) or out.shape != (2 * d, 2 * d):
        raise AssertionError(f"expected a [{2 * d}, {2 * d}] output sharded on dim 0, got {out.placements} {out.shape}")
    assert_close(out.to_local(), torch.relu(F.linear(xf, wf)).chunk(d, 0)[comm().rank()], "DTensor, sharded rows")
    # torch shards 2d + 1 rows unevenly; pyfuser binds global = local * d, so ranks would disagree on the
    # global shape (wrong output metadata, mismatched collectives): a clear error instead.
    uneven = distribute_tensor(randn(2 * d + 1, 8), torch_mesh, [Shard(0)])
    expect_error(lambda: fn(uneven, distribute_tensor(wf, torch_mesh, [Replicate()])), ValueError,
                 "DTensorFusion input 0", f"dim 0 has extent {2 * d + 1}", "not divisible")


@case()
def bad_inputs_raise_clear_errors() -> None:
    d, _, mesh = world()
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.neg(x))
        place(DeviceMesh(range(d + 2)), x)
    expect_error(lambda: MultiDeviceExecutor(fd.fusion), ValueError, "T0", f"needs rank {d + 1}", f"only {d}")
    expect_error(lambda: fd.execute([randn(4, 4)]), ValueError, "T0", f"only {d}")

    with FusionDefinition() as fd:
        x = fd.define_tensor([2 * d + 1, 4])
        fd.add_output(fd.ops.neg(x))
        place(mesh, x)
        shard_axis(x, 0, d)
    expect_error(lambda: fd.execute([randn(2, 4)]), ValueError, "T0 axis 0", f"extent {2 * d + 1}", "not divisible")

    with FusionDefinition() as fd:
        x = fd.define_tensor([4 * d, 4])
        fd.add_output(fd.ops.neg(x))
        place(mesh, x)
        shard_axis(x, 0, d)
    expect_error(lambda: fd.execute([randn(4 * d, 4)]), ValueError, "T0", "axis 0", "static size 4", "shard")

    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1])
        fd.add_output(fd.ops.neg(x))
        place(mesh, x)
        x.axis(1).parallelize(X)  # one element of axis 1 per rank
    expect_error(lambda: fd.execute([randn(2, d, 3)]), ValueError, "T0", "axis 1", "static size 1", "shard")

    with FusionDefinition() as fd:
        x, w = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.add(x, w))
        place(mesh, x)
        place(DeviceMesh(list(reversed(range(d)))), w)
        shard_axis(x, 0, d)
        shard_axis(w, 0, d)
    expect_error(lambda: fd.execute([randn(2, 3), randn(2, 3)]), ValueError, "no resharding path", "DeviceMesh{")


if __name__ == "__main__":
    main()
