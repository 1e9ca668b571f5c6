"""Scans, topk, argsort, argmax / argmin and triu against torch, their Python definitions and
their bad input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from pyfuser import DataType, FusionDefinition, get_val_tolerances
from pyfuser.frontend.validate import tolerance
from pyfuser.ir.ops.scan import ScanOp, ScanOpType
from tests.ir.test_python_definition import rebuild


def run(build: Callable[[FusionDefinition], Any], inputs: list[Any], device: str = "cpu") -> list[torch.Tensor]:
    with FusionDefinition() as fd:
        build(fd)
    args = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
    outputs = fd.execute(args)
    for a, b in zip(outputs, rebuild(fd).execute(args), strict=True):
        torch.testing.assert_close(a, b)
    return [o.cpu() for o in outputs]


@pytest.mark.parametrize("name", ["cumsum", "cumprod", "cummin", "cummax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_scans(name: str, dtype: torch.dtype, device: str) -> None:
    x = (torch.randn(5, 4, device=device) * 3).to(dtype).t()  # non-contiguous

    def build(fd: FusionDefinition) -> None:
        t = fd.from_pytorch(x)
        fd.add_output(getattr(fd.ops, name)(t, 0))
        fd.add_output(getattr(fd.ops, name)(t, -1))

    outs = run(build, [x], device)
    ref = getattr(torch, name)
    want = [ref(x, d) for d in (0, 1)]
    want = [w[0] if name in ("cummin", "cummax") else w for w in want]  # (values, indices)
    for got, w in zip(outs, want, strict=True):
        assert got.dtype == w.dtype
        torch.testing.assert_close(got.cpu(), w.cpu())


@pytest.mark.parametrize(("name", "operand", "dtype"), [
    ("cumsum", torch.bool, DataType.Int32), ("cumsum", torch.int32, DataType.Int32),
    ("cumsum", torch.float32, DataType.Int32), ("cumsum", torch.int64, DataType.Double),
    ("cumprod", torch.int32, DataType.Float), ("cumsum", torch.bfloat16, DataType.Float),
])
def test_scans_accumulate_in_the_dtype_asked(name: str, operand: torch.dtype, dtype: DataType, device: str) -> None:
    """torch's ``dtype=``: the operand cast to it, the scan in it (an int32 count stays int32, wrapping as
    torch's does), one op instead of casts around an int64 scan."""
    x = (torch.randn(3, 7) * 100).to(operand)
    if operand == torch.int32:
        x = x * 30_000_000  # sums past int32's range: wrapped as torch's
    (got,) = run(lambda fd: fd.add_output(getattr(fd.ops, name)(fd.from_pytorch(x.to(device)), 1, dtype=dtype)), [x],
                 device)
    want = getattr(torch, name)(x, 1, dtype=dtype.torch_dtype)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)


def test_only_sums_and_products_accumulate_in_a_dtype() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        with pytest.raises(ValueError, match="cummax takes no dtype: only cumsum and cumprod accumulate in one"):
            ScanOp(fd.fusion, ScanOpType.cummax, fd.ops.cumsum(x, 1), x, 1, DataType.Double)


def test_scan_tolerance_grows_with_the_scanned_axis() -> None:
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.cumsum(fd.define_tensor([-1, -1]), 1))
    x = torch.randn(3, 300)
    fd.validate([x])
    assert get_val_tolerances(fd.fusion, [x]) == [tolerance(DataType.Float, 300)]


@pytest.mark.parametrize(("largest", "sorted_"), [(True, True), (False, True), (True, False)])
def test_topk(largest: bool, sorted_: bool, device: str) -> None:
    x = torch.randn(4, 9, device=device)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        k = fd.define_scalar(dtype=DataType.Int)
        values, indices = fd.ops.topk(t, k, dim=1, largest=largest, sorted=sorted_)
        fd.add_output(values)
        fd.add_output(indices)
    v, i = fd.execute([x, 3])
    x = x.cpu()
    want = torch.topk(x, 3, 1, largest, True)
    if not sorted_:  # unspecified order: compare as sets
        v, order = torch.sort(v.cpu(), 1, descending=largest)
        i = torch.gather(i.cpu(), 1, order)
    torch.testing.assert_close(v.cpu(), want.values)
    torch.testing.assert_close(torch.gather(x, 1, i.cpu()), want.values)
    with pytest.raises(ValueError, match=r"topk: k = 10 is out of range for T0 axis 1 of size 9 \(valid: 0..9\)"):
        fd.execute([x, 10])


def test_argsort_argmax_argmin_and_triu(device: str) -> None:
    x = torch.randn(3, 5, 4, device=device)

    def build(fd: FusionDefinition) -> None:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.argsort(t, 1, descending=True))
        fd.add_output(fd.ops.argmax(t, 1))
        fd.add_output(fd.ops.argmin(t, -1, keepdim=True))
        fd.add_output(fd.ops.argmax(t))
        fd.add_output(fd.ops.triu(t, -1))
        fd.add_output(fd.ops.triu(t, fd.define_scalar(dtype=DataType.Int)))

    outs = run(build, [x, 2], device)
    x = x.cpu()
    wants = [torch.argsort(x, 1, descending=True), x.argmax(1), x.argmin(-1, keepdim=True), x.argmax(),
             torch.triu(x, -1), torch.triu(x, 2)]
    for got, want in zip(outs, wants, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize(("call", "error", "pattern"), [
    (lambda fd, x: fd.ops.cumsum(fd.ops.sum(x), 0), ValueError, r"cumsum: T\d+ is 0-dim; a scan needs an axis"),
    (lambda fd, x: fd.ops.cumsum(x, 2), ValueError, r"T0: cumsum dim entry 2 is out of range for rank 2"),
    (lambda fd, x: fd.ops.cumsum(x, 1, dtype=torch.int32), TypeError, r"cumsum: dtype must be a DataType"),
    (lambda fd, x: fd.ops.topk(x, 5, dim=0), ValueError, r"topk: k = 5 is larger than T0 axis 0's extent 4"),
    (lambda fd, x: fd.ops.topk(fd.ops.cast(x, DataType.ComplexFloat), 1), TypeError, r"not valid for this op"),
    (lambda fd, x: fd.ops.triu(fd.ops.sum(x, [0]), 0), ValueError, r"triu: T\d+ has rank 1; triu needs at least 2 axes"),
    (lambda fd, x: fd.ops.triu(x, 0.5), TypeError, r"triu: diagonal must be an int or an integer scalar"),
    (lambda fd, x: fd.ops.argmax(fd.ops.cast(x, DataType.ComplexFloat)), TypeError, r"not valid for this op"),
])
def test_bad_arguments(call: Callable[..., Any], error: type[Exception], pattern: str) -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, -1])
        with pytest.raises(error, match=pattern):
            call(fd, x)


def test_argmax_of_an_empty_axis() -> None:
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.argmax(fd.define_tensor([-1, -1]), 1))
    with pytest.raises(ValueError, match=r"argmax: T0 axis 1 has size 0; there is no largest element to index"):
        fd.execute([torch.randn(2, 0)])
