"""Bad input: a ValueError / TypeError naming the tensor, the axis and what was expected; nothing runs,
and the definition stays usable afterwards."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from pyfuser import DataType, FusionDefinition, ParallelType, TensorView
from pyfuser.frontend.fusion_definition import ClosedDefinitionError, IgnoredScheduleWarning
from pyfuser.multidevice import DeviceMesh


def pointwise_fd() -> FusionDefinition:
    """``T2 = T0[i0, i1] * T1[i2]`` with T1 broadcast over rows."""
    with FusionDefinition() as fd:
        t0, t1 = fd.define_tensor([-1, -1], contiguity=True), fd.define_tensor([-1], contiguity=True)
        fd.add_output(fd.ops.mul(t0, t1))
    return fd


def assert_still_usable(fd: FusionDefinition) -> None:
    x, y = torch.randn(3, 4), torch.randn(4)
    (out,) = fd.execute([x, y])
    torch.testing.assert_close(out, x * y)


# --- execution-time input checks ------------------------------------------------------------------
@pytest.mark.parametrize(("make_inputs", "error", "pattern"), [
    (lambda: [torch.randn(3, 4)], ValueError, r"expected 2 inputs \(T0, T1\), got 1"),
    (lambda: [torch.randn(3, 4), torch.randn(4), torch.randn(4)], ValueError, r"expected 2 inputs \(T0, T1\), got 3"),
    (lambda: [torch.randn(3, 4).half(), torch.randn(4)], ValueError, r"input 0 \(T0\): expected dtype torch.float32, "
                                                                     r"got torch.float16"),
    (lambda: [torch.randn(3, 4), torch.randn(1, 4)], ValueError, r"input 1 \(T1\): expected rank 1, got rank 2"),
    (lambda: [torch.randn(3, 4), 2.0], TypeError, r"input 1 \(T1\) must be a torch.Tensor, got float"),
    (lambda: [torch.randn(4, 3).t(), torch.randn(4)], ValueError,
     r"input 0 \(T0\) axis \d: declared contiguous, so its stride must be"),
    (lambda: [torch.randn(3, 8)[:, ::2], torch.randn(4)], ValueError,
     r"input 0 \(T0\) axis 1: declared contiguous, so its stride must be 1, but got stride 2"),
])
def test_bad_execute_inputs(make_inputs: Callable[[], list[Any]], error: type[Exception], pattern: str) -> None:
    fd = pointwise_fd()
    assert_still_usable(fd)  # also with a compiled program already cached
    with pytest.raises(error, match=pattern):
        fd.execute(make_inputs())
    assert_still_usable(fd)


def test_incompatible_symbolic_sizes_at_run_time() -> None:
    fd = pointwise_fd()
    with pytest.raises(ValueError, match=r"mul: T0 axis 1 has size 4 but T1 axis 0 has size 5; they must be equal"):
        fd.execute([torch.randn(3, 4), torch.randn(5)])
    with pytest.raises(ValueError, match=r"mul: T0 axis 1 has size 4 but T1 axis 0 has size 1"):
        fd.execute([torch.randn(3, 4), torch.randn(1)])  # not declared broadcast: no silent broadcasting
    assert_still_usable(fd)


def test_incompatible_static_broadcast_shapes_at_definition() -> None:
    with FusionDefinition() as fd:
        a, b = fd.define_tensor([3, 4]), fd.define_tensor([5])
        with pytest.raises(ValueError, match=r"add: incompatible broadcast shapes: T0 axis 1 has extent 4 "
                                             r"but T1 axis 0 \(output axis 1\) has extent 5"):
            fd.ops.add(a, b)
        positive = fd.ops.gt(a, 0.0)
        counters = dict(fd.fusion._counters)
        with pytest.raises(ValueError, match="incompatible broadcast shapes"):
            fd.ops.where(positive, a, b)
        with pytest.raises(ValueError, match="incompatible broadcast shapes"):
            fd.ops.add(fd.ops.broadcast_in_dim(b, [2, 5], [1]), a)
        assert [len(t.uses) for t in (a, b)] == [1, 1], "rejected ops leave no dangling expressions"
        assert fd.fusion._counters["expr"] == counters["expr"] + 2, "only the two broadcasts were created"
        fd.add_output(fd.ops.add(a, fd.define_tensor([4])))
    (out,) = fd.execute([torch.ones(3, 4), torch.ones(5), torch.ones(4)])
    assert out.shape == (3, 4)


def test_static_size_mismatch() -> None:
    with FusionDefinition() as fd:
        t = fd.define_tensor([2, -1, 1])
        fd.add_output(fd.ops.neg(t))
    with pytest.raises(ValueError, match=r"input 0 \(T0\) axis 0: expected static size 2, got size 3"):
        fd.execute([torch.randn(3, 4, 1)])
    with pytest.raises(ValueError, match=r"input 0 \(T0\) axis 2: expected a broadcast axis of size 1, got size 5"):
        fd.execute([torch.randn(2, 4, 5)])
    torch.testing.assert_close(fd.execute([torch.ones(2, 4, 1)])[0], -torch.ones(2, 4, 1))


def test_strides_violating_stride_order() -> None:
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1, -1], contiguity=False, stride_order=[0, 2, 1])  # axis 1 outermost
        fd.add_output(fd.ops.abs(t))
    good = torch.randn(5, 4, 3).permute(2, 0, 1)  # sizes [3, 5, 4]; axis 1 outermost, axis 0 innermost
    with pytest.raises(ValueError, match=r"input 0 \(T0\) axis \d: stride \d+ is larger than axis \d's stride"):
        fd.execute([torch.randn(3, 5, 4)])
    torch.testing.assert_close(fd.execute([good])[0], good.abs())


def test_wrong_scalar_input() -> None:
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1])
        s = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.mul(t, s))
    with pytest.raises(TypeError, match=r"input 1 \(i\w+\): expected a int64_t scalar, got 2.5"):
        fd.execute([torch.ones(2), 2.5])
    torch.testing.assert_close(fd.execute([torch.ones(2), 3])[0], torch.full((2,), 3.0))


def test_execute_without_outputs() -> None:
    with FusionDefinition() as fd:
        fd.define_tensor([-1])
    with pytest.raises(ValueError, match="no outputs"):
        fd.execute([torch.ones(2)])


# --- definition-time checks -------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "pattern"), [
    ({"stride_order": [0, 0]}, r"T0: stride_order \[0, 0\] is not a permutation of 0..1"),
    ({"stride_order": [1, 2]}, r"T0: stride_order \[1, 2\] is not a permutation"),
    ({"stride_order": [1, 0, 2]}, r"T0: stride_order \[1, 0, 2\] has 3 entries but the tensor has rank 2"),
    ({"contiguity": [True]}, r"T0: contiguity \[True\] has 1 entries but shape \[-1, -1\] has rank 2"),
    ({"contiguity": [1, True]}, r"T0: contiguity entries must be True, False or None \(expanded\), got 1"),
])
def test_bad_define_tensor(kwargs: dict[str, Any], pattern: str) -> None:
    with FusionDefinition() as fd:
        with pytest.raises(ValueError, match=pattern):
            fd.define_tensor([-1, -1], **kwargs)
        t0 = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.neg(t0))
    assert str(t0) == "T0_g_float[iS0{i0}, iS1{i1}]", "a rejected definition leaves no trace"
    torch.testing.assert_close(fd.execute([torch.ones(2, 2)])[0], -torch.ones(2, 2))


def test_bad_define_tensor_shape_and_dtype() -> None:
    with FusionDefinition() as fd:
        with pytest.raises(ValueError, match=r"T0: shape\[1\] must be -1 \(symbolic\), 1 \(broadcast\) or a"):
            fd.define_tensor([2, -3])
        with pytest.raises(TypeError, match="DataType"):
            fd.define_tensor([2], dtype="float")  # type: ignore[arg-type]


def test_bad_output_stride_order() -> None:
    with FusionDefinition() as fd:
        t = fd.ops.neg(fd.define_tensor([-1, -1]))
        with pytest.raises(ValueError, match=r"add_output T1: stride_order \[2, 0\] is not a permutation"):
            fd.add_output(t, stride_order=[2, 0])
        fd.add_output(t, stride_order=[0, 1])
    (out,) = fd.execute([torch.ones(2, 3)])
    assert out.stride() == (1, 2)


@pytest.mark.parametrize(("call", "pattern"), [
    (lambda fd, t: fd.ops.sum(t, [2]), r"T0: sum dims entry 2 is out of range for rank 2 \(valid: -2..1\)"),
    (lambda fd, t: fd.ops.var(t, [-3]), r"T0: var_mean dims entry -3 is out of range for rank 2"),
    (lambda fd, t: fd.ops.permute(t, [0, 2]), r"T0: permute dims entry 2 is out of range"),
    (lambda fd, t: fd.ops.permute(t, [0, 0]), r"permute: dims \[0, 0\] is not a permutation of T0's 2 axes"),
    (lambda fd, t: fd.ops.squeeze(t, [1]), r"squeeze: T0 axis 1 has extent 4; only size-1 axes can be squeezed"),
    (lambda fd, t: fd.ops.cat([t, t], 2), r"T0: cat dim entry 2 is out of range"),
    (lambda fd, t: fd.ops.broadcast(t, [True, False]), r"broadcast: T0 has rank 2 but is_broadcast_dim"),
    (lambda fd, t: fd.ops.reshape(t, [5, -1]), r"reshape: cannot reshape T0 of 12 elements into \[5, -1\]"),
    (lambda fd, t: fd.ops.reshape(t, [-1, -1]), r"reshape: new_shape \[-1, -1\] for T0 has more than one -1"),
    (lambda fd, t: fd.ops.expand(t, [3, 8]), r"expand: T0 axis 1 has extent 4 and is not a broadcast axis"),
    (lambda fd, t: fd.ops.matmul(t, t), r"matmul: T0 axis 1 has extent 4 but T0 axis 0 has extent 3"),
    (lambda fd, t: fd.ops.slice(t, [0], [1]), r"slice: T0 has rank 2 but start_indices has 1 entries"),
    (lambda fd, t: fd.ops.slice(t, [0, 0], [1, 1], [1, 0]), r"slice: T0 axis 1: stride must be a positive int"),
    (lambda fd, t: fd.ops.pad(t, [1, 1, 1, 1, 1, 1]), r"pad: pad_widths .* at most 4 for T0 of rank 2"),
    (lambda fd, t: fd.ops.gelu(t, approximate="erf"), r"gelu: approximate must be 'none' or 'tanh'"),
    (lambda fd, t: fd.ops.mean(fd.ops.cast(t, DataType.Int), [0]), r"mean: T\d+ has dtype int64_t"),
    (lambda fd, t: fd.ops.add(t, "x"), r"add operand 1: expected a tensor, scalar or Python number, got str"),
])
def test_bad_op_arguments(call: Callable[[FusionDefinition, Any], Any], pattern: str) -> None:
    with FusionDefinition() as fd:
        t = fd.define_tensor([3, 4])
        with pytest.raises((ValueError, TypeError), match=pattern):
            call(fd, t)
        fd.add_output(fd.ops.mul(t, 2.0))
    torch.testing.assert_close(fd.execute([torch.ones(3, 4)])[0], torch.full((3, 4), 2.0))


def test_tensor_from_another_fusion_definition() -> None:
    with FusionDefinition() as fd1:
        a = fd1.define_tensor([-1])
        fd1.add_output(fd1.ops.neg(a))
    with FusionDefinition() as fd2:
        b = fd2.define_tensor([-1])
        with pytest.raises(ValueError, match=r"add operand 0: T0_g_float\[iS0\{i0\}\] belongs to another "
                                             "FusionDefinition"):
            fd2.ops.add(a, b)
        with pytest.raises(ValueError, match="T0 belongs to another FusionDefinition"):
            fd2.add_output(a)
        with pytest.raises(ValueError, match="another FusionDefinition"):
            fd2.ops.cat([b, a], 0)
        fd2.add_output(fd2.ops.exp(b))
    torch.testing.assert_close(fd2.execute([torch.zeros(2)])[0], torch.ones(2))
    torch.testing.assert_close(fd1.execute([torch.ones(2)])[0], -torch.ones(2))


# --- schedule checks ---------------------------------------------------------------------------------
def scheduled_fd() -> tuple[FusionDefinition, Any]:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        t1 = fd.ops.sum(fd.ops.exp(t0), [1])
        fd.add_output(t1)
    return fd, t1


def assert_schedule_usable(fd: FusionDefinition) -> None:
    x = torch.randn(5, 6)
    torch.testing.assert_close(fd.execute([x])[0], x.exp().sum(1))


@pytest.mark.parametrize(("call", "error", "pattern"), [
    (lambda t: t.split(2, 4), ValueError, r"T2: axis 2 is out of range for a loop domain of 2 IDs \(valid: -2..1\)"),
    (lambda t: t.axis(-3), ValueError, r"T2: axis -3 is out of range"),
    (lambda t: t.split(0, 0), ValueError, r"T2 axis 0: split factor must be positive, got 0"),
    (lambda t: t.outer_split(1, -2), ValueError, r"T2 axis 1: split factor must be positive, got -2"),
    (lambda t: t.split(0, 2.5), TypeError, r"T2 axis 0: split factor must be a positive int, got float"),
    (lambda t: t.merge(0), ValueError, r"T2: cannot merge reduction ID rS\d+\{i1\} with iteration ID iS\d+\{i0\}"),
    (lambda t: t.merge(1), ValueError, r"T2: cannot merge axis 1 with the next axis: it is the last loop ID"),
    (lambda t: t.merge(0, 0), ValueError, r"T2: cannot merge axis 0 with itself"),
    (lambda t: t.reorder({0: 1, 1: 1}), ValueError, r"T2: reorder \{0: 1, 1: 1\} sends two axes to the same"),
    (lambda t: t.reorder({3: 0}), ValueError, r"T2: reorder source 3 is out of range"),
    (lambda t: t.axis(1).parallelize(ParallelType.stream), ValueError,
     r"T2 axis 1 \(rS\d+\{i1\}\) is a reduction ID and cannot be parallelized on stream"),
    (lambda t: t.axis(0).parallelize("stream"), TypeError, r"parallelize expects a ParallelType, got str"),
    (lambda t: t.set_allocation_domain([t.get_logical_domain()[0]], True), ValueError,
     r"T2 allocation domain does not cover logical IDs rS\d+\{i1\}"),
    (lambda t: t.set_memory_type("shared"), TypeError, r"T2: expected a MemoryType, got str"),
])
def test_bad_schedule(call: Callable[[Any], Any], error: type[Exception], pattern: str) -> None:
    fd, t1 = scheduled_fd()
    loop_before = t1.get_loop_domain()
    with pytest.raises(error, match=pattern):
        call(t1)
    assert t1.get_loop_domain() == loop_before, "a rejected schedule call changes nothing"
    assert_schedule_usable(fd)


def test_same_parallel_type_twice() -> None:
    fd, t1 = scheduled_fd()
    t1.split(0, 2)
    t1.axis(0).parallelize(ParallelType.grid_x)
    with pytest.raises(ValueError, match=r"T2 axis 1 cannot be parallelized on grid_x: axis 0 \(iblockIdx.x\d+\{"):
        t1.axis(1).parallelize(ParallelType.grid_x)
    assert t1.axis(1).parallel_type is ParallelType.serial
    with pytest.warns(IgnoredScheduleWarning, match=r"T2 axis 0 \(grid_x\)"):  # fd.execute schedules itself
        assert_schedule_usable(fd)


def test_allocation_domain_must_cover_logical() -> None:
    fd, t1 = scheduled_fd()
    t1.split(0, 2)
    outer, inner, red = t1.get_loop_domain()
    with pytest.raises(ValueError, match=r"T2 allocation domain .*split/merge partners are missing"):
        t1.set_allocation_domain([outer, red], True)
    with pytest.raises(ValueError, match=r"T2 allocation domain lists iS\d+\{2\} twice"):
        t1.set_allocation_domain([outer, inner, inner, red], True)
    with pytest.raises(ValueError, match=r"T2: contiguity \[True\] has 1 entries but the allocation domain has 2"):
        t1.set_allocation_domain([outer, inner, red], [True])
    assert not t1.has_allocation_domain()
    with FusionDefinition() as other:
        stranger = other.define_tensor([-1])
    with pytest.raises(ValueError, match=r"T2 allocation domain contains iS0\{i0\}, which is not derived from the "
                                         "logical domain"):
        t1.set_allocation_domain([stranger.axis(0), red], True)
    assert_schedule_usable(fd)


def test_merge_of_broadcast_with_reduction_is_allowed() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, 1, -1])
        t1 = fd.ops.sum(t0, [2])
        fd.add_output(t1)
    t1.merge(1)  # broadcast (b) with reduction (r): a reduction ID
    assert t1.axis(1).is_reduction()
    x = torch.randn(3, 1, 4)
    torch.testing.assert_close(fd.execute([x])[0], x.sum(2))


# --- runtime size checks beyond pointwise -----------------------------------------------------------------
@pytest.mark.parametrize(("build", "inputs", "pattern"), [
    (lambda fd, a, b: fd.ops.matmul(a, b), [torch.randn(2, 3), torch.randn(4, 5)],
     r"matmul: T0 axis 1 has size 3 but T1 axis 0 has size 4"),
    (lambda fd, a, b: fd.ops.linear(a, b), [torch.randn(2, 3), torch.randn(5, 4)],
     r"linear: T0 axis 1 has size 3 but T1 axis 1 has size 4"),
    (lambda fd, a, b: fd.ops.cat([a, b], 0), [torch.randn(2, 3), torch.randn(2, 4)],
     r"cat: T1 axis 1 has size 4 but T0 axis 1 has size 3"),
])
def test_incompatible_symbolic_sizes_of_other_ops(build: Callable[..., Any], inputs: list[torch.Tensor],
                                                  pattern: str) -> None:
    with FusionDefinition() as fd:
        a, b = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        fd.add_output(build(fd, a, b))
    with pytest.raises(ValueError, match=pattern):
        fd.execute(inputs)


def test_sizes_and_split_factors_must_be_known_before_execution() -> None:
    with FusionDefinition() as other:
        foreign = other.define_scalar(dtype=DataType.Int)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1])
        n = fd.define_scalar(dtype=DataType.Int)
        doubled = fd.ops.mul(n, 2)  # size arithmetic: known before the fusion runs
        fd.ops.full([doubled], 1.0, DataType.Float)
        powered = fd.ops.pow(n, 2)  # other arithmetic of integer inputs: known on the host too (nvFuser's)
        fd.ops.full([powered], 1.0, DataType.Float)
        scaled = fd.ops.cast(fd.ops.mul(fd.define_scalar(dtype=DataType.Double), 2.0), DataType.Int)
        with pytest.raises(ValueError, match=r"full shape\[0\]: i\w+ must be a constant, an input scalar"):
            fd.ops.full([scaled], 1.0, DataType.Float)
        with pytest.raises(ValueError, match=r"full shape\[0\]: i\w+ belongs to another FusionDefinition"):
            fd.ops.full([foreign], 1.0, DataType.Float)
        with pytest.raises(TypeError, match=r"scalar double\(2.0\) of type double cannot be used as a size"):
            fd.ops.full([fd.define_scalar(2.0)], 1.0, DataType.Float)
        out = fd.ops.exp(t)
        fd.add_output(out)
    with pytest.raises(ValueError, match=r"T3 axis 0: split factor i\w+ must be a constant or an input scalar"):
        out.split(0, powered)
    with pytest.raises(ValueError, match=r"T3 axis 0: split factor i\w+ belongs to another FusionDefinition"):
        out.split(0, foreign)
    out.split(0, n)
    x = torch.randn(7)
    torch.testing.assert_close(fd.execute([x, 3, 1.5])[0], x.exp())


def test_reshape_of_symbolic_sizes_checked_at_run_time() -> None:
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.reshape(t, [5, -1]))
    with pytest.raises(ValueError, match=r"reshape: T0 has 12 elements \(shape \[3, 4\]\) and cannot be reshaped to "
                                         r"\[5, 2\]"):
        fd.execute([torch.randn(3, 4)])
    x = torch.randn(5, 4)
    torch.testing.assert_close(fd.execute([x])[0], x.reshape(5, -1))


def test_squeeze_of_a_symbolic_axis_checked_at_run_time() -> None:
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.squeeze(t, [0]))
    with pytest.raises(ValueError, match=r"squeeze: T0 axis 0 has size 3; only size-1 axes can be squeezed"):
        fd.execute([torch.randn(3, 4)])
    x = torch.randn(1, 4)
    torch.testing.assert_close(fd.execute([x])[0], x[0])


def test_split_factor_from_an_input_scalar_must_be_positive_at_run_time() -> None:
    """A non-positive factor bound at execution is a clear error (it was a ZeroDivisionError),
    checked on every run since scalar values are not part of the cached signature."""
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1])
        n = fd.define_scalar(dtype=DataType.Int)
        out = fd.ops.exp(t)
        fd.add_output(out)
    out.split(0, n)
    out.axis(0).parallelize(ParallelType.stream)
    x = torch.randn(4, 5)
    torch.testing.assert_close(fd.execute([x, 3])[0], x.exp())
    for bad in (0, -2):
        with pytest.raises(ValueError, match=rf"input 1 \(i\d+\) is used as T1 axis 0 split factor and must be at "
                                             rf"least 1, got {bad}"):
            fd.execute([x, bad])


def test_reshape_with_minus_one_next_to_a_zero_size() -> None:
    """torch rejects ``reshape(0, -1)`` as ambiguous; it was a ZeroDivisionError here."""
    with FusionDefinition() as fd, pytest.raises(ValueError, match=r"reshape: new_shape \[0, -1\] for T0 .* ambiguous"):
        fd.ops.reshape(fd.define_tensor([-1, -1]), [0, -1])
    with FusionDefinition() as fd:
        n = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.reshape(fd.define_tensor([-1, -1]), [n, -1]))
    x = torch.randn(2, 3)
    torch.testing.assert_close(fd.execute([2, x])[0], x.reshape(2, -1))
    with pytest.raises(ValueError, match=r"reshape: cannot reshape T0 \(shape \[0, 3\]\) .* ambiguous"):
        fd.execute([0, torch.randn(0, 3)])


@pytest.mark.parametrize("call", [
    lambda fd: fd.define_tensor([-1], dtype=DataType.Null),
    lambda fd: fd.define_scalar(dtype=DataType.Null),
    lambda fd: fd.ops.cast(fd.define_tensor([-1]), DataType.Null),
    lambda fd: fd.ops.full([2], 1.0, DataType.Null),
])
def test_null_dtype_is_rejected_where_a_concrete_dtype_is_needed(call: Callable[[FusionDefinition], Any]) -> None:
    """DataType.Null means "infer" (a reduction's dtype=); it was accepted as a tensor dtype."""
    with FusionDefinition() as fd, pytest.raises(TypeError, match=r"DataType.Null is not a tensor or scalar type"):
        call(fd)
    with FusionDefinition() as fd:  # the reductions' default still means "infer"
        fd.add_output(fd.ops.sum(fd.define_tensor([-1], dtype=DataType.Int32), dtype=DataType.Null))
    assert fd.execute([torch.arange(4, dtype=torch.int32)])[0].dtype == torch.int64


@pytest.mark.parametrize("dtype", [DataType.Bool, DataType.ComplexFloat])
def test_iota_of_a_dtype_torch_cannot_count_in(dtype: DataType) -> None:
    """Was accepted, then a NotImplementedError from torch.arange at execution."""
    with FusionDefinition() as fd, pytest.raises(TypeError, match=r"iota: dtype must be an integer or floating-point"):
        fd.ops.iota(3, dtype=dtype)


def test_iota_of_a_symbolic_extent() -> None:
    """An axis's extent without a constant value has no scalar to count to: a clear error, not int(None)."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1], contiguity=True)
        extent = t0.get_logical_domain()[0].extent
        with pytest.raises(ValueError, match=r"iota: length i\d+ is a symbolic extent; pass an int or an integer scalar"):
            fd.ops.iota(extent)
        fd.add_output(fd.ops.iota(fd.ops.size(t0, 0)))
    (out,) = fd.execute([torch.randn(5)])
    torch.testing.assert_close(out, torch.arange(5))


def test_expand_of_a_symbolic_non_broadcast_axis_checked_at_run_time() -> None:
    """``expand(t[-1, 1], [5, 4])`` returned a [3, 4] tensor for a [3, 1] input; torch raises."""
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, 1])
        n = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.expand(t, [5, 4]))
        fd.add_output(fd.ops.expand(t, [n, 2]))
    x = torch.randn(5, 1)
    fixed, sized = fd.execute([x, 5])
    torch.testing.assert_close(fixed, x.expand(5, 4))
    torch.testing.assert_close(sized, x.expand(5, 2))
    with pytest.raises(ValueError, match=r"expand: T0 axis 0 has size 3 and is not a broadcast axis; cannot expand "
                                         r"it to 5"):
        fd.execute([torch.randn(3, 1), 5])


@pytest.mark.parametrize("op", ["max", "min"])
def test_reduction_torch_cannot_do_is_rejected_even_with_dtype(op: str) -> None:
    """``max(complex, dtype=Float)`` skipped the definition-time check, then torch raised
    NotImplementedError at execution."""
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=DataType.ComplexFloat)
        with pytest.raises(TypeError, match=r"not valid for this op: .* not implemented for 'ComplexFloat'"):
            getattr(fd.ops, op)(t, [1], dtype=DataType.Float)
        with pytest.raises(TypeError, match=r"not valid for this op"):
            getattr(fd.ops, op)(t, [1])


def test_option_names_given_as_a_string() -> None:
    """A bare string was iterated letter by letter ("unknown option(s) ['_', 'a', ...]")."""
    fd = pointwise_fd()
    with pytest.raises(TypeError, match=r"_disable_options must be a list of option names, got the string "
                                        r"'infer_contiguity'; write \['infer_contiguity'\]"):
        fd.execute([torch.randn(2, 3), torch.randn(3)], _disable_options="infer_contiguity")  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda() -> None:
    """Was an AssertionError from inside torch.cuda."""
    fd = pointwise_fd()
    with pytest.raises(ValueError, match=r"execute\(device='cuda'\): CUDA is not available"):
        fd.execute([torch.randn(2, 3), torch.randn(3)], device="cuda")


def test_a_resolved_device_argument_is_remembered_but_not_for_other_values() -> None:
    """``device=`` is resolved once per value naming one device (a torch.compile region passes its
    device on every call); a bool, which hashes like an int, is still refused every time."""
    fd = pointwise_fd()
    args = [torch.randn(2, 3), torch.randn(3)]
    want = fd.execute(args)
    for device in ("cpu", torch.device("cpu"), "cpu", torch.device("cpu")):
        torch.testing.assert_close(fd.execute(args, device=device), want)
    for _ in range(2):
        with pytest.raises(TypeError, match=r"execute\(device=True\): expected a torch.device"):
            fd.execute(args, device=True)  # type: ignore[arg-type]


def test_one_output_listed_twice_with_different_stride_orders() -> None:
    """The second requirement silently replaced the first, so one listing came back wrong."""
    with FusionDefinition() as fd:
        out = fd.ops.exp(fd.define_tensor([-1, -1]))
        fd.add_output(out, stride_order=[1, 0])
        fd.add_output(out, stride_order=[1, 0])  # the same requirement twice is fine
        with pytest.raises(ValueError, match=r"add_output T1: already an output with stride_order \[1, 0\]; one "
                                             r"tensor cannot also be required in stride_order \[0, 1\]"):
            fd.add_output(out, stride_order=[0, 1])
        fd.add_output(fd.ops.set(out), stride_order=[0, 1])
    x = torch.randn(2, 3)
    rows, rows_again, cols = fd.execute([x])
    assert rows.stride() == rows_again.stride() == (3, 1) and cols.stride() == (1, 2)
    torch.testing.assert_close(cols, x.exp())


def test_scalar_inputs_are_converted_to_their_declared_type() -> None:
    """A Double scalar given ``2`` computed ``int32 * 2`` as int32 (the fusion says float); a
    complex value given to a Double or Int scalar was accepted and made the result complex."""
    with FusionDefinition() as fd:
        s = fd.define_scalar(dtype=DataType.Double)
        c = fd.define_scalar(dtype=DataType.ComplexDouble)
        t = fd.define_tensor([-1], dtype=DataType.Int32)
        fd.add_output(fd.ops.mul(t, s))
        fd.add_output(fd.ops.mul(fd.ops.cast(t, DataType.Float), c))
    x = torch.arange(3, dtype=torch.int32)
    for value in (2, 2.0, True, torch.tensor(2)):
        scaled, rotated = fd.execute([value, 2, x])
        torch.testing.assert_close(scaled, x * float(value))
        torch.testing.assert_close(rotated, x.float() * complex(2))
    for bad in (1 + 2j, torch.tensor(1 + 2j)):
        with pytest.raises(TypeError, match=r"input 0 \(d\d+\): expected a double scalar, got"):
            fd.execute([bad, 2, x])


@pytest.mark.parametrize(("value", "dtype", "error", "pattern"), [
    (2.5, DataType.Int, ValueError, r"define_scalar: 2.5 is not a int64_t value \(it would become 2\)"),
    (2, DataType.Bool, ValueError, r"define_scalar: 2 is not a bool value"),
    (1 + 2j, DataType.Double, ValueError, r"define_scalar: \(1\+2j\) is not a double value"),
    (float("nan"), DataType.Int, ValueError, r"define_scalar: nan is not a int64_t value"),
    ("a", DataType.Int, TypeError, r"define_scalar: value must be a Python number, got str"),
])
def test_constant_scalar_that_its_dtype_cannot_hold(value: Any, dtype: DataType, error: type[Exception],
                                                    pattern: str) -> None:
    """``define_scalar(2.5, dtype=Int)`` silently became 2."""
    with FusionDefinition() as fd, pytest.raises(error, match=pattern):
        fd.define_scalar(value, dtype=dtype)
    with FusionDefinition() as fd:  # exact conversions stay accepted
        assert str(fd.define_scalar(2.0, dtype=DataType.Int)) == "int64_t(2)"
        assert str(fd.define_scalar(1, dtype=DataType.Bool)) == "bool(true)"


def test_full_with_a_fill_value_its_dtype_cannot_hold() -> None:
    """A complex fill for a float tensor failed only at execution (RuntimeError inside torch.full);
    a tensor fill_value failed deep inside the op."""
    with FusionDefinition() as fd:
        with pytest.raises(ValueError, match=r"full: fill_value \(1\+2j\) cannot be stored as float"):
            fd.ops.full([2], 1 + 2j, DataType.Float)
        with pytest.raises(TypeError, match=r"full: fill_value must be a number or a scalar, got tensor T0"):
            fd.ops.full([2], fd.define_tensor([]), DataType.Float)
        fd.add_output(fd.ops.full([2], 2.5, DataType.Int))  # torch truncates, and so do we
    torch.testing.assert_close(fd.execute([torch.tensor(1.0)])[0], torch.full((2,), 2.5).long())


# --- requests pyfuser cannot honour as written: an error, or a warning saying what happens instead ---------
def test_mesh_parallel_axis_without_a_device_mesh() -> None:
    fd = pointwise_fd()
    t0 = fd.fusion.inputs()[0]
    t0.axis(0).parallelize(ParallelType.mesh_x)
    with pytest.raises(ValueError, match=r"T0 axis 0 \(ideviceIdx\.x\d+\{i0\}\) is parallelized on mesh_x but no tensor "
                                         r"of the fusion has a device mesh to shard it over; call "
                                         r"T0\.set_device_mesh\(DeviceMesh\(\.\.\.\)\) first"):
        fd.execute([torch.randn(3, 4), torch.randn(4)])
    t0.axis(0).parallelize(ParallelType.serial)
    assert_still_usable(fd)


def test_mesh_parallel_axis_with_a_mesh_set_afterwards_runs() -> None:
    """The mesh may come after the parallel type: only a fusion without any mesh is an error."""
    fd = pointwise_fd()
    t0 = fd.fusion.inputs()[0]
    t0.axis(0).parallelize(ParallelType.mesh_x)
    t0.outer_split(1, 1)
    t0.set_device_mesh(DeviceMesh([0]))
    x, y = torch.randn(1, 5), torch.randn(5)
    (out,) = fd.execute([x, y])
    torch.testing.assert_close(out, x * y)


def _scheduled_pointwise() -> tuple[FusionDefinition, TensorView]:
    with FusionDefinition() as fd:
        t0, t1 = fd.define_tensor([-1, -1]), fd.define_tensor([-1])
        t2 = fd.ops.mul(fd.ops.exp(t0), t1)
        fd.add_output(t2)
    t2.merge(0).split(0, 4)
    t2.axis(0).parallelize(ParallelType.grid_x)
    t2.axis(1).parallelize(ParallelType.block_x)
    return fd, t2


def test_kernel_parallel_types_under_execute_warn_once_and_name_manual_execute() -> None:
    fd, t2 = _scheduled_pointwise()
    x, y = torch.randn(5, 7).t(), torch.randn(5)  # non-contiguous
    with pytest.warns(IgnoredScheduleWarning, match=r"fd\.execute schedules each kernel itself and ignores the kernel "
                      r"parallel types of T\d+ axis 0 \(grid_x\), T\d+ axis 1 \(block_x\); fd\.manual_execute runs "
                      r"the fusion as you scheduled it"):
        (out,) = fd.execute([x, y])
    torch.testing.assert_close(out, torch.exp(x) * y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fd.execute([x, y])  # the same schedule: said once
        # manual_validate's reference run sets the schedule aside on purpose: no warning there
        fd.manual_validate([x.contiguous(), y])
    t2.axis(1).parallelize(ParallelType.serial)
    with pytest.warns(IgnoredScheduleWarning, match=r"of T\d+ axis 0 \(grid_x\);"):  # a new schedule: said again
        fd.execute([x, y])


def test_stream_and_unscheduled_fusions_execute_without_a_warning() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        t1 = fd.ops.sum(fd.ops.relu(t0), [1])
        fd.add_output(t1)
    t1.outer_split(0, 2)
    t1.axis(0).parallelize(ParallelType.stream)
    x = torch.randn(4, 6, dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (out,) = fd.execute([x])
    torch.testing.assert_close(out, torch.relu(x).sum(1), atol=1e-2, rtol=1e-2)


def test_ops_after_the_with_block_closed() -> None:
    fd = pointwise_fd()
    t0 = fd.fusion.inputs()[0]
    with pytest.raises(ClosedDefinitionError, match=r"fd\.ops\.add: the `with FusionDefinition\(\) as fd:` block "
                                                    r"has closed and the definition is complete .*call fd\.ops inside "
                                                    r"the block, or reopen it with `with fd:`"):
        fd.ops.add(t0, 1.0)
    with pytest.raises(AttributeError, match="no_such_op"):
        fd.ops.no_such_op  # noqa: B018
    assert len(fd.fusion.outputs()) == 1
    assert_still_usable(fd)
    with fd:  # reopened: ops again, and the new output runs
        fd.add_output(fd.ops.add(t0, 1.0))
    x, y = torch.randn(3, 4), torch.randn(4)
    torch.testing.assert_close(fd.execute([x, y])[1], x + 1)


def test_definitions_built_without_a_with_block_and_schedules_after_it_stay_open() -> None:
    """No ``with`` (as the torch.compile translator and the DTensor wrapper build them): ops at any time;
    scheduling after the block, and a scalar output (built with an op) added after it, are fine."""
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1, -1])
    fd.add_output(fd.ops.neg(t0))
    with FusionDefinition() as fd2:
        a = fd2.define_tensor([-1, -1])
        s = fd2.define_scalar(None, DataType.Double)
        fd2.add_output(fd2.ops.mul(a, s))
    a.split(1, 2)
    fd2.add_output(s)
    x = torch.randn(3, 4)
    torch.testing.assert_close(fd.execute([x])[0], -x)
    out, scalar = fd2.execute([x, 2.5])
    torch.testing.assert_close(out, x * 2.5)
    assert scalar.item() == 2.5


def test_cuda_graph_on_a_cpu_execution_warns_and_runs_plainly() -> None:
    fd = pointwise_fd()
    x, y = torch.randn(3, 4), torch.randn(4)
    with pytest.warns(RuntimeWarning, match=r"_enable_options=\['cuda_graph'\]: CUDA graphs capture CUDA work only; "
                                            r"the fusion runs on cpu without one"):
        (out,) = fd.execute([x, y], _enable_options=["cuda_graph"])
    torch.testing.assert_close(out, x * y)
