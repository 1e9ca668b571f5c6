"""Cheap chains from a fusion input (or from nothing) forwarded into each reader: a value two kernels of
different shapes read (the rotary embedding's cos of both q and k with fewer KV heads, position ids from
an iota) is recomputed inside both, not written out by a kernel of its own. Through generated kernels
(Triton's interpreter on CPU) against torch."""

from __future__ import annotations

import re

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from tests.codegen.conftest import execute_with_kernels, kernel_schedulers

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
        stored = re.findall(r"tl\.store\(T\d+ \+ [^,]*, ([^,)]*\)?)", code)
        assert len(stored) == len(set(stored)), code  # no value stored twice
