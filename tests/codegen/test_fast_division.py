"""Indices divided by sizes known at launch (``kernel_source.division_multiplier``, the prelude's ``_fdiv`` and
``_fmod``): an odd size takes the launch's multiplier, any other the plain division, and both give the
quotient of every non-negative int32 index."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyfuser import FusionDefinition
from pyfuser.codegen.compiled_kernel import load_kernel
from pyfuser.codegen.kernel_source import division_multiplier
from pyfuser.codegen.triton_support import prelude


def _divide(n: int, packed: int) -> int:
    """What ``_fdiv`` computes in 32-bit unsigned arithmetic."""
    multiplier, shift = (packed >> 8) & 0xFFFFFFFF, (packed >> 1) & 127
    return (((n * multiplier) >> 32) + n) >> shift


@settings(max_examples=2000, deadline=None)
@given(st.integers(1, 2**31 - 1), st.integers(0, 2**31 - 1))
def test_the_multiplier_divides_every_int32_index(divisor: int, n: int) -> None:
    packed = division_multiplier(divisor)
    assert packed % 2 == 1 and packed > 2**31  # never specialized by Triton, always one type
    assert _divide(n, packed) == n // divisor
    assert _divide(2**31 - 1, packed) == (2**31 - 1) // divisor
    assert _divide(n - n % divisor, packed) == n // divisor  # at a multiple, where rounding would show


@pytest.mark.parametrize("divisor", [1, 3, 7, 49, 1023, 12345, 2**31 - 1])
def test_the_kernel_helpers_divide_and_wrap(divisor: int) -> None:
    """``_fdiv`` and ``_fmod`` through Triton's interpreter on indices up to 2**31 - 1, odd divisors (the
    multiplier) and an even one (the plain division)."""
    pytest.importorskip("triton")
    source = prelude("interpreter") + '''

@_jit
def divide(Q, R, start, m, d, odd: tl.constexpr):
    n = start + tl.arange(0, 1024)
    if odd:
        tl.store(Q + tl.arange(0, 1024), _fdiv(n, m, d, 1))
        tl.store(R + tl.arange(0, 1024), _fmod(n, m, d, 1, 1))
    else:
        tl.store(Q + tl.arange(0, 1024), _fdiv(n, m, d, 2))
        tl.store(R + tl.arange(0, 1024), _fmod(n, m, d, 2, 1))
'''
    divide = load_kernel("divide", source)
    for d in (divisor, divisor + 1):
        for start in (0, divisor * 5 - 3, 2**31 - 1024):
            q, r = torch.empty(1024, dtype=torch.int32), torch.empty(1024, dtype=torch.int32)
            divide[(1,)](q, r, start, division_multiplier(d), d, d % 2 == 1)
            n = torch.arange(1024, dtype=torch.int64) + start
            assert torch.equal(q.long(), n // d) and torch.equal(r.long(), n % d), (d, start)


def _kernel_code(x: torch.Tensor) -> tuple[str, list[torch.Tensor]]:
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.mul(fd.ops.permute(fd.from_pytorch(x), [0, 2, 1, 3]), 2.0))
    got = fd.execute([x], _enable_options=["triton_interpreter"])
    return "\n".join(fd.fec.kernel_codes()), got


@pytest.mark.parametrize("shape", [(2, 5, 7, 3), (3, 4, 8, 16), (1, 33, 65, 5)])
def test_permuted_4d_tensors_of_odd_and_even_sizes(shape: tuple[int, ...]) -> None:
    """A permuted 4-D tensor's indices, taken from the flat index of its output: divided through the
    launch's multiplier for each size argument, whichever the alignment (the kernel decides per variant),
    and right for odd sizes (the multiplier) and even ones (the plain division)."""
    pytest.importorskip("triton")
    x = torch.randn(shape)
    code, (got,) = _kernel_code(x)
    torch.testing.assert_close(got, x.permute(0, 2, 1, 3) * 2.0)
    assert re.search(r"_fdiv\(", code) and re.search(r"_fmod\(", code), code
    assert not re.search(r" // \(?ks", code) and not re.search(r" % \(?ks", code), code  # no plain division by a size
