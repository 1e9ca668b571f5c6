"""Normalizations as generated kernels, against torch: softmax, log-softmax, layernorm, rmsnorm and
their backward formulas, a batchnorm-like outer normalization, and seed 003's fusion; each lands in
the scheduler the issue names (read from the kernels that ran)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition, schedule
from pyfuser.codegen.kernel_sequence import build_sources
from pyfuser.codegen.values import L2Hint
from pyfuser.ir.layout import Layout
from pyfuser.scheduler import inner_outer_persistent, inner_persistent, outer_persistent, reduction
from pyfuser.scheduler.grid_reduction import split_at_grid_reductions
from pyfuser.scheduler.kernel_scheduling import KernelScheduling
from pyfuser.scheduler.reduction_schedule import PLAIN_ROWS_TILE
from pyfuser.scheduler.registry import Machine, SchedulerType, SizeHints
from pyfuser.utils import next_power_of_2
from tests.codegen.conftest import define_layernorm_backward, define_rmsnorm_backward, kernel_schedulers, kernel_segments

TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
DT = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16}


def _close(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype = torch.float32) -> None:
    torch.testing.assert_close(got.float(), ref.float(), rtol=TOL[dtype], atol=TOL[dtype])


def _softmax(log: bool) -> FusionDefinition:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        m = fd.ops.max(x, [1], keepdim=True)
        shifted = fd.ops.sub(x, m)
        s = fd.ops.sum(fd.ops.exp(shifted), [1], keepdim=True)
        fd.add_output(fd.ops.sub(shifted, fd.ops.log(s)) if log else fd.ops.div(fd.ops.exp(shifted), s))
    return fd


@pytest.mark.parametrize("cols", [50, 1500])  # 1500: longer than the interpreter's tile, multi-pass
def test_softmax_and_log_softmax(cols: int, device: str, run_kernels) -> None:
    x = torch.randn(9, cols, device=device)
    for log in (False, True):
        fd = _softmax(log)
        (out,) = run_kernels(fd, [x])
        _close(out, torch.log_softmax(x, 1) if log else torch.softmax(x, 1))
        assert kernel_schedulers(fd) == ["inner_persistent"]
        if device == "cpu":
            assert kernel_segments(fd)[0].scheduler_params.shape == ("tile" if cols < 1024 else "loop")


def _many_sms(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """On the CPU, the interpreter's tiles on a machine of 132 SMs: rows of a softmax few enough to
    split across programs (fewer than half the SMs: ``ONLINE_SPLIT_SMS_PER_ROW``) on any machine."""
    if device == "cpu":
        monkeypatch.setattr(Machine, "of", staticmethod(lambda _device: Machine(132, 1024, 128)))


@pytest.mark.parametrize(("rows", "cols", "dtype"), [(1, 4100, torch.float32), (3, 5001, torch.bfloat16)])
def test_few_wide_rows_are_split_across_programs(rows: int, cols: int, dtype: torch.dtype, device: str,
                                                 run_kernels, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fewer rows than the machine has programs, each longer than a loop's few steps: each row's max,
    sum of exponentials (or of squares) and output are computed by several programs, a share of the
    row each (a grid reduction per reduction, the share read again by the next launch)."""
    _many_sms(monkeypatch, device)
    x = torch.randn(rows, cols, device=device).to(dtype) * 4
    w = torch.randn(cols, device=device).to(dtype)
    for log in (False, True):
        with FusionDefinition() as fd:
            t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
            shifted = fd.ops.sub(t, fd.ops.max(t, [1], keepdim=True))
            s = fd.ops.sum(fd.ops.exp(shifted), [1], keepdim=True)
            y = fd.ops.sub(shifted, fd.ops.log(s)) if log else fd.ops.div(fd.ops.exp(shifted), s)
            fd.add_output(fd.ops.cast(y, DT[dtype]))
        (out,) = run_kernels(fd, [x])
        _close(out, (torch.log_softmax if log else torch.softmax)(x.float(), 1).to(dtype), dtype)
        assert kernel_schedulers(fd) == ["inner_persistent"]
        if device == "cpu":
            params = kernel_segments(fd)[0].scheduler_params
            assert params.shape == "split" and params.split >= 2
    fd = _rmsnorm(DT[dtype])
    (out,) = run_kernels(fd, [x, w])
    xf = x.float()
    _close(out, (xf * torch.rsqrt((xf * xf).mean(1, keepdim=True) + 1e-6) * w.float()).to(dtype), dtype)
    if device == "cpu":
        assert kernel_segments(fd)[0].scheduler_params.shape == "split"
    fd = _layernorm(DT[dtype])  # var_mean: Welford's partial results per program, combined by the next launch
    (out,) = run_kernels(fd, [x, w, w])
    _close(out, F.layer_norm(x.float(), (cols,), w.float(), w.float(), 1e-5).to(dtype), dtype)
    if device == "cpu":
        assert kernel_segments(fd)[0].scheduler_params.shape == "split"


def test_split_rows_with_per_row_results_and_independent_reductions(device: str, run_kernels,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Cross-entropy's loss per row over few wide rows: the target's logit summed beside the max (two
    grid reductions at once), the results per row only (the last launch has no share of the row to
    loop over, so the broadcasts of the row's sums index nothing there)."""
    _many_sms(monkeypatch, device)
    x = torch.randn(2, 4100, device=device) * 3
    target = torch.tensor([7, 4099], device=device)
    with FusionDefinition() as fd:
        t, tgt = fd.from_pytorch(x), fd.from_pytorch(target)
        m = fd.ops.max(t, [1], keepdim=True)
        lse = fd.ops.add(fd.ops.log(fd.ops.sum(fd.ops.exp(fd.ops.sub(t, m)), [1], keepdim=True)), m)
        hot = fd.ops.eq(fd.ops.broadcast(fd.ops.iota(4100, dtype=DataType.Int), [True, False]),
                        fd.ops.broadcast(tgt, [False, True]))
        picked = fd.ops.sum(fd.ops.where(hot, t, 0.0), [1], keepdim=True)
        fd.add_output(fd.ops.squeeze(fd.ops.sub(lse, picked), [1]))
    (out,) = run_kernels(fd, [x, target])
    _close(out, F.cross_entropy(x, target, reduction="none"))
    if device == "cpu":
        assert kernel_segments(fd)[0].scheduler_params.shape == "split"


def test_split_rows_as_the_machine_has_programs() -> None:
    """Programs per row: enough for two programs per SM (``WAVES``), at most one per 4 loop steps of
    the row (an H200: 132 SMs, steps of 8192), and only for fewer rows than half the SMs (132 rows: one
    program a row)."""
    h200 = Machine(132, 16384, 2048)
    fd = _rmsnorm(DataType.Float)
    for rows, cols, split in [(63, 262144, 5), (1, 262144, 8), (33, 128256, 3), (63, 65536, 2), (132, 262144, 1),
                              (264, 262144, 1), (63, 16384, 1)]:
        params = inner_persistent.compute_heuristics(fd.fusion, SizeHints(cols, rows, h200))
        assert (params.shape == "split", params.split) == (split > 1, split), (rows, cols)


def test_a_softmax_splits_only_rows_fewer_than_half_the_sms() -> None:
    """A softmax reads a looped row twice in one program (max and sum of exponentials in one pass),
    three times split across programs: it splits only rows fewer than half the SMs (66 on an H200)."""
    h200 = Machine(132, 16384, 2048)
    for log in (False, True):
        fd = _softmax(log)
        for rows, cols, split in [(130, 131072, 1), (66, 262144, 1), (65, 262144, 5), (63, 262144, 5),
                                  (8, 262144, 8), (1, 262144, 8), (2, 65536, 2)]:
            params = inner_persistent.compute_heuristics(fd.fusion, SizeHints(cols, rows, h200))
            assert (params.shape, params.split) == (("split", split) if split > 1 else ("loop", 1)), (rows, cols)


def test_softmax_backward(device: str, run_kernels) -> None:
    y, dy = torch.softmax(torch.randn(7, 40, device=device), 1), torch.randn(7, 40, device=device)
    with FusionDefinition() as fd:
        ty, tdy = fd.from_pytorch(y), fd.from_pytorch(dy)
        fd.add_output(fd.ops.mul(ty, fd.ops.sub(tdy, fd.ops.sum(fd.ops.mul(tdy, ty), [1], keepdim=True))))
    (out,) = run_kernels(fd, [y, dy])
    _close(out, y * (dy - (dy * y).sum(1, keepdim=True)))
    assert kernel_schedulers(fd) == ["inner_persistent"]


def _layernorm(dtype: DataType) -> FusionDefinition:
    with FusionDefinition() as fd:
        x, w, b = fd.define_tensor([-1, -1], dtype=dtype), fd.define_tensor([-1], dtype=dtype), \
            fd.define_tensor([-1], dtype=dtype)
        xf = fd.ops.cast(x, DataType.Float)
        var, mean = fd.ops.var_mean(xf, [1], correction=0, keepdim=True)
        y = fd.ops.mul(fd.ops.sub(xf, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
        y = fd.ops.add(fd.ops.mul(y, fd.ops.broadcast(fd.ops.cast(w, DataType.Float), [True, False])),
                       fd.ops.broadcast(fd.ops.cast(b, DataType.Float), [True, False]))
        fd.add_output(fd.ops.cast(y, dtype))
    return fd


def _rmsnorm(dtype: DataType) -> FusionDefinition:
    with FusionDefinition() as fd:
        x, w = fd.define_tensor([-1, -1], dtype=dtype), fd.define_tensor([-1], dtype=dtype)
        xf = fd.ops.cast(x, DataType.Float)
        ms = fd.ops.mean(fd.ops.mul(xf, xf), [1], keepdim=True)
        y = fd.ops.mul(fd.ops.mul(xf, fd.ops.rsqrt(fd.ops.add(ms, 1e-6))),
                       fd.ops.broadcast(fd.ops.cast(w, DataType.Float), [True, False]))
        fd.add_output(fd.ops.cast(y, dtype))
    return fd


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cols", [48, 1100])
def test_layernorm_and_rmsnorm(dtype: torch.dtype, cols: int, device: str, run_kernels) -> None:
    x, w, b = (torch.randn(shape, device=device, dtype=dtype) for shape in ((6, cols), (cols,), (cols,)))
    fd = _layernorm(DT[dtype])
    (out,) = run_kernels(fd, [x, w, b])
    _close(out, F.layer_norm(x.float(), (cols,), w.float(), b.float(), 1e-5), dtype)
    assert kernel_schedulers(fd) == ["inner_persistent"]
    fd = _rmsnorm(DT[dtype])
    (out,) = run_kernels(fd, [x, w])
    xf = x.float()
    _close(out, xf * torch.rsqrt((xf * xf).mean(1, keepdim=True) + 1e-6) * w.float(), dtype)
    assert kernel_schedulers(fd) == ["inner_persistent"]


def _group_norm_as_aten_decomposes_it(dtype: DataType) -> FusionDefinition:
    """GroupNorm with one channel a group (wav2vec2's first convolution), as ATen's decomposition
    writes it: the statistics over a ``[N, C, 1, L]`` view (a reduction of a broadcast axis beside
    the row) and the normalization of a second cast of the input through a broadcast of its own."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1], dtype=dtype)
        stats_view = fd.ops.broadcast(fd.ops.cast(x, DataType.Float), [False, False, True, False])
        var, mean = fd.ops.var_mean(stats_view, [2, 3], correction=0)
        flags = [False, False, True, True]
        y = fd.ops.mul(fd.ops.sub(fd.ops.broadcast(fd.ops.cast(x, DataType.Float), [False, False, True, False]),
                                  fd.ops.broadcast(mean, flags)),
                       fd.ops.rsqrt(fd.ops.add(fd.ops.broadcast(var, flags), 1e-5)))
        fd.add_output(fd.ops.cast(y, dtype))
    return fd


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cols", [100, 1500])
def test_group_norm_reads_its_row_as_the_statistics_do(dtype: torch.dtype, cols: int, device: str,
                                                       run_kernels) -> None:
    """The reduced broadcast axis of the statistics' view is merged into the row; the normalization's
    own broadcast maps to nothing there, so the merge is forwarded to the row: the output is written
    in the statistics' loop nest (one tile, or the same steps), not element by element in a loop of
    its own over the whole row."""
    x = torch.randn(3, 5, cols, device=device, dtype=dtype) * 2 + 3
    fd = _group_norm_as_aten_decomposes_it(DT[dtype])
    (out,) = run_kernels(fd, [x])
    xf = x.float().unsqueeze(2)
    ref = (xf - xf.mean((2, 3), keepdim=True)) * torch.rsqrt(xf.var((2, 3), keepdim=True, correction=0) + 1e-5)
    _close(out, ref, dtype)
    assert kernel_schedulers(fd) == ["inner_persistent"]
    (params,) = [s.scheduler_params for s in kernel_segments(fd)]
    body = _kernel_body(fd.last_kernel_code(), "inner_persistent_")
    bounds = re.findall(r"for \w+ in \w*range\((.*)\):", body)
    if params.shape == "tile":
        assert bounds == [], body
    else:  # looped rows: every loop steps through the row in tiles, none visits it element by element
        assert bounds and not any(re.fullmatch(r"ks\d+|\d+", b) for b in bounds), body


def _kernel_body(code: str, part: str) -> str:
    """The source of the first kernel whose name contains ``part`` (up to the next file's imports)."""
    match = re.search(rf"def \w*{re.escape(part)}\w*\(", code)
    assert match is not None, code
    start = match.start()
    return code[start:code.find("\nimport ", start) % (len(code) + 1)]


@pytest.mark.parametrize("cols", [40, 1300])
def test_layernorm_and_rmsnorm_backward(cols: int, device: str, run_kernels, monkeypatch: pytest.MonkeyPatch) -> None:
    """dx per row (inner reductions) and dw, db across rows (outer ones): one inner-outer kernel,
    whose partial results across rows a second launch finishes; dx, dw and db share one pass over
    the rows. Rows too long to stay on chip are split into two launches (``test_wide_inner_outer.py``);
    the kernel that loops over them (where a part of the split has no scheduler) is forced here."""
    monkeypatch.setattr(KernelScheduling, "split_at", lambda self, fusion, bucket: [])
    n = 11
    x = torch.randn(n, cols, device=device, requires_grad=True)
    w, b = torch.randn(cols, device=device, requires_grad=True), torch.randn(cols, device=device, requires_grad=True)
    dy = torch.randn(n, cols, device=device)
    F.layer_norm(x, (cols,), w, b, 1e-5).backward(dy)
    mean = x.detach().mean(1, keepdim=True)
    rstd = torch.rsqrt(x.detach().var(1, keepdim=True, unbiased=False) + 1e-5)
    with FusionDefinition() as fd:
        for out in define_layernorm_backward(fd, dy, x.detach(), mean, rstd, w.detach()):
            fd.add_output(out)
    dx, dw, db = run_kernels(fd, [dy, x.detach(), mean, rstd, w.detach()])
    _close(dx, x.grad)
    _close(dw, w.grad)
    _close(db, b.grad)
    assert kernel_schedulers(fd) == ["inner_outer_persistent"]
    assert "_partial0" in fd.last_kernel_code() and "_final" in fd.last_kernel_code()
    if cols <= 128:  # the row as one tile: one pass over the rows reads each input once
        partial = _kernel_body(fd.last_kernel_code(), "_partial0")
        assert partial.count("for ") == 1 and partial.count("tl.load(T0 ") == 1, partial
        # Each reduction across rows keeps over the row loop a partial per row of the step, added up
        # after the loop, or one row where the rows of a step are added up each step (two sums, each
        # with its compensation); a step of one row has no row axis.
        params = schedule.compute_heuristics(fd.fusion, SchedulerType.inner_outer_persistent,
                                             [dy, x.detach(), mean, rstd, w.detach()])
        kept = re.findall(r"acc\d+ = tl\.full\(\[([^\]]*)\]", partial.split("for ")[0])
        rows = f"{params.rows if params.keep_step_rows else 1}, "
        assert len(kept) == 4, partial
        assert all(shape.startswith(rows) if params.rows > 1 else "," not in shape for shape in kept), partial

    # rmsnorm backward: dx per row and dw across rows
    xd = x.detach().requires_grad_()
    wd = w.detach().requires_grad_()
    rms = torch.rsqrt((xd * xd).mean(1, keepdim=True) + 1e-6)
    (xd * rms * wd).backward(dy)
    r = rms.detach()
    with FusionDefinition() as fd:
        dx, grad_w, _ = define_rmsnorm_backward(fd, dy, x.detach(), r, w.detach())
        fd.add_output(dx)
        fd.add_output(grad_w)
    dx, dw = run_kernels(fd, [dy, x.detach(), r, w.detach()])
    _close(dx, xd.grad)
    _close(dw, wd.grad)
    assert kernel_schedulers(fd) == ["inner_outer_persistent"]


def test_rmsnorm_backward_of_a_batch_of_one_is_one_inner_outer_kernel(device: str, run_kernels) -> None:
    """A Llama layer's RMSNorm backward at batch 1 (the weight gradient summed over batch and rows, the
    batch a size-1 broadcast axis): the batch's reduction is a squeeze, so the per-row and the across-rows
    reductions iterate one space and run as one inner-outer kernel (they were three kernels)."""
    rows, cols = 6, 40
    x, dy = torch.randn(1, rows, cols, device=device), torch.randn(1, rows, cols, device=device)
    w = torch.randn(cols, device=device)
    xd, wd = x.clone().requires_grad_(), w.clone().requires_grad_()
    rms = torch.rsqrt((xd * xd).mean(-1, keepdim=True) + 1e-6)
    (xd * rms * wd).backward(dy)
    r = rms.detach()
    with FusionDefinition() as fd:
        tdy, tx, tr, tw = (fd.from_pytorch(t) for t in (dy, x, r, w))
        g = fd.ops.mul(tdy, fd.ops.broadcast(tw, [True, True, False]))
        c = fd.ops.sum(fd.ops.mul(g, tx), [2], keepdim=True)
        r3 = fd.ops.mul(fd.ops.mul(tr, tr), tr)
        fd.add_output(fd.ops.sub(fd.ops.mul(g, tr), fd.ops.mul(tx, fd.ops.mul(r3, fd.ops.div(c, float(cols))))))
        fd.add_output(fd.ops.sum(fd.ops.mul(tdy, fd.ops.mul(tx, tr)), [0, 1]))
    dx, dw = run_kernels(fd, [dy, x, r, w])
    _close(dx, xd.grad)
    _close(dw, wd.grad)
    assert kernel_schedulers(fd) == ["inner_outer_persistent"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_channels_last_layernorm_backward_into_a_channel_scale(dtype: torch.dtype, device: str, run_kernels) -> None:
    """ConvNeXt's training step: a channel scale ``v = u * s`` before a layer norm over the channels of a
    channels-last activation; the backward's per-row ``rstd`` (a size-1 channel axis) is the first
    value the scale's gradient ``ds = sum(dv * u)`` reads. The partial launch's loop nest must iterate
    the channels: a per-row tensor of as many loop axes, whose channel axis is a broadcast, has no
    such loop (its kernel failed to build, and the region fell back to ATen calls)."""
    n, h, w_, c = 3, 5, 7, 24
    u = torch.randn(n, c, h, w_, device=device).to(dtype).permute(0, 2, 3, 1)  # channels-last, non-contiguous
    s = torch.randn(c, device=device).to(dtype)
    w = torch.randn(c, device=device).to(dtype)
    dy = torch.randn(n, h, w_, c, device=device).to(dtype)
    ud, sd = u.float().requires_grad_(), s.float().requires_grad_()
    v = ud * sd
    F.layer_norm(v, (c,), w.float(), None, 1e-6).backward(dy.float())
    vf = v.detach()
    rstd = torch.rsqrt(vf.var(-1, keepdim=True, unbiased=False) + 1e-6)
    vhat = ((vf - vf.mean(-1, keepdim=True)) * rstd).to(dtype)
    inputs = [rstd, dy, vhat, w, u, s]
    with FusionDefinition() as fd:
        tr, tdy, tvhat, tw, tu, ts = (fd.from_pytorch(t) for t in inputs)
        g = fd.ops.mul(fd.ops.cast(tdy, DataType.Float), fd.ops.broadcast(tw, [True, True, True, False]))
        a = fd.ops.sum(g, [3], keepdim=True)
        cg = fd.ops.sum(fd.ops.mul(g, tvhat), [3], keepdim=True)
        dv = fd.ops.mul(tr, fd.ops.sub(fd.ops.sub(g, fd.ops.div(a, float(c))),
                                       fd.ops.mul(tvhat, fd.ops.div(cg, float(c)))))
        fd.add_output(fd.ops.cast(fd.ops.mul(dv, fd.ops.broadcast(ts, [True, True, True, False])), DT[dtype]))
        fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.mul(dv, tu), [0, 1, 2]), DT[dtype]))
    du, ds = run_kernels(fd, inputs)
    assert kernel_schedulers(fd) == ["inner_outer_persistent"]
    _close(du, ud.grad, dtype)
    _close(ds, sd.grad, dtype)


@pytest.mark.parametrize(("rows_per_step", "keep_step_rows"), [(1, False), (2, False), (2, True), (8, True)])
def test_pipelined_inner_outer_kernel_masks_rows_past_the_end(rows_per_step: int, keep_step_rows: bool,
                                                              device: str) -> None:
    """A software-pipelined row loop (``num_stages`` > 1, compiled) has no ``if`` in its body (Triton
    does not pipeline a loop that branches): a row past the end of a program's block is masked
    instead, in its loads, its sums and its stores. 11 rows over 3 programs: the last block ends
    early; with 8 rows a step each block is one step, partly past its end (the partials kept per
    row of a step add zeros there)."""
    cols, n = 40, 11
    x, dy = torch.randn(n, cols, device=device), torch.randn(n, cols, device=device)
    w = torch.randn(cols, device=device)
    inputs = [dy, x, w]
    with FusionDefinition() as fd:
        tdy, tx, tw = (fd.from_pytorch(t) for t in inputs)
        g = fd.ops.mul(tdy, fd.ops.broadcast(tw, [True, False]))
        c = fd.ops.sum(fd.ops.mul(g, tx), [1], keepdim=True)
        fd.add_output(fd.ops.sub(g, fd.ops.mul(tx, c)))
        fd.add_output(fd.ops.sum(fd.ops.mul(tdy, tx), [0]))
        params = schedule.compute_heuristics(fd.fusion, SchedulerType.inner_outer_persistent, inputs)
        params = dataclasses.replace(params, rows=rows_per_step, split=3, num_stages=3, keep_step_rows=keep_step_rows)
        schedule.schedule(fd.fusion, SchedulerType.inner_outer_persistent, params)
    dx, dw = fd.manual_execute(inputs, params)
    g_ref = dy * w
    _close(dx, g_ref - x * (g_ref * x).sum(1, keepdim=True))
    _close(dw, (dy * x).sum(0))
    if device == "cuda":  # Triton's interpreter neither pipelines nor takes a scalar & block mask
        partial = _kernel_body(fd.last_kernel_code(), "_partial0")
        assert re.search(r"num_stages=\(?3\b", partial) and "if " not in partial, partial  # 3 but for 4-byte rows


@pytest.mark.parametrize("rows", [30, 700])
def test_outer_normalization(rows: int, device: str, run_kernels) -> None:
    """Batchnorm-like: statistics over the rows (outer in memory), read back on every row."""
    x = torch.randn(rows, 24, device=device)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        var, mean = fd.ops.var_mean(t, [0], correction=0, keepdim=True)
        fd.add_output(fd.ops.mul(fd.ops.sub(t, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5))))
    (out,) = run_kernels(fd, [x])
    _close(out, (x - x.mean(0)) * torch.rsqrt(x.var(0, unbiased=False) + 1e-5))
    assert kernel_schedulers(fd) == ["outer_persistent"]


def test_outer_normalization_gives_every_sm_programs() -> None:
    """A normalization over channels stored outermost (a layer norm of a transposed activation, as
    Whisper's encoder has) cannot split its reduced axis, so its column blocks narrow (to 64-byte row
    segments at least) until the programs fill the SMs twice over."""
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        tf = fd.ops.cast(t, DataType.Float)
        var, mean = fd.ops.var_mean(tf, [0], correction=0, keepdim=True)
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.sub(tf, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5))),
                                  DataType.BFloat16))
    machine = Machine(132, 16384, 2048)
    for channels, columns in ((1024, 12000), (768, 3000), (64, 1 << 20), (1024, 100)):
        params = outer_persistent.compute_heuristics(fd.fusion, SizeHints(reduced=channels, kept=columns,
                                                                          machine=machine))
        programs = -(-columns // params.tile)
        assert params.tile >= 32, (channels, columns, params)  # 64-byte segments of bf16
        assert programs >= 2 * machine.sm_count or params.tile == 32, (channels, columns, params)
        wider = -(-columns // (2 * params.tile))  # programs of twice the columns: too few, or the widest tile
        assert params.tile == 256 or wider < 2 * machine.sm_count, (channels, columns, params)


def _batch_norm_backward(dtype: DataType) -> FusionDefinition:
    """The input's gradient of a training batch norm over channels-last [N, H, W, C] activations flattened
    to [N*H*W, C], as torch's decomposition writes it: two sums per channel over the rows, read back
    (the last input: 1 / rows)."""
    with FusionDefinition() as fd:
        dy = fd.ops.cast(fd.define_tensor([-1, -1], dtype=dtype), DataType.Float)
        x = fd.ops.cast(fd.define_tensor([-1, -1], dtype=dtype), DataType.Float)
        mean = fd.define_tensor([-1])
        rstd = fd.define_tensor([-1])
        centered = fd.ops.sub(x, fd.ops.broadcast(mean, [True, False]))
        sum_dy = fd.ops.sum(dy, [0], keepdim=True)
        dot = fd.ops.sum(fd.ops.mul(dy, centered), [0], keepdim=True)
        inv_rows = fd.define_scalar(dtype=DataType.Float)
        r = fd.ops.broadcast(rstd, [True, False])
        proj = fd.ops.mul(fd.ops.mul(dot, fd.ops.mul(r, r)), inv_rows)
        dx = fd.ops.sub(fd.ops.sub(dy, fd.ops.mul(sum_dy, inv_rows)), fd.ops.mul(centered, proj))
        fd.add_output(fd.ops.cast(fd.ops.mul(dx, r), dtype))
    return fd


def test_outer_normalization_of_few_columns_splits_its_rows_across_programs() -> None:
    """A normalization over many rows of few channels (a batch norm's backward over channels-last
    activations: N*H*W rows, C columns) would run on C / block programs, each looping over every row
    more than once (0.97 ms against Inductor's 0.15 for 32 x 256 x 56 x 56 bf16 on an H100): its sums
    split across programs like a reduction's, each program's share of the rows read again by the final
    launch. var_mean, whose partial results are not finished across programs, keeps one program a block."""
    machine = Machine(132, 16384, 2048)
    fd = _batch_norm_backward(DataType.BFloat16)
    for rows, channels, split in [(32 * 56 * 56, 256, True), (32 * 7 * 7, 2048, True), (100352, 64, True),
                                  (64, 256, False)]:  # the last: rows on chip, one program per block
        params = outer_persistent.compute_heuristics(fd.fusion, SizeHints(reduced=rows, kept=channels, machine=machine))
        programs = -(-channels // params.tile) * params.split
        assert (params.split > 1) == split, (rows, channels, params)
        assert not split or programs >= machine.sm_count, (rows, channels, params)
    with FusionDefinition() as stats:
        t = stats.define_tensor([-1, -1])
        var, mean = stats.ops.var_mean(t, [0], correction=0, keepdim=True)
        stats.add_output(stats.ops.mul(stats.ops.sub(t, mean), stats.ops.rsqrt(stats.ops.add(var, 1e-5))))
    params = outer_persistent.compute_heuristics(stats.fusion, SizeHints(reduced=100352, kept=256, machine=machine))
    assert params.split == 1, params


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_outer_normalization_against_torch(dtype: torch.dtype, device: str, run_kernels,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The split batch-norm backward (rows past the interpreter's persistent tile, 5 channels: split on
    any machine) equals torch's, the rows a non-multiple of every block, the input a transposed view."""
    _many_sms(monkeypatch, device)
    torch.manual_seed(0)
    rows, channels = 3001, 5
    dy = torch.randn(rows, channels, device=device, dtype=dtype)
    x = torch.randn(channels, rows, device=device, dtype=dtype).t()
    mean, rstd = x.float().mean(0), torch.rsqrt(x.float().var(0, unbiased=False) + 1e-5)
    fd = _batch_norm_backward(DT[dtype])
    (dx,) = run_kernels(fd, [dy, x, mean, rstd, 1.0 / rows])
    xc, dyf = x.double() - mean.double(), dy.double()
    want = (dyf - dyf.mean(0) - xc * (dyf * xc).mean(0) * rstd.double() ** 2) * rstd.double()
    _close(dx, want, dtype)
    assert kernel_schedulers(fd) == ["outer_persistent"]
    if device == "cpu":
        assert kernel_segments(fd)[0].scheduler_params.split > 1


def _softmax_of_rows_outermost(dtype: torch.dtype, log: bool) -> FusionDefinition:
    """(Log-)softmax over the last axis of a ``[cols, rows]`` tensor given transposed (``rows`` outermost
    in memory: the kernel benchmark's permuted softmax)."""
    with FusionDefinition() as fd:
        x = fd.ops.cast(fd.define_tensor([-1, -1], dtype=DT[dtype], stride_order=[0, 1]), DataType.Float)
        shifted = fd.ops.sub(x, fd.ops.max(x, [1], keepdim=True))
        total = fd.ops.sum(fd.ops.exp(shifted), [1], keepdim=True)
        out = fd.ops.sub(shifted, fd.ops.log(total)) if log else fd.ops.div(fd.ops.exp(shifted), total)
        fd.add_output(fd.ops.cast(out, DT[dtype]))
    return fd


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("split", [3, 40])
def test_partials_of_a_split_normalization_are_laid_out_programs_outermost(dtype: torch.dtype, log: bool,
                                                                          split: int, device: str) -> None:
    """A softmax over rows outermost in memory, split across ``split`` programs per column block: its final
    step keeps the split (each program reads its share of the rows again) and reads every partial max and
    sum of its columns in a loop, a row of partials an iteration. The partials are laid out with the
    programs' axis outermost (``[programs, columns]``, though their logical order is ``[columns,
    programs]``), so each such row is contiguous; equal to torch, the rows a non-multiple of every block."""
    torch.manual_seed(0)
    x = (torch.randn(4001, 7, device=device, dtype=dtype) * 4).t()
    fd = _softmax_of_rows_outermost(dtype, log)
    with fd:
        params = schedule.compute_heuristics(fd.fusion, SchedulerType.outer_persistent, [x])
        params = dataclasses.replace(params, split=split, online=False)
        schedule.schedule(fd.fusion, SchedulerType.outer_persistent, params)
    fusion = fd.fusion.clone()  # the launches are cut from a copy: manual_execute compiles the definition's
    reference = next(t for t in fusion.tensors() if t.name == params.reference)
    layouts = {t.name: Layout.dense([1, 0], [False, False]) for t in (*fusion.inputs(), *fusion.outputs())}
    launches = build_sources(split_at_grid_reductions(fusion, reference), "k", "cpu", layouts)
    assert len(launches) == 3  # the partial maxima; the partial sums; the output
    for part, source in launches[:2]:
        (partial,) = part.fusion.outputs()
        assert [i.extent.value for i in partial.get_logical_domain(no_reductions=True)][1] == split
        assert source.output_perms == ((1, 0),), source.output_perms
    (out,) = fd.manual_execute([x], params)
    want = (torch.log_softmax if log else torch.softmax)(x.double(), 1)
    _close(out, want.to(dtype), dtype)


def test_nchw_batch_norm_backward_split_across_programs_against_float64(device: str, run_kernels,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A training batch norm's backward over NCHW activations (torch's decomposition: each channel a row
    of N blocks of H*W, fewer rows than SMs, so the sums split across programs on a GPU of the real
    size, and on the interpreter's machine given 132 SMs): the input's, weight's and bias's gradients
    against float64, within a few times ATen's own error. (On one H100 the weight's gradient of
    32x64x112x112 bf16 differed from ATen's by more than 2e-3 of its scale; on the CPU, with the H100's
    schedule, it is within 1e-7.)"""
    _many_sms(monkeypatch, device)
    torch.manual_seed(0)
    n, c, h, w = (8, 64, 56, 56) if device == "cuda" else (3, 5, 33, 47)
    x = torch.randn(n, c, h, w, device=device, dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    weight = torch.randn(c, device=device)
    var, mean = torch.var_mean(x.float(), dim=(0, 2, 3), correction=0)
    rstd = torch.rsqrt(var + 1e-5)
    with FusionDefinition() as fd:
        tdy, tx, tmean, trstd, tw = (fd.from_pytorch(t) for t in (dy, x, mean, rstd, weight))
        flags = [True, False, True, True]
        dyf, xf = fd.ops.cast(tdy, DataType.Float), fd.ops.cast(tx, DataType.Float)
        centered = fd.ops.sub(xf, fd.ops.broadcast(tmean, flags))
        sum_dy = fd.ops.sum(dyf, [0, 2, 3])
        dot = fd.ops.sum(fd.ops.mul(dyf, centered), [0, 2, 3])
        inv = 1.0 / (n * h * w)
        proj = fd.ops.mul(fd.ops.mul(dot, fd.ops.mul(trstd, trstd)), inv)
        dx = fd.ops.sub(fd.ops.sub(dyf, fd.ops.broadcast(fd.ops.mul(sum_dy, inv), flags)),
                        fd.ops.mul(centered, fd.ops.broadcast(proj, flags)))
        fd.add_output(fd.ops.cast(fd.ops.mul(dx, fd.ops.broadcast(fd.ops.mul(trstd, tw), flags)), DataType.BFloat16))
        fd.add_output(fd.ops.mul(dot, trstd))
        fd.add_output(sum_dy)
    got = run_kernels(fd, [dy, x, mean, rstd, weight])
    aten = torch.ops.aten.native_batch_norm_backward(dy, x, weight, None, None, mean, rstd, True, 1e-5,
                                                     [True, True, True])
    xc, dyd = x.double() - mean.double()[None, :, None, None], dy.double()
    rows = (0, 2, 3)
    r = rstd.double()[None, :, None, None]
    exact_dx = (dyd - dyd.mean(rows, keepdim=True) - xc * (dyd * xc).mean(rows, keepdim=True) * r * r) * r * \
        weight.double()[None, :, None, None]
    exact = [exact_dx, (dyd * xc).sum(rows) * rstd.double(), dyd.sum(rows)]
    for k, (g, a, e) in enumerate(zip(got, aten, exact, strict=True)):
        error = (g.double() - e).abs().max().item()
        reference = (a.double() - e).abs().max().item()
        assert error <= 4 * reference + 1e-6 * e.abs().max().item(), (k, error, reference)
    if device == "cpu":
        assert [s.scheduler_params.shape for s in kernel_segments(fd)] == ["split"], kernel_segments(fd)


def _seed003() -> FusionDefinition:
    """Seed 003's fusion: T0 [1, N, M] with allocation (iS1, bS0, iS2), contiguity t n t."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([1, -1, -1], contiguity=[True, None, True], stride_order=[1, 2, 0])
        t2 = fd.ops.sum(fd.ops.squeeze(t0, [0]), [1])
        t4 = fd.ops.add(t0, fd.ops.broadcast(t2, [True, False, True]))
        fd.add_output(t4)
        fd.add_output(fd.ops.sum(fd.ops.squeeze(t4, [0]), [0]))
    return fd


@pytest.mark.parametrize("cols", [50, 1200])
def test_seed_003_runs_in_the_inner_outer_persistent_kernel(cols: int, device: str, run_kernels,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(KernelScheduling, "split_at", lambda self, fusion, bucket: [])  # rows looped on CPU too
    fd = _seed003()
    x = torch.randn(37, 1, cols, device=device).permute(1, 0, 2)
    t4, t6 = run_kernels(fd, [x])
    ref4 = x + x.sum(2, keepdim=True)
    _close(t4, ref4)
    _close(t6, ref4[0].sum(0))
    assert kernel_schedulers(fd) == ["inner_outer_persistent"]
    ir = fd.last_scheduled_fusion_ir()
    # The input's cache: on chip, its allocation derived from its loop (split, blockIdx), not the
    # input's (iS1, bS0, iS2) copied over (the seed's bug).
    cache = next(block for block in ir.split("\nT") if "= Set(" not in block and "cache" not in block
                 and block.startswith("7_l_float"))
    allocation = next(line for line in cache.splitlines() if "allocation domain" in line)
    assert "iblockIdx.x" in allocation, cache
    assert "reduction( T" in ir and "rfactor" in ir


@pytest.mark.parametrize("sm_count", [4, 132])
def test_inner_outer_programs_all_have_rows(sm_count: int) -> None:
    """As few programs as keep each block of rows as short as one program per SM makes it: 4096 rows
    on 132 SMs are 128 blocks of 32, not 132 programs of which four have no row."""
    fd = _seed003()
    for rows in [1, 3, 5, 100, 128, 132, 133, 1000, 4096, 16384]:
        hints = SizeHints(reduced=4096, kept=rows, machine=Machine(sm_count, 16384, 2048))
        programs = inner_outer_persistent.compute_heuristics(fd.fusion, hints).split
        block = -(-rows // programs)
        assert block == -(-rows // min(sm_count, rows)), (rows, programs)
        assert (programs - 1) * block < rows, (rows, programs)  # the last program has rows


def test_narrow_rows_step_many_rows_and_keep_a_partial_per_row_of_the_step() -> None:
    """Rows up to 512 wide (a channels-last layer norm's channels), fewer than a block of 64 an SM: one
    program an SM, 16 elements a thread, many rows a step, and each reduction across rows keeps a partial
    per row of the step over the loop (no reduction across warps each step), never more rows a step than a
    program's block has; wider rows add up each step's rows."""
    fd = _seed003()
    h100 = Machine(132, 16384, 2048)
    for width, rows_per_step, warps in [(64, 64, 8), (96, 32, 8), (128, 32, 8), (192, 8, 4), (384, 4, 4), (512, 4, 4)]:
        params = inner_outer_persistent.compute_heuristics(fd.fusion, SizeHints(width, 8192, h100))
        assert (params.rows, params.num_warps, params.keep_step_rows) == (rows_per_step, warps, True), width
        assert params.split == 131, width  # blocks of 63 rows, one an SM (the last SM without one)
    # rows of 64 keep that rule with many rows too
    params = inner_outer_persistent.compute_heuristics(fd.fusion, SizeHints(64, 100352, h100))
    assert (params.rows, params.num_warps, params.split) == (64, 8, 132)
    for rows, rows_per_step in [(1000, 8), (132, 1), (300, 4)]:  # blocks of 8, 1 and 3 rows
        params = inner_outer_persistent.compute_heuristics(fd.fusion, SizeHints(96, rows, h100))
        assert (params.rows, params.keep_step_rows) == (rows_per_step, rows_per_step > 1), rows
    wide = inner_outer_persistent.compute_heuristics(fd.fusion, SizeHints(1024, 8192, h100))
    assert not wide.keep_step_rows and wide.rows == 4


def test_many_narrow_rows_take_small_programs_of_64_rows() -> None:
    """Many rows of 65-512 elements (``inner_outer_persistent.ManyRows``): a program a block of 64 rows,
    steps of 512 elements (1024 for rows over 128) on as many warps as give each lane 16 of them, or 4
    where rows load narrower than 16 bytes (``narrow_warps``: rows of odd length); each step's rows kept as
    partials from rows of 256 (the runtime sizes by buckets of at most 65536 rows: blocks of 128 past them)."""
    fd = _seed003()
    h100 = Machine(132, 16384, 2048)
    for width, rows_per_step, warps, narrow, keep in [(96, 4, 1, 4, False), (128, 4, 1, 4, False),
                                                      (192, 4, 2, 8, True), (384, 2, 2, 8, True),
                                                      (512, 2, 2, 8, True)]:
        for rows in (8448, 16384, 131072):
            params = inner_outer_persistent.compute_heuristics(fd.fusion, SizeHints(width, rows, h100))
            assert (params.rows, params.num_warps, params.narrow_warps, params.keep_step_rows) == \
                (rows_per_step, warps, narrow, keep), (width, rows)
            assert params.split == -(-rows // 64), (width, rows)
    # fewer rows than a block of 64 an SM: one program an SM
    assert inner_outer_persistent.compute_heuristics(fd.fusion, SizeHints(128, 8192, h100)).split == 131


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("cols", [127, 200, 512])
def test_many_narrow_rows_in_blocks_of_64_against_torch(cols: int, dtype: torch.dtype, device: str, run_kernels,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Layer-norm backward over many narrow rows on a machine of 4 SMs (1000 rows: blocks of 64, the last
    one short), rows of odd length loading narrower than 16 bytes: dx, dw and db against torch's."""
    monkeypatch.setattr(Machine, "of", staticmethod(lambda _device: Machine(4, 16384, 2048)))
    n = 1000
    x, w, b = (torch.randn(*shape, device=device, dtype=dtype) for shape in ((n, cols), (cols,), (cols,)))
    dy = torch.randn(n, cols, device=device, dtype=dtype)
    xf, wf, bf = (t.float().requires_grad_() for t in (x, w, b))  # the reference in float32 from the same values
    F.layer_norm(xf, (cols,), wf, bf, 1e-5).backward(dy.float())
    mean = xf.detach().mean(1, keepdim=True)
    rstd = torch.rsqrt(xf.detach().var(1, keepdim=True, unbiased=False) + 1e-5)
    with FusionDefinition() as fd:
        for out in define_layernorm_backward(fd, dy, x, mean, rstd, w):
            fd.add_output(out)
    dx, dw, db = run_kernels(fd, [dy, x, mean, rstd, w])
    params = schedule.compute_heuristics(fd.fusion, SchedulerType.inner_outer_persistent, [dy, x, mean, rstd, w])
    assert (params.split, params.rows) == (16, max(1, (512 if cols <= 128 else 1024) // next_power_of_2(cols)))
    torch.testing.assert_close(dx, xf.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dw, wf.grad, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(db, bf.grad, rtol=1e-4, atol=1e-3)
    assert kernel_schedulers(fd) == ["inner_outer_persistent"]


def test_rows_share_smaller_programs_in_normalizations_than_in_reductions() -> None:
    """Rows shorter than a persistent tile share a program: 1024 elements on 2 warps for a
    normalization (its loads overlap other programs' reductions), 2048 for a plain reduction."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sub(x, fd.ops.sum(x, [1], keepdim=True)))
    with FusionDefinition() as plain:
        plain.add_output(plain.ops.sum(plain.define_tensor([-1, -1]), [1]))
    for width in (256, 512, 1024, 2048, 8192):
        hints = SizeHints(reduced=width, kept=1 << 20, machine=Machine(132, 16384, 2048))
        norm = inner_persistent.compute_heuristics(fd.fusion, hints)
        assert (norm.rows * width, norm.num_warps) == (max(width, 1024), max(2, width // 1024)), width
        assert reduction.compute_heuristics(plain.fusion, hints).rows * width == max(width, PLAIN_ROWS_TILE), width


def _centered_rows(fd: FusionDefinition, x: Any) -> None:
    """bf16 rows minus their sums (in float32)."""
    xf = fd.ops.cast(x, DataType.Float)
    fd.add_output(fd.ops.cast(fd.ops.sub(xf, fd.ops.sum(xf, [1], keepdim=True)), DataType.BFloat16))


def test_normalizations_keep_their_rows_in_l2_and_the_kernel_follows_the_hint(device: str) -> None:
    """The inner persistent scheduler keeps its rows' lines in L2 (``L2Hint.keep``, ``evict_last``), rows on
    chip and looped, below 32 MiB, and from there too but for the last pass over a looped row
    (``L2Hint.keep_until_last``); the kernel's loads follow the parameter, and the results do not depend on
    it."""
    with FusionDefinition() as fd:
        _centered_rows(fd, fd.define_tensor([-1, -1], dtype=DataType.BFloat16))
    machine = Machine(132, 16384, 2048)
    for rows, reduced, hint in ((1024, 1024, L2Hint.keep), (8192, 1024, L2Hint.keep),
                                (131072, 1024, L2Hint.keep_until_last), (64, 262144, L2Hint.keep_until_last)):
        hints = SizeHints(reduced=reduced, kept=rows, machine=machine)
        assert inner_persistent.compute_heuristics(fd.fusion, hints).l2 is hint, (rows, reduced)
    data = torch.randn(6, 40, device=device, dtype=torch.bfloat16)
    ref = (data.float() - data.float().sum(1, keepdim=True)).bfloat16()
    for hinted in (False, True):
        params = dataclasses.replace(schedule.compute_heuristics(fd.fusion, SchedulerType.inner_persistent, [data]),
                                     l2=L2Hint.keep if hinted else L2Hint.none)
        with FusionDefinition() as run:
            _centered_rows(run, run.from_pytorch(data))
            schedule.schedule(run.fusion, SchedulerType.inner_persistent, params)
        (out,) = run.manual_execute([data], params)
        _close(out, ref, torch.bfloat16)
        kernel = _kernel_body(run.last_kernel_code(), "manual_kernel")
        assert ("evict_last" in kernel) is hinted, kernel
