"""Pointwise kernels run their full tiles without the bound: every program but the last takes a branch
whose accesses carry no bound condition (so Triton widens them to 16 bytes whatever the element count),
the last one the masked body; results are torch's for every count around the tile's size."""

from __future__ import annotations

import re

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from tests.codegen.conftest import execute_with_kernels, kernel_schedulers, masked_path, tile_branches
from tests.conftest import devices

_DTYPES = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16}


def _branches(code: str) -> tuple[str, str]:
    branches = tile_branches(code)
    assert branches is not None, code
    return branches


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(1,), (7, 3), (2047,), (2048,), (2049,), (3, 5, 7, 41), (2, 1024)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gelu_of_any_count_takes_the_full_tiles_branch_without_a_bound(device: str, dtype: torch.dtype,
                                                                       shape: tuple[int, ...]) -> None:
    x = torch.randn(*shape, dtype=dtype, device=device)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1] * len(shape), dtype=_DTYPES[dtype])  # sizes known at launch only
        fd.add_output(fd.ops.cast(fd.ops.gelu(fd.ops.cast(t, DataType.Float)), _DTYPES[dtype]))
    (got,) = execute_with_kernels(fd, [x])
    torch.testing.assert_close(got, torch.nn.functional.gelu(x.float()).to(dtype))
    assert kernel_schedulers(fd) == ["pointwise"]
    full, last = _branches(fd.last_kernel_code())
    assert re.search(r"mask\d+ = tl\.full\(\[\d+\], 1, tl\.int1\)", full) and " < " not in full, full
    assert re.search(r"mask\d+ = \(ix\d+ < ", last), last


def test_a_tile_that_divides_the_static_count_needs_no_bound() -> None:
    x = torch.randn(4, 1024)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(fd.from_pytorch(x, static_sizes=True)))
    (got,) = execute_with_kernels(fd, [x])
    torch.testing.assert_close(got, x.exp())
    code = fd.last_kernel_code()
    assert masked_path(code) == code and "mask" not in code[code.index("_kernel("):], code


@pytest.mark.parametrize("device", devices())
def test_broadcast_and_permuted_operands_read_the_same_in_both_branches(device: str) -> None:
    """A bias broadcast along the flat index (read modulo its extent) and a transposed input: both
    branches index them alike."""
    x = torch.randn(37, 61, device=device).t()
    b = torch.randn(37, device=device)
    with FusionDefinition() as fd:
        tx, tb = fd.from_pytorch(x), fd.define_tensor([-1])
        fd.add_output(fd.ops.mul(fd.ops.add(tx, fd.ops.broadcast_in_dim(tb, [61, 37], [1])), 3.0))
    (got,) = execute_with_kernels(fd, [x, b])
    torch.testing.assert_close(got, (x + b) * 3.0)
    full, last = _branches(fd.last_kernel_code())
    loads = re.findall(r"tl\.load\(([^,]*),", full)
    assert loads == re.findall(r"tl\.load\(([^,]*),", last) and len(loads) == 2


@pytest.mark.parametrize("device", devices())
def test_reductions_keep_one_body(device: str) -> None:
    """A row reduction's tile spans the row, not a split flat index: its kernel has no second branch."""
    x = torch.randn(33, 45, device=device)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.sum(fd.ops.exp(t), [1]))
    (got,) = execute_with_kernels(fd, [x])
    torch.testing.assert_close(got, x.exp().sum(1))
    code = fd.last_kernel_code()
    assert masked_path(code) == code
