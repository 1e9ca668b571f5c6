"""Cheap chains from a fusion input (or from nothing) forwarded into each reader: a value two kernels of
different shapes read (the rotary embedding's cos of both q and k with fewer KV heads, position ids from
an iota) is recomputed inside both, not written out by a kernel of its own. Through generated kernels
(Triton's interpreter on CPU) against torch."""

from __future__ import annotations

import re

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.ir.tensor_view import TensorView
from pyfuser.options import CompileOptions, EnableOption
from pyfuser.preseg.forward_input_broadcasts import COPY_BUDGET, forward_input_broadcasts
from tests.codegen.conftest import execute_with_kernels, kernel_schedulers, masked_path

_DTYPES = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize(("batch", "heads", "kv_heads", "seq", "dim"), [(2, 4, 2, 8, 8), (1, 3, 1, 5, 7), (1, 1, 1, 1, 3)])
def test_rotary_tables_are_recomputed_in_each_kernel(batch: int, heads: int, kv_heads: int, seq: int, dim: int,
                                                     dtype: torch.dtype) -> None:
    """cos / sin of the angles (an input), scaled and broadcast, read by q's and k's kernels (different head
    counts: two kernels): no third kernel writing the tables."""
    g = torch.Generator().manual_seed(seq * dim)
    q = torch.randn(batch, heads, seq, dim, generator=g).to(dtype)
    k = torch.randn(batch, kv_heads, seq, dim, generator=g).to(dtype)
    angles = torch.randn(seq, dim, generator=g)
    with FusionDefinition() as fd:
        tq, tk = fd.from_pytorch(q), fd.from_pytorch(k)
        ta = fd.from_pytorch(angles)
        cos = fd.ops.broadcast(fd.ops.cast(fd.ops.mul(fd.ops.cos(ta), 1.0), _DTYPES[dtype]), [True, True, False, False])
        sin = fd.ops.broadcast(fd.ops.cast(fd.ops.sin(ta), _DTYPES[dtype]), [True, True, False, False])
        fd.add_output(fd.ops.add(fd.ops.mul(tq, cos), sin))
        fd.add_output(fd.ops.sub(fd.ops.mul(tk, cos), sin))
    out_q, out_k = execute_with_kernels(fd, [q, k, angles])
    cos_t, sin_t = (angles.cos() * 1.0).to(dtype), angles.sin().to(dtype)
    torch.testing.assert_close(out_q, q * cos_t + sin_t)
    torch.testing.assert_close(out_k, k * cos_t - sin_t)
    # (as many head counts as kernels: equal shapes share one)
    assert kernel_schedulers(fd) == ["pointwise"] * len({heads, kv_heads}), kernel_schedulers(fd)


def test_an_iota_read_by_two_kernels_is_recomputed_in_both() -> None:
    """Position ids from an iota (cast, broadcast), read by a kernel over [rows, n] and a reduction over
    [n, cols]: two kernels."""
    x, y = torch.randn(3, 7), torch.randn(7, 5)
    with FusionDefinition() as fd:
        tx, ty = fd.from_pytorch(x), fd.from_pytorch(y)
        positions = fd.ops.cast(fd.ops.iota(7, 0, 1, DataType.Int), DataType.Float)
        fd.add_output(fd.ops.mul(tx, fd.ops.broadcast(positions, [True, False])))
        fd.add_output(fd.ops.sum(fd.ops.mul(ty, fd.ops.broadcast(positions, [False, True])), [1]))
    row, total = execute_with_kernels(fd, [x, y])
    p = torch.arange(7, dtype=torch.float32)
    torch.testing.assert_close(row, x * p)
    torch.testing.assert_close(total, (y * p[:, None]).sum(1))
    assert len(kernel_schedulers(fd)) == 2, kernel_schedulers(fd)


def test_a_forwarded_value_that_is_an_output_is_written_once() -> None:
    """cos of an input that the fusion also returns: written by a kernel (an output), and its readers get
    the values it holds."""
    x, a = torch.randn(4, 6), torch.randn(6)
    with FusionDefinition() as fd:
        tx, ta = fd.from_pytorch(x), fd.from_pytorch(a)
        cos = fd.ops.cos(ta)
        fd.add_output(cos)
        fd.add_output(fd.ops.mul(tx, fd.ops.broadcast(cos, [True, False])))
        fd.add_output(fd.ops.sum(fd.ops.add(tx, fd.ops.broadcast(cos, [True, False])), [0]))
    cos_out, prod, total = execute_with_kernels(fd, [x, a])
    torch.testing.assert_close(cos_out, a.cos())
    torch.testing.assert_close(prod, x * a.cos())
    torch.testing.assert_close(total, (x + a.cos()).sum(0))


def test_a_value_a_matmul_reads_is_computed_once() -> None:
    """Queries scaled (a scalar times an input) and read by a matmul, and, reshaped, by a bias gradient's
    sum: the matmul reads the value from memory, so it is written anyway and the sum's kernel reads it
    too (a forwarded copy was computed and written beside it: Whisper's scaled queries twice)."""
    q, w = torch.randn(2, 6, 32), torch.randn(32, 16)
    with FusionDefinition() as fd:
        tq, tw = fd.from_pytorch(q, static_sizes=True), fd.from_pytorch(w, static_sizes=True)
        scaled = fd.ops.mul(tq, 0.125)
        fd.add_output(fd.ops.matmul(scaled, tw))
        fd.add_output(fd.ops.sum(fd.ops.reshape(scaled, [12, 32]), [0]))
    product, total = execute_with_kernels(fd, [q, w])
    torch.testing.assert_close(product, (q * 0.125) @ w)
    torch.testing.assert_close(total, (q * 0.125).reshape(12, 32).sum(0))
    for code in fd.fec.kernel_codes():
        stored = re.findall(r"tl\.store\(T\d+ \+ [^,]*, ([^,)]*\)?)", masked_path(code))
        assert len(stored) == len(set(stored)), code  # no value stored twice


def _buckets(fd: FusionDefinition, seq: int, span: int) -> TensorView:
    """DeBERTa's relative-position bucket of each ``[query, key]`` pair, from two iotas (sign, log, ceil,
    where)."""
    rows = fd.ops.broadcast(fd.ops.iota(seq, 0, 1, DataType.Int), [False, True])
    cols = fd.ops.broadcast(fd.ops.iota(seq, 0, 1, DataType.Int), [True, False])
    relative = fd.ops.sub(rows, cols)
    mid = span // 2
    magnitude = fd.ops.where(fd.ops.logical_and(fd.ops.lt(relative, mid), fd.ops.gt(relative, -mid)),
                             fd.ops.full([seq, seq], mid - 1, DataType.Int), fd.ops.abs(relative))
    log_position = fd.ops.add(fd.ops.ceil(fd.ops.mul(fd.ops.div(fd.ops.log(fd.ops.div(
        fd.ops.cast(magnitude, DataType.Float), float(mid))), 2.0), float(mid - 1))), float(mid))
    bucket = fd.ops.where(fd.ops.le(magnitude, mid), fd.ops.cast(relative, DataType.Float),
                          fd.ops.mul(log_position, fd.ops.cast(fd.ops.sign(relative), DataType.Float)))
    return fd.ops.cast(bucket, DataType.Int)


def _torch_buckets(seq: int, span: int) -> torch.Tensor:
    relative = torch.arange(seq)[:, None] - torch.arange(seq)[None, :]
    mid = span // 2
    magnitude = torch.where((relative < mid) & (relative > -mid), torch.full_like(relative, mid - 1), relative.abs())
    log_position = torch.ceil(torch.log(magnitude.float() / mid) / 2.0 * (mid - 1)) + mid
    return torch.where(magnitude <= mid, relative.float(), log_position * torch.sign(relative).float()).long()


@pytest.mark.parametrize(("heads", "seq", "span"), [(2, 8, 4), (3, 13, 8), (1, 5, 2)])
def test_relative_position_tables_join_the_softmax_that_gathers_them_both_ways(heads: int, seq: int,
                                                                                span: int) -> None:
    """DeBERTa's scores: content-to-position gathered at the bucket table's ``[q, k]`` positions, and
    position-to-content gathered with the same table's rows as keys (then transposed), then the softmax:
    one table, read with its first axis as the query by one gather and as the key by the other. It is
    computed from nothing inside that one kernel (each reader's copy maps its own axes), the gathers with
    no range check (the index is clamped to the axis, whose extent is static)."""
    g = torch.Generator().manual_seed(seq)
    scores = torch.randn(heads, seq, seq, generator=g)
    c2p = torch.randn(heads, seq, 2 * span, generator=g)
    p2c = torch.randn(heads, seq, 2 * span, generator=g)
    with FusionDefinition() as fd:
        # (static sizes, as a torch.compile region declares them: the clamp's bound is checked against them)
        ts, tc, tp = (fd.from_pytorch(t, static_sizes=True) for t in (scores, c2p, p2c))
        table = _buckets(fd, seq, span)
        forward, backward = (fd.ops.expand(fd.ops.broadcast(fd.ops.clamp(fd.ops.add(t, span), 0, 2 * span - 1),
                                                            [True, False, False]), [heads, seq, seq])
                             for t in (table, fd.ops.neg(table)))
        content = fd.ops.take_along_axis(tc, forward, 2)
        position = fd.ops.permute(fd.ops.take_along_axis(tp, backward, 2), [0, 2, 1])
        logits = fd.ops.add(ts, fd.ops.add(content, position))
        exp = fd.ops.exp(fd.ops.sub(logits, fd.ops.max(logits, [2], keepdim=True)))
        fd.add_output(fd.ops.div(exp, fd.ops.sum(exp, [2], keepdim=True)))
    (got,) = execute_with_kernels(fd, [scores, c2p, p2c])
    index = _torch_buckets(seq, span)
    forward_t = (index + span).clamp(0, 2 * span - 1).expand(heads, seq, seq)
    backward_t = (-index + span).clamp(0, 2 * span - 1).expand(heads, seq, seq)
    want = (scores + c2p.gather(2, forward_t) + p2c.gather(2, backward_t).transpose(1, 2)).softmax(2)
    torch.testing.assert_close(got, want)
    assert len(kernel_schedulers(fd)) == 1, kernel_schedulers(fd)  # (a short row's softmax is unrolled)
    kernel = fd.last_kernel_code()
    assert "_check_index(" not in kernel[kernel.index("_kernel("):]


def test_a_long_chain_many_exprs_read_stays_shared() -> None:
    """Copies of a chain computed from nothing cost the segmenter time: a value whose copies would add more
    than ``COPY_BUDGET`` exprs is computed once, and the results stay right."""
    links, readers = 300, 8
    xs = [torch.randn(links, 2 + k) for k in range(readers)]
    with FusionDefinition() as fd:
        value = fd.ops.cast(fd.ops.iota(links, 0, 1, DataType.Int), DataType.Float)
        for k in range(links - 1):
            value = fd.ops.add(value, float(k % 3))
        table = fd.ops.broadcast(value, [False, True])
        for x in xs:
            fd.add_output(fd.ops.mul(fd.from_pytorch(x), table))
    copied = fd.fusion.clone()
    forward_input_broadcasts(copied, CompileOptions(enabled=frozenset({EnableOption.triton_interpreter})))
    assert (readers - 1) * links > COPY_BUDGET
    assert len(copied.exprs()) == len(fd.fusion.exprs())
    got = execute_with_kernels(fd, xs)
    want = torch.arange(links, dtype=torch.float32) + sum(float(k % 3) for k in range(links - 1))
    for g, x in zip(got, xs, strict=True):
        torch.testing.assert_close(g, x * want[:, None])
