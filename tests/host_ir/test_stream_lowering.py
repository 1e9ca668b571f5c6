"""Stream loops past the seed: outer / inner splits (non-divisible too), propagation from inputs,
pointwise chains with broadcasts, reductions, layouts; results always compared with torch."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyfuser import DataType, FusionDefinition
from pyfuser.ir.iter_domain import ParallelType

STREAM = ParallelType.stream


def _fors(dump: str) -> list[str]:
    return [x.strip() for x in dump.splitlines() if x.strip().startswith("FOR ")]


@pytest.mark.parametrize(("rows", "chunks"), [(7, 3), (6, 3), (5, 4), (2, 3), (0, 2)])
def test_outer_split_stream_chunks(rows, chunks, device, run_seed_dumped):
    """c iterations over ceilDiv(n, c) rows; the last chunk is smaller or empty (then skipped)."""
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1, -1])
    t1 = fd.ops.exp(t0)
    t2 = fd.ops.mul(t1, 2.0)
    fd.add_output(t2)
    for t in (t1, t2):
        t.outer_split(0, chunks)
        t.axis(0).parallelize(STREAM)
    x = torch.randn(rows, 3, device=device)
    (out,), dump = run_seed_dumped(fd, [x])
    torch.testing.assert_close(out, torch.exp(x) * 2.0)
    assert len(_fors(dump)) == 1
    assert "iStreamIdx" in _fors(dump)[0] and f"{{{chunks}}}" in _fors(dump)[0]
    assert f"( ceilDiv(i0, {chunks}) )" in dump


def test_inner_split_stream_chunks(device, run_seed_dumped):
    """The outer ID of an inner split: ceilDiv(n, f) iterations of f rows each."""
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1, -1])
    t1 = fd.ops.neg(t0)
    fd.add_output(t1)
    t1.split(1, 4)
    t1.axis(1).parallelize(STREAM)
    x = torch.randn(3, 10, device=device)
    (out,), dump = run_seed_dumped(fd, [x])
    torch.testing.assert_close(out, -x)
    assert "FOR StreamIdx in iStreamIdx" in dump and "{( ceilDiv(i1, 4) )}:" in dump


def test_a_broadcast_id_on_stream_is_one_chunk(device, run_seed_dumped):
    """A size-1 (broadcast) axis parallelized on stream, as nvFuser's S = 1 pipelines write it: one chunk,
    the whole tensor, so no loop."""
    fd = FusionDefinition()
    t0 = fd.define_tensor([1, -1, -1])
    t1 = fd.ops.neg(t0)
    fd.add_output(t1)
    t1.axis(0).parallelize(STREAM)
    x = torch.randn(1, 3, 5, device=device)
    (out,), dump = run_seed_dumped(fd, [x])
    torch.testing.assert_close(out, -x)
    assert "FOR" not in dump and "bStreamIdx" in dump


def test_stream_on_input_puts_consumers_in_the_loop(device, run_seed_dumped):
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1, -1])
    t1 = fd.define_tensor([1, -1])  # broadcast row: read whole in every iteration
    t2 = fd.ops.add(t0, t1)
    t3 = fd.ops.sum(t0, [1])
    fd.add_output(t2)
    fd.add_output(t3)
    t0.outer_split(0, 2)
    t0.axis(0).parallelize(STREAM)
    x, row = torch.randn(5, 4, device=device), torch.randn(1, 4, device=device)
    (out, total), dump = run_seed_dumped(fd, [x, row])
    torch.testing.assert_close(out, x + row)
    torch.testing.assert_close(total, x.sum(1))
    assert len(_fors(dump)) == 1  # both consumers map T0's stream axis: one loop
    assert dump.count("HirAliasSelect( T0_") == 1
    assert "HirAliasSelect( T1_" not in dump


def test_stream_on_input_propagates_through_all_consumers(device, run_seed_dumped):
    """nvFuser's test_two_matmuls_inlinable: chunking the input puts both chained matmuls in the loop
    (2c GEMMs); the propagation stops at an expr that cannot take it (a reduction of the axis)."""
    c = 3
    fd = FusionDefinition()
    inp, w1, w2 = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
    out = fd.ops.matmul(fd.ops.matmul(inp, w1), w2)
    fd.add_output(out)
    fd.add_output(fd.ops.sum(fd.ops.relu(out), [0]))  # relu joins the loop; the sum over the chunked axis cannot
    inp.outer_split(0, c)
    inp.axis(0).parallelize(STREAM)
    x, a, b = (torch.randn(*shape, device=device) for shape in ((2 * c, 3), (3, 5), (5, 4)))
    with torch.profiler.profile() as profile:
        (got, total), dump = run_seed_dumped(fd, [x, a, b], _enable_options=["host_ir_lowering"],
                                        _disable_options=["infer_contiguity"])
    torch.testing.assert_close(got, x @ a @ b)
    torch.testing.assert_close(total, torch.relu(x @ a @ b).sum(0))
    assert len(_fors(dump)) == 1
    assert sum(e.name == "aten::mm" for e in profile.events()) == 2 * c


def test_non_stream_consumer_closes_loop_and_reads_whole(device, run_seed_dumped):
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1, -1])
    t1 = fd.ops.relu(t0)
    t2 = fd.ops.sum(t1, [0])  # reduces over the stream axis: needs all of t1
    t3 = fd.ops.add(t1, t2)
    fd.add_output(t3)
    t1.axis(0).parallelize(STREAM)
    t3.axis(0).parallelize(STREAM)
    x = torch.randn(6, 3, device=device)
    (out,), dump = run_seed_dumped(fd, [x])
    torch.testing.assert_close(out, torch.relu(x) + torch.relu(x).sum(0))
    assert len(_fors(dump)) == 2
    allocs = [line for line in dump.splitlines() if "ALLOCATE" in line]
    assert len(allocs) == 2 and not any("numberOfStreams" in line for line in allocs)  # t1 read outside: whole


def test_reduction_in_loop_keeps_positions(device, run_seed_dumped):
    """Chunks keep the selected dim at run time, so reduction axes stay valid."""
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1, -1, -1])
    t1 = fd.ops.sum(t0, [2])
    t2 = fd.ops.mul(t1, t1)
    fd.add_output(t2)
    for t in (t1, t2):
        t.axis(1).parallelize(STREAM)
    x = torch.randn(2, 5, 3, device=device)
    (out,), dump = run_seed_dumped(fd, [x])
    torch.testing.assert_close(out, x.sum(2) ** 2)
    assert len(_fors(dump)) == 1


def test_permuted_input_and_required_output_layout(device, run_seed_dumped):
    x = torch.randn(4, 6, device=device).t()  # [6, 4], column-major
    fd = FusionDefinition()
    t0 = fd.from_pytorch(x)
    t1 = fd.ops.sigmoid(t0)
    fd.add_output(t1, stride_order=[0, 1])  # column-major output required
    t1.outer_split(1, 3)
    t1.axis(1).parallelize(STREAM)
    (out,), _ = run_seed_dumped(fd, [x])
    torch.testing.assert_close(out, torch.sigmoid(x))
    assert out.stride() == (1, 6)


def test_set_of_input_never_aliases_it(device):
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1])
    fd.add_output(fd.ops.set(t0))
    x = torch.randn(5, device=device)
    (out,) = fd.execute([x])
    assert out.data_ptr() != x.data_ptr()
    torch.testing.assert_close(out, x, rtol=0, atol=0)


def test_full_and_expand_run_chunk_wise(device, run_seed_dumped):
    fd = FusionDefinition()
    t0 = fd.define_tensor([1, -1])
    n = fd.define_scalar(dtype=torch.int64)
    t1 = fd.ops.expand(t0, [n, -1])
    t2 = fd.ops.full([n, 3], 1.5, dtype=torch.float32)
    t3 = fd.ops.add(t1, 1.0)
    fd.add_output(t3)
    fd.add_output(t2)
    for t in (t1, t3):
        t.outer_split(0, 2)
        t.axis(0).parallelize(STREAM)
    t2.axis(0).parallelize(STREAM)
    row = torch.randn(1, 3, device=device)
    (out, filled), dump = run_seed_dumped(fd, [row, 5])
    torch.testing.assert_close(out, row.expand(5, 3) + 1.0)
    torch.testing.assert_close(filled, torch.full((5, 3), 1.5, device=device))
    assert len(_fors(dump)) == 2


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(0, 9), cols=st.integers(1, 5), chunks=st.integers(1, 5), transpose=st.booleans(),
       inner=st.booleans())
def test_stream_pointwise_chain_matches_torch(rows, cols, chunks, transpose, inner):
    base = torch.randn(cols, rows).t() if transpose else torch.randn(rows, cols)
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1, -1], contiguity=True, stride_order=[0, 1] if transpose else [1, 0])
    t1 = fd.ops.tanh(t0)
    t2 = fd.ops.sub(t1, t0)
    fd.add_output(t2)
    for t in (t1, t2):
        t.split(0, chunks, inner_split=inner)
        t.axis(0).parallelize(STREAM)
    (out,) = fd.execute([base])
    torch.testing.assert_close(out, torch.tanh(base) - base)


def test_scalar_work_between_loop_exprs_is_hoisted(device, run_seed_dumped):
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1, -1])
    s = fd.define_scalar(dtype=torch.float64)
    t1 = fd.ops.exp(t0)
    t2 = fd.ops.add(t1, fd.ops.mul(s, 2.0))
    fd.add_output(t2)
    for t in (t1, t2):
        t.axis(0).parallelize(STREAM)
    x = torch.randn(5, 2, device=device)
    (out,), dump = run_seed_dumped(fd, [x, 0.25])
    torch.testing.assert_close(out, torch.exp(x) + 0.5)
    assert len(_fors(dump)) == 1
    assert dump.index("* double(2.0)") < dump.index("FOR ")


def test_var_mean_outputs_chunked_together(device, run_seed_dumped):
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1, -1])
    var, mean = fd.ops.var_mean(t0, [1], correction=1)
    fd.add_output(var)
    fd.add_output(mean)
    mean.outer_split(0, 2)
    mean.axis(0).parallelize(STREAM)  # scheduled on the second output: both are produced chunk-wise
    x = torch.randn(7, 4, device=device)
    (v, m), dump = run_seed_dumped(fd, [x])
    ev, em = torch.var_mean(x, 1, correction=1)
    torch.testing.assert_close(v, ev)
    torch.testing.assert_close(m, em)
    assert len(_fors(dump)) == 1 and dump.count("ALLOCATE") == 2


def test_chunk_outputs_written_in_place_keep_torch_promotion(device):
    """Pointwise ops write chunks with ``out=``; the promoted dtype must match torch's."""
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1, -1], dtype=torch.int32)
    t1 = fd.ops.exp(t0)                # int -> float
    t2 = fd.ops.add(t0, 2.5)           # int + python float -> float
    t3 = fd.ops.truediv(t0, t0)        # int / int -> float
    t4 = fd.ops.mul(t0, 3)             # stays int
    outs = (t1, t2, t3, t4)
    for t in outs:
        fd.add_output(t)
        t.outer_split(0, 2)
        t.axis(0).parallelize(STREAM)
    x = torch.randint(1, 5, (5, 3), dtype=torch.int32, device=device)
    got = fd.execute([x])
    for g, want in zip(got, (torch.exp(x), x + 2.5, x / x, x * 3), strict=True):
        assert g.dtype == want.dtype
        torch.testing.assert_close(g, want)


def _gather_then_compare(copy: bool) -> FusionDefinition:
    """``take_along_axis(y, i % 2, 1) < y`` with both ops on stream along axis 1, the gathered one;
    ``copy``: the comparison reads a copy of ``y``."""
    fd = FusionDefinition()
    x = fd.define_tensor([-1, -1, -1])
    i = fd.define_tensor([-1, -1, -1], dtype=DataType.Int)
    y = fd.ops.log10(fd.ops.minimum(x, x))
    gathered = fd.ops.take_along_axis(y, fd.ops.remainder(i, 2), 1)
    out = fd.ops.lt(gathered, fd.ops.segment_set(y) if copy else y)
    fd.add_output(out)
    for t in (gathered, out):
        t.outer_split(1, 2)
        t.axis(1).parallelize(STREAM)
    return fd


def test_a_kernel_cannot_read_a_lookup_whole_and_chunked(device):
    """A stream loop over the gathered axis of ``take_along_axis``: the gather reads its lookup whole along
    that axis, the comparison in the same kernel reads the lookup chunked, and a kernel takes one operand
    per tensor: an error says so and what to do (the kernel used to get the chunk, and its index check
    called an in-range index out of range). With the comparison reading a copy the loop runs, as torch."""
    x, index = torch.rand(3, 2, 5, device=device) + 0.5, torch.randint(-4, 5, (3, 2, 5), device=device)
    options = [] if device == "cuda" else ["triton_interpreter"]
    with pytest.raises(ValueError, match=r"parallelized on stream, but the kernel of .* reads T\d+ whole along that "
                                         r"axis \(TakeAlongAxisOp computing T\d+\) and other ops of it read T\d+ "
                                         r"chunked: .* copy T\d+ \(segment_set\)"):
        _gather_then_compare(copy=False).execute([x, index], _enable_options=options)
    (out,) = _gather_then_compare(copy=True).execute([x, index], _enable_options=options)
    y = torch.log10(x)
    torch.testing.assert_close(out, torch.take_along_dim(y, index % 2, 1) < y)
