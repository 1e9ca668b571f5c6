"""Bound programs as one generated function (``host_ir/straight_line.py``): after the first run
under a binding, a straight-line program's runs are one Python function of its inputs. The same
results as the steps on new data; views as reinterpretations of the nearest tensor that is not a
view (a chain costs one call, an input's views follow its offset); a copying reshape still copies;
an argument whose alignment changed takes the launcher; outputs the recorded run copied are copied
on every run; programs with loops keep their steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pyfuser import FusionDefinition
from pyfuser.integrations.torch_compile import PyfuserBackend
from pyfuser.ir.iter_domain import ParallelType


def _gemm_between_views(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> FusionDefinition:
    """``exp(permute(reshape(x @ w1)) @ w2)`` and ``reshape(x @ w1)`` flattened: matmuls are ATen calls,
    so the views between them are too."""
    with FusionDefinition() as fd:
        tx, t1, t2 = fd.from_pytorch(x), fd.from_pytorch(w1), fd.from_pytorch(w2)
        a = fd.ops.matmul(tx, t1)  # [6, 16]
        b = fd.ops.permute(fd.ops.reshape(a, [2, 3, 16]), [1, 0, 2])  # [3, 2, 16], a view of a
        fd.add_output(fd.ops.exp(fd.ops.matmul(b, t2)))  # [3, 2, 5]
        fd.add_output(fd.ops.reshape(a, [96]))
    return fd


def test_a_bound_program_runs_as_one_function_on_new_data(device: str, bind: Callable[..., Any]) -> None:
    x, w1, w2 = torch.randn(6, 8, device=device), torch.randn(8, 16, device=device), torch.randn(16, 5, device=device)
    fd = _gemm_between_views(x, w1, w2)
    bound = bind(fd, [x, w1, w2])
    assert not bound.function
    for k in range(4):
        x, w1, w2 = torch.randn_like(x) + k, torch.randn_like(w1), torch.randn_like(w2)
        out, flat = bound.run([x, w1, w2])
        a = x @ w1
        torch.testing.assert_close(out, (a.reshape(2, 3, 16).permute(1, 0, 2) @ w2).exp(), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(flat, a.reshape(96), atol=1e-5, rtol=1e-5)
        assert flat.data_ptr() != x.data_ptr()
    source = bound.function.source
    # three views (reshape, permute, reshape): the permuted one reads the matmul's result directly, the
    # reshape only the permute read is gone
    assert source.count("_reinterpret(") == 2, source
    # the matmuls call torch without the size checks the recorded run made: the 2-D one as the BLAS
    # call itself (``blas_calls.py``), the permuted 3-D one as ``torch.matmul`` (its fold copies)
    assert source.count("= _mm(") == 1 and source.count("= _call") == 1, source
    assert "_evaluate" not in source and ".stride()" not in source, source


def test_views_of_an_input_follow_its_offset(device: str, bind: Callable[..., Any]) -> None:
    """The same strides at another storage offset (a slice of a larger tensor, some not 16-byte
    aligned): an input's views are reinterpreted relative to the input, and a kernel whose argument's
    alignment changed runs through its launcher."""
    big, w = torch.randn(64, device=device), torch.randn(16, 3, device=device)
    x = big[:32].view(4, 8)
    with FusionDefinition() as fd:
        tx, tw = fd.from_pytorch(x), fd.from_pytorch(w)
        rows = fd.ops.reshape(tx, [2, 16])
        fd.add_output(fd.ops.matmul(rows, tw))
        fd.add_output(fd.ops.add(fd.ops.mul(tx, 2.0), 1.0))
    bound = bind(fd, [x, w])
    for offset in (0, 4, 1, 8, 3, 0):
        x = big[offset:offset + 32].view(4, 8)
        product, affine = bound.run([x, w])
        torch.testing.assert_close(product, x.reshape(2, 16) @ w, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(affine, x * 2 + 1)
    assert "_reinterpret(v1, (2, 16), (16, 1), 0)" in bound.function.source


def test_a_reshape_that_copies_stays_a_copy(device: str, bind: Callable[..., Any]) -> None:
    """A reshape of a transposed result cannot be a view: the function reinterprets the matmul's result
    for the permute and evaluates the reshape (a copy)."""
    x, w = torch.randn(6, 4, device=device), torch.randn(4, 10, device=device)
    with FusionDefinition() as fd:
        tx, tw = fd.from_pytorch(x), fd.from_pytorch(w)
        fd.add_output(fd.ops.reshape(fd.ops.permute(fd.ops.matmul(tx, tw), [1, 0]), [60]))
        fd.add_output(fd.ops.exp(tx))
    bound = bind(fd, [x, w])
    for _ in range(3):
        x, w = torch.randn_like(x), torch.randn_like(w)
        flat, ex = bound.run([x, w])
        torch.testing.assert_close(flat, (x @ w).t().reshape(60), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ex, x.exp())
    source = bound.function.source
    assert source.count("_reinterpret(") == 1 and source.count("_evaluate") == 1, source


def test_programs_with_a_loop_keep_their_steps(device: str, bind: Callable[..., Any]) -> None:
    x, w = torch.randn(6, 4, device=device), torch.randn(4, 10, device=device)
    fd = FusionDefinition()
    out = fd.ops.matmul(fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1]))
    fd.add_output(out)
    out.outer_split(1, 3)
    out.axis(1).parallelize(ParallelType.Stream)
    bound = bind(fd, [x, w])
    for _ in range(3):
        torch.testing.assert_close(bound.run([x, w])[0], x @ w, atol=1e-5, rtol=1e-5)
    assert bound.function is False


def test_outputs_conformed_on_the_recorded_run_are_conformed_on_every_run(device: str,
                                                                          bind: Callable[..., Any]) -> None:
    """One value returned twice, and an output that is a view of an input: the recorded run copied
    them (no output shares memory with an input or another output); the straight-line function copies
    them the same way on every later run, on new data."""
    x, w = torch.randn(6, 4, device=device), torch.randn(4, 10, device=device)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        y = fd.ops.matmul(tx, fd.from_pytorch(w))
        fd.add_output(y)
        fd.add_output(y)
        fd.add_output(fd.ops.permute(tx, [1, 0]))
    bound = bind(fd, [x, w])
    for _ in range(3):
        x, w = torch.randn_like(x), torch.randn_like(w)
        a, b, t = bound.run([x, w])
        assert len({a.data_ptr(), b.data_ptr(), t.data_ptr(), x.data_ptr()}) == 4
        torch.testing.assert_close(a, x @ w, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(b, x @ w, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(t, x.t())
    assert bound.function


def test_a_compiled_layer_trains_through_straight_line_regions(device: str, kernel_options: list[str]) -> None:
    """A linear + RMSNorm + SiLU block, forward and backward, several steps: from the third call on
    each region with a GEMM runs its function; gradients match eager's."""
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(16, 32, bias=False), torch.nn.RMSNorm(32), torch.nn.SiLU(),
                                torch.nn.Linear(32, 16, bias=False)).to(device)
    backend = PyfuserBackend(enable_options=kernel_options)
    compiled = torch.compile(layer, backend=backend, dynamic=False)
    for _ in range(4):
        x = torch.randn(3, 5, 16, device=device, requires_grad=True)
        out = compiled(x)
        out.square().sum().backward()
        grads = [p.grad.clone() for p in layer.parameters()]
        layer.zero_grad()
        xe = x.detach().requires_grad_()
        ref = layer(xe)
        ref.square().sum().backward()
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(x.grad, xe.grad, atol=1e-5, rtol=1e-5)
        for g, p in zip(grads, layer.parameters(), strict=True):
            torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-5)
        layer.zero_grad()
    functions = [b.function for g in backend.graphs for r in g.regions for b in r._bound.values()]
    assert functions and all(functions), functions
