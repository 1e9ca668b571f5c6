"""Generated kernels against torch on what the differential fuzzer's interpreter mode found wrong:
one focused case per defect, named by what the kernel got wrong."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import pytest
import torch
from triton.runtime import interpreter

from pyfuser import DataType, FusionDefinition, ParallelType
from pyfuser.ir.tensor_view import TensorView
from tests.codegen.conftest import execute_with_aten, kernel_schedulers


def test_float_scalar_argument_converted_in_the_kernel(device: str, run_kernels) -> None:
    """A Double scalar input divided by an int tensor (computed in float32): the argument is a typed
    value in the kernel (the interpreter passes a Python float, which has no ``.to``)."""
    x = torch.tensor([1, -2, 3, 4, -5], dtype=torch.int32, device=device)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        s = fd.define_scalar(dtype=DataType.Double)
        fd.add_output(fd.ops.truediv(s, fd.ops.slice(t, [1], [5], [2])))
    (out,) = run_kernels(fd, [x, -0.5])
    torch.testing.assert_close(out, -0.5 / x[1:5:2])


@pytest.mark.parametrize("value", [True, False])
def test_bool_scalar_argument_filling_int_and_selecting(value: bool, device: str) -> None:
    """A Bool scalar input filling an int32 tensor and choosing in a ``where``: the kernel reads it as a
    comparison of its integer argument (Triton 3.6's interpreter cannot make an int1 of the int32 it is
    passed: an internal error, fuzz seed 830001 on the GPU machine)."""
    x = torch.randn(5, 6, device=device)
    with FusionDefinition() as fd:
        flag = fd.define_scalar(dtype=DataType.Bool)
        n = fd.define_scalar(dtype=DataType.Int)
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.full([n, 6, 6], flag, DataType.Int32))
        fd.add_output(fd.ops.where(flag, t, fd.ops.neg(t)))
    full, chosen = fd.execute([value, 5, x], device=device,
                              _enable_options=[] if device == "cuda" else ["triton_interpreter"])
    assert fd.last_kernel_code()
    torch.testing.assert_close(full, torch.full([5, 6, 6], value, dtype=torch.int32, device=device))
    torch.testing.assert_close(chosen, x if value else -x)


def test_iota_with_double_start_and_step_cast_to_bfloat16(device: str) -> None:
    """Double constants of an iota are typed like its output (float64 arithmetic stored as bf16 gave NaN)."""
    with FusionDefinition() as fd:
        n = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.cast(fd.ops.iota(n, 1.0, -0.5, DataType.Float), DataType.BFloat16))
    (out,) = fd.execute([5], device=device, _enable_options=[] if device == "cuda" else ["triton_interpreter"])
    assert fd.last_kernel_code()
    torch.testing.assert_close(out, torch.tensor([1.0 - 0.5 * i for i in range(5)], device=device).bfloat16())


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_of_an_empty_axis_raise_like_aten(op: str, device: str, run_kernels) -> None:
    """torch has no max / min of an empty axis: the kernel's launcher raises the ATen path's error
    instead of returning the accumulator's initial value."""
    x = torch.randn(3, 0, device=device)
    with FusionDefinition() as fd:
        fd.add_output(getattr(fd.ops, op)(fd.from_pytorch(x), [0, 1], keepdim=True))
    with pytest.raises(ValueError) as aten:
        execute_with_aten(fd, [x])
    with pytest.raises(ValueError) as kernel:
        run_kernels(fd, [x])
    assert str(kernel.value) == str(aten.value) == f"{op}: T0 axis 1 has size 0; the {op} of an empty axis is undefined"
    y = torch.randn(3, 2, device=device)  # the same program with elements: computed by the kernel
    (out,) = run_kernels(fd, [y])
    torch.testing.assert_close(out, (torch.amax if op == "max" else torch.amin)(y, [0, 1], keepdim=True))


def test_var_mean_of_an_empty_looped_axis_is_nan(device: str, run_kernels) -> None:
    """Welford's mean of no elements is 0 / 0, not the accumulator's initial 0."""
    x = torch.randn(2, 0, 7, 2, device=device)
    with FusionDefinition() as fd:
        var, mean = fd.ops.var_mean(fd.from_pytorch(x), [0, 1], 0, keepdim=False)
        fd.add_output(var)
        fd.add_output(mean)
    var_out, mean_out = run_kernels(fd, [x])
    assert var_out.isnan().all() and mean_out.isnan().all() and mean_out.shape == (7, 2)


def test_half_and_bfloat16_intermediates_are_rounded(device: str, run_kernels) -> None:
    """A bf16 cast rounds inside the kernel (to nearest even), so a comparison after it sees what
    torch sees; a float32 0-dim operand of a bf16 op is rounded to bf16 first, as torch does."""
    x = (torch.randn(6, 1, 2, device=device) * 3).half()
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        doubled = fd.ops.add(t, t)
        fd.add_output(fd.ops.gt(doubled, fd.ops.cast(fd.ops.cat([doubled, doubled], 1), DataType.BFloat16)))
    (out,) = run_kernels(fd, [x])
    doubled_ref = x + x
    assert torch.equal(out, doubled_ref > torch.cat([doubled_ref, doubled_ref], 1).bfloat16())

    base = torch.tensor([-1.2344, 0.8203, -1.5938], dtype=torch.bfloat16, device=device)
    exponent = torch.tensor(-0.99966, device=device)  # rounds to -1 in bf16: an integral exponent
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.pow(fd.from_pytorch(base), fd.from_pytorch(exponent)))
    (out,) = run_kernels(fd, [base, exponent])
    torch.testing.assert_close(out, torch.pow(base, exponent))


def test_bfloat16_conversions_round_to_nearest_even(device: str, run_kernels) -> None:
    """Every float32 -> bf16 store rounds to nearest even (the interpreter's own conversion
    truncates), also subnormals, infinities and NaN."""
    x = torch.cat([torch.randn(500, device=device) * 10.0 ** torch.randint(-40, 38, (500,), device=device),
                   torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, 1e-40, 1.00390625, 3.3961e38],
                                device=device)])
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.cast(fd.from_pytorch(x), DataType.BFloat16))
    (out,) = run_kernels(fd, [x])
    torch.testing.assert_close(out, x.bfloat16(), rtol=0, atol=0, equal_nan=True)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.cast(fd.from_pytorch(out), DataType.Float))
    (back,) = run_kernels(fd, [out])
    torch.testing.assert_close(back, out.float(), rtol=0, atol=0, equal_nan=True)


def test_integer_div_by_a_tensor_runs_as_aten_and_raises_for_zero(device: str) -> None:
    """A kernel cannot raise for an integer division by 0 as ATen on a CPU does: that division stays
    ATen; one by a non-zero constant is a kernel."""
    x = torch.tensor([4, -7, 9], dtype=torch.int32, device=device)
    options = [] if device == "cuda" else ["triton_interpreter"]
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.div(t, t))
    zeros = torch.zeros_like(x)
    if device == "cuda":  # CUDA's integer division by 0 does not raise: the result is torch's own
        assert torch.equal(fd.execute([zeros])[0], torch.div(zeros, zeros, rounding_mode="trunc"))
    else:
        with pytest.raises(ValueError, match="a divisor is 0"):
            fd.execute([zeros], _enable_options=options)
    (out,) = fd.execute([x], _enable_options=options)
    assert torch.equal(out, torch.ones_like(x))
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.div(fd.from_pytorch(x), 2))
    (out,) = fd.execute([x], _enable_options=options)
    assert fd.last_kernel_code() and torch.equal(out, torch.div(x, 2, rounding_mode="trunc"))


@pytest.mark.parametrize("op", ["var_mean", "sum"])
def test_size_one_axis_with_any_stride_in_a_merged_index(op: str, device: str, run_kernels) -> None:
    """Contiguity ignores the stride of a size-1 axis, which torch leaves at any value (a permute):
    a merged index of axes ending in one steps by the next outer axis' stride."""
    x = torch.randn(1, 3, 3, 3, device=device).permute(1, 0, 3, 2)  # strides (9, 27, 1, 3)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1, -1, -1], dtype=DataType.Float)
        if op == "var_mean":
            var, mean = fd.ops.var_mean(t, None, 2, keepdim=False)
            fd.add_output(var)
            fd.add_output(mean)
        else:
            fd.add_output(fd.ops.sum(t, [2], keepdim=False))
    outs = run_kernels(fd, [x])
    wants = torch.var_mean(x, [0, 1, 2, 3], correction=2) if op == "var_mean" else (x.sum(2),)
    for out, want in zip(outs, wants, strict=True):
        torch.testing.assert_close(out, want)


def test_sum_over_an_expanded_axis_masks_the_padded_tile(device: str, run_kernels) -> None:
    """A value the same along the reduced axis (expanded) is still masked past the axis' extent (3
    on a tile of 4): the reduction's bound is on its own split index, not on the value's."""
    x = torch.randn(1, 1, dtype=torch.float64, device=device)
    with FusionDefinition() as fd:
        t = fd.define_tensor([1, -1], contiguity=True, dtype=DataType.Double)
        expanded = fd.ops.expand(fd.ops.broadcast(t, [True, False, False]), [3, 3, 1])
        fd.add_output(fd.ops.sum(fd.ops.permute(expanded, [1, 0, 2]), [0], keepdim=False))
    (out,) = run_kernels(fd, [x])
    torch.testing.assert_close(out, x[None].expand(3, 3, 1).permute(1, 0, 2).sum(0))


def test_stream_loop_chunks_an_input_that_meets_the_first_output_through_another(device: str) -> None:
    """``t9 = set(x); t11 = ne(t9, y)`` in one kernel of a stream loop: y's axis maps to t9's through
    t11, so the loop passes y's chunks, not the whole y."""
    x = torch.randn(5, dtype=torch.float64, device=device)
    y = torch.randint(0, 2, (5,), device=device).bool()
    with FusionDefinition() as fd:
        tx, ty = fd.from_pytorch(x), fd.from_pytorch(y)
        copy = fd.ops.set(tx)
        ne = fd.ops.ne(copy, ty)
        fd.add_output(ne)
        fd.add_output(copy)
    for tv in (copy, ne):
        tv.outer_split(0, 3)
        tv.axis(0).parallelize(ParallelType.stream)
    ne_out, copy_out = fd.execute([x, y], _enable_options=[] if device == "cuda" else ["triton_interpreter"])
    assert fd.last_kernel_code() and "FOR StreamIdx" in str(fd.fec.last_program)
    assert torch.equal(ne_out, x != y) and torch.equal(copy_out, x)


def test_input_also_returned_with_a_stride_order_is_read_as_given(device: str, run_kernels) -> None:
    """An input that is also an output with a required stride order is read in its own layout (the
    required order is that of the returned copy)."""
    x = torch.randn(3, 3, 2, device=device).bfloat16()  # dense, row-major
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, 3, -1], dtype=DataType.BFloat16)
        fd.add_output(fd.ops.rsqrt(t), stride_order=[1, 2, 0])
        fd.add_output(t, stride_order=[1, 2, 0])
    out, same = run_kernels(fd, [x])
    torch.testing.assert_close(out, torch.rsqrt(x), equal_nan=True)
    assert torch.equal(same, x)


def test_pow_follows_c_at_infinities_zeros_and_ones(device: str, run_kernels) -> None:
    """The interpreter's pow (no libdevice) agrees with C's pow where the formula would not:
    -inf ** -1.5 is 0, -0.0 ** -1 is -inf, 1 ** nan and (-1) ** inf are 1, 0 ** nan is nan."""
    values = [float("-inf"), float("inf"), -1.0, 1.0, 0.0, -0.0, -2.0, 0.5, float("nan"), 3.0, -1.5]
    a = torch.tensor([x for x in values for _ in values], device=device)
    b = torch.tensor([y for _ in values for y in values], device=device)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.pow(fd.from_pytorch(a), fd.from_pytorch(b)))
    (out,) = run_kernels(fd, [a, b])
    want = torch.pow(a, b)
    torch.testing.assert_close(out, want, equal_nan=True)
    assert torch.equal(torch.signbit(out[want == 0]), torch.signbit(want[want == 0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_pow_of_large_results_is_as_accurate_as_torchs(device: str, run_kernels, dtype: torch.dtype) -> None:
    """``6.0 ** 6.0`` is 46656 exactly; the interpreter's pow (no libdevice) computed exp2(b * log2 a) in
    float32, 7 ulps off, and ``sin`` of it was 0.13 away (CPU fuzz seed 9507154). Against float64: within
    torch's own error (plus an ulp) over bases and exponents whose results span float32's range."""
    a = torch.tensor([6.0, 6.0, 1.5, 3.7, 10.0, 0.3, 2.0, 7.25, 11.0], device=device).to(dtype)
    b = torch.tensor([6.0, 5.5, 100.0, 20.0, 10.0, -30.0, 126.5, -11.0, 9.0], device=device).to(dtype)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.pow(fd.from_pytorch(a), fd.from_pytorch(b)))
    (out,) = run_kernels(fd, [a, b])
    exact = torch.pow(a.double(), b.double())
    finite = exact.abs() < torch.finfo(dtype).max
    ours = ((out.double() - exact).abs() / exact.abs())[finite]
    torchs = ((torch.pow(a, b).double() - exact).abs() / exact.abs())[finite]
    assert bool((ours <= torchs + torch.finfo(dtype).eps).all()), (ours, torchs)
    if dtype is torch.float32:
        assert float(out[0]) == 46656.0


@contextmanager
def interpreter_bounds_checked() -> Iterator[list[str]]:
    """Triton's interpreter with every unmasked lane of a load or store checked against the storages
    of the launch's tensor arguments (an access past them corrupts the heap, or a GPU's memory):
    yields the list of violations; the lanes outside are masked off, so the process survives them."""
    storages: list[tuple[int, int]] = []
    violations: list[str] = []
    init_args = interpreter.GridExecutor._init_args_hst
    load, store = interpreter.InterpreterBuilder.create_masked_load, interpreter.InterpreterBuilder.create_masked_store

    def recording_init_args(self: Any, args_dev: Any, kwargs: Any) -> Any:
        storages.clear()
        for arg in (*args_dev, *kwargs.values()):
            if isinstance(arg, torch.Tensor):
                storages.append((arg.untyped_storage().data_ptr(), arg.untyped_storage().nbytes()))
        return init_args(self, args_dev, kwargs)

    def checked(kind: str, ptrs: Any, mask: Any) -> Any:
        """``mask`` less the lanes outside every storage (recorded, and kept from the heap)."""
        size = np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize
        shape = np.broadcast_shapes(ptrs.data.shape, mask.data.shape)
        addresses = np.broadcast_to(ptrs.data, shape).astype(np.int64)
        inside = np.zeros(shape, dtype=bool)
        for start, nbytes in storages:
            inside |= (addresses >= start) & (addresses + size <= start + nbytes)
        live = np.broadcast_to(mask.data, shape)
        if (live & ~inside).any():
            violations.append(f"{kind} of {int((live & ~inside).sum())} lanes outside every argument's storage")
        return interpreter.TensorHandle(live & inside, mask.dtype)

    def checked_load(self: Any, ptrs: Any, mask: Any, *args: Any) -> Any:
        return load(self, ptrs, checked("load", ptrs, mask), *args)

    def checked_store(self: Any, ptrs: Any, value: Any, mask: Any, *args: Any) -> Any:
        return store(self, ptrs, value, checked("store", ptrs, mask), *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(interpreter.GridExecutor, "_init_args_hst", recording_init_args)
        patch.setattr(interpreter.InterpreterBuilder, "create_masked_load", checked_load)
        patch.setattr(interpreter.InterpreterBuilder, "create_masked_store", checked_store)
        yield violations


def test_stream_loop_chunk_masks_a_split_that_divides_only_the_whole_extent(device: str) -> None:
    """An expand to [2, 2, n] in a stream loop over its axis 1: the kernel's tile of 4 covers axis 0
    merged with a chunk of axis 1 (2 x 1 = 2 in a chunk, not the fusion's static 2 x 2 = 4), so the
    split that divides the static extent overshoots the chunk and needs its mask (it wrote past the
    tensor, a double free in the interpreter)."""
    x = torch.randn(1, 1, 5, device=device)
    with FusionDefinition() as fd:
        t = fd.define_tensor([1, 1, -1], dtype=DataType.Float)
        expanded = fd.ops.expand(t, [2, 2, -1])
        fd.add_output(expanded)
    expanded.split(0, 3, inner_split=False)
    expanded.outer_split(2, 2)
    expanded.axis(2).parallelize(ParallelType.stream)
    checked = interpreter_bounds_checked() if device != "cuda" else nullcontext([])
    with checked as violations:
        (out,) = fd.execute([x], _enable_options=[] if device == "cuda" else ["triton_interpreter"])
    assert fd.last_kernel_code() and "FOR StreamIdx" in str(fd.fec.last_program)
    assert violations == []
    assert torch.equal(out, x.expand(2, 2, 5))


def test_transform_like_keeps_the_split_piece_whose_merge_a_lower_rank_tensor_lacks(device: str, run_kernels) -> None:
    """The transpose scheduler tiles a 3-D output (split, then merge with the other axes); a 1-D
    producer (a cat of a slice and an iota) has the split's axis but not the merge's partner, so it
    keeps both pieces of the split in its loop domain (it was left with the inner one, and rejected)."""
    x = torch.randint(-4, 5, [4, 2, 1], dtype=torch.int32, device=device).permute(1, 2, 0)
    y = torch.randn(1, dtype=torch.float64, device=device)
    with FusionDefinition() as fd:
        t1 = fd.define_tensor([-1, -1, -1], dtype=DataType.Int32)
        t7 = fd.define_tensor([1], dtype=DataType.Double)
        head = fd.ops.slice(fd.ops.relu(t7), [-1], [0], [1])
        row = fd.ops.cat([head, fd.ops.iota(4, 0, -1, DataType.Int)], 0)
        fd.add_output(fd.ops.le(row, fd.ops.cast(t1, DataType.Half)), stride_order=[0, 1, 2])
    row_ref = torch.cat([torch.relu(y)[-1:0], torch.arange(0, -4, -1, device=device)])
    for layout in (x, x.contiguous()):  # the contiguous input goes to the transpose scheduler
        (out,) = run_kernels(fd, [layout, y])
        assert torch.equal(out, row_ref <= x.to(torch.float16))


def test_parallelize_like_binds_each_reference_axis_once_per_tensor(device: str, run_kernels) -> None:
    """``x[:, None] * x`` makes both axes of the product one ID class; a reduction over the size-1
    broadcast axis of ``x[:, None]`` then has two loop IDs mapped to the reference's one
    block-parallel axis. Each takes its own reference axis (the broadcast none), as the code
    generator indexes them; both were given block_x, which was rejected."""
    x = torch.randint(0, 2, [7], device=device).bool()
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1], contiguity=True, dtype=DataType.Bool)
        column = fd.ops.broadcast(t0, [False, True])
        fd.add_output(fd.ops.cast(fd.ops.max(t0, [0], keepdim=True), DataType.Double))
        fd.add_output(fd.ops.mul(t0, column))
        fd.add_output(fd.ops.mean(fd.ops.cast(column, DataType.Float), [1], keepdim=False))
    top, outer, mean = run_kernels(fd, [x])
    assert fd.last_kernel_code()
    assert torch.equal(top, torch.amax(x, [0], keepdim=True).double())
    assert torch.equal(outer, x * x[:, None])
    torch.testing.assert_close(mean, x[:, None].float().mean(1))


def test_input_broadcast_beside_a_reduction_of_an_empty_tensor_is_returned(device: str, run_kernels) -> None:
    """A broadcast of an input that no kernel reads joined the reduction kernel reading the same input
    as a sibling output; with an empty reduction input the kernel has no program, so the broadcast
    was never written (uninitialized memory returned). It is a view now, and the kernel makes no
    access outside its arguments."""
    for flag in (True, False, True, False):
        checked = interpreter_bounds_checked() if device != "cuda" else nullcontext([])
        with FusionDefinition() as fd:
            t0 = fd.define_tensor([-1, -1], contiguity=True)
            t1 = fd.define_tensor([], dtype=DataType.Bool)
            fd.add_output(fd.ops.ne(t1, fd.ops.sum(t0, [1])))
            fd.add_output(fd.ops.broadcast(t1, [True, True]))
        with checked as violations:
            ne, column = run_kernels(fd, [torch.randn(0, 3, device=device), torch.tensor(flag, device=device)])
        assert violations == []
        assert fd.last_kernel_code() and ne.shape == (0,)
        assert column.shape == (1, 1) and column.item() is flag


def test_an_output_no_program_covers_is_computed_by_aten(device: str, run_kernels) -> None:
    """A broadcast the user scheduled (so it stays a kernel) beside a reduction of an empty tensor:
    in the reduction's kernel, whose grid is shaped by the reduction's empty output, no program wrote
    it (uninitialized memory returned). An output that lacks an axis the reduction keeps is a kernel
    of its own now (a launch with no program while an output is not empty would still fall back to
    ATen calls)."""
    for flag in (True, False, True, False):
        with FusionDefinition() as fd:
            t0 = fd.define_tensor([-1, -1], contiguity=True)
            t1 = fd.define_tensor([], dtype=DataType.Bool)
            fd.add_output(fd.ops.ne(t1, fd.ops.sum(t0, [1])))
            column = fd.ops.broadcast(t1, [True, True])
            fd.add_output(column)
        column.merge(0)
        checked = interpreter_bounds_checked() if device != "cuda" else nullcontext([])
        with checked as violations:
            ne, out = run_kernels(fd, [torch.randn(0, 3, device=device), torch.tensor(flag, device=device)])
        assert violations == []
        assert str(fd.fec.last_program).count("LaunchKernel(") == 2, "the broadcast is a kernel of its own"
        assert ne.shape == (0,) and out.shape == (1, 1) and out.item() is flag
    (ne, out) = run_kernels(fd, [torch.randn(2, 3, device=device), torch.tensor(True, device=device)])
    assert out.item() is True and ne.shape == (2,)


def test_a_reduction_result_stored_across_an_empty_tile_axis(device: str, run_kernels) -> None:
    """The variance of no elements (NaN) was computed in the kernel but stored under the mask of the
    tile it is broadcast across (the sum's lanes over the same, empty, input): no lane wrote it. The
    first lane of such an axis always stores."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, 6], contiguity=True, dtype=DataType.Float)
        t1 = fd.ops.broadcast(t0, [True, False, False, True])
        fd.add_output(fd.ops.sum(t1, [1, 2], keepdim=True, dtype=DataType.Double))
        fd.add_output(fd.ops.var(t0, None, 2, keepdim=True))
        fd.add_output(fd.ops.lt(t1, t1))
    for rows in (0, 1, 4):
        x = torch.randn(rows, 6, device=device)
        total, var, less = run_kernels(fd, [x])
        assert fd.last_kernel_code()
        torch.testing.assert_close(total, x[None, :, :, None].double().sum([1, 2], keepdim=True))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns of degrees of freedom <= 0
            torch.testing.assert_close(var, torch.var(x, [0, 1], correction=2, keepdim=True), equal_nan=True)
        assert less.shape == (1, rows, 6, 1) and not less.any()


def _split_on_stream(tvs: Sequence[TensorView], chunks: int) -> None:
    """Each of ``tvs`` computed in ``chunks`` stream iterations of its axis 1."""
    for tv in tvs:
        tv.outer_split(1, chunks)
        tv.axis(1).parallelize(ParallelType.stream)


def _refused_on_stream_computed_without(define: Callable[[bool], FusionDefinition], inputs: list[Any],
                                        run_kernels: Any) -> list[torch.Tensor]:
    """``define(True)`` (split on stream) refused because a kernel would read one input's chunk along two
    axes; the outputs of ``define(False)``, the same fusion unsplit."""
    with pytest.raises(ValueError, match=r"reads T\d+ along axes .* a chunk of one is not a chunk of the others"):
        run_kernels(define(True), inputs)
    return run_kernels(define(False), inputs)


def test_stream_loop_refuses_a_kernel_reading_one_input_along_two_chunked_axes(device: str, run_kernels) -> None:
    """``where(t.permute(...), t, ...)`` in a stream loop over the output's axis 1, which is ``t``'s axis 0
    through the permute and ``t``'s axis 1 directly: one chunk of ``t`` cannot serve both reads (the
    kernel got the chunk along axis 0 for both, a wrong result). Refused, naming both axes; without
    the stream split the same fusion computes. (``t2`` reads two inputs: a chain of one input is forwarded
    into each of its reads, which then read chunks of their own.)"""
    x = torch.randn(2, 2, 2, 2, device=device)
    threes = torch.full_like(x, 3.0)

    def define(stream: bool) -> FusionDefinition:
        with FusionDefinition() as fd:
            t0 = fd.define_tensor([2, -1, -1, -1], dtype=DataType.Float)
            t1 = fd.define_tensor([2, -1, -1, -1], dtype=DataType.Float)
            t2 = fd.ops.ne(fd.ops.cast(t0, DataType.Int32), fd.ops.cast(t1, DataType.Int32))
            t5 = fd.ops.permute(t2, [2, 0, 3, 1])
            out = fd.ops.where(t5, t2, t5)
            fd.add_output(out)
        if stream:
            _split_on_stream((out, t5), 3)
        return fd

    (out,) = _refused_on_stream_computed_without(define, [x, threes], run_kernels)
    mask = x.to(torch.int32) != 3
    assert torch.equal(out, torch.where(mask.permute(2, 0, 3, 1), mask, mask.permute(2, 0, 3, 1)))


def test_stream_loop_refuses_a_kernel_whose_second_output_reads_the_input_along_another_axis(
        device: str, run_kernels) -> None:
    """``t.T`` returned beside ``t.T * t``, both split on stream along axis 1: the first output reads ``t``
    along axis 0 only, the second along both, so one chunk of ``t`` cannot serve the kernel (the products
    and a pad of ``t.T`` came out wrong: fuzz seed 9406589). Refused, naming both axes; without the split
    the same fusion computes."""
    x = torch.randn(3, 3, device=device)

    def define(stream: bool) -> FusionDefinition:
        with FusionDefinition() as fd:
            t0 = fd.define_tensor([3, -1], dtype=DataType.Float)
            t2 = fd.ops.permute(t0, [1, 0])
            t3 = fd.ops.mul(t2, t0)
            fd.add_output(t2)
            fd.add_output(t3)
        if stream:
            _split_on_stream((t2, t3), 2)
        return fd

    transposed, product = _refused_on_stream_computed_without(define, [x], run_kernels)
    assert torch.equal(transposed, x.t()) and torch.equal(product, x.t() * x)


def test_manual_schedule_whose_grid_has_no_program_for_a_nonempty_output(device: str) -> None:
    """A hand-scheduled kernel whose grid spans an empty axis cannot write an output beside it (a
    broadcast): ``manual_execute`` says so instead of returning uninitialized memory."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1], contiguity=True)
        t1 = fd.define_tensor([], dtype=DataType.Bool)
        total = fd.ops.sum(t0, [1])
        differs = fd.ops.ne(t1, total)
        fd.add_output(differs)
        fd.add_output(fd.ops.broadcast(t1, [True, True]))
    for tv in (total, differs):
        tv.axis(0).parallelize(ParallelType.grid_x)
    x = torch.randn(3, 4, device=device)
    flag = torch.tensor(True, device=device)
    differs_out, column = fd.manual_execute([x, flag])
    assert torch.equal(differs_out, flag != x.sum(1)) and column.item() is True
    with pytest.raises(ValueError, match=r"manual_execute: the schedule's grid has no program for these sizes "
                                         r"\(an extent it spans is 0\), but not every output \(T\d+, T\d+\) is empty"):
        fd.manual_execute([torch.randn(0, 4, device=device), flag])


def test_broadcast_output_beside_an_outer_reduction_is_written(device: str, run_kernels) -> None:
    """A Llama backward region: the rotary table ``sin[None]`` is an output beside a reduction over
    the heads' axis whose result it multiplies (12 heads: a sum of at most 7 is pointwise math,
    ``preseg/unrolled_reductions.py``). In the reduction's kernel its loop merged a broadcast
    with an axis the reference iterates (a loop of another extent) and the kernel failed to build, so
    the whole region fell back to ATen calls. It is a kernel of its own now."""
    with FusionDefinition() as fd:
        grads = fd.define_tensor([2, 2, 12, 16, 16], contiguity=True, stride_order=[4, 2, 1, 3, 0])
        angles = fd.define_tensor([1, 16, 16], contiguity=[None, True, True])
        table = fd.ops.broadcast(fd.ops.sin(angles), [False, True, False, False])
        rotated = fd.ops.mul(fd.ops.sum(grads, [2]), table)
        half = fd.ops.pad(fd.ops.slice(rotated, [0, 0, 0, 0], [2, 2, 16, 8]), [8, 0])
        fd.add_output(table)
        fd.add_output(fd.ops.reshape(fd.ops.permute(half, [0, 2, 1, 3]), [2, 16, 32]))
    g = torch.randn(12288, device=device).as_strided((2, 2, 12, 16, 16), (6144, 192, 16, 384, 1))
    a = torch.randn(1, 16, 16, device=device)
    table_out, out = run_kernels(fd, [g, a])
    assert "reduction" in kernel_schedulers(fd)
    expected_table = a.sin()[:, None]
    half_ref = torch.nn.functional.pad((g.sum(2) * expected_table)[..., :8], [8, 0])
    torch.testing.assert_close(table_out, expected_table.expand_as(table_out))
    torch.testing.assert_close(out, half_ref.permute(0, 2, 1, 3).reshape(2, 16, 32))


@pytest.mark.parametrize("exponent", [2, 3.0, 1.0, 0.5, -0.5, -1, -2.0, 1.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pow_by_a_constant_is_atens(device: str, run_kernels, exponent: float, dtype: torch.dtype) -> None:
    """``x ** 2`` (Llama's RMSNorm; ``x ** 1`` in its backward) is a multiplication, as ATen computes
    it, not the general pow (``libdevice.pow`` made the norm 3x slower than Inductor's); the roots and reciprocals ATen
    takes for 0.5, -0.5, -1 and -2 give its values at zeros, infinities and negative bases too."""
    special = [float("-inf"), float("inf"), float("nan"), -0.0, 0.0, -1.0, -2.5, 1e-20]
    x = torch.cat([torch.tensor(special), torch.randn(40) * 3]).to(device=device, dtype=dtype)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.pow(fd.from_pytorch(x), fd.define_scalar(exponent)))
    (out,) = run_kernels(fd, [x])
    want = torch.pow(x, exponent)
    tolerance = {"atol": 1e-5, "rtol": 1e-5} if dtype is torch.float32 else {}
    torch.testing.assert_close(out, want, equal_nan=True, **tolerance)
    assert torch.equal(torch.signbit(out[want == 0]), torch.signbit(want[want == 0]))
    assert ("_pow(" in fd.last_kernel_code().split("def pointwise_")[-1]) == (exponent == 1.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gelu_tanh_as_a_sigmoid_matches_torch_everywhere(device: str, run_kernels, dtype: torch.dtype) -> None:
    """The kernel computes gelu(tanh) as ``x * sigmoid(2u)``: torch's values at infinities, NaN, values
    whose cube overflows, deep in both tails and around 0."""
    special = [float("-inf"), float("inf"), float("nan"), -1e20, 1e20, -30.0, 30.0, -0.0, 1e-30, -5.0]
    x = torch.cat([torch.tensor(special), torch.linspace(-8, 8, 161)]).to(device=device, dtype=dtype)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.gelu(fd.from_pytorch(x), approximate="tanh"))
    (out,) = run_kernels(fd, [x])
    tolerance = {"atol": 1e-6, "rtol": 1e-5} if dtype is torch.float32 else {}
    torch.testing.assert_close(out, torch.nn.functional.gelu(x, approximate="tanh"), equal_nan=True, **tolerance)


def test_a_symbolic_pad_that_crops_an_empty_axis_is_refused(device: str, run_kernels) -> None:
    """Fuzz seed 11817: a pad whose width is a scalar input crops more than an empty axis has; ATen
    raises, and so does the kernel's launch (it only checked that the padded size stays >= 0)."""
    x = torch.randn(0, 2, 7, device=device, dtype=torch.float64)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        left = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.pad(fd.ops.reshape(tx, [3, 0]), [left, 1]))
    with pytest.raises(RuntimeError):
        torch.nn.functional.pad(x.reshape(3, 0), [-1, 1])
    with pytest.raises(ValueError, match=r"pad T\d+ \(of T\d+\): T\d+ axis 1 is cropped by widths .*more than its size"):
        run_kernels(fd, [x, -1])
    (out,) = run_kernels(fd, [x, 0])  # a width of 0 crops nothing
    assert out.shape == (3, 1) and bool((out == 0).all())


def test_a_pad_read_only_through_its_padding_conditions(device: str, run_kernels) -> None:
    """Fuzz seed 15050: a pad of a [6, 1, 1] tensor whose load has no mask besides the pad's own
    conditions (the interpreter refused the mask's dtype)."""
    x = torch.randn(6, 1, 1, device=device)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        lo, mid = fd.define_scalar(dtype=DataType.Int), fd.define_scalar(dtype=DataType.Int)
        t = fd.ops.pad(tx, [lo, 1, mid, 0, 1, -1], -2.0)
        fd.add_output(fd.ops.expand(t, [6, -1, 1]))
    (out,) = run_kernels(fd, [x, -1, 1])
    torch.testing.assert_close(out, torch.nn.functional.pad(x, [-1, 1, 1, 0, 1, -1], value=-2.0))


def test_an_iota_sliced_to_one_element_beside_a_slice(device: str, run_kernels) -> None:
    """Fuzz seed 17744: the iota's index after a slice to one element is a constant expression
    (``(0 + 2)``), a Python int in the kernel."""
    x = torch.randn(2, 7, device=device)
    with FusionDefinition() as fd:
        t = fd.ops.slice(fd.from_pytorch(x), [0, -1], [-1, 7], [1, 1])
        i = fd.ops.slice(fd.ops.iota(4, 1, 2, DataType.Int32), [-2], [-1], [1])
        fd.add_output(fd.ops.ge(t, i))
    (out,) = run_kernels(fd, [x])
    assert torch.equal(out, x[0:-1, -1:7] >= torch.tensor([5], dtype=torch.int32, device=device))


def test_a_pad_operand_read_at_constant_offsets(device: str, run_kernels) -> None:
    """Fuzz seed 42908: a slice with constant starts reads a pad's operand at constant offsets: the
    in-range condition is a Python bool, made a mask of the address's shape (the interpreter refused
    a 0-dim one)."""
    x = torch.randint(-4, 5, [7, 1], dtype=torch.int32, device=device)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        lo, hi = fd.define_scalar(dtype=DataType.Int), fd.define_scalar(dtype=DataType.Int)
        both = fd.ops.logical_or(fd.ops.pad(tx, [2, 2, 0, 0], 1.5), tx)
        fd.add_output(fd.ops.slice(fd.ops.broadcast(both, [True, False, False]), [-1, lo, -2], [4, hi, 4], [3, 1, 1]))
    (out,) = run_kernels(fd, [x, 1, 7])
    want = torch.logical_or(torch.nn.functional.pad(x, [2, 2, 0, 0], value=1.5), x)[None][-1:4:3, 1:7, -2:4]
    assert torch.equal(out, want)


def test_a_pad_operand_read_at_a_scalar_offset_beside_a_varying_one(device: str, run_kernels) -> None:
    """Fuzz seed 94309: the pad's in-range condition depends on a size argument only (a 0-dim value)
    while the address varies along the tile: the mask takes the address's shape."""
    e = torch.randint(-4, 5, [2, 5], dtype=torch.int32, device=device)
    x = torch.randn(1, 5, dtype=torch.float16, device=device)
    with FusionDefinition() as fd:
        te, tx = fd.from_pytorch(e), fd.from_pytorch(x)
        start = fd.define_scalar(dtype=DataType.Int)
        padded = fd.ops.pad(fd.ops.pow(tx, fd.ops.pow(tx, te)), [1, 2], -2)
        fd.add_output(fd.ops.slice(fd.ops.expand(padded, [2, 8]), [start, -2], [2, 8], [1, 3]))
    (out,) = run_kernels(fd, [e, x, 1])
    want = torch.nn.functional.pad(torch.pow(x, torch.pow(x, e)), [1, 2], value=-2).expand(2, 8)[1:2, -2:8:3]
    torch.testing.assert_close(out, want, equal_nan=True)


@pytest.mark.parametrize("step", [1, 2, 3])
def test_loads_at_strided_slice_indices_are_masked(device: str, run_kernels, step: int) -> None:
    """A strided slice's index is an expression (``ix * 2 + start``): the load's tile axes are read
    from the names in it, so the load is masked like the store (unmasked, the lanes past the end read
    out of bounds: fuzz seed 310066 crashed the interpreter)."""
    x = torch.randn(5, 37, device=device)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.slice(fd.ops.neg(t), [1, 1], [4, 37], [1, step]))
    (out,) = run_kernels(fd, [x])
    torch.testing.assert_close(out, -x[1:4, 1:37:step])
    loads = [line for line in fd.last_kernel_code().splitlines() if "tl.load(" in line]
    assert loads and all("mask=" in line for line in loads), loads


def test_a_computed_extent_is_compared_with_the_loop_it_shares(device: str, run_kernels) -> None:
    """A slice whose symbolic bounds leave one element, added to a tensor of three: the kernel iterates
    both as one loop, so the launch compares the slice's extent with the loop's and refuses the
    mismatch naming the axis (it gave the output the other tensor's shape: fuzz seed 317863)."""
    x, y = torch.randn(5, 4, device=device), torch.randn(3, 4, device=device)
    with FusionDefinition() as fd:
        tx, ty = fd.from_pytorch(x), fd.from_pytorch(y)
        stop = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.add(fd.ops.slice(tx, [1, 0], [stop, 4]), ty))
    (out,) = run_kernels(fd, [x, y, 4])
    torch.testing.assert_close(out, x[1:4] + y)
    with pytest.raises(ValueError, match=r"axis 0 has size 1, but the kernel iterates it with the axes it maps to, "
                                         r"of size 3; they must be equal"):
        run_kernels(fd, [x, y, 2])


def test_an_input_scalars_extent_is_compared_with_the_loop_it_shares(device: str, run_kernels) -> None:
    """``full([n, 4])`` broadcast against an operand of static size 8 along ``n``: the kernel iterates
    the axis as 8, so the launch compares the scalar's value with it and refuses 6 naming the axis (the
    kernel returned a tensor of 8 rows where torch raises: fuzz seed 9301367)."""
    y = torch.randn(8, 1, device=device)
    with FusionDefinition() as fd:
        n = fd.define_scalar(dtype=DataType.Int)
        ty = fd.from_pytorch(y)
        fd.add_output(fd.ops.add(fd.ops.full([n, 4], -1.5, DataType.Float), ty))
    (out,) = run_kernels(fd, [8, y])
    torch.testing.assert_close(out, torch.full((8, 4), -1.5, device=device) + y)
    with pytest.raises(ValueError, match=r"axis 0 has size 6, but the kernel iterates it with the axes it maps to, "
                                         r"of size 8; they must be equal"):
        run_kernels(fd, [6, y])


@pytest.mark.parametrize("shape", [(1, 5, 3), (1, 37, 19)])
def test_a_squeezed_reduction_follows_the_reduction_loop_nest(device: str, run_kernels,
                                                              shape: tuple[int, ...]) -> None:
    """A keepdim var_mean over a tensor with a leading size-1 axis, squeezed to its kept axis: the
    schedule merges that broadcast axis into the kept one, and the squeeze's output (which lacks it)
    follows the merge by forwarding, so it is stored from the loop point the mean was computed at
    (it kept an axis of its own: "T2 is read at a loop point where it was not reduced", CPU fuzz seed
    2001221)."""
    x = torch.randn(shape[0], shape[2], shape[1], device=device).transpose(1, 2)
    with FusionDefinition() as fd:
        t = fd.define_tensor([1, -1, -1], dtype=DataType.Float)
        _, mean = fd.ops.var_mean(t, [1], 1, keepdim=True)
        fd.add_output(fd.ops.squeeze(mean, [0, 1]))
        fd.add_output(fd.ops.mean(mean, [0, 1, 2], keepdim=False))
    squeezed, total = run_kernels(fd, [x])
    want = torch.var_mean(x, [1], correction=1, keepdim=True)[1]
    torch.testing.assert_close(squeezed, want.squeeze(1).squeeze(0))
    torch.testing.assert_close(total, want.mean())


def test_a_squeezed_var_mean_of_a_linear_output(device: str, run_kernels) -> None:
    """CPU fuzz seed 2000625, minimized: the var_mean over two size-1 axes of a linear's output, squeezed
    and averaged in double (the squeeze's output did not follow the merged loop nest)."""
    a, w, b = torch.randn(2, device=device), torch.randn(6, 1, device=device), torch.randn(6, device=device)
    with FusionDefinition() as fd:
        ta = fd.define_tensor([-1], dtype=DataType.Float)
        tw = fd.define_tensor([-1, -1], contiguity=True, dtype=DataType.Float)
        tb = fd.define_tensor([-1], contiguity=True, dtype=DataType.Float)
        x = fd.ops.broadcast(fd.ops.reshape(fd.ops.sum(ta, [0], keepdim=False), [1, 1]), [False, False, True, True])
        _, mean = fd.ops.var_mean(fd.ops.linear(x, tw, tb), [0, 1], 0, keepdim=True)
        fd.add_output(fd.ops.mean(mean, [0, 1, 2, 3], keepdim=True, dtype=DataType.Double))
    (out,) = run_kernels(fd, [a, w, b])
    lin = torch.nn.functional.linear(a.sum().reshape(1, 1)[:, :, None, None], w, b)
    want = torch.var_mean(lin, [0, 1], correction=0, keepdim=True)[1].mean([0, 1, 2, 3], keepdim=True,
                                                                          dtype=torch.float64)
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("rows", [0, 3])
def test_a_reduced_value_read_along_another_axis_of_its_class_is_its_own_kernel(device: str, run_kernels,
                                                                                 rows: int) -> None:
    """CPU fuzz seed 2001101: a column count ``s[j]`` of ``x[i, 0, j, 0]`` broadcast to ``[1, 1, 1, j]`` and
    combined with ``x``'s own ``[i, 1, j, 1]``: the output's axes 2 and 3 both iterate ``j``, and the
    reduction kernel's programs tile axis 2, so ``s`` read along axis 3 is a value they did not compute.
    The reduction analysis refuses such a segment; the output is a pointwise kernel of its own."""
    x = torch.randn(rows, 1, 4, 1, device=device)
    x[..., 1, :] = float("nan")
    flag = torch.tensor([[True]], device=device)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        t7 = fd.define_tensor([1, 1], contiguity=True, dtype=DataType.Bool)
        le = fd.ops.le(t0, t0)
        counts = fd.ops.silu(fd.ops.sum(le, [0, 3], keepdim=False, dtype=DataType.Float))
        fd.add_output(fd.ops.where(fd.ops.where(le, True, le), counts, t7))
    (out,) = run_kernels(fd, [x, flag])
    r1 = x <= x
    want = torch.where(torch.where(r1, True, r1), torch.nn.functional.silu(r1.sum([0, 3], dtype=torch.float32)), flag)
    torch.testing.assert_close(out, want)
    assert kernel_schedulers(fd) == ["reduction", "pointwise"]


@pytest.mark.parametrize("kind", ["sum", "prod", "min"])
@pytest.mark.parametrize("rows", [4, 5, 13])
def test_a_reduction_in_a_second_pass_over_the_row_counts_each_value_once(device: str, run_kernels, kind: str,
                                                                          rows: int) -> None:
    """CPU fuzz seed 9201292: a persistent kernel's row of ``x[i, 0]``, a min of ``expm1`` over it, then a
    second pass over the squeezed row (its min with the first min's result added, and a sum, product or min
    of it) in a loop of its own. Every lane of the tile added the loop's values, so reducing across the
    lanes at the finish counted each value once per lane (a sum times the tile width, a product to its
    power): a serial reduction axis is never a tile axis at the finish."""
    x = torch.randn(rows, 1, device=device, dtype=torch.float16, generator=torch.Generator(device).manual_seed(0))
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, 1], contiguity=True, stride_order=[0, 1], dtype=DataType.Half)
        first = fd.ops.min(fd.ops.expm1(t0), [0], keepdim=False)
        row = fd.ops.squeeze(t0, [1])
        fd.add_output(fd.ops.min(fd.ops.add(row, fd.ops.rsqrt(fd.ops.abs(first))), None, keepdim=True))
        fd.add_output(getattr(fd.ops, kind)(row, [0], keepdim=False))
    _, out = run_kernels(fd, [x])
    row_ref = x.squeeze(1).float()
    want = {"sum": row_ref.sum(), "prod": row_ref.prod(), "min": row_ref.min()}[kind].to(torch.float16)
    torch.testing.assert_close(out, want, rtol=2e-3, atol=2e-3)


def test_a_full_reductions_result_compared_with_bfloat16_values_promotes_like_a_number(device: str,
                                                                                     run_kernels) -> None:
    """CPU fuzz seed 9942847: ``min(x) >= x.bfloat16()`` with ``x`` float32. The minimum is a 0-dim tensor,
    which torch promotes like a number: the comparison is in bfloat16 (the minimum rounded first). The
    kernel saw the minimum broadcast to the row's rank and compared in float32 (False where the rounded
    values are equal)."""
    x = torch.tensor([0.2838, -1.7218, 2.1105, -0.8574], device=device)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.ge(fd.ops.min(t, [0], keepdim=False), fd.ops.cast(t, DataType.BFloat16)))
        fd.add_output(fd.ops.lt(fd.ops.cast(t, DataType.BFloat16), fd.ops.sum(t, [0], keepdim=False)))
    ge, lt = run_kernels(fd, [x])
    torch.testing.assert_close(ge, x.amin() >= x.bfloat16())
    torch.testing.assert_close(lt, x.bfloat16() < x.sum())
    assert ge.tolist() == [False, True, False, False]


@pytest.mark.parametrize("index", [-3, 2, -1])
def test_a_gathered_value_stored_to_one_element_from_a_wider_tile_is_the_valid_lanes(device: str, run_kernels,
                                                                                     index: int) -> None:
    """CPU fuzz seed 9950044: a gather of a ``[1, 1]`` index (a remainder of it) from ``[4, 3]``, the output
    ``[1, 1]`` laid out by its stride order. Every lane of the 512-wide tile stored to the one element
    (its address has no tile index), and the lanes past the extent held the masked load's zero: the
    store's mask dropped the extent's condition, which the value is computed under, not the address."""
    x = torch.randn(4, 3, device=device)
    i = torch.tensor([[index]], device=device)
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1], dtype=DataType.Float)
        ti = fd.define_tensor([1, 1], contiguity=True, dtype=DataType.Int)
        fd.add_output(fd.ops.gather(tx, fd.ops.remainder(ti, 3), 1), stride_order=[1, 0])
    (out,) = run_kernels(fd, [x, i])
    torch.testing.assert_close(out, torch.gather(x, 1, torch.remainder(i, 3)))


def test_the_mean_of_one_infinite_element_is_that_element(device: str, run_kernels) -> None:
    """CPU fuzz seed 9952375: a var_mean over an axis of one element whose value is -inf (a division by a
    false comparison). The on-chip var_mean corrects its first mean by the deviations' sum, ``-inf - -inf``
    = NaN for this row; torch's Welford gives the element (its first step), its variance NaN. Rows of more
    elements with an inf keep a NaN mean, as torch's Welford gives it once a later element follows."""
    x = torch.tensor([[-float("inf"), 2.0, 3.0], [1.0, float("inf"), 0.5]], device=device)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        one_var, one_mean = fd.ops.var_mean(fd.ops.slice(t, [0, 0], [1, 3]), [0], 0, keepdim=False)
        fd.add_output(one_mean)
        fd.add_output(one_var)
    one_mean, one_var = run_kernels(fd, [x])
    want_var, want_mean = torch.var_mean(x[:1], 0, correction=0)
    torch.testing.assert_close(one_mean, want_mean)
    torch.testing.assert_close(one_var, want_var, equal_nan=True)
    assert torch.isnan(one_var[0]) and one_mean[0] == -float("inf")
