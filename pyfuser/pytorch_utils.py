"""torch <-> pyfuser type translations under the names of nvFuser's ``nvfuser_direct.pytorch_utils``."""

from __future__ import annotations

import torch

from pyfuser.ir.dtypes import DataType, data_type_of_python

__all__ = ["python_scalar_to_nvfuser_dtype", "torch_dtype_to_nvfuser_dtype"]

_PYTHON_TYPES: dict[type, DataType] = {bool: DataType.Bool, int: DataType.Int, float: DataType.Double,
                                       complex: DataType.ComplexDouble}


def torch_dtype_to_nvfuser_dtype(dtype: torch.dtype | type) -> DataType:
    """The DataType of a torch dtype, or of a Python number type (``float`` -> Double, as nvFuser)."""
    if isinstance(dtype, type) and dtype in _PYTHON_TYPES:
        return _PYTHON_TYPES[dtype]
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"torch_dtype_to_nvfuser_dtype: expected a torch.dtype or a Python number type, got {dtype!r}")
    return DataType.from_torch(dtype)


def python_scalar_to_nvfuser_dtype(value: bool | int | float | complex) -> DataType:
    """The DataType a Python number is defined with."""
    return data_type_of_python(value)
