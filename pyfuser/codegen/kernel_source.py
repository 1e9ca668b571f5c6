"""What the code generator produces: a kernel's source and everything its launcher needs."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyfuser.ir.dtypes import DataType
from pyfuser.ir.symbolic import SymExpr


class KernelError(ValueError):
    """A segment the code generator cannot turn into a kernel; the message names tensor and axis."""


class KernelLaunchError(RuntimeError):
    """Triton refused to compile or launch a generated kernel (a code generator bug): the message names
    the kernel and the cause, ``source`` holds the kernel's text for the report."""

    def __init__(self, kernel: str, source: str, cause: Exception) -> None:
        super().__init__(f"generated kernel {kernel} failed to compile or launch: {type(cause).__name__}: {cause}")
        self.kernel = kernel
        self.source = source


class IndexOutOfRange(IndexError):
    """What a kernel run by Triton's interpreter raises for an index out of range (its prelude's
    ``_check_index``, the interpreter's stand-in for a device-side assert); the launch reports it as a
    ValueError, as ATen's indexing ops do on a CPU."""


@dataclass(frozen=True)
class SizeSource:
    """Where the launcher reads a size class: dim ``dim`` of input (``output=False``) or output
    ``index``; or, for a class no input holds, ``extent`` in the bound sizes (also for an output
    the launcher allocates itself, whose shape it must know first)."""

    symbol: str
    index: int = -1
    dim: int = -1
    output: bool = False
    extent: SymExpr | None = None


#: The alignment of an integer argument ``x``: ``ALIGNMENTS[x & 15]``, the largest power of two up to
#: 16 that divides it.
ALIGNMENTS = (16, 1, 2, 1, 4, 1, 2, 1, 8, 1, 2, 1, 4, 1, 2, 1)


def division_multiplier(divisor: int) -> int:
    """What a kernel divides a non-negative int32 index by ``divisor`` with (the prelude's ``_fdiv``):
    Granlund and Montgomery's round-up multiplier ``m`` and shift ``s`` (``n // d`` is ``(mulhi(n, m)
    + n) >> s`` for ``0 <= n < 2**31``, as CUTLASS's ``FastDivmod``), packed as ``2**40 + m * 2**8
    + s * 2 + 1``: odd and above 2**31, so Triton neither specializes it (on being 1 or a multiple of
    16) nor changes its type from one divisor to the next. A size passed at launch cannot be divided
    by as Inductor divides by the sizes it bakes in (a multiply by a constant); an integer division
    is a subroutine of about 20 instructions per element, which made index arithmetic the bottleneck
    of kernels over 3-D and 4-D tensors (a batch norm's rows of 7 x 7 pixels)."""
    if divisor < 1:  # an empty axis: no index is divided (the launch has no program or no lane)
        divisor = 1
    shift = (divisor - 1).bit_length()
    multiplier = ((1 << 32) * ((1 << shift) - divisor)) // divisor + 1
    return (1 << 40) | (multiplier << 8) | (shift << 1) | 1


def tensor_param(position: int) -> str:
    """The kernel parameter of tensor ``position`` (the segment's inputs, then its outputs)."""
    return f"T{position}"


def stride_param(position: int, dim: int) -> str:
    """The kernel parameter of tensor ``position``'s stride along ``dim``."""
    return f"st{position}_{dim}"


#: A stride parameter's name in a kernel, or in one step of a cooperative launch (``s{k}_`` before it):
#: groups (that prefix, the tensor's position).
STRIDE_PARAM = re.compile(r"(s\d+_)?st(\d+)_\d+")


def alignment_param(name: str) -> str:
    """The constexpr parameter that holds integer argument ``name``'s alignment (``ALIGNMENTS``).

    Triton specializes an integer argument only on being 1 or a multiple of 16, which a row of
    1000 or 1500 elements is not: without more, every load of such rows is an element wide. Inductor
    bakes sizes into its kernels; a kernel here takes them at launch, and is compiled per alignment
    of each instead (a variant per class: 1, 2, 4, 8, 16), which its first lines assert to Triton
    (the prelude's ``_aligned``)."""
    return f"{name}_align"


@dataclass(frozen=True)
class KernelSource:
    """A generated kernel and everything its launcher needs. Arguments, in order: tensors (the
    segment's tensor inputs, then its outputs), strides, sizes, the divisors' multipliers
    (``divisors``), scalars, the constexpr tile sizes of axes whose extent is only known at launch
    (``dynamic_tiles``), then the constexpr alignment of each stride and size (``alignment_param``)."""

    name: str
    source: str
    #: position in the segment's inputs of each tensor input and of each scalar argument
    tensor_inputs: tuple[int, ...]
    scalar_inputs: tuple[int, ...]
    #: (tensor position among inputs+outputs, dim) per stride argument
    stride_args: tuple[tuple[int, int], ...]
    sizes: tuple[SizeSource, ...]
    #: per grid axis used (x, y, z): extent over the size symbols
    grid: tuple[SymExpr, ...]
    #: (tensor input, dim, tensor input, dim): dims the kernel takes as one size, compared at launch
    size_checks: tuple[tuple[int, int, int, int], ...]
    #: (tensor input, dim, size): dims the kernel takes as a constant (an ``expand`` target)
    constant_checks: tuple[tuple[int, int, int], ...]
    #: per output: shape over the size symbols, allocation order, dtype
    output_shapes: tuple[tuple[SymExpr, ...], ...]
    output_perms: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[DataType, ...]
    #: the tensor names, for messages (inputs then outputs)
    tensor_names: tuple[str, ...]
    #: (extent over the size symbols, factor, message): a vectorized split that must divide at launch
    divisibility_checks: tuple[tuple[SymExpr, int, str], ...] = ()
    #: (constexpr parameter, extent over the size symbols, largest allowed power of two, message):
    #: a tile axis as wide as a runtime extent (a persistent row), sized at launch
    dynamic_tiles: tuple[tuple[str, SymExpr, int, str], ...] = ()
    #: (extent over the fusion's bound sizes, constant, message with ``{}`` for the size): static
    #: extents a kernel in a stream loop checks on the whole tensors, not on its chunks
    extent_checks: tuple[tuple[SymExpr, int, str], ...] = ()
    #: (extent over the size symbols, message): a reduced axis of a max / min, which ATen refuses
    #: when empty (there is no identity to return); checked at launch, before the early return
    #: of empty outputs
    nonempty_checks: tuple[tuple[SymExpr, str], ...] = ()
    #: (extent over the size symbols, message with ``{}`` for it): a pad's output axis, negative when
    #: the widths crop more than the axis has (ATen's error, before any allocation)
    nonnegative_checks: tuple[tuple[SymExpr, str], ...] = ()
    #: (extent over the fusion's bound sizes, the loop's extent over the size symbols, message with
    #: ``{}`` for both): a computed extent (a slice's, a pad's) the kernel iterates as one loop with
    #: other axes, which must have the loop's size at launch
    mapped_extent_checks: tuple[tuple[SymExpr, SymExpr, str], ...] = ()
    #: (tensor position, dim, the dims allocated just outside it, nearest first): the stride argument
    #: of ``dim`` multiplies the index of a merged group of those dims. Contiguity ignores the stride
    #: of a size-1 dim (torch gives it any value), so when ``dim`` has size 1 the launcher passes the
    #: stride of the nearest of them that has not, which is what the group's index steps by.
    stride_fallbacks: tuple[tuple[int, int, tuple[int, ...]], ...] = ()
    #: positions in ``scalar_inputs`` of Bool scalars, passed as ints (Triton 3.6's interpreter cannot
    #: take a Python bool argument; the kernel compares the int with 0)
    bool_scalars: tuple[int, ...] = ()
    #: positions in ``scalar_inputs`` of 0-dim CPU tensors, whose value the launch reads on the host
    cpu_scalars: tuple[int, ...] = ()
    #: the kernel asserts on the device (an index's range): compiled in Triton's debug mode, which
    #: alone keeps ``tl.device_assert``s, without its checks of every integer add for overflow
    #: (Inductor's options for its indirect loads)
    device_asserts: bool = False
    #: (parameter, divisor over the size symbols): an index divided by a size known at launch takes
    #: the divisor's multiplier (``division_multiplier``) as this argument
    divisors: tuple[tuple[str, SymExpr], ...] = ()
