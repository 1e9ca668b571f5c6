"""Integer helpers with no pyfuser dependency, shared by the schedulers, the code generator and
the runtime, so that none of them imports another layer for arithmetic (nvFuser's ``utils.h``)."""

from __future__ import annotations


def next_power_of_2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``): Triton tile sizes and size buckets."""
    return 1 << max(n - 1, 0).bit_length()
