"""A same-dtype cast of a computed value nothing else reads is dropped from the outputs
(``preseg/identity_casts.py``): the float32 embedding gradient is written once, by its scatter, not
copied by a kernel of its own. A cast of an input, of a value read elsewhere, or of one the user laid out
stays a copy."""

from __future__ import annotations

import torch

from pyfuser import DataType, FusionDefinition
from tests.codegen.conftest import execute_with_aten, execute_with_kernels, kernel_schedulers


def _embedding_backward(grad: torch.Tensor, index: torch.Tensor) -> FusionDefinition:
    with FusionDefinition() as fd:
        tg, ti = fd.from_pytorch(grad), fd.from_pytorch(index)
        vocab = fd.define_scalar(None, DataType.Int)
        acc = fd.ops.full([vocab, grad.shape[1]], 0.0, DataType.Float)
        fd.add_output(fd.ops.cast(fd.ops.index_put_accumulate(acc, ti, tg), DataType.Float))
    return fd


def _reference(grad: torch.Tensor, index: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.zeros(vocab, grad.shape[1]).index_put_((index,), grad, accumulate=True)


def test_a_float32_embedding_gradient_is_written_by_its_scatter_alone() -> None:
    grad, index = torch.randn(37, 24), torch.randint(0, 11, (37,))
    fd = _embedding_backward(grad, index)
    (got,) = execute_with_kernels(fd, [grad, index, 11])
    torch.testing.assert_close(got, _reference(grad, index, 11))
    assert "__to_float(" not in fd.last_scheduled_fusion_ir()
    assert kernel_schedulers(fd) == ["scatter"]
    (got,) = execute_with_aten(_embedding_backward(grad, index), [grad, index, 11])
    torch.testing.assert_close(got, _reference(grad, index, 11))


def test_a_cast_of_an_input_stays_a_copy() -> None:
    x = torch.randn(5, 7)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.cast(fd.from_pytorch(x), DataType.Float))
    for run in (execute_with_aten, execute_with_kernels):
        (got,) = run(fd, [x])
        torch.testing.assert_close(got, x)
        assert got.data_ptr() != x.data_ptr()


def test_a_cast_of_a_value_read_elsewhere_stays() -> None:
    x = torch.randn(5, 7)
    with FusionDefinition() as fd:
        y = fd.ops.exp(fd.from_pytorch(x))
        fd.add_output(fd.ops.cast(y, DataType.Float))
        fd.add_output(fd.ops.sum(y, [1]))
    copy, total = execute_with_kernels(fd, [x])
    torch.testing.assert_close(copy, x.exp())
    torch.testing.assert_close(total, x.exp().sum(1))
    assert "__to_float(" in fd.last_scheduled_fusion_ir()
