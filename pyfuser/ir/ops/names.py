"""How kernel math spells pointwise functions, as nvFuser prints them (its CUDA runtime names):
``expf`` for a float ``exp``, ``fmax`` for a floating ``maximum``, ``__half2float`` for a cast."""

from __future__ import annotations

from pyfuser.ir.dtypes import DataType

#: Math functions that have a single-precision variant spelled with an ``f`` suffix.
_FLOAT_SUFFIXED = frozenset({"exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "erf"})

#: Short type names used inside cast function names.
_CAST_NAME = {
    DataType.Float: "float", DataType.Double: "double", DataType.Half: "half", DataType.BFloat16: "bfloat",
    DataType.Int: "int64", DataType.Int32: "int32", DataType.Bool: "bool",
    DataType.ComplexFloat: "complex_float", DataType.ComplexDouble: "complex_double",
}


def unary_function(op: str, out: DataType) -> str:
    return f"{op}f" if out is DataType.Float and op in _FLOAT_SUFFIXED else op


def binary_function(op: str, out: DataType) -> str:
    """``maximum`` / ``minimum`` are ``fmax`` / ``fmin`` on floating values, ``max`` / ``min`` otherwise."""
    if op in ("maximum", "minimum"):
        return ("f" if out.is_floating else "") + op[:3]
    return op


def cast_function(src: DataType, dst: DataType) -> str:
    """``__half2float``-style names to and from 16-bit floats, ``__to_double``-style otherwise."""
    reduced = {DataType.Half: "half", DataType.BFloat16: "bfloat"}
    if src in reduced:
        dst_name = "int" if dst is DataType.Int else _CAST_NAME[dst]
        return f"__{reduced[src]}2{dst_name}"
    if dst in reduced:
        if src.is_complex:
            return f"__real_then_2{reduced[dst]}"
        src_name = "int" if src.is_integral else _CAST_NAME[src]
        return f"__{src_name}2{reduced[dst]}"
    prefix = "__real_then_to_" if src.is_complex and not dst.is_complex else "__to_"
    return prefix + _CAST_NAME[dst]
