"""Dense tensors whose axes the schedule merges in a nest (((d0, d1), d2): a pointwise kernel's flat loop,
the N*H*W rows of channels-last batch-norm statistics) are indexed by the nest's one merged index and
one stride: contiguous along the tile, so a GPU loads them in wide vectors. A merge nest split into
separate strides (``ix // ks * st_1 + ix % ks * st_2``) hides that contiguity from Triton."""

from __future__ import annotations

import re

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from tests.codegen.conftest import execute_with_kernels, masked_path


def _load_terms(code: str, tensor: str) -> list[int]:
    """The number of stride terms in each load of ``tensor`` in ``code``."""
    return [len(re.findall(r"\* st\d+_\d+", m)) for m in re.findall(rf"tl\.load\({tensor} \+ ([^,]*),", masked_path(code))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(4, 33, 17), (1, 5, 7), (3, 1, 9), (2, 6, 1)], ids=["odd", "N=1", "H=1", "W=1"])
def test_three_axis_input_beside_a_broadcast_is_read_linearly(shape: tuple[int, int, int], dtype: torch.dtype) -> None:
    """Scores scaled plus a mask shared by the batch: the scores and the output span the flat loop and
    are indexed by it alone, the mask by the flat index modulo its extent (the inner axes merged first)."""
    x = torch.randn(*shape, dtype=dtype)
    m = torch.randn(1, *shape[1:], dtype=dtype)
    with FusionDefinition() as fd:
        tx, tm = fd.from_pytorch(x), fd.from_pytorch(m)
        y = fd.ops.add(fd.ops.mul(fd.ops.cast(tx, DataType.Float), 0.125), fd.ops.cast(tm, DataType.Float))
        fd.add_output(fd.ops.cast(y, DataType.BFloat16 if dtype == torch.bfloat16 else DataType.Float))
    (out,) = execute_with_kernels(fd, [x, m])
    torch.testing.assert_close(out, (x.float() * 0.125 + m.float()).to(dtype))
    code = fd.last_kernel_code()
    if all(s > 1 for s in shape):
        assert _load_terms(code, "T0") == [1] and _load_terms(code, "T1") == [1], code


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_channels_last_rows_are_read_linearly(dtype: torch.dtype) -> None:
    """var_mean over N, H, W of channels-last activations: the merged rows are one index of one stride."""
    x = torch.randn(3, 5, 6, 7, dtype=dtype).contiguous(memory_format=torch.channels_last) * 2 + 1
    with FusionDefinition() as fd:
        var, mean = fd.ops.var_mean(fd.ops.cast(fd.from_pytorch(x), DataType.Float), [0, 2, 3], correction=0)
        fd.add_output(mean)
        fd.add_output(var)
    mean, var = execute_with_kernels(fd, [x])
    ref_var, ref_mean = torch.var_mean(x.double(), [0, 2, 3], correction=0)
    torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(var.double(), ref_var, rtol=1e-5, atol=1e-5)
    terms = _load_terms(fd.last_kernel_code(), "T0")
    assert terms and all(t == 2 for t in terms), fd.last_kernel_code()  # the rows and the channels


def _divisions(index: str) -> int:
    """Divisions by runtime sizes in ``index``: plain, or through the launch's multiplier (``_fdiv``)."""
    return index.count("//") + index.count("_fdiv(")


def _remainders(index: str) -> int:
    return index.count("%") + index.count("_fmod(")


def _indices_of_strided_loads(code: str) -> list[list[str]]:
    """The index expression of each stride term of each load of more than one term, with every ``ix`` that
    divides or takes a remainder written out (down to the flat index)."""
    assigned = {name: expr for name, expr in re.findall(r"^\s*(ix\d+) = (.*)$", code, re.MULTILINE)
                if _divisions(expr) or _remainders(expr)}

    def expanded(expr: str) -> str:
        return re.sub(r"\bix\d+\b", lambda m: f"({expanded(assigned[m[0]])})" if m[0] in assigned else m[0], expr)

    accesses = re.findall(r"tl\.load\(T\d+ \+ ([^,]*),", masked_path(code))
    loads = [re.findall(r"\((ix\d+)\) \* st\d+_\d+", terms) for terms in accesses]
    return [[expanded(name) for name in names] for names in loads if len(names) > 1]


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (3, 2, 17, 33)])
def test_each_axis_of_a_merged_nest_is_one_division_and_one_remainder(shape: tuple[int, ...]) -> None:
    """A padding mask [B, 1, 1, K] under scores [B, H, Q, K] flattened into one loop: the mask's batch index
    is the flat index over the product of the inner extents, its key index the flat index modulo K, each
    computed from the flat index directly (Inductor's indexing), not as remainders of remainders
    (``(i % (H * Q * K)) % (Q * K) % K``: three integer remainders by runtime sizes per element)."""
    x = torch.randn(*shape)
    mask = torch.rand(shape[0], 1, 1, shape[3]) > 0.3
    with FusionDefinition() as fd:
        tx, tm = fd.from_pytorch(x), fd.from_pytorch(mask)
        fd.add_output(fd.ops.where(tm, tx, -1e4))
    (out,) = execute_with_kernels(fd, [x, mask])
    torch.testing.assert_close(out, torch.where(mask, x, -1e4))
    ((batch, key),) = _indices_of_strided_loads(fd.last_kernel_code())
    for index in (batch, key):
        assert _divisions(index) + _remainders(index) == 1, fd.last_kernel_code()
    assert _divisions(batch) and _remainders(key), fd.last_kernel_code()


@pytest.mark.parametrize("shape", [(3, 5, 6, 7), (2, 4, 1, 9)])
def test_nchw_rows_read_their_contiguous_part_at_one_index(shape: tuple[int, ...]) -> None:
    """Sums over N, H and W of NCHW activations (batch-norm statistics and backward): the rows are not
    contiguous as a whole (the channel lies between N and H * W), but their H * W part is; the reduced
    axes are merged innermost first, so it is read at one index (the flat row index modulo H * W) of one
    stride beside N's and the channel's: one division and one remainder by runtime sizes an element, not
    three (an H200's batch-norm backward of bf16 32 x 256 x 56 x 56 ran 5x Inductor's time on them)."""
    x = torch.randn(*shape)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        fd.add_output(fd.ops.sum(tx, [0, 2, 3]))
        fd.add_output(fd.ops.sum(fd.ops.mul(tx, tx), [0, 2, 3]))
    total, squares = execute_with_kernels(fd, [x])
    torch.testing.assert_close(total, x.sum([0, 2, 3]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(squares, (x * x).sum([0, 2, 3]), rtol=1e-5, atol=1e-5)
    terms = _load_terms(fd.last_kernel_code(), "T0")
    live = sum(s > 1 for s in shape)
    assert terms and all(t == live - (1 if shape[2] > 1 and shape[3] > 1 else 0) for t in terms), fd.last_kernel_code()
