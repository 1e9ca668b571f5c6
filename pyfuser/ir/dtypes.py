"""Data types of fusion values and their torch / printed spellings."""

from __future__ import annotations

from enum import Enum

import torch


class KindFlag(int):
    """A yes / no about a kind of value or ID that reads both ways: pyfuser's ``v.is_tensor`` and
    nvFuser's method call ``v.is_tensor()``."""

    def __call__(self) -> bool:
        return bool(self)

    def __repr__(self) -> str:
        return repr(bool(self))

    __str__ = __repr__


class DataType(Enum):
    Float = "float"
    Double = "double"
    Half = "__half"
    BFloat16 = "__bfloat"
    #: 8-bit floats (storage and casts; arithmetic on them computes in a cast-up dtype, as torch's)
    Float8_e4m3fn = "__e4m3"
    Float8_e5m2 = "__e5m2"
    Int = "int64_t"
    Int32 = "int"
    #: nvFuser's type of a Philox seed / offset tensor (SDPA's RNG state); few ops take it
    UInt64 = "uint64_t"
    Bool = "bool"
    ComplexFloat = "std::complex<float>"
    ComplexDouble = "std::complex<double>"
    Null = "null"

    def __str__(self) -> str:
        return self.value

    def __call__(self) -> DataType:
        """The type itself: nvFuser's ``tv.dtype()`` is a method where pyfuser's ``tv.dtype`` is this value,
        so both spellings give the DataType."""
        return self

    @property
    def torch_dtype(self) -> torch.dtype:
        if self is DataType.Null:
            raise ValueError("DataType.Null has no torch dtype")
        return _TO_TORCH[self]

    @staticmethod
    def from_torch(dtype: torch.dtype) -> DataType:
        try:
            return _FROM_TORCH[dtype]
        except KeyError:
            raise TypeError(f"torch dtype {dtype} has no pyfuser DataType") from None

    @property
    def is_floating(self) -> bool:
        return self in (DataType.Float, DataType.Double, DataType.Half, DataType.BFloat16, DataType.Float8_e4m3fn,
                        DataType.Float8_e5m2)

    @property
    def is_float8(self) -> bool:
        return self in (DataType.Float8_e4m3fn, DataType.Float8_e5m2)

    @property
    def is_complex(self) -> bool:
        return self in (DataType.ComplexFloat, DataType.ComplexDouble)

    @property
    def is_integral(self) -> bool:
        return self in (DataType.Int, DataType.Int32, DataType.UInt64)

    @property
    def itemsize(self) -> int:
        return self.torch_dtype.itemsize


_TO_TORCH: dict[DataType, torch.dtype] = {
    DataType.Float: torch.float32,
    DataType.Double: torch.float64,
    DataType.Half: torch.float16,
    DataType.BFloat16: torch.bfloat16,
    DataType.Float8_e4m3fn: torch.float8_e4m3fn,
    DataType.Float8_e5m2: torch.float8_e5m2,
    DataType.Int: torch.int64,
    DataType.Int32: torch.int32,
    DataType.UInt64: torch.uint64,
    DataType.Bool: torch.bool,
    DataType.ComplexFloat: torch.complex64,
    DataType.ComplexDouble: torch.complex128,
}
_FROM_TORCH: dict[torch.dtype, DataType] = {v: k for k, v in _TO_TORCH.items()}


def as_data_type(dtype: DataType | torch.dtype, allow_null: bool = False) -> DataType:
    """``dtype`` as a DataType. ``DataType.Null`` ("infer it", as in a reduction's ``dtype=``) is a
    TypeError unless ``allow_null``: no tensor or scalar has that type."""
    if isinstance(dtype, DataType):
        if dtype is DataType.Null and not allow_null:
            raise TypeError("DataType.Null is not a tensor or scalar type (it only means \"infer the dtype\" "
                            "where an op accepts that); pass a concrete DataType")
        return dtype
    if isinstance(dtype, torch.dtype):
        return DataType.from_torch(dtype)
    raise TypeError(f"expected a pyfuser DataType or torch.dtype, got {type(dtype).__name__}")


def python_scalar_type(dtype: DataType) -> type:
    if dtype is DataType.Bool:
        return bool
    if dtype.is_integral:
        return int
    if dtype.is_complex:
        return complex
    return float


#: torch's sizes, strides and element counts are int64.
INT64_MAX = 2**63 - 1


def integer_range(dtype: DataType) -> tuple[int, int] | None:
    """The values an integral ``dtype`` holds (None for other dtypes)."""
    if not dtype.is_integral:
        return None
    info = torch.iinfo(dtype.torch_dtype)
    return info.min, info.max


def check_scalar_in_range(value: object, dtype: DataType, what: str) -> None:
    """ValueError naming ``what`` when a Python int does not fit integral ``dtype`` (``2**70`` as an
    int64_t), which torch would report as an overflow deep inside an op."""
    bounds = integer_range(dtype)
    if bounds is not None and isinstance(value, int) and not bounds[0] <= value <= bounds[1]:
        raise ValueError(f"{what}: {value} does not fit {dtype} (valid: {bounds[0]}..{bounds[1]})")


def data_type_of_python(value: object) -> DataType:
    """The DataType a Python number is defined with (nvFuser: double / int64 / bool)."""
    if isinstance(value, bool):
        return DataType.Bool
    if isinstance(value, int):
        return DataType.Int
    if isinstance(value, float):
        return DataType.Double
    if isinstance(value, complex):
        return DataType.ComplexDouble
    raise TypeError(f"expected a Python number, got {type(value).__name__}")
