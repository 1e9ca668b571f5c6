"""How a generated Triton kernel computes each pointwise op kind: the op-to-Triton table.

The IR's op enums (``ir/ops/pointwise.py``) hold the math (the torch reference) and the op's
metadata; the kernel text lives here, beside the prelude (``triton_support.py``) whose ``_name``
helpers the templates call, so that another backend adds its own table instead of editing the IR.
A kind missing from the table runs as an ATen call (``codegen/support.py`` says so to the
schedulers).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyfuser.ir.ops import BinaryOpType, TernaryOpType, UnaryOpType

PointwiseKind = UnaryOpType | BinaryOpType | TernaryOpType


@dataclass(frozen=True)
class TritonOp:
    """``template``: the Triton expression on operands ``{0}``, ``{1}``, ``{2}`` already converted to
    the op's compute dtype (``_name(...)`` helpers are the prelude's); ``floating_only``: the form is
    only exact in floating point (integer operands run as ATen calls)."""

    template: str
    floating_only: bool = False


TRITON_POINTWISE: dict[PointwiseKind, TritonOp] = {
    UnaryOpType.neg: TritonOp("-{0}"),
    UnaryOpType.abs: TritonOp("tl.abs({0})"),
    UnaryOpType.exp: TritonOp("tl.exp({0})"),
    UnaryOpType.log: TritonOp("tl.log({0})"),
    UnaryOpType.sqrt: TritonOp("tl.sqrt({0})"),
    UnaryOpType.rsqrt: TritonOp("tl.rsqrt({0})"),
    UnaryOpType.reciprocal: TritonOp("1.0 / {0}"),
    UnaryOpType.sin: TritonOp("tl.sin({0})"),
    UnaryOpType.cos: TritonOp("tl.cos({0})"),
    UnaryOpType.tanh: TritonOp("_tanh({0})"),
    UnaryOpType.sigmoid: TritonOp("_sigmoid({0})"),
    UnaryOpType.relu: TritonOp("tl.where({0} < 0, 0, {0})"),  # NaN stays NaN
    UnaryOpType.silu: TritonOp("{0} * _sigmoid({0})"),
    UnaryOpType.gelu: TritonOp("0.5 * {0} * (1.0 + tl.erf({0} * 0.7071067811865476))"),
    # 0.5 * x * (1 + tanh(u)) is x * sigmoid(2u): one exp and one reciprocal instead of libdevice's
    # tanh, which made the kernel compute-bound on an H200 (0.73 of copy bandwidth); as accurate
    # (no cancellation in 1 + tanh(u) for negative x).
    UnaryOpType.gelu_tanh: TritonOp("{0} * _sigmoid(1.5957691216057308 * ({0} + 0.044715 * {0} * {0} * {0}))"),
    UnaryOpType.erf: TritonOp("tl.erf({0})"),
    UnaryOpType.exp2: TritonOp("tl.exp2({0})", floating_only=True),
    UnaryOpType.log2: TritonOp("tl.log2({0})", floating_only=True),
    UnaryOpType.log10: TritonOp("tl.log({0}) * 0.4342944819032518", floating_only=True),
    UnaryOpType.log1p: TritonOp("_log1p({0})", floating_only=True),
    UnaryOpType.expm1: TritonOp("_expm1({0})", floating_only=True),
    # rounding: an integer is its own floor / ceil / trunc / round (torch's), the helpers pass it on
    UnaryOpType.floor: TritonOp("_floor({0})"),
    UnaryOpType.ceil: TritonOp("_ceil({0})"),
    UnaryOpType.trunc: TritonOp("_trunc({0})"),
    UnaryOpType.round: TritonOp("_round({0})"),
    UnaryOpType.frac: TritonOp("{0} - _trunc({0})", floating_only=True),
    UnaryOpType.sign: TritonOp("_sign({0})"),
    UnaryOpType.isnan: TritonOp("{0} != {0}"),
    UnaryOpType.isinf: TritonOp("_isinf({0})"),
    UnaryOpType.logical_not: TritonOp("{0} == 0"),
    UnaryOpType.cast: TritonOp("{0}"),
    BinaryOpType.add: TritonOp("{0} + {1}"),
    BinaryOpType.sub: TritonOp("{0} - {1}"),
    BinaryOpType.mul: TritonOp("{0} * {1}"),
    BinaryOpType.div: TritonOp("_div({0}, {1})"),
    BinaryOpType.truediv: TritonOp("{0} / {1}"),
    # C's remainder (the dividend's sign): Triton's ``%`` (``srem`` / ``frem``; the interpreter's numpy fmod)
    BinaryOpType.fmod: TritonOp("{0} % {1}"),
    BinaryOpType.mod: TritonOp("{0} % {1}"),
    BinaryOpType.pow: TritonOp("_pow({0}, {1})", floating_only=True),
    BinaryOpType.maximum: TritonOp("tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)"),
    BinaryOpType.minimum: TritonOp("tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)"),
    BinaryOpType.eq: TritonOp("{0} == {1}"),
    BinaryOpType.ne: TritonOp("{0} != {1}"),
    BinaryOpType.lt: TritonOp("{0} < {1}"),
    BinaryOpType.le: TritonOp("{0} <= {1}"),
    BinaryOpType.gt: TritonOp("{0} > {1}"),
    BinaryOpType.ge: TritonOp("{0} >= {1}"),
    BinaryOpType.logical_and: TritonOp("tl.where({0} != 0, {1} != 0, False)"),
    BinaryOpType.logical_or: TritonOp("tl.where({0} != 0, True, {1} != 0)"),
    # Integer and boolean operands only (torch's rule, checked at definition); exact on the operands
    # converted to the output's type: the low bits of a sign-extended value are the value's.
    BinaryOpType.bitwise_and: TritonOp("{0} & {1}"),
    BinaryOpType.bitwise_or: TritonOp("{0} | {1}"),
    BinaryOpType.bitwise_xor: TritonOp("{0} ^ {1}"),
    UnaryOpType.bitwise_not: TritonOp("_bitwise_not({0})"),
    TernaryOpType.where: TritonOp("tl.where({0} != 0, {1}, {2})"),
    TernaryOpType.clamp: TritonOp("_clamp({0}, {1}, {2})"),
}
