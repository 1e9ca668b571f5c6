"""``fd.validate``: outputs against references (default: the fusion's torch reference) within
nvFuser's tolerances, which grow with the output dtype's precision and its reduction size."""

from __future__ import annotations

import pytest
import torch

from pyfuser import DataType, FusionDefinition, get_val_tolerances, validate_with_auto_inferred_outputs
from pyfuser.frontend.validate import SUM_TOLERANCES_FLOAT, SUM_TOLERANCES_HALF, reduction_sizes, tolerance


def softmax_sum(dtype: DataType = DataType.Float) -> FusionDefinition:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dtype)
        e = fd.ops.exp(x)
        fd.add_output(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)))  # reduction size 1 * n (inherited)
        fd.add_output(fd.ops.sum(fd.ops.sum(x, [1]), [0]))  # m * n
        fd.add_output(fd.ops.cast(fd.ops.gt(x, 0), DataType.Int))
    return fd


def test_validate_against_the_torch_reference_and_given_outputs(device: str) -> None:
    fd = softmax_sum()
    x = torch.randn(3, 40, device=device)
    outputs = fd.validate([x])
    torch.testing.assert_close(outputs[0], torch.softmax(x, 1))
    fd.validate([x], [torch.softmax(x, 1), x.sum(), (x > 0).long()])
    with pytest.raises(AssertionError, match=r"validate: output 1 \(T\d+, float\) differs from the reference: max abs "
                                             r"error [\d.]+ \(absolute tolerance .*reduction size 120\)"):
        fd.validate([x], [torch.softmax(x, 1), x.sum() + 1, (x > 0).long()])
    with pytest.raises(AssertionError, match=r"output 2 \(T\d+, int64_t\) is not equal to the reference"):
        fd.validate([x], [torch.softmax(x, 1), x.sum(), (x < 0).long()])
    with pytest.raises(AssertionError, match=r"output 0 \(T\d+, float\) has shape \(3, 40\) but the reference has \(40, 3\)"):
        fd.validate([x], [torch.softmax(x, 1).t(), x.sum(), (x > 0).long()])
    with pytest.raises(ValueError, match="the fusion returns 3 outputs but 1 reference outputs were given"):
        fd.validate([x], [x])


def test_tolerances_follow_nvfusers_tables() -> None:
    assert tolerance(DataType.Float, 1) == (SUM_TOLERANCES_FLOAT[0][1], SUM_TOLERANCES_FLOAT[1][1])
    assert tolerance(DataType.Float, 100) == (SUM_TOLERANCES_FLOAT[6][1], SUM_TOLERANCES_FLOAT[6][1] * 0.01)  # 128: next
    assert tolerance(DataType.Half, 4) == (SUM_TOLERANCES_HALF[1][1], SUM_TOLERANCES_HALF[1][1] * 0.01)
    assert tolerance(DataType.BFloat16, 4) == pytest.approx((SUM_TOLERANCES_HALF[1][1] * 10,
                                                             SUM_TOLERANCES_HALF[1][1] * 0.1))
    assert tolerance(DataType.Float, 10**9) == (SUM_TOLERANCES_FLOAT[-1][1] * 2, SUM_TOLERANCES_FLOAT[-1][1] * 0.02)
    assert tolerance(DataType.Int, 1000) == (0.0, 0.0) and tolerance(DataType.Bool, 1) == (0.0, 0.0)
    fd = softmax_sum()
    x = torch.randn(3, 40)
    tols = get_val_tolerances(fd.fusion, [x])
    assert tols == [tolerance(DataType.Float, 40), tolerance(DataType.Float, 120), (0.0, 0.0)]
    sizes = reduction_sizes(fd.fusion, {"i0": 3, "i1": 40})
    assert sorted(set(sizes.values())) == [1, 40, 120]


def test_validate_in_half_precision_and_with_in_place_outputs() -> None:
    fd = softmax_sum(DataType.Half)
    fd.validate([torch.randn(4, 64, dtype=torch.half)])
    acc = torch.randn(5)
    before = acc.clone()
    with FusionDefinition() as inplace:
        t = inplace.define_tensor([-1])
        inplace.add_output(inplace.ops.add(t, 1.0), alias_input=t)
        inplace.add_output(inplace.ops.mul(t, 2.0))
    (doubled,) = inplace.validate([acc])  # the reference reads the inputs before they are overwritten
    torch.testing.assert_close(doubled, before * 2)
    torch.testing.assert_close(acc, before + 1)
    validate_with_auto_inferred_outputs(inplace.fusion, [acc * 2], [acc])


def test_a_float_output_of_a_value_rounded_to_half_is_judged_by_the_half_table() -> None:
    """``2 * float(half(x * x + x))``: a kernel that contracts ``x * x + x`` into one FMA may round to the
    neighbouring Half, which the doubling makes 2**-8 at 7.5 (nvFuser's
    ``test_reduction_reference_missing_input_ids`` saw 0.0039 on a GPU): a Half error, not a float32 one.
    A float output of a slice of a Half input (copies, rounded nowhere) keeps the float32 table."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        h = fd.define_tensor([-1], dtype=DataType.Half)
        rounded = fd.ops.cast(fd.ops.add(fd.ops.mul(x, x), x), DataType.Half)
        fd.add_output(fd.ops.mul(fd.ops.cast(rounded, DataType.Float), 2.0))
        fd.add_output(fd.ops.mul(fd.ops.cast(fd.ops.slice(h, [1], [4]), DataType.Float), 2.0))
    inputs = [torch.full((4,), 1.5), torch.full((4,), 3.0, dtype=torch.half)]
    assert get_val_tolerances(fd.fusion, inputs) == [tolerance(DataType.Half, 1), tolerance(DataType.Float, 1)]
    out, copied = fd.validate(inputs)
    fd.validate(inputs, [out + 2 ** -8, copied])
    with pytest.raises(AssertionError, match=r"output 1 \(T\d+, float\) differs from the reference: max abs error "
                                             r"0.00390625 \(absolute tolerance 1.68222e-06"):
        fd.validate(inputs, [out, copied + 2 ** -8])
