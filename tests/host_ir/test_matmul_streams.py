"""Stream-parallel matmul / linear: each iteration runs one GEMM on one chunk, checked with
torch.profiler (``aten::mm`` / ``aten::addmm`` count and input shapes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.profiler import ProfilerActivity, profile

from pyfuser import FusionDefinition
from pyfuser.ir.iter_domain import ParallelType

STREAM = ParallelType.stream
#: A GEMM on a chunk may use another kernel than on the whole matrix (GPU): compare loosely.
TOL = {"rtol": 1e-4, "atol": 1e-4}


def _gemm_calls(fd: FusionDefinition, inputs: list[torch.Tensor], name: str = "aten::mm") -> list:
    """Input shapes of each ``name`` call in one (already compiled) execution."""
    fd.execute(inputs)  # compile outside the profiled run
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fd.execute(inputs)
    return [e.input_shapes for e in prof.events() if e.name == name]


def test_matmul_column_chunks_three_mm_calls(device, run_dumped):
    fd = FusionDefinition()
    a = fd.define_tensor([-1, -1])
    b = fd.define_tensor([-1, -1])
    out = fd.ops.matmul(a, b)
    fd.add_output(out)
    out.outer_split(1, 3)
    out.axis(1).parallelize(STREAM)
    x, w = torch.randn(6, 4, device=device), torch.randn(4, 10, device=device)
    (result,), dump = run_dumped(fd, [x, w])
    torch.testing.assert_close(result, x @ w, **TOL)
    assert result.is_contiguous()
    # matmul writes each chunk in place: mm(a, b_chunk, out=out_chunk)
    assert _gemm_calls(fd, [x, w]) == [[[6, 4], [4, 4], [6, 4]], [[6, 4], [4, 4], [6, 4]], [[6, 4], [4, 2], [6, 2]]]
    assert "HirAliasSelect( T1_" in dump and "HirAliasSelect( T0_" not in dump  # b sliced by columns, a whole


def test_chained_matmuls_row_chunks_share_one_loop(device, run_dumped):
    fd = FusionDefinition()
    x = fd.define_tensor([-1, -1])
    w1 = fd.define_tensor([-1, -1])
    w2 = fd.define_tensor([-1, -1])
    y = fd.ops.matmul(x, w1)
    z = fd.ops.matmul(y, w2)
    fd.add_output(z)
    for t in (y, z):
        t.outer_split(0, 3)
        t.axis(0).parallelize(STREAM)
    inputs = [torch.randn(8, 4, device=device), torch.randn(4, 5, device=device), torch.randn(5, 6, device=device)]
    (result,), dump = run_dumped(fd, inputs)
    torch.testing.assert_close(result, inputs[0] @ inputs[1] @ inputs[2], **TOL)
    assert dump.count("FOR StreamIdx") == 1
    assert "numberOfStreams * ( ceilDiv(i0, 3) )" in dump  # y never leaves the loop: ring buffer
    rows = [3, 3, 2]
    expected = [call for r in rows for call in ([[r, 4], [4, 5], [r, 5]], [[r, 5], [5, 6], [r, 6]])]
    assert _gemm_calls(fd, inputs) == expected


def test_column_then_row_parallel_run_in_separate_loops(device, run_dumped):
    fd = FusionDefinition()
    x = fd.define_tensor([-1, -1])
    w1 = fd.define_tensor([-1, -1])
    w2 = fd.define_tensor([-1, -1])
    y = fd.ops.matmul(x, w1)  # column chunks of y
    z = fd.ops.matmul(y, w2)  # y's columns are z's contraction: z needs y whole
    fd.add_output(z)
    y.outer_split(1, 2)
    y.axis(1).parallelize(STREAM)
    z.outer_split(1, 2)
    z.axis(1).parallelize(STREAM)
    inputs = [torch.randn(4, 3, device=device), torch.randn(3, 6, device=device), torch.randn(6, 5, device=device)]
    (result,), dump = run_dumped(fd, inputs)
    torch.testing.assert_close(result, inputs[0] @ inputs[1] @ inputs[2], **TOL)
    assert dump.count("FOR StreamIdx") == 2
    allocs = [line for line in dump.splitlines() if "ALLOCATE" in line]
    assert len(allocs) == 2 and not any("numberOfStreams" in line for line in allocs)
    assert _gemm_calls(fd, inputs) == [[[4, 3], [3, 3], [4, 3]]] * 2 + [[[4, 6], [6, 3], [4, 3]], [[4, 6], [6, 2], [4, 2]]]


def test_linear_chunked_along_n_slices_weight_and_bias(device):
    fd = FusionDefinition()
    x = fd.define_tensor([-1, -1, -1])
    w = fd.define_tensor([-1, -1])
    b = fd.define_tensor([-1])
    out = fd.ops.linear(x, w, b)
    fd.add_output(out)
    out.outer_split(2, 2)
    out.axis(2).parallelize(STREAM)
    inputs = [torch.randn(2, 3, 4, device=device), torch.randn(5, 4, device=device), torch.randn(5, device=device)]
    (result,) = fd.execute(inputs)
    torch.testing.assert_close(result, F.linear(*inputs), **TOL)
    # one addmm per chunk: bias chunk, flattened rows, weight chunk transposed
    assert [shapes[:3] for shapes in _gemm_calls(fd, inputs, "aten::addmm")] == [
        [[3], [6, 4], [4, 3]], [[2], [6, 4], [4, 2]]]


def _copies(fd: FusionDefinition, inputs: list[torch.Tensor]) -> int:
    fd.execute(inputs)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fd.execute(inputs)
    return sum(e.name == "aten::copy_" for e in prof.events())


def test_linear_writes_its_chunks_in_place(device):
    """A chunk of a linear is one mm / addmm into the output's slice: no result allocated and copied (with a
    bias, addmm itself first broadcasts the bias into the slice: one copy per chunk, no more)."""
    for bias, axis in ((False, 0), (True, 0), (True, 1)):
        fd = FusionDefinition()
        x, w = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        b = fd.define_tensor([-1]) if bias else None
        out = fd.ops.linear(x, w, b)
        fd.add_output(out)
        out.outer_split(axis, 2)
        out.axis(axis).parallelize(STREAM)
        inputs = [torch.randn(6, 4, device=device), torch.randn(5, 4, device=device)]
        inputs += [torch.randn(5, device=device)] if bias else []
        (result,) = fd.execute(inputs)
        torch.testing.assert_close(result, F.linear(*inputs), **TOL)
        assert _copies(fd, inputs) <= (2 if bias else 0), (bias, axis)


def test_linear_into_a_strided_chunk_falls_back_to_a_copy(device):
    """A 1-D weight has no mm form: the result is computed, then copied into the chunk (still correct)."""
    fd = FusionDefinition()
    x, w = fd.define_tensor([-1, -1]), fd.define_tensor([-1])
    out = fd.ops.linear(x, w)
    fd.add_output(out)
    out.outer_split(0, 2)
    out.axis(0).parallelize(STREAM)
    inputs = [torch.randn(5, 4, device=device), torch.randn(4, device=device)]
    (result,) = fd.execute(inputs)
    torch.testing.assert_close(result, F.linear(*inputs), **TOL)


def test_linear_chunked_along_m(device, run_dumped):
    fd = FusionDefinition()
    x = fd.define_tensor([-1, -1])
    w = fd.define_tensor([-1, -1])
    out = fd.ops.linear(x, w)
    fd.add_output(out)
    out.axis(0).parallelize(STREAM)
    inputs = [torch.randn(3, 4, device=device), torch.randn(6, 4, device=device)]
    (result,), dump = run_dumped(fd, inputs)
    torch.testing.assert_close(result, F.linear(*inputs), **TOL)
    assert "HirAliasSelect( T0_" in dump and "HirAliasSelect( T1_" not in dump


@settings(max_examples=12, deadline=None)
@given(m=st.integers(1, 9), k=st.integers(1, 5), n=st.integers(1, 9), chunks=st.integers(1, 5),
       axis=st.sampled_from([0, 1]), transposed=st.booleans())
def test_matmul_one_mm_per_nonempty_chunk(m, k, n, chunks, axis, transposed):
    a = torch.randn(k, m).t() if transposed else torch.randn(m, k)
    b = torch.randn(k, n)
    fd = FusionDefinition()
    ta = fd.define_tensor([-1, -1], contiguity=True, stride_order=[0, 1] if transposed else [1, 0])
    tb = fd.define_tensor([-1, -1])
    out = fd.ops.matmul(ta, tb)
    fd.add_output(out)
    out.outer_split(axis, chunks)
    out.axis(axis).parallelize(STREAM)
    (result,) = fd.execute([a, b])
    torch.testing.assert_close(result, a @ b, **TOL)
    extent = (m, n)[axis]
    size = -(-extent // chunks)
    lengths = [min(size, extent - i * size) for i in range(chunks) if i * size < extent]
    calls = _gemm_calls(fd, [a, b])
    assert [call[2][axis] for call in calls] == lengths
