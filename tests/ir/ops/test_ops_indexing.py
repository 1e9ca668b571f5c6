"""Indexing ops against torch (non-contiguous, broadcast and empty operands), their Python
definitions, and their bad input: an out-of-range index is a ValueError, never an
out-of-bounds read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition
from tests.ir.test_python_definition import rebuild


def run(build: Callable[[FusionDefinition], Any], inputs: list[Any], device: str = "cpu") -> list[torch.Tensor]:
    with FusionDefinition() as fd:
        build(fd)
    outputs = fd.execute([x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs])
    again = rebuild(fd).execute([x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs])
    for a, b in zip(outputs, again, strict=True):
        torch.testing.assert_close(a, b)
    return outputs


def test_index_select(device: str) -> None:
    x = torch.randn(5, 7).t()  # non-contiguous [7, 5]
    index = torch.tensor([4, 0, 4, 2])
    x, index = x.to(device), index.to(device)  # declared from the tensors the fusion runs on
    def build(fd: FusionDefinition) -> None:
        t, i = fd.from_pytorch(x), fd.from_pytorch(index)
        fd.add_output(fd.ops.index_select(t, i, 0))
        fd.add_output(fd.ops.index_select(fd.ops.exp(t), i, -1))

    out0, out1 = run(build, [x, index], device)
    torch.testing.assert_close(out0.cpu(), (x.index_select(0, index)).cpu())
    torch.testing.assert_close(out1.cpu(), (x.exp().index_select(1, index)).cpu())
    (empty,) = run(lambda fd: fd.add_output(fd.ops.index_select(fd.define_tensor([-1, -1]),
                                                                fd.define_tensor([-1], dtype=DataType.Int), 0)),
                   [x, torch.zeros(0, dtype=torch.long, device=device)], device)
    assert empty.shape == (0, 5)


def test_select_with_a_constant_and_an_input_index(device: str) -> None:
    x = torch.randn(3, 4, 5, device=device)

    def build(fd: FusionDefinition) -> None:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.select(t, 1, dim=1))
        fd.add_output(fd.ops.select(t, fd.define_scalar(dtype=DataType.Int), dim=-1))
        fd.add_output(fd.ops.select(t, -1, dim=0))

    a, b, c = run(build, [x, 3], device)
    torch.testing.assert_close(a.cpu(), (x[:, 1]).cpu())
    torch.testing.assert_close(b.cpu(), (x[..., 3]).cpu())
    torch.testing.assert_close(c.cpu(), (x[-1]).cpu())


def test_gather_and_take_along_axis(device: str) -> None:
    x = torch.randn(4, 6)
    small = torch.randint(0, 6, (3, 2))  # gather: smaller than x off dim
    full = torch.randint(0, 6, (4, 9))   # take_along_axis: equal off dim
    x, small, full = x.to(device), small.to(device), full.to(device)

    def build(fd: FusionDefinition) -> None:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.gather(t, fd.from_pytorch(small), 1))
        fd.add_output(fd.ops.take_along_axis(t, fd.from_pytorch(full), 1))
        fd.add_output(fd.ops.take_along_axis(fd.ops.exp(t), fd.ops.permute(fd.from_pytorch(full[:, :4].t().contiguous()),
                                                                          [1, 0]), 1))

    a, b, c = run(build, [x, small, full, full[:, :4].t().contiguous()], device)
    torch.testing.assert_close(a.cpu(), (torch.gather(x, 1, small)).cpu())
    torch.testing.assert_close(b.cpu(), (torch.take_along_dim(x, full, 1)).cpu())
    torch.testing.assert_close(c.cpu(), (torch.take_along_dim(x.exp(), full[:, :4], 1)).cpu())


def test_scatter_with_a_tensor_and_a_number(device: str) -> None:
    x = torch.zeros(3, 5)
    index = torch.tensor([[0, 1, 2], [4, 3, 2]])
    src = torch.randn(2, 4)
    x, index, src = x.to(device), index.to(device), src.to(device)

    def build(fd: FusionDefinition) -> None:
        t, i = fd.from_pytorch(x), fd.from_pytorch(index)
        fd.add_output(fd.ops.scatter(t, i, fd.from_pytorch(src), 1))
        fd.add_output(fd.ops.scatter(t, i, 7.5, 1))

    a, b = run(build, [x, index, src], device)
    torch.testing.assert_close(a.cpu(), (torch.scatter(x, 1, index, src)).cpu())
    torch.testing.assert_close(b.cpu(), (torch.scatter(x, 1, index, 7.5)).cpu())


def test_embedding_and_its_backward(device: str) -> None:
    weight = torch.randn(10, 4)
    tokens = torch.tensor([[1, 2, 0], [9, 1, 1]])
    grad = torch.randn(6, 4)
    weight, tokens, grad = weight.to(device), tokens.to(device), grad.to(device)

    def build(fd: FusionDefinition) -> None:
        w, ids = fd.from_pytorch(weight), fd.from_pytorch(tokens)
        fd.add_output(fd.ops.embedding_fwd(ids, w))
        fd.add_output(fd.ops.embedding_fwd(ids, w, padding_idx=1, max_norm=1.0))
        flat = fd.ops.reshape(ids, [-1])
        fd.add_output(fd.ops.index_put_accumulate(fd.ops.full([10, 4], 0.0, DataType.Float), flat, fd.from_pytorch(grad)))

    before = weight.clone()
    a, b, c = run(build, [weight, tokens, grad], device)
    torch.testing.assert_close(a.cpu(), (F.embedding(tokens, weight)).cpu())
    torch.testing.assert_close(b.cpu(), (F.embedding(tokens, weight.clone(), padding_idx=1, max_norm=1.0)).cpu())
    torch.testing.assert_close(weight, before), "max_norm renormalizes a copy, never the input"
    want = torch.zeros(10, 4, device=weight.device).index_put((tokens.reshape(-1),), grad, accumulate=True)
    torch.testing.assert_close(c.cpu(), (want).cpu())


@pytest.mark.parametrize(("build", "inputs", "pattern"), [
    (lambda fd: fd.ops.index_select(fd.define_tensor([-1, -1]), fd.define_tensor([-1], dtype=DataType.Int), 0),
     [torch.randn(3, 2), torch.tensor([0, 3])], r"index_select: index T1 holds 3, out of range for T0 axis 0 of size 3 "
                                                r"\(valid: 0..2\)"),
    (lambda fd: fd.ops.index_select(fd.define_tensor([-1, -1]), fd.define_tensor([-1], dtype=DataType.Int), 1),
     [torch.randn(3, 2), torch.tensor([-1])], r"holds -1, out of range for T0 axis 1 of size 2"),
    (lambda fd: fd.ops.gather(fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1], dtype=DataType.Int), 0),
     [torch.randn(3, 2), torch.tensor([[5]])], r"gather: index T1 holds 5, out of range for T0 axis 0 of size 3"),
    (lambda fd: fd.ops.gather(fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1], dtype=DataType.Int), 0),
     [torch.randn(3, 2), torch.zeros(1, 4, dtype=torch.long)], r"gather: T1 axis 1 has size 4 but must be at most T0 "
                                                                 r"axis 1's size 2"),
    (lambda fd: fd.ops.take_along_axis(fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1], dtype=DataType.Int), 0),
     [torch.randn(3, 2), torch.zeros(1, 1, dtype=torch.long)], r"take_along_axis: T1 axis 1 has size 1 but must be "
                                                                 r"equal T0 axis 1's size 2"),
    (lambda fd: fd.ops.scatter(fd.define_tensor([-1]), fd.define_tensor([-1], dtype=DataType.Int), 1.0, 0),
     [torch.randn(3), torch.tensor([3])], r"scatter: index T1 holds 3, out of range for T0 axis 0 of size 3"),
    (lambda fd: fd.ops.select(fd.define_tensor([-1]), fd.define_scalar(dtype=DataType.Int), 0),
     [torch.randn(3), -4], r"select: index -4 is out of range for T0 axis 0 of size 3 \(valid: -3..2\)"),
    (lambda fd: fd.ops.embedding_fwd(fd.define_tensor([-1], dtype=DataType.Int), fd.define_tensor([-1, -1])),
     [torch.tensor([0, 4]), torch.randn(4, 2)], r"embedding_fwd: index T0 holds 4, out of range for T1 axis 0 of size 4"),
    (lambda fd: fd.ops.index_put_accumulate(fd.define_tensor([-1, -1]), fd.define_tensor([-1], dtype=DataType.Int),
                                            fd.define_tensor([-1, -1])),
     [torch.zeros(3, 2), torch.tensor([0, 2]), torch.randn(3, 2)], r"index_put_accumulate: value T2 has shape \(3, 2\) "
                                                                     r"but must be \(2, 2\)"),
])
def test_out_of_range_indices_are_errors(build: Callable[[FusionDefinition], Any], inputs: list[Any],
                                         pattern: str) -> None:
    with FusionDefinition() as fd:
        fd.add_output(build(fd))
    with pytest.raises(ValueError, match=pattern):
        fd.execute(inputs)


@pytest.mark.parametrize(("call", "error", "pattern"), [
    (lambda fd, x, i: fd.ops.index_select(x, fd.ops.cast(i, DataType.Float), 0), TypeError,
     r"index_select: index T\d+ has dtype float; expected an integer"),
    (lambda fd, x, i: fd.ops.index_select(x, fd.ops.broadcast(i, [True, False]), 0), ValueError,
     r"index_select: T\d+ has rank 2 but index_select takes a 1-D or 0-dim index"),
    (lambda fd, x, i: fd.ops.gather(x, i, 0), ValueError,
     r"gather: T1 has rank 1 but arg T0 has rank 2; the index must have it too"),
    (lambda fd, x, i: fd.ops.select(x, 3, 0), ValueError, r"select: index 3 is out of range for T0 axis 0 of size 3"),
    (lambda fd, x, i: fd.ops.select(x, 1.5, 0), TypeError, r"select: index double\(1.5\) has dtype double"),
    (lambda fd, x, i: fd.ops.select(x, 0, 2), ValueError, r"T0: select dim entry 2 is out of range for rank 2"),
    (lambda fd, x, i: fd.ops.scatter(x, fd.ops.broadcast(i, [False, True]), fd.ops.cast(x, DataType.Double), 0),
     TypeError, r"scatter: src T\d+ has dtype double but arg T0 has float; cast it first"),
    (lambda fd, x, i: fd.ops.embedding_fwd(i, fd.ops.sum(x, [0])), ValueError,
     r"embedding_fwd: T\d+ has rank 1 but the embedding weight must be 2-D"),
    (lambda fd, x, i: fd.ops.take_along_axis(x, fd.define_tensor([2, 7], dtype=DataType.Int), 0), ValueError,
     r"take_along_axis: T2 axis 1 has extent 7 but must be equal T0 axis 1's extent 4"),
])
def test_bad_indexing_arguments(call: Callable[..., Any], error: type[Exception], pattern: str) -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([3, 4])
        i = fd.define_tensor([-1], dtype=DataType.Int)
        with pytest.raises(error, match=pattern):
            call(fd, x, i)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a host synchronization needs a GPU")
def test_indexing_on_a_gpu_never_waits_for_the_device() -> None:
    """Where the host must not wait for the device (torch's sync debug mode, a CUDA graph's capture),
    indices are checked by an asynchronous device assert: a step of gathers and embeddings queues its
    work without reading anything back."""
    with FusionDefinition() as fd:
        ids = fd.define_tensor([-1, -1], dtype=DataType.Int)
        w = fd.define_tensor([-1, -1])
        x = fd.define_tensor([-1, -1])
        index = fd.define_tensor([-1, -1], dtype=DataType.Int)
        fd.add_output(fd.ops.embedding_fwd(ids, w))
        fd.add_output(fd.ops.gather(x, index, 1))
        fd.add_output(fd.ops.take_along_axis(x, index, 1))
    inputs = [torch.randint(0, 9, (4, 5)), torch.randn(9, 3), torch.randn(4, 6), torch.randint(0, 6, (4, 2))]
    inputs = [t.cuda() for t in inputs]
    fd.execute(inputs, _disable_options=["kernel_codegen"])  # compiled, then timed below
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        emb, gathered, taken = fd.execute(inputs, _disable_options=["kernel_codegen"])
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.testing.assert_close(emb, F.embedding(inputs[0], inputs[1]))
    torch.testing.assert_close(gathered, torch.gather(inputs[2], 1, inputs[3]))
    torch.testing.assert_close(taken, torch.take_along_dim(inputs[2], inputs[3], 1))
