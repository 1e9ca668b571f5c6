"""A full reduction whose output has an allocation order set (issue 31's fuzz case: ``min`` over all
axes of a [1, 16] half input, allocation order [1, 0]) schedules and computes torch's result, with
generated kernels and ATen, for any declaration of the input's size-1 axis."""

from __future__ import annotations

import pytest
import torch

from pyfuser import DataType, FusionDefinition


@pytest.mark.parametrize("shape", [[-1, -1], [1, -1]])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("kernels", [False, True], ids=["aten", "kernels"])
def test_full_min_with_a_reversed_allocation(shape: list[int], keepdim: bool, kernels: bool, device: str) -> None:
    x = torch.randn(1, 16, dtype=torch.half, device=device)
    with FusionDefinition() as fd:
        m = fd.ops.min(fd.define_tensor(shape, dtype=DataType.Half), None, keepdim=keepdim)
        fd.add_output(m)
        ids = m.get_logical_domain()
        m.set_allocation_domain(ids[::-1], True)
    options = ["triton_interpreter"] if kernels and device == "cpu" else []
    (out,) = fd.execute([x], _enable_options=options, **({} if kernels else {"_disable_options": ["kernel_codegen"]}))
    if kernels:
        assert fd.last_kernel_code()
    torch.testing.assert_close(out, torch.amin(x, [0, 1], keepdim=keepdim))
