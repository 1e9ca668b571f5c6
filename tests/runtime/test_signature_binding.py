"""``fd.execute`` through one generated function per input signature: a signature's second call binds
the program to it (``BoundProgram``), whose first run is recorded and written as a straight-line function
that later calls of the signature run, the signature being the one guard. Results equal the program's
steps on new data (other storage offsets and alignments, permuted and expanded inputs, one tensor passed
twice, bf16, new values of floating-point scalars); calls with integer scalars, outputs written into
inputs, and programs with stream loops keep the evaluator's steps; calls cycling through more sizes than
a program keeps bindings for stay correct without re-recording on every call."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.host_ir.specialization import SPECIALIZATION_LIMIT
from pyfuser.runtime.executor import FusionExecutorCache


def _norm_and_sum(dtype: DataType = DataType.Float) -> FusionDefinition:
    """A pointwise prologue, a row reduction and a broadcast back: two kernels, one output a view."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[False, False], dtype=dtype)
        y = fd.define_tensor([-1, -1], contiguity=[False, False], dtype=dtype)
        s = fd.ops.add(fd.ops.cast(x, DataType.Float), fd.ops.cast(y, DataType.Float))
        total = fd.ops.sum(s, [1])
        fd.add_output(fd.ops.cast(fd.ops.div(s, fd.ops.broadcast(total, [False, True])), dtype))
        fd.add_output(total)
        fd.add_output(fd.ops.permute(s, [1, 0]))
    return fd


def _reference(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    s = x.float() + y.float()
    total = s.sum(1)
    return [(s / total[:, None]).to(x.dtype), total, s.t()]


def _bound_functions(fec: FusionExecutorCache) -> list[Any]:
    """The generated function of each bound signature (None where its binding has not run yet)."""
    return [entry.bound.program.straight_line(entry.bound.binding)
            for entry in fec._by_signature.values() if entry.bound]


def _check(fd: FusionDefinition, x: torch.Tensor, y: torch.Tensor, options: list[str]) -> None:
    got = fd.execute([x, y], _enable_options=options)
    for g, want in zip(got, _reference(x, y), strict=True):
        torch.testing.assert_close(g, want, atol=1e-3 if x.dtype == torch.bfloat16 else 1e-5, rtol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_signatures_third_call_runs_its_generated_function(device: str, kernel_options: list[str],
                                                              dtype: torch.dtype) -> None:
    fd = _norm_and_sum(DataType.Float if dtype == torch.float32 else DataType.BFloat16)
    big = torch.randn(3 * 37 + 8, 5, device=device, dtype=dtype)
    y = torch.randn(5, 37, device=device, dtype=dtype).t()  # permuted
    for call, offset in enumerate((0, 0, 0, 1, 8, 3)):
        x = big[offset:offset + 37 * 3].view(37, 15)[:, :5]  # same strides, another offset and alignment
        _check(fd, x, y, kernel_options)
        functions = _bound_functions(fd.fec)
        if call == 0:
            assert not any(entry.bound for entry in fd.fec._by_signature.values())
        else:  # bound on the second call, whose run wrote the function
            assert len(functions) == 1 and functions[0] is not None
    # one generated kernel (the sum, the division and the permuted copy fused), its launch inlined behind
    # the inputs' alignment check; no step of the evaluator
    source = functions[0].source
    assert "_evaluate" not in source and "data_ptr() % 16" in source, source


def test_new_data_expanded_inputs_and_one_tensor_twice(device: str, kernel_options: list[str]) -> None:
    """The bound function does not assume its inputs distinct, nor their memory: an expanded input, then
    the same tensor passed as both inputs, under the signature bound with two distinct tensors."""
    fd = _norm_and_sum()
    row = torch.randn(1, 9, device=device)
    for k in range(4):
        x = torch.randn(6, 9, device=device) + k
        _check(fd, x, row.expand(6, 9), kernel_options)
    x = torch.randn(6, 9, device=device)
    first = fd.execute([x, x.clone()], _enable_options=kernel_options)
    for _ in range(3):
        got = fd.execute([x, x], _enable_options=kernel_options)
        for g, want in zip(got, first, strict=True):
            torch.testing.assert_close(g, want)
    assert len(_bound_functions(fd.fec)) == 2


def test_outputs_never_share_memory_with_inputs_on_bound_calls(device: str, kernel_options: list[str]) -> None:
    """An output that is an input (``set``) and one returned twice are copies on every call, as on the
    first."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], contiguity=[True])
        y = fd.ops.set(x)
        z = fd.ops.exp(x)
        fd.add_output(y)
        fd.add_output(z)
        fd.add_output(z)
    for _ in range(4):
        t = torch.randn(11, device=device)
        a, b, c = fd.execute([t], _enable_options=kernel_options)
        torch.testing.assert_close(a, t)
        torch.testing.assert_close(b, t.exp())
        assert a.data_ptr() != t.data_ptr() and b.data_ptr() != c.data_ptr()
    assert len(_bound_functions(fd.fec)) == 1


def test_float_scalars_are_the_functions_arguments(device: str, kernel_options: list[str]) -> None:
    """A floating-point input scalar's value is no part of the signature: the bound function takes it as
    an argument on every call (converted to its declared type: an int given for a Double computes as a
    float), into the kernel that reads it and into an ATen call; new values give new results."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[True, True])
        alpha = fd.define_scalar(dtype=DataType.Double)
        scaled = fd.ops.mul(x, alpha)
        fd.add_output(scaled)
        fd.add_output(fd.ops.sum(fd.ops.add(scaled, alpha), [1]))
    t = torch.randn(5, 7, device=device)
    for value in (1.0, 2.0, -3.0, 0.5, 2.0, -1.25):
        out, total = fd.execute([t, value], _enable_options=kernel_options)
        torch.testing.assert_close(out, t * value)
        torch.testing.assert_close(total, (t * value + value).sum(1), atol=1e-5, rtol=1e-5)
    assert len(_bound_functions(fd.fec)) == 1 and _bound_functions(fd.fec)[0] is not None
    out, _ = fd.execute([t, 3], _enable_options=kernel_options)  # an int: another signature, the same values
    torch.testing.assert_close(out, t * 3.0)


def test_calls_with_integer_scalars_or_in_place_outputs_keep_the_steps(device: str, kernel_options: list[str]) -> None:
    """An integer scalar may size a tensor (its value is bound with the sizes), and an output written
    into an input is work of every call: their signatures keep the program's run."""
    with FusionDefinition() as sized:
        x = sized.define_tensor([-1], contiguity=[True])
        n = sized.define_scalar(dtype=DataType.Int)
        sized.add_output(sized.ops.add(x, sized.ops.full([n], 1.0, dtype=DataType.Float)))
    t = torch.randn(7, device=device)
    for _ in range(3):
        torch.testing.assert_close(sized.execute([t, 7], _enable_options=kernel_options)[0], t + 1)
    assert [entry.bound for entry in sized.fec._by_signature.values()] == [False]

    with FusionDefinition() as in_place:
        x = in_place.define_tensor([-1], contiguity=[True])
        in_place.add_output(in_place.ops.add(x, 1.0), x)
    t = torch.zeros(5, device=device)
    for k in range(1, 4):
        in_place.execute([t], _enable_options=kernel_options)
        torch.testing.assert_close(t, torch.full((5,), float(k), device=device))
    assert [entry.bound for entry in in_place.fec._by_signature.values()] == [False]


def test_many_sizes_bind_at_most_the_programs_limit(device: str, kernel_options: list[str]) -> None:
    """Calls cycling through more sizes than a program keeps bindings for: the first
    ``SPECIALIZATION_LIMIT`` sizes bind, the others keep the program's run (no recording per call)."""
    fd = _norm_and_sum()
    sizes = [(3 + k, 4 + 2 * k) for k in range(SPECIALIZATION_LIMIT + 3)]
    for _ in range(3):
        for n, c in sizes:
            _check(fd, torch.randn(n, c, device=device), torch.randn(n, c, device=device), kernel_options)
    bound = [entry.bound for entry in fd.fec._by_signature.values()]
    assert sum(1 for b in bound if b) == SPECIALIZATION_LIMIT and bound.count(False) == 3
    assert all(f is not None for f in _bound_functions(fd.fec))
