"""Segmentation into kernel / ATen / communication segments, read from the dumps."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition, ParallelType
from pyfuser.options import CompileOptions, EnableOption
from pyfuser.preseg.pipeline import run_preseg_passes
from pyfuser.scheduler import reduction_analysis
from pyfuser.segmentation.segmenter import _Segmenter, segment_fusion
from tests.codegen.conftest import kernel_segments


def _dump(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fd: FusionDefinition, inputs,
          run) -> tuple[list[torch.Tensor], str]:
    capsys.readouterr()
    monkeypatch.setenv("PYFUSER_DUMP", "segmented_fusion,host_ir")
    outputs = run(fd, inputs)
    monkeypatch.delenv("PYFUSER_DUMP")
    return outputs, capsys.readouterr().out


def test_pointwise_linear_pointwise_is_kernel_aten_kernel(monkeypatch, capsys, device, run_kernels) -> None:
    x, w, b = torch.randn(6, 8, device=device), torch.randn(5, 8, device=device), torch.randn(8, device=device)
    with FusionDefinition() as fd:
        tx, tw, tb = fd.from_pytorch(x), fd.from_pytorch(w), fd.from_pytorch(b)
        h = fd.ops.linear(fd.ops.relu(fd.ops.add(tx, tb)), tw)
        fd.add_output(fd.ops.gelu(fd.ops.mul(h, 0.5)))
    (out,), dump = _dump(monkeypatch, capsys, fd, [x, w, b], run_kernels)
    torch.testing.assert_close(out, F.gelu(F.linear(torch.relu(x + b), w) * 0.5), atol=1e-5, rtol=1e-5)
    segments = [line.split()[1] for line in dump.splitlines() if line.startswith("  g")]
    assert segments == ["pointwise", "expr_eval", "pointwise"]
    host = dump[dump.index("%HostIrContainer"):]
    assert host.index("LaunchKernel( pointwise_") < host.index("= linear(") < host.rindex("LaunchKernel(")
    assert "expr_eval (pointwise: LinearOp" in dump, "the ATen segment says why no kernel took it"


def test_segment_set_forces_a_boundary(monkeypatch, capsys, device, run_kernels) -> None:
    x = torch.randn(4, 5, device=device)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.exp(fd.ops.segment_set(fd.ops.neg(t))))
    (out,), dump = _dump(monkeypatch, capsys, fd, [x], run_kernels)
    torch.testing.assert_close(out, torch.exp(-x))
    assert dump.count("LaunchKernel(") == 2, "neg and exp in two kernels"
    assert "SegmenterSet(" in dump[dump.index("%HostIrContainer"):], "the forced boundary: a copy between them"


def test_siblings_reading_one_input_share_a_kernel(monkeypatch, capsys, device, run_kernels) -> None:
    x = torch.randn(4, 5, device=device)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.exp(t))
        fd.add_output(fd.ops.sin(t))
    outs, dump = _dump(monkeypatch, capsys, fd, [x], run_kernels)
    torch.testing.assert_close(outs[0], torch.exp(x))
    torch.testing.assert_close(outs[1], torch.sin(x))
    assert dump.count("LaunchKernel(") == 1


def test_segments_that_each_write_single_values_share_a_kernel(monkeypatch, capsys, device, run_kernels) -> None:
    """A training step's per-layer counters (``num_batches_tracked + 1`` of each batch norm, 0-dim int64)
    and size-1 results share nothing: one kernel computes them all, not one launch each. A counter that
    reads another segment's output joins it only where no cycle forms; segments of larger shapes stay apart."""
    counters = [torch.tensor(k, device=device) for k in range(5)]
    x, y = torch.randn(1, 1, device=device), torch.randn(3, 4, device=device)
    z = torch.randn(3, 4, device=device)
    with FusionDefinition() as fd:
        for _ in counters:
            fd.add_output(fd.ops.add(fd.define_tensor([], dtype=DataType.Int), fd.define_scalar(1, dtype=DataType.Int)))
        fd.add_output(fd.ops.exp(fd.from_pytorch(x)))
        fd.add_output(fd.ops.mul(fd.from_pytorch(y), 2.0))
        fd.add_output(fd.ops.sin(fd.from_pytorch(z)))
    outs, dump = _dump(monkeypatch, capsys, fd, [*counters, x, y, z], run_kernels)
    for k, out in enumerate(outs[:5]):
        assert out.item() == k + 1 and out.dtype == torch.int64
    torch.testing.assert_close(outs[5], torch.exp(x))
    torch.testing.assert_close(outs[6], y * 2)
    torch.testing.assert_close(outs[7], torch.sin(z))
    assert dump.count("LaunchKernel(") == 3, dump


def test_no_cycle_through_an_aten_segment(monkeypatch, capsys, device, run_kernels) -> None:
    """a -> matmul (ATen) -> b, and a -> b directly: a and b cannot share a kernel around the matmul."""
    x, w = torch.randn(4, 5, device=device), torch.randn(5, 5, device=device)
    with FusionDefinition() as fd:
        t, tw = fd.from_pytorch(x), fd.from_pytorch(w)
        a = fd.ops.exp(t)
        m = fd.ops.matmul(a, tw)
        fd.add_output(fd.ops.div(a, m))
    (out,), dump = _dump(monkeypatch, capsys, fd, [x, w], run_kernels)
    torch.testing.assert_close(out, x.exp() / (x.exp() @ w))
    segments = [line.split()[1] for line in dump.splitlines() if line.startswith("  g")]
    assert segments == ["pointwise", "expr_eval", "pointwise"]


def test_kernels_off_on_cpu_by_default(monkeypatch, capsys) -> None:
    x = torch.randn(4, 5)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(fd.from_pytorch(x)))
    (out,), dump = _dump(monkeypatch, capsys, fd, [x], lambda f, i: f.execute(i))
    torch.testing.assert_close(out, torch.exp(x))
    assert "generated kernels are off" in dump and "LaunchKernel" not in dump


def test_stream_loop_body_is_a_generated_kernel(monkeypatch, capsys, device, run_kernels) -> None:
    x = torch.randn(10, 6, device=device)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        a = fd.ops.mul(t, 2.0)
        y = fd.ops.relu(a)
        fd.add_output(y)
    for tv in (a, y):
        tv.outer_split(0, 3)
        tv.axis(0).parallelize(ParallelType.stream)
    (out,), dump = _dump(monkeypatch, capsys, fd, [x], run_kernels)
    torch.testing.assert_close(out, torch.relu(x * 2))
    body = dump[dump.index("FOR StreamIdx"):]
    assert body.count("LaunchKernel(") == 1, "mul and relu fused, launched on each chunk"
    assert "HirAliasSelect" in body.split("LaunchKernel(")[0]


def _rope_like(fd: FusionDefinition, x: torch.Tensor, w: torch.Tensor, v: torch.Tensor, *,
               explicit: bool, broadcast_is_output: bool = False) -> None:
    """``v`` broadcast to ``x``'s shape (an explicit broadcast_in_dim: broadcast + expand; else the
    implicit broadcast of a pointwise op), read before and after an ATen matmul."""
    tx, tw, tv = fd.from_pytorch(x), fd.from_pytorch(w), fd.from_pytorch(v)
    c = fd.ops.broadcast_in_dim(tv, list(x.shape), [1]) if explicit else tv
    m = fd.ops.matmul(fd.ops.mul(tx, c), tw)
    fd.add_output(fd.ops.add(m, c))
    if broadcast_is_output:
        fd.add_output(c)


@pytest.mark.parametrize("explicit", [True, False])
def test_input_broadcast_read_by_two_kernels_is_computed_in_each(monkeypatch, capsys, device, run_kernels,
                                                                  explicit) -> None:
    """Before the matmul and after it: each kernel broadcasts the input itself (one copy of the
    broadcast per reader), no kernel writes the broadcast out and nothing else is launched."""
    x, w, v = torch.randn(4, 6, device=device), torch.randn(6, 6, device=device), torch.randn(6, device=device)
    with FusionDefinition() as fd:
        _rope_like(fd, x, w, v, explicit=explicit)
    (out,), dump = _dump(monkeypatch, capsys, fd, [x, w, v], run_kernels)
    torch.testing.assert_close(out, (x * v) @ w + v, atol=1e-5, rtol=1e-5)
    segments = [line.split()[1] for line in dump.splitlines() if line.startswith("  g")]
    assert segments == ["pointwise", "expr_eval", "pointwise"]
    assert sum(type(e).__name__ == "BroadcastOp" for e in fd.fusion.exprs()) == 1, "the user's fusion is unchanged"


def test_input_broadcast_that_is_an_output_is_not_forwarded(monkeypatch, capsys, device, run_kernels) -> None:
    x, w, v = torch.randn(4, 6, device=device), torch.randn(6, 6, device=device), torch.randn(6, device=device)
    with FusionDefinition() as fd:
        _rope_like(fd, x, w, v, explicit=True, broadcast_is_output=True)
    (out, c), dump = _dump(monkeypatch, capsys, fd, [x, w, v], run_kernels)
    torch.testing.assert_close(out, (x * v) @ w + v, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(c, v.expand(4, 6))
    host = dump[dump.index("%HostIrContainer"):]
    assert host.count("LaunchKernel(") == 2, "the broadcast is written once, by the kernel that also multiplies"


def test_a_head_merge_reshape_is_a_view_of_the_kernels_output(device: str, run_kernels) -> None:
    """``[b, h, s, d]`` computed, permuted to ``[b, s, h, d]``, reshaped to ``[b * s, h * d]``: the kernel
    writes the permuted order (``preseg.view_friendly_layouts``), so ATen's reshape copies nothing."""
    x = torch.randn(2, 3, 4, 5, device=device)
    y = torch.randn(2, 4, 3, 5, device=device).transpose(1, 2)  # an input in the other order too
    with FusionDefinition() as fd:
        grad = fd.ops.add(fd.ops.mul(fd.from_pytorch(x), 2.0), fd.from_pytorch(y))
        fd.add_output(fd.ops.reshape(fd.ops.permute(grad, [0, 2, 1, 3]), [8, 15]))
    run_kernels(fd, [x, y])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        (out,) = run_kernels(fd, [x, y])
    torch.testing.assert_close(out, (x * 2 + y).permute(0, 2, 1, 3).reshape(8, 15))
    # (the interpreter's own copies in and out of its buffers are no ATen clones)
    copies = [e.name for e in prof.events() if e.name in ("aten::clone", "aten::_reshape_copy", "aten::contiguous")]
    assert not copies and len(kernel_segments(fd)) == 1, copies


def test_an_index_expanded_for_a_gather_is_computed_by_the_gathers_kernel(monkeypatch, capsys, device) -> None:
    """DeBERTa's relative positions: an index computed per [S, S] and expanded over batch x heads for
    a gather. The gather reads its lookup tensor (a segment input) at the index's values, so one kernel
    computes the index where it reads it: no index tensor is written, expanded or not."""
    scores = torch.randn(6, 5, 9, device=device)
    positions = torch.arange(5, device=device)
    with FusionDefinition() as fd:
        s = fd.from_pytorch(scores)
        p = fd.from_pytorch(positions)
        relative = fd.ops.sub(fd.ops.broadcast(p, [False, True]), fd.ops.broadcast(p, [True, False]))
        index = fd.ops.clamp(fd.ops.add(relative, 4), 0, 8)
        expanded = fd.ops.expand(fd.ops.broadcast(index, [True, False, False]), [6, 5, 5])
        fd.add_output(fd.ops.gather(s, expanded, 2))
    kernels_on = ["triton_interpreter"] if device == "cpu" else []
    (out,), dump = _dump(monkeypatch, capsys, fd, [scores, positions],
                         lambda fd, i: fd.execute(i, _enable_options=kernels_on))
    want_index = ((positions[:, None] - positions[None, :]) + 4).clamp(0, 8).expand(6, 5, 5)
    torch.testing.assert_close(out, torch.gather(scores, 2, want_index))
    assert "Segmented fusion (1 segments)" in dump, dump
    launch = next(line for line in dump.splitlines() if "LaunchKernel(" in line)
    assert "int64_t" not in launch.split("outputs = ")[1] and len(kernel_segments(fd)) == 1, dump


def test_a_transpose_only_a_matmul_reads_is_a_view(monkeypatch, capsys, device) -> None:
    """A permute that would be a kernel of its own (a transpose kernel) for a matmul, which reads either
    layout, is a view: no kernel, no copy."""
    x, w = torch.randn(6, 8, device=device), torch.randn(6, 5, device=device)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.matmul(fd.ops.permute(fd.from_pytorch(x), [1, 0]), fd.from_pytorch(w)))
    kernels_on = ["triton_interpreter"] if device == "cpu" else []
    (out,), dump = _dump(monkeypatch, capsys, fd, [x, w], lambda fd, i: fd.execute(i, _enable_options=kernels_on))
    torch.testing.assert_close(out, x.t() @ w, atol=1e-5, rtol=1e-5)
    assert "LaunchKernel(" not in dump and "a permute only ATen calls read: a view" in dump


def test_segmenting_analyzes_each_candidate_segment_once(monkeypatch, device, run_kernels) -> None:
    """Merges refused once come back (the second round of merges) and every reduction scheduler asks
    about the same candidate: a model's graph has thousands of candidates, so each set of exprs is
    analyzed once (counted by the ID graphs the reduction analysis builds)."""
    x = torch.randn(6, 9, device=device, dtype=torch.bfloat16)
    w = torch.randn(6, 7, device=device)
    with FusionDefinition() as fd:
        tx, tw = fd.ops.cast(fd.from_pytorch(x), DataType.Float), fd.from_pytorch(w)
        rows = fd.ops.sum(fd.ops.exp(tx), [1])
        # rows of another width: a kernel of its own, which the row sums' cannot take in (tried twice)
        fd.add_output(rows)
        fd.add_output(fd.ops.mul(fd.ops.broadcast(rows, [False, True]), tw))
    fusion = fd.fusion.clone()
    options = CompileOptions(enabled=frozenset({EnableOption.triton_interpreter}), device=torch.device(device))
    run_preseg_passes(fusion, options)
    analyzed: list[tuple[int, ...]] = []
    id_graph = reduction_analysis.IdGraph

    def counted(tensors, exprs, **kwargs):
        exprs = list(exprs)
        analyzed.append(tuple(map(id, exprs)))
        return id_graph(tensors, exprs, **kwargs)

    monkeypatch.setattr(reduction_analysis, "IdGraph", counted)
    segmented = segment_fusion(fusion, options)
    monkeypatch.undo()
    assert len(segmented.groups) == 2 and analyzed
    assert len(analyzed) == len(set(analyzed)), f"{len(analyzed) - len(set(analyzed))} candidates analyzed again"
    want_rows = x.float().exp().sum(1)
    got_rows, got_scaled = run_kernels(fd, [x, w])
    torch.testing.assert_close(got_rows, want_rows, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_scaled, want_rows[:, None] * w, atol=1e-4, rtol=1e-4)


def test_cycle_checks_walk_the_groups_between_the_two_merged(monkeypatch) -> None:
    """A chain whose every link an ATen call reads, their results summed: each merge of the chain asks
    whether a path leads back to it through another segment. A walk of everything downstream of the
    chain makes segmenting it grow as the cube of its length; the groups between the two merged, as the
    square (counted by the groups whose readers the walks look up)."""
    def walked(links: int) -> int:
        with FusionDefinition() as fd:
            t = fd.define_tensor([-1, -1], dtype=DataType.Float)
            w = fd.define_tensor([-1, -1], dtype=DataType.Float)
            total = None
            for _ in range(links):
                t = fd.ops.exp(t)
                product = fd.ops.matmul(t, w)
                total = product if total is None else fd.ops.add(total, product)
            fd.add_output(total)
            fd.add_output(t)
        fusion = fd.fusion.clone()
        options = CompileOptions(enabled=frozenset({EnableOption.triton_interpreter}))
        run_preseg_passes(fusion, options)
        calls = [0]
        consumers = _Segmenter._consumers

        def counted(self, group):
            calls[0] += 1
            return consumers(self, group)

        monkeypatch.setattr(_Segmenter, "_consumers", counted)
        segmented = segment_fusion(fusion, options)
        monkeypatch.undo()
        assert [g.scheduler.name for g in segmented.groups].count("expr_eval") == links  # the matmuls
        return calls[0]

    small, large = walked(20), walked(40)
    assert large < 5 * small, (small, large)


def test_a_reduction_result_viewed_and_transposed_for_a_matmul_is_written_once(monkeypatch, capsys, device) -> None:
    """A loss gradient (a normalization's result) viewed [tokens, vocabulary] and transposed for the head's
    weight gradient, and viewed again for the input gradient: the reshapes and the permute are views of
    the kernel's one output (the kernel wrote both reshapes, or the transpose and a reshape: the gradient
    twice)."""
    x, h, w = torch.randn(2, 8, 64, device=device), torch.randn(16, 32, device=device), torch.randn(64, 32, device=device)
    with FusionDefinition() as fd:
        tx, th, tw = (fd.from_pytorch(t, static_sizes=True) for t in (x, h, w))
        e = fd.ops.exp(fd.ops.sub(tx, fd.ops.broadcast(fd.ops.max(tx, [2]), [False, False, True])))
        grad = fd.ops.div(e, fd.ops.broadcast(fd.ops.sum(e, [2]), [False, False, True]))
        fd.add_output(fd.ops.matmul(fd.ops.permute(fd.ops.reshape(grad, [16, 64]), [1, 0]), th))
        fd.add_output(fd.ops.matmul(fd.ops.reshape(grad, [16, 64]), tw))
    kernels_on = ["triton_interpreter"] if device == "cpu" else []
    (weight_grad, input_grad), dump = _dump(monkeypatch, capsys, fd, [x, h, w],
                                            lambda fd, i: fd.execute(i, _enable_options=kernels_on))
    want = torch.softmax(x, 2).reshape(16, 64)
    torch.testing.assert_close(weight_grad, want.t() @ h, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(input_grad, want @ w, atol=1e-5, rtol=1e-5)
    (launch,) = [line for line in dump.splitlines() if "LaunchKernel(" in line]
    assert len(re.findall(r"T\d+_g", launch.split("outputs = ")[1])) == 1, launch
