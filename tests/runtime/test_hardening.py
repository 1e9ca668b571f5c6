"""Regressions of issue 9: defects found by differential testing against eager torch, each built from
its minimal repro, and the bound on the executor's signature cache."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition, ParallelType

STREAM = ParallelType.stream
TOL = {"rtol": 1e-4, "atol": 1e-4}


# --- 1. one tensor as both operands of a stream-chunked matmul / linear ----------------------------------
@pytest.mark.parametrize("axis", [0, 1])
def test_matmul_of_a_tensor_with_itself_in_a_stream_loop(device: str, axis: int) -> None:
    """``matmul(x, x)`` chunked by rows reads the first ``x`` by rows and the second whole (both were
    chunked: a wrong result with no error); by columns, the other way round."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.ops.matmul(x, x)
        fd.add_output(y)
    y.outer_split(axis, 2)
    y.axis(axis).parallelize(STREAM)
    x0 = torch.randn(5, 5, device=device)
    torch.testing.assert_close(fd.execute([x0])[0], x0 @ x0, **TOL)


@pytest.mark.parametrize("axis", [0, 1])
def test_linear_of_a_tensor_with_itself_in_a_stream_loop(device: str, axis: int) -> None:
    """``linear(x, x)`` raised a size mismatch on CPU (wrong on CUDA): the weight was chunked by rows."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        b = fd.define_tensor([-1])
        y = fd.ops.linear(x, x, b)
        fd.add_output(y)
    y.outer_split(axis, 3)
    y.axis(axis).parallelize(STREAM)
    x0, b0 = torch.randn(4, 4, device=device), torch.randn(4, device=device)
    torch.testing.assert_close(fd.execute([x0, b0])[0], F.linear(x0, x0, b0), **TOL)


def test_stream_input_read_twice_by_matmul(device: str) -> None:
    """An input scheduled on stream puts its consumer in the loop: ``matmul(x, x)`` keeps ``x``'s rows
    at the first position and contracts them at the second, where ``x`` is read whole."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.ops.matmul(x, x)
        fd.add_output(y)
    x.axis(0).parallelize(STREAM)
    x0 = torch.randn(3, 3, device=device)
    torch.testing.assert_close(fd.execute([x0])[0], x0 @ x0, **TOL)


def test_logical_map_of_a_tensor_read_twice_keeps_only_agreed_ids() -> None:
    """Propagation (sharding, layouts) walks ``logical_map``: for ``matmul(x, x)`` no ID of ``x`` maps to
    one output ID at both positions, so none is propagated; each position has its own map."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.ops.matmul(x, x)
        fd.add_output(y)
    expr = y.definition
    assert expr is not None
    rows, cols = x.get_logical_domain()
    m, n, rk = y.get_logical_domain()
    assert expr.logical_map(x) == {}
    assert expr.operand_map(0) == {rows: m, cols: rk}
    assert expr.operand_map(1) == {rows: rk, cols: n}


def test_producer_chunked_in_the_loop_and_read_whole_closes_the_loop(device: str) -> None:
    """``x`` is produced chunk by chunk in a loop, then ``matmul(x, x)`` needs all of ``x`` at its second
    position: it cannot join that loop."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1])
        x = fd.ops.exp(a)
        y = fd.ops.matmul(x, x)
        fd.add_output(y)
    for t in (x, y):
        t.outer_split(0, 2)
        t.axis(0).parallelize(STREAM)
    a0 = torch.randn(4, 4, device=device)
    torch.testing.assert_close(fd.execute([a0])[0], a0.exp() @ a0.exp(), **TOL)
    assert str(fd.fec.last_program).count("FOR StreamIdx") == 2


# --- 2. outputs never share memory ---------------------------------------------------------------------
def _add_output_twice(fd: FusionDefinition, x: Any) -> None:
    y = fd.ops.add(x, 1.0)
    fd.add_output(y)
    fd.add_output(y)


def _add_output_and_no_op_expand(fd: FusionDefinition, x: Any) -> None:
    y = fd.ops.add(x, 1.0)
    fd.add_output(y)
    fd.add_output(fd.ops.expand(y, [-1, -1]))  # returns y itself


def _add_input_twice(fd: FusionDefinition, x: Any) -> None:
    fd.add_output(x)
    fd.add_output(x)


@pytest.mark.parametrize("build", [_add_output_twice, _add_output_and_no_op_expand, _add_input_twice])
def test_one_value_returned_twice_gives_two_tensors(build: Callable[[FusionDefinition, Any], None]) -> None:
    with FusionDefinition() as fd:
        build(fd, fd.define_tensor([-1, -1]))
    a, b = fd.execute([torch.randn(2, 3)])
    assert a is not b and a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    expected = b.clone()
    a.zero_()
    torch.testing.assert_close(b, expected)


def test_empty_input_returned_as_output_is_a_new_tensor() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(x)
    x0 = torch.randn(0, 3)
    (out,) = fd.execute([x0])
    assert out is not x0 and out.shape == (0, 3)


# --- 3. expand checks the whole tensor, not the stream chunk ------------------------------------------------
def test_expand_size_check_sees_the_whole_tensor_in_a_stream_loop(device: str) -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, 7])
        fd.add_output(fd.ops.expand(t0, [7, 7]))
    t0.axis(0).parallelize(STREAM)
    x = torch.randn(7, 7, device=device)
    torch.testing.assert_close(fd.execute([x])[0], x)
    # ATen's expand, the kernel's launch check, or the stream loop's check of what it chunks (the loop
    # runs over the expand's 7 rows, or over the input's 5 when the output is the kernel's)
    mismatch = r"(T0 axis 0 has size 5|T\d+ axis 0 has size 7, but the stream loop over \S+ that chunks it runs over 5)"
    with pytest.raises(ValueError, match=mismatch):
        fd.execute([torch.randn(5, 7, device=device)])
    kernels = fd.execute([x], _enable_options=["triton_interpreter"])[0]  # generated kernels in the loop
    torch.testing.assert_close(kernels, x)
    with pytest.raises(ValueError, match=mismatch):
        fd.execute([torch.randn(5, 7, device=device)], _enable_options=["triton_interpreter"])


# --- 4. batched matmul into a strided stream chunk ----------------------------------------------------------
@pytest.mark.parametrize("b_shape", [[5], [5, 2]], ids=["vector", "matrix"])
def test_batched_matmul_into_a_column_major_stream_chunk(device: str, b_shape: list[int]) -> None:
    """torch.matmul(out=) folds a batched ``a`` into one GEMM and fails on a strided ``out``."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1, -1])
        v = fd.define_tensor([-1] * len(b_shape))
        y = fd.ops.matmul(a, v)
        fd.add_output(y, stride_order=list(range(len(b_shape) + 1)))
    y.outer_split(0, 2)
    y.axis(0).parallelize(STREAM)
    a0, v0 = torch.randn(4, 3, 5, device=device), torch.randn(b_shape, device=device)
    (out,) = fd.execute([a0, v0])
    torch.testing.assert_close(out, a0 @ v0, **TOL)
    assert out.stride()[0] == 1


def test_vector_times_matrix_into_a_stream_chunk(device: str) -> None:
    """``matmul([k], [k, n])`` with out= resizes ``out`` (deprecated), which breaks a chunk view."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1])
        b = fd.define_tensor([-1, -1])
        y = fd.ops.matmul(a, b)
        fd.add_output(y)
    y.outer_split(0, 2)
    y.axis(0).parallelize(STREAM)
    a0, b0 = torch.randn(3, device=device), torch.randn(3, 5, device=device)
    torch.testing.assert_close(fd.execute([a0, b0])[0], a0 @ b0, **TOL)


@pytest.mark.parametrize("k", [0, 3])
def test_vector_times_batched_matrix_into_a_strided_stream_chunk(device: str, k: int) -> None:
    """Found by the fuzzer: ``matmul([k], [b, k, n])`` by column chunks (strided views of the output)
    raised torch's size mismatch: torch unsqueezes the vector and views its result into ``out``."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1])
        b = fd.define_tensor([-1, -1, -1])
        y = fd.ops.matmul(a, b)
        fd.add_output(y)
    y.outer_split(1, 2)
    y.axis(1).parallelize(STREAM)
    a0, b0 = torch.randn(k, device=device), torch.randn(2, k, 3, device=device)
    torch.testing.assert_close(fd.execute([a0, b0])[0], a0 @ b0, **TOL)


# --- 5. linear's bias from a reduction ----------------------------------------------------------------------
def test_linear_bias_from_a_reduction() -> None:
    with FusionDefinition() as fd:
        x, w, b = fd.define_tensor([-1, 5]), fd.define_tensor([3, 5]), fd.define_tensor([4, 3])
        fd.add_output(fd.ops.linear(x, w, fd.ops.sum(b, [0])))
    x0, w0, b0 = torch.randn(2, 5), torch.randn(3, 5), torch.randn(4, 3)
    torch.testing.assert_close(fd.execute([x0, w0, b0])[0], F.linear(x0, w0, b0.sum(0)))


def test_linear_bias_from_a_reduction_of_the_wrong_extent_is_rejected() -> None:
    with FusionDefinition() as fd:
        x, w, b = fd.define_tensor([-1, 5]), fd.define_tensor([3, 5]), fd.define_tensor([3, 4])
        with pytest.raises(ValueError, match=r"linear: T3 axis 0 has extent 4 but T1 axis 0 has extent 3"):
            fd.ops.linear(x, w, fd.ops.sum(b, [0]))


# --- 6. empty and size-1 axes impose nothing on strides ------------------------------------------------------
@pytest.mark.parametrize(("make", "stride_order"), [
    pytest.param(lambda: torch.zeros(5, 0, 1) / 4, None, id="strides-0-1-0"),
    pytest.param(lambda: torch.empty_strided((0, 3, 2), (7, 5, 3)), None, id="arbitrary-strides"),
    pytest.param(lambda: (torch.zeros(3, 0, 2) / 4).permute(2, 1, 0), [0, 1, 2], id="permuted"),
    pytest.param(lambda: (torch.zeros(3, 0, 2) / 4), [0, 1, 2], id="declared-permuted-given-plain"),
])
def test_empty_inputs_meet_any_declared_layout(make: Callable[[], torch.Tensor], stride_order: list[int] | None) -> None:
    x0 = make()
    assert x0.is_contiguous() or stride_order is not None
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1] * x0.dim(), contiguity=True, stride_order=stride_order)
        fd.add_output(fd.ops.div(x, 4.0))
    (out,) = fd.execute([x0])
    assert out.shape == x0.shape


def test_from_pytorch_of_an_empty_tensor_declares_the_plain_layout() -> None:
    x0 = (torch.zeros(3, 0, 2) / 4).permute(2, 1, 0)
    with FusionDefinition() as fd:
        x = fd.from_pytorch(x0)
        fd.add_output(fd.ops.neg(x))
    assert not x.has_allocation_domain() and x.contiguity == [True, True, True]
    assert fd.execute([torch.zeros(2, 0, 3)])[0].shape == (2, 0, 3)


def test_from_pytorch_of_a_permuted_tensor_with_an_expanded_axis() -> None:
    """Found by the fuzzer: the stride order from_pytorch declared (the stride-0 axis at its logical
    place) was then rejected by the input's own stride-order check."""
    x0 = torch.randn(4, 3, 6, 1).permute(1, 3, 0, 2).expand(3, 3, 4, 6)  # strides (6, 0, 18, 1)
    with FusionDefinition() as fd:
        x = fd.from_pytorch(x0)
        fd.add_output(fd.ops.neg(x))
    torch.testing.assert_close(fd.execute([x0])[0], -x0)
    with pytest.raises(ValueError, match=r"input 0 \(T0\) axis 0: stride 6 is larger than axis 2's stride 1"):
        fd.execute([torch.randn(200).as_strided((3, 3, 4, 6), (6, 0, 1, 18))])  # axis 2 innermost: not as declared


def test_size_one_axes_still_impose_nothing_and_others_still_are_checked() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=True)
        fd.add_output(fd.ops.neg(x))
    fd.execute([torch.randn(1, 8)[:, ::1].as_strided((1, 4), (100, 1))])
    with pytest.raises(ValueError, match=r"input 0 \(T0\) axis 1: declared contiguous, so its stride must be 1, "
                                         r"but got stride 2"):
        fd.execute([torch.randn(3, 8)[:, ::2]])


# --- 7. raw torch / Python errors become ValueError / TypeError naming what is wrong --------------------------
def _one_input(build: Callable[[FusionDefinition, Any], Any], shape: list[int] | None = None,
               dtype: DataType = DataType.Float) -> FusionDefinition:
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape or [-1, -1], dtype=dtype)
        build(fd, x)
    return fd


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_over_an_empty_axis(op: str) -> None:
    fd = _one_input(lambda fd, x: fd.add_output(getattr(fd.ops, op)(x, [1])))
    with pytest.raises(ValueError, match=rf"{op}: T0 axis 1 has size 0; the {op} of an empty axis is undefined"):
        fd.execute([torch.randn(3, 0)])
    assert fd.execute([torch.randn(0, 3)])[0].shape == (0,)  # an empty kept axis is fine, as in torch


def test_pad_cropping_an_empty_axis() -> None:
    fd = _one_input(lambda fd, x: fd.add_output(fd.ops.pad(x, [-1, 0])))
    with pytest.raises(ValueError, match=re.escape("pad T1 (of T0 with widths [-1, 0]): axis 1 has size 0; widths -1, "
                                                   "0 would crop 1 elements more than it has")):
        fd.execute([torch.randn(3, 0)])
    torch.testing.assert_close(fd.execute([x := torch.randn(3, 2)])[0], x[:, 1:])


def test_pad_cropping_more_than_an_axis_holds_then_padding() -> None:
    """Found by the fuzzer: ``pad(x[0], [-1, 2])`` ends with one element, but torch crops first and raised
    a raw ``narrow()`` error."""
    fd = _one_input(lambda fd, x: fd.add_output(fd.ops.pad(x, [-1, 2], -2.0)), [-1])
    with pytest.raises(ValueError, match=re.escape("pad T1 (of T0 with widths [-1, 2]): axis 0 has size 0; widths -1, "
                                                   "2 would crop 1 elements more than it has")):
        fd.execute([torch.randn(0)])
    torch.testing.assert_close(fd.execute([x := torch.randn(2)])[0], F.pad(x, [-1, 2], value=-2.0))


@pytest.mark.parametrize("op", ["div", "fmod", "mod", "remainder"])
@pytest.mark.parametrize("divisor", ["number", "tensor"])
def test_integer_division_by_zero(divisor: str, op: str) -> None:
    """A quotient or a remainder of integers by 0 (torch raises): a ValueError naming the operands, with
    generated kernels on too (a divisor that may be 0 keeps the op an ATen call)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=DataType.Int)
        y = fd.define_tensor([-1], dtype=DataType.Int) if divisor == "tensor" else 0
        fd.add_output(getattr(fd.ops, op)(x, y))
    inputs = [torch.arange(3)] + ([torch.tensor([1, 0, 2])] if divisor == "tensor" else [])
    other = "T1" if divisor == "tensor" else r"int64_t\(0\)"
    for options in ([], ["triton_interpreter"]):
        with pytest.raises(ValueError, match=rf"{op}: on the integer operands T0 and {other}, a divisor is 0"):
            fd.execute(inputs, _enable_options=options)


def test_integer_power_with_a_negative_exponent() -> None:
    fd = _one_input(lambda fd, x: fd.add_output(fd.ops.pow(x, -1)), [-1], DataType.Int)
    with pytest.raises(ValueError, match=r"pow: on the integer operands T0 and int64_t\(-1\), an exponent is negative"):
        fd.execute([torch.arange(1, 4)])


def test_scalar_integer_division_is_exact() -> None:
    """Scalar-only ``div`` truncated through a double (``int(a / b)``)."""
    with FusionDefinition() as fd:
        a, b = fd.define_scalar(dtype=DataType.Int), fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.div(a, b))
    big = 2**62 + 1
    assert fd.execute([big, 1])[0].item() == big
    assert fd.execute([-7, 2])[0].item() == -3
    with pytest.raises(ValueError, match=r"div: on the integer operands i0 and i1, a divisor is 0"):
        fd.execute([1, 0])


@pytest.mark.parametrize(("dtype", "value", "pattern"), [
    (DataType.Int, 2**70, r"input 1 \(i1\): 1180591620717411303424 does not fit int64_t"),
    (DataType.Int, -(2**63) - 1, r"input 1 \(i1\): -9223372036854775809 does not fit int64_t"),
    (DataType.Int32, 2**31, r"input 1 \(i1\): 2147483648 does not fit int \(valid: -2147483648..2147483647\)"),
    (DataType.Double, 10**400, r"input 1 \(d1\): 1000000000.* does not fit double"),
])
def test_input_scalar_out_of_range(dtype: DataType, value: int, pattern: str) -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=DataType.Int if dtype.is_integral else DataType.Double)
        s = fd.define_scalar(dtype=dtype)
        fd.add_output(fd.ops.add(x, s))
    x0 = torch.arange(3) if dtype.is_integral else torch.randn(3, dtype=torch.float64)
    fd.execute([x0, 5])  # a valid value first: the signature is cached, the value is checked anyway
    with pytest.raises(ValueError, match=pattern):
        fd.execute([x0, value])


def test_constant_scalars_out_of_range() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=DataType.Int)
        with pytest.raises(ValueError, match=r"add operand 1: 1180591620717411303424 does not fit int64_t"):
            fd.ops.add(x, 2**70)
        with pytest.raises(ValueError, match=r"define_scalar: 1180591620717411303424 does not fit int64_t"):
            fd.define_scalar(2**70)
        with pytest.raises(ValueError, match=r"define_scalar: 2147483648 does not fit int"):
            fd.define_scalar(2**31, dtype=DataType.Int32)
        with pytest.raises(ValueError, match=r"full shape\[0\]: 9223372036854775808 does not fit int64_t"):
            fd.ops.full([2**63], 1.0, DataType.Float)


@pytest.mark.parametrize(("build", "inputs", "pattern"), [
    (lambda fd, s: fd.add_output(fd.ops.full([s, s], 1.0, DataType.Float)), [2**40],
     r"full T0: sizes \[1099511627776, 1099511627776\] overflow: the byte size exceeds 2\*\*63 - 1"),
    (lambda fd, s: fd.add_output(fd.ops.iota(s)), [2**62], r"iota T0: sizes \[4611686018427387904\] overflow"),
    (lambda fd, s: fd.add_output(fd.ops.pad(fd.ops.full([2, 2], 0.0, DataType.Float), [s, s, s, 0])), [2**40],
     r"pad T1 \(of T0 with widths \[1099511627776, 1099511627776, 1099511627776, 0\]\): sizes .* overflow"),
    (lambda fd, s: fd.add_output(fd.ops.expand(fd.ops.full([1, 1], 0.0, DataType.Float), [s, s])), [2**40],
     r"expand T1: sizes \[1099511627776, 1099511627776\] overflow: the element count exceeds"),
])
def test_sizes_that_overflow(build: Callable[[FusionDefinition, Any], Any], inputs: list[int], pattern: str) -> None:
    with FusionDefinition() as fd:
        build(fd, fd.define_scalar(dtype=DataType.Int))
    with pytest.raises(ValueError, match=pattern):
        fd.execute(inputs)


def test_allocation_of_a_stream_loop_output_that_overflows() -> None:
    with FusionDefinition() as fd:
        s = fd.define_scalar(dtype=DataType.Int)
        y = fd.ops.full([s, s], 1.0, DataType.Float)
        fd.add_output(y)
    y.outer_split(0, 2)
    y.axis(0).parallelize(STREAM)
    with pytest.raises(ValueError, match=r"allocating T0: sizes \[1099511627776, 1099511627776\] overflow"):
        fd.execute([2**40])


def _add_one() -> FusionDefinition:
    return _one_input(lambda fd, x: fd.add_output(fd.ops.add(x, 1.0)))


@pytest.mark.parametrize(("inputs", "kwargs", "error", "pattern"), [
    ([torch.randn(2, 2)], {"device": "nonsense"}, ValueError, r"execute\(device='nonsense'\) is not a device"),
    ([torch.randn(2, 2)], {"device": -1}, ValueError, r"execute\(device=-1\) is not a device"),
    ([torch.randn(2, 2)], {"device": "meta"}, ValueError, r"execute\(device='meta'\): pyfuser runs on CPU or CUDA"),
    ([torch.randn(2, 2)], {"device": 1.5}, TypeError, r"execute\(device=1.5\): expected a torch.device"),
    ([torch.randn(2, 2, device="meta")], {}, ValueError, r"input 0 \(T0\) is on meta; pyfuser runs on CPU or CUDA"),
    ([torch.randn(2, 2).to_sparse()], {}, ValueError, r"input 0 \(T0\): expected a dense \(strided\) tensor, got "
                                                       r"layout torch.sparse_coo"),
    (None, {}, TypeError, r"execute: inputs must be a list of tensors and scalars, got NoneType"),
    (torch.randn(3, 2), {}, TypeError, r"got one torch.Tensor; pass \[tensor\] for a single input"),
    ("ab", {}, TypeError, r"execute: inputs must be a list of tensors and scalars, got str"),
])
def test_bad_execute_arguments(inputs: Any, kwargs: dict[str, Any], error: type[Exception], pattern: str) -> None:
    fd = _add_one()
    with pytest.raises(error, match=pattern):
        fd.execute(inputs, **kwargs)
    torch.testing.assert_close(fd.execute([x := torch.randn(2, 2)])[0], x + 1.0)


@pytest.mark.parametrize(("call", "error", "pattern"), [
    (lambda fd: fd.define_tensor([-1, -1], stride_order=5), TypeError,
     r"define_tensor T0: stride_order must be a list of ints, got 5"),
    (lambda fd: fd.add_output(fd.ops.neg(fd.define_tensor([-1, -1])), stride_order=5), TypeError,
     r"add_output T1: stride_order must be a list of ints, got 5"),
    (lambda fd: fd.define_tensor([2**63]), ValueError,
     r"define_tensor T0: shape\[0\] must be -1 \(symbolic\), 1 \(broadcast\) or a non-negative size below 2\*\*63"),
    (lambda fd: fd.define_tensor(3), TypeError, r"define_tensor T0: shape must be a list of ints, got 3"),
    (lambda fd: fd.define_tensor([-1], contiguity=1), TypeError,
     r"define_tensor T0: contiguity must be a bool, None or a list of them, got 1"),
    (lambda fd: fd.ops.mean(fd.define_tensor([-1]), [0], dtype=DataType.Int), TypeError,
     r"mean: dtype=int64_t was requested for T0; mean needs a floating-point or complex dtype"),
    (lambda fd: fd.ops.mean(fd.define_tensor([-1], dtype=DataType.Int), [0]), TypeError,
     r"mean: T0 has dtype int64_t; mean needs a floating-point dtype"),
])
def test_bad_definitions(call: Callable[[FusionDefinition], Any], error: type[Exception], pattern: str) -> None:
    with FusionDefinition() as fd:
        with pytest.raises(error, match=pattern):
            call(fd)


# --- the executor's signature cache is bounded ----------------------------------------------------------------
def test_signature_cache_is_bounded_and_layouts_compile_once() -> None:
    fd = _add_one()
    executor = fd.fec
    for rows in range(2, 2002):
        fd.execute([torch.randn(rows, 2)])
    assert len(executor._by_signature) == 256
    assert executor.compile_count == 1
    recent = torch.randn(2001, 2)
    fd.execute([recent])  # the most recent signature is still cached (least recently used go first)
    assert len(executor._by_signature) == 256 and executor.compile_count == 1
    torch.testing.assert_close(fd.execute([recent])[0], recent + 1.0)
