"""The output dtype rule of every op kind: torch's type promotion, found by running the kind's torch
reference on one-element CPU tensors, so definition-time dtypes (and rejections) match execution
exactly. Meta tensors would be cheaper but skip some of torch's checks (``tensor - True`` passes on
meta)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from pyfuser.ir.base import Val, as_tensor
from pyfuser.ir.dtypes import DataType, data_type_of_python, python_scalar_type

_PROBE_VALUES = {bool: True, int: 3, float: 1.5, complex: 1.5 + 0.5j}


def _dtype_of(x: Val | complex) -> DataType:
    return x.dtype if isinstance(x, Val) else data_type_of_python(x)


def _probe(val: Val | complex, number_like: bool = False) -> Any:
    if not isinstance(val, Val):
        # Torch promotes a Python number by its kind, never its value: a stand-in of the same kind
        # keeps value errors (``x_int // 0``) for execution, where they are reported as such.
        return _PROBE_VALUES[python_scalar_type(data_type_of_python(val))]
    tv = as_tensor(val)
    if tv is not None:
        # Real rank: a 0-dim tensor promotes like a number in torch, at definition as at execution
        # (also once broadcast to its op's rank: ``number_like``).
        return torch.ones((1,) * (0 if number_like else tv.ndim), dtype=tv.dtype.torch_dtype)
    return _PROBE_VALUES[python_scalar_type(val.dtype)]


def result_dtype(fn: Callable[..., Any], vals: Sequence[Val | complex], number_like: Sequence[int] = ()) -> DataType:
    """Result dtype of ``fn`` under torch's promotion, found by running it on tiny tensors
    (Python numbers by a number of their kind; ``number_like``: positions of tensors that were 0-dim
    before their op broadcast them, ``BinaryOp.number_like``)."""
    probes = [_probe(v, k in number_like) for k, v in enumerate(vals)]
    if not any(isinstance(p, torch.Tensor) for p in probes):
        # Scalars only: promote as 0-dim tensors of the scalars' dtypes would.
        probes = [torch.ones((), dtype=_dtype_of(v).torch_dtype) for v in vals]
    try:
        result = fn(*probes)
    except (RuntimeError, TypeError) as e:
        names = ", ".join(f"{v} ({_dtype_of(v)})" for v in vals)
        raise TypeError(f"operands {names} are not valid for this op: {e}") from None
    return DataType.from_torch(result.dtype)

