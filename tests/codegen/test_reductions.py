"""Reductions as generated kernels, against torch: every op and dtype, several and all axes, keepdim,
inner and outer layouts, permuted / sliced / expanded inputs, empty and size-1 axes, long rows
(looped) and few long rows (split across programs: a grid reduction in two launches)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from pyfuser import DataType, FusionDefinition, schedule
from pyfuser.codegen.values import L2Hint
from pyfuser.scheduler import inner_persistent, reduction, reduction_schedule
from pyfuser.scheduler.registry import Machine, SchedulerType, SizeHints
from tests.codegen.conftest import kernel_schedulers, kernel_segments

DTYPES = {torch.float32: DataType.Float, torch.float16: DataType.Half, torch.bfloat16: DataType.BFloat16,
          torch.int32: DataType.Int32, torch.int64: DataType.Int}
TORCH = {"sum": torch.sum, "prod": torch.prod, "mean": torch.mean,
         "max": lambda x, d, keepdim=False: torch.amax(x, d, keepdim=keepdim),
         "min": lambda x, d, keepdim=False: torch.amin(x, d, keepdim=keepdim)}


def _data(shape: tuple[int, ...], dtype: torch.dtype, device: str, op: str = "sum") -> torch.Tensor:
    if dtype.is_floating_point:
        x = torch.randn(shape, device=device)
        return (1 + 0.01 * x if op == "prod" else x).to(dtype)
    high = 3 if op == "prod" else 50
    return torch.randint(-high, high, shape, device=device, dtype=dtype)


def _reduce(op: str, shape: tuple[int, ...], dims: list[int], keepdim: bool, dtype: torch.dtype,
            device: str, run_kernels, x: torch.Tensor | None = None) -> tuple[FusionDefinition, torch.Tensor]:
    x = _data(shape, dtype, device, op) if x is None else x
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(getattr(fd.ops, op)(t, dims, keepdim=keepdim))
    (out,) = run_kernels(fd, [x])
    if op == "prod":  # torch.prod takes one dim
        ref = x.float() if dtype.is_floating_point else x
        for d in sorted(dims, reverse=True):
            ref = torch.prod(ref, d, keepdim=keepdim)
    else:
        ref = TORCH[op](x, dims, keepdim=keepdim)
    tol = {torch.float16: 2e-2, torch.bfloat16: 5e-2}.get(dtype, 1e-4)
    torch.testing.assert_close(out.float() if dtype.is_floating_point else out, ref.to(out.dtype).float()
                               if dtype.is_floating_point else ref.to(out.dtype), rtol=tol, atol=tol)
    return fd, x


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "mean"])
def test_every_reduction_op_and_dtype(op: str, dtype: torch.dtype, device: str, run_kernels) -> None:
    if op == "mean" and not dtype.is_floating_point:
        pytest.skip("torch.mean takes floating tensors only")
    for dims, keepdim in (([1], False), ([0], True)):
        fd, _ = _reduce(op, (6, 37), dims, keepdim, dtype, device, run_kernels)
        assert kernel_schedulers(fd) == ["reduction"]


@pytest.mark.parametrize(("shape", "dims"), [((3, 4, 5), [0, 2]), ((3, 4, 5), [1]), ((3, 4, 5), [0, 1, 2]),
                                             ((7, 1, 9), [1, 2]), ((1, 9), [0, 1]), ((2, 3, 4, 5), [1, 3])])
def test_several_and_all_axes(shape: tuple[int, ...], dims: list[int], device: str, run_kernels) -> None:
    """A size-1 axis among the reduced ones is squeezed; reducing only such axes is a squeeze, no
    kernel (tests/ir/ops/test_ops_reduction.py)."""
    for op in ("sum", "max"):
        _reduce(op, shape, dims, False, torch.float32, device, run_kernels)
        _reduce(op, shape, dims, True, torch.float32, device, run_kernels)


def test_inner_and_outer_layouts(device: str, run_kernels) -> None:
    """A column-major input makes ``sum(dim=1)`` an outer reduction; sliced and expanded inputs."""
    base = torch.randn(40, 9, device=device)
    for x in (base, base.t().contiguous().t(), base[::2, 1:], base[:, :1].expand(40, 9),
              torch.randn(9, 40, device=device).permute(1, 0)):
        for dim in (0, 1):
            _reduce("sum", tuple(x.shape), [dim], False, torch.float32, device, run_kernels, x=x)


def test_empty_and_size_one_axes(device: str, run_kernels) -> None:
    for shape, dims in (((0, 5), [1]), ((5, 0), [1]), ((5, 0), [0]), ((1, 1), [0, 1]), ((4, 1), [1])):
        x = torch.randn(shape, device=device)
        with FusionDefinition() as fd:
            fd.add_output(fd.ops.sum(fd.from_pytorch(x), dims))
        (out,) = fd.execute([x], _enable_options=["triton_interpreter"] if device == "cpu" else [])
        torch.testing.assert_close(out, x.sum(dims))


def test_long_rows_loop_and_few_rows_split(device: str, run_kernels) -> None:
    """The interpreter's machine model holds rows of up to 1024 elements in one tile: 3000 loops;
    two such rows keep too few programs busy and are split across programs (two launches)."""
    cases = {((40, 3000), 1): ("loop", 1), ((2, 10000), 1): ("split", 4), ((10000, 2), 1): ("tile", 1),
             ((3, 9000), 1): ("split", 2), ((10000, 2), 0): ("outer", 8), ((40, 3000), 0): ("outer", 1)}
    for (shape, dim), (kind, split) in cases.items():
        x = torch.randn(shape, device=device)
        fd, _ = _reduce("sum", shape, [dim], False, torch.float32, device, run_kernels, x=x)
        params = kernel_segments(fd)[0].scheduler_params
        if device == "cpu":
            assert (params.shape, params.split) == (kind, split), params
    x = torch.randn(20000, device=device)
    fd, _ = _reduce("sum", (20000,), [0], False, torch.float32, device, run_kernels, x=x)
    if device == "cpu":
        assert kernel_segments(fd)[0].scheduler_params.shape == "split"
        assert "_partial0" in fd.last_kernel_code() and "_final" in fd.last_kernel_code()


def test_column_blocks_of_16_bit_data_step_by_their_float32_accumulators_on_enough_programs() -> None:
    """A column reduction's block is 128 columns of any width; its loop step holds 2048 float32
    accumulators where the launch has two programs an SM or more (16 rows a step, bfloat16 or float32
    data), else 8 KiB of the data it reads (fewer programs keep more loads in flight each), and 16 KiB
    where narrowing the blocks gave fewer than two programs an SM (bfloat16 64-column blocks of 2048 x
    16384, 256 programs: 128 rows a step)."""
    h200 = Machine(132, 16384, 2048)
    cases = {(DataType.BFloat16, 65536, 1000): (128, 16), (DataType.Float, 65536, 1000): (128, 16),
             (DataType.BFloat16, 2048, 16384): (64, 128)}
    for (dtype, rows, columns), (tile, step) in cases.items():
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1], dtype=dtype, contiguity=True)
            fd.add_output(fd.ops.max(fd.ops.cast(x, DataType.Float), [0]))
        params = reduction.compute_heuristics(fd.fusion, SizeHints(rows, columns, h200))
        assert (params.shape, params.tile, params.tile_reduced) == ("outer", tile, step), params


@pytest.mark.parametrize("dtype", [DataType.BFloat16, DataType.Float])
def test_few_rows_of_a_column_reduction_are_one_tile_unless_it_also_writes_its_input_shape(dtype: DataType) -> None:
    """Column sums of 33 rows take the rows in one tile (no loop, no loop compensation) where every
    output is reduced; a segment that also writes an output of the input's shape (a norm backward's
    ``dx`` beside its column sums) loops over the rows."""
    h200 = Machine(132, 16384, 2048)
    for full_size in (False, True):
        with FusionDefinition() as fd:
            x = fd.ops.cast(fd.define_tensor([-1, -1], dtype=dtype, contiguity=True), DataType.Float)
            fd.add_output(fd.ops.sum(x, [0]))
            if full_size:
                fd.add_output(fd.ops.mul(x, 2.0))
        params = reduction.compute_heuristics(fd.fusion, SizeHints(64, 65536, h200))
        assert params.shape == "outer" and (params.tile_reduced > 0) == full_size, params


def test_prologue_and_epilogue_share_the_reduction_kernel(device: str, run_kernels) -> None:
    x, y = torch.randn(8, 33, device=device), torch.randn(8, 33, device=device)
    with FusionDefinition() as fd:
        tx, ty = fd.from_pytorch(x), fd.from_pytorch(y)
        s = fd.ops.sum(fd.ops.add(fd.ops.mul(tx, ty), 1.0), [1])
        fd.add_output(fd.ops.mul(fd.ops.exp(s), 2.0))
        fd.add_output(fd.ops.mul(tx, ty))
    out, prod = run_kernels(fd, [x, y])
    torch.testing.assert_close(out, torch.exp((x * y + 1).sum(1)) * 2, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(prod, x * y)
    assert kernel_schedulers(fd) == ["reduction"]


def test_half_precision_accumulates_in_float(device: str, run_kernels) -> None:
    x = torch.full((4, 4096), 1.0, device=device, dtype=torch.float16) + 1e-3
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.sum(fd.ops.cast(fd.from_pytorch(x), DataType.Float), [1]))
    (out,) = run_kernels(fd, [x])
    torch.testing.assert_close(out, x.float().sum(1))


def test_welford_var_mean_with_a_large_mean(device: str, run_kernels) -> None:
    """var_mean is one-pass Welford in float32: exact enough on fp16 data offset by 1e4, where the
    naive E[x^2] - E[x]^2 in fp16 is off by far more than the variance itself."""
    x = (1e4 + 4 * torch.randn(16, 2000, device=device)).to(torch.float16)
    with FusionDefinition() as fd:
        var, mean = fd.ops.var_mean(fd.from_pytorch(x), [1], correction=1)
        fd.add_output(var)
        fd.add_output(mean)
    var, mean = run_kernels(fd, [x])
    ref_var, ref_mean = torch.var_mean(x.double(), 1, correction=1)
    torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-3, atol=1e-2)
    torch.testing.assert_close(var.double(), ref_var, rtol=2e-2, atol=0.5)
    naive = (x * x).mean(1) - x.mean(1) * x.mean(1)  # E[x^2] - E[x]^2 with fp16 values: overflows / cancels
    assert not torch.isclose(naive.double(), ref_var, rtol=0.1).any(), "the naive formula should fail on this data"
    assert kernel_schedulers(fd) == ["reduction"]


def test_var_mean_in_double_precision(device: str, run_kernels) -> None:
    """Double data accumulates in double (a float32 accumulator loses the digits torch keeps)."""
    for cols in (50, 3000):  # on chip, and looped (Welford)
        x = 1e3 + torch.randn(6, cols, device=device, dtype=torch.float64)
        with FusionDefinition() as fd:
            var, mean = fd.ops.var_mean(fd.from_pytorch(x), [1])
            fd.add_output(var)
            fd.add_output(mean)
        var, mean = run_kernels(fd, [x])
        ref_var, ref_mean = torch.var_mean(x, 1)
        torch.testing.assert_close(var, ref_var)
        torch.testing.assert_close(mean, ref_mean)


@pytest.mark.parametrize("shape, params", [
    ((13, 1000), {"shape": "loop", "tile": 64}),
    ((3, 1000), {"shape": "split", "tile": 64, "split": 4}),
    ((1000, 40), {"shape": "outer", "tile": 16, "tile_reduced": 8, "split": 3}),
    ((1000, 40), {"shape": "outer", "tile": 16, "tile_reduced": 8, "split": 1}),
], ids=["loop", "split", "outer-split", "outer"])
def test_pipelined_reduction_loops(shape: tuple[int, int], params: dict[str, object], device: str) -> None:
    """Every looped reduction shape, software-pipelined (``num_stages`` 3: compiled, with no branch in
    the loop body), on extents no tile divides: max, and a sum whose value is read back per row."""
    x = torch.randn(shape, device=device)
    dim = 0 if params["shape"] == "outer" else 1
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.max(t, [dim]))
        fd.add_output(fd.ops.sum(fd.ops.mul(t, t), [dim]))
        base = schedule.compute_heuristics(fd.fusion, SchedulerType.reduction, [x])
        chosen = dataclasses.replace(base, num_stages=3, **params)  # type: ignore[arg-type]
        schedule.schedule(fd.fusion, SchedulerType.reduction, chosen)
    top, squares = fd.manual_execute([x], chosen)
    torch.testing.assert_close(top, x.amax(dim))
    torch.testing.assert_close(squares, (x * x).sum(dim), rtol=1e-4, atol=1e-4)
    if device == "cuda":
        code = fd.last_kernel_code()
        # 3 stages (but for rows loaded 4 bytes at a time), and no branch in a kernel body
        assert re.search(r"num_stages=\(?3\b", code) and not re.search(r"\n {8,}if ", code), code


@pytest.mark.parametrize("axis", [1, 0])
def test_a_plain_reductions_streamed_input_leaves_l2_first(axis: int, device: str, run_kernels,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain reduction of a large input reads it once: its loads ask L2 to evict those lines first
    (``L2Hint.stream``, ``evict_first``), for rows innermost and outermost in memory, in one tile and in a
    loop; a narrower input broadcast into the rows (read by many programs) takes no hint; a normalization's
    first reads (its rows read again) keep their lines. The values are torch's either way. (The threshold is
    lowered to these tensors' sizes: the rule by size is the next test's.)"""
    monkeypatch.setattr(reduction_schedule, "STREAM_MIN_BYTES", 0)
    for rows, columns in ((33, 40), (5, 3000)):
        x = torch.randn(rows, columns, device=device)
        w = torch.randn(columns if axis == 1 else rows, device=device)
        with FusionDefinition() as fd:
            tx, tw = fd.from_pytorch(x), fd.from_pytorch(w)
            scale = fd.ops.broadcast(tw, [True, False] if axis == 1 else [False, True])
            fd.add_output(fd.ops.sum(fd.ops.mul(tx, scale), [axis]))
        (out,) = run_kernels(fd, [x, w])
        want = (x * (w[None, :] if axis == 1 else w[:, None])).sum(axis)
        torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
        code = fd.last_kernel_code()
        # per load: the loop-nest indices its offset reads (x: two, w: one) and whether it is hinted
        hinted = sorted((len(set(re.findall(r"\b(?:ix|r|pid)\d+\b", m.group(1)))), "'evict_first'" in m.group(0))
                        for m in re.finditer(r"tl\.load\(T\d \+ ([^,]*),[^\n]*", code))
        assert hinted == [(1, False), (2, True)], (rows, columns, code)
        assert "evict_last" not in code
    with FusionDefinition() as norm:
        t = norm.from_pytorch(x)
        norm.add_output(norm.ops.sub(t, norm.ops.broadcast(norm.ops.sum(t, [1]), [False, True])))
    (centered,) = run_kernels(norm, [x])
    torch.testing.assert_close(centered, x - x.sum(1, keepdim=True), atol=1e-4, rtol=1e-4)
    # the normalization's first pass keeps its rows' lines: its last pass reads them again
    assert _x_load_hints(norm.last_kernel_code())[0] == "evict_last", norm.last_kernel_code()


@pytest.mark.parametrize("inner", [True, False])
def test_plain_reductions_stream_from_32_mib(inner: bool) -> None:
    """The size rule of the L2 hint (``reduction_schedule.STREAM_MIN_BYTES``): a size bucket of 32 MiB and more
    streams, a smaller one keeps its lines (bf16 and float32: bytes, not elements)."""
    h200 = Machine(132, 16384, 2048)
    for dtype, rows, columns, stream in ((DataType.BFloat16, 1024, 32000, True), (DataType.BFloat16, 127, 32000, False),
                                         (DataType.Float, 4096, 2048, True), (DataType.Float, 2048, 2048, False)):
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1], dtype=dtype)
            fd.add_output(fd.ops.sum(fd.ops.cast(x, DataType.Float), [1 if inner else 0]))
        reduced, kept = (columns, rows) if inner else (rows, columns)
        hints = SizeHints(reduced=1 << (reduced - 1).bit_length(), kept=1 << (kept - 1).bit_length(), machine=h200)
        params = reduction.compute_heuristics(fd.fusion, hints)
        assert (params.l2 is L2Hint.stream) is stream, (dtype, rows, columns, params)
        assert params.l2 in (L2Hint.stream, L2Hint.keep)


def _x_load_hints(code: str) -> list[str]:
    """The eviction policy of each load of input ``T0`` in the order of the kernel's text."""
    return [m.group(1) for m in re.finditer(r"tl\.load\(T0 \+[^\n]*eviction_policy='(\w+)'", code)]


@pytest.mark.parametrize("outputs", [1, 2])
def test_a_looped_normalizations_last_pass_lets_its_rows_go_first(outputs: int, device: str, run_kernels,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A normalization whose rows are read in a loop reads them again in the pass that writes its output:
    from ``STREAM_MIN_BYTES`` on (lowered here to these tensors' sizes) the reads of the first passes keep
    their lines (``evict_last``), the pass writing the last elementwise output lets them go first
    (``evict_first``), an earlier output's pass keeps them (the last one reads them again), and the
    weights, read by every row, keep theirs (``L2Hint.keep_until_last``). Below the threshold every read
    keeps. Values are torch's either way."""
    x = torch.randn(6, 20000, device=device, dtype=torch.bfloat16)
    w = torch.randn(20000, device=device, dtype=torch.bfloat16)

    def define() -> FusionDefinition:
        with FusionDefinition() as fd:
            tx, tw = fd.from_pytorch(x), fd.from_pytorch(w)
            xf = fd.ops.cast(tx, DataType.Float)
            var, mean = fd.ops.var_mean(xf, [1], correction=0)
            centred = fd.ops.sub(xf, fd.ops.broadcast(mean, [False, True]))
            scale = fd.ops.rsqrt(fd.ops.add(fd.ops.broadcast(var, [False, True]), fd.define_scalar(1e-5)))
            fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.mul(centred, scale), fd.ops.broadcast(tw, [True, False])),
                                      DataType.BFloat16))
            if outputs == 2:
                fd.add_output(fd.ops.cast(centred, DataType.BFloat16))
        return fd

    ref = torch.nn.functional.layer_norm(x.float(), [20000], eps=1e-5) * w.float()
    for lowered in (True, False):
        if lowered:
            monkeypatch.setattr(reduction_schedule, "STREAM_MIN_BYTES", 0)
        else:
            monkeypatch.undo()
        fd = define()
        got = run_kernels(fd, [x, w])
        torch.testing.assert_close(got[0].float(), ref, atol=4e-2, rtol=2e-2)
        if outputs == 2:
            torch.testing.assert_close(got[1].float(), x.float() - x.float().mean(1, keepdim=True), atol=2e-2, rtol=1e-2)
        code = fd.last_kernel_code()
        hints = _x_load_hints(code)
        assert len(hints) == 1 + outputs, code  # the var_mean's pass, then one pass per output
        assert hints == ["evict_last"] * outputs + (["evict_first"] if lowered else ["evict_last"]), code
        assert re.search(r"tl\.load\(T1 \+[^\n]*'evict_last'", code), code  # the weights keep their lines


def test_looped_normalizations_last_pass_streams_from_32_mib() -> None:
    """The size rule of ``L2Hint.keep_until_last`` (``reduction_schedule.STREAM_MIN_BYTES``, as plain
    reductions'): a looped layer norm of bf16 1024 x 32000 (a bucket of 64 MiB) lets its last pass's rows
    go first, one of 127 x 32000 keeps them; a row on chip keeps them too at any size."""
    h200 = Machine(132, 16384, 2048)
    for rows, columns, hint in ((1024, 32000, L2Hint.keep_until_last), (127, 32000, L2Hint.keep),
                                (8192, 4096, L2Hint.keep_until_last)):
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
            xf = fd.ops.cast(x, DataType.Float)
            var, mean = fd.ops.var_mean(xf, [1], correction=0)
            fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.sub(xf, fd.ops.broadcast(mean, [False, True])),
                                                 fd.ops.broadcast(fd.ops.rsqrt(var), [False, True])), DataType.BFloat16))
        hints = SizeHints(reduced=1 << (columns - 1).bit_length(), kept=1 << (rows - 1).bit_length(), machine=h200)
        params = inner_persistent.compute_heuristics(fd.fusion, hints)
        assert params.l2 is hint, (rows, columns, params)
