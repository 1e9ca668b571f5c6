"""Symbolic integer arithmetic for extents.

Extents of IterDomains are small immutable expression trees over named integers (``i0``,
``i2``, ...) bound when a fusion is executed.  They print the way nvFuser prints them:
``i0``, ``( i0 * i2 )``, ``( ceilDiv(i4, 3) )``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


class SymExpr(ABC):
    """Base of the symbolic integer expression tree (immutable, hashable)."""

    __slots__ = ()

    @abstractmethod
    def evaluate(self, env: Mapping[str, int]) -> int:
        """The value once every named size in ``env`` is bound."""

    @abstractmethod
    def free_names(self) -> frozenset[str]:
        """Names of the sizes this extent depends on."""

    @property
    def is_const(self) -> bool:
        return isinstance(self, SymConst)

    @property
    def value(self) -> int | None:
        """The integer value if constant, else None."""
        return self.val if isinstance(self, SymConst) else None

    def __add__(self, other: SymExpr | int) -> SymExpr:
        return binary("+", self, as_sym(other))

    def __radd__(self, other: int) -> SymExpr:
        return binary("+", as_sym(other), self)

    def __sub__(self, other: SymExpr | int) -> SymExpr:
        return binary("-", self, as_sym(other))

    def __rsub__(self, other: int) -> SymExpr:
        return binary("-", as_sym(other), self)

    def __mul__(self, other: SymExpr | int) -> SymExpr:
        return binary("*", self, as_sym(other))

    def __rmul__(self, other: int) -> SymExpr:
        return binary("*", as_sym(other), self)

    def __floordiv__(self, other: SymExpr | int) -> SymExpr:
        return binary("/", self, as_sym(other))

    def __mod__(self, other: SymExpr | int) -> SymExpr:
        return binary("%", self, as_sym(other))


@dataclass(frozen=True, slots=True)
class SymConst(SymExpr):
    val: int

    def evaluate(self, env: Mapping[str, int]) -> int:
        return self.val

    def free_names(self) -> frozenset[str]:
        return frozenset()

    def __str__(self) -> str:
        return str(self.val)


@dataclass(frozen=True, slots=True)
class SymVar(SymExpr):
    name: str

    def evaluate(self, env: Mapping[str, int]) -> int:
        try:
            return env[self.name]
        except KeyError:
            raise ValueError(f"symbolic extent {self.name} is not bound to a size") from None

    def free_names(self) -> frozenset[str]:
        return frozenset((self.name,))

    def __str__(self) -> str:
        return self.name


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _trunc_div(a: int, b: int) -> int:
    """C's integer division (toward zero), as nvFuser's extents and integer ``div``."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _trunc_mod(a: int, b: int) -> int:
    """C's remainder (the dividend's sign), paired with ``_trunc_div``."""
    return a - _trunc_div(a, b) * b


_APPLY: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": _trunc_div,
    "%": _trunc_mod,
    "ceilDiv": _ceil_div,
    "max": max,
    "min": min,
}
_FUNCTION_OPS = ("ceilDiv", "max", "min")


@dataclass(frozen=True, slots=True)
class SymBinary(SymExpr):
    op: str
    lhs: SymExpr
    rhs: SymExpr

    def evaluate(self, env: Mapping[str, int]) -> int:
        return _APPLY[self.op](self.lhs.evaluate(env), self.rhs.evaluate(env))

    def free_names(self) -> frozenset[str]:
        return self.lhs.free_names() | self.rhs.free_names()

    def __str__(self) -> str:
        if self.op in _FUNCTION_OPS:
            return f"( {self.op}({self.lhs}, {self.rhs}) )"
        return f"( {self.lhs} {self.op} {self.rhs} )"


def as_sym(x: SymExpr | int) -> SymExpr:
    if isinstance(x, SymExpr):
        return x
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"expected an int or a symbolic extent, got {type(x).__name__}")
    return SymConst(x)


def _const_rhs(e: SymExpr, *ops: str) -> tuple[SymExpr, int] | None:
    """``(x, c)`` when ``e`` is ``x op c`` with a constant ``c`` and ``op`` in ``ops``."""
    if isinstance(e, SymBinary) and e.op in ops and e.rhs.value is not None:
        return e.lhs, e.rhs.value
    return None


def _add_const(a: SymExpr, c: int) -> SymExpr:
    """``a + c`` for a constant ``c``: a constant offset already on ``a`` is folded in, and a
    negative total prints as a subtraction (``( i0 - 2 )``)."""
    if isinstance(a, SymBinary) and (inner := _const_rhs(a, "+", "-")) is not None:
        x, k = inner
        c += k if a.op == "+" else -k
        a = x
    if c == 0:
        return a
    return SymBinary("+", a, SymConst(c)) if c > 0 else SymBinary("-", a, SymConst(-c))


def binary(op: str, a: SymExpr, b: SymExpr) -> SymExpr:
    """Build ``a op b``, simplified: constants folded, identities dropped, constant offsets and
    factors combined (``( i0 + 1 ) + 2`` -> ``( i0 + 3 )``). Every rule holds for all integers
    except division by zero, which stays unsimplified so evaluation still reports it."""
    av, bv = a.value, b.value
    if av is not None and bv is not None and not (op in ("/", "%", "ceilDiv") and bv == 0):
        return SymConst(_APPLY[op](av, bv))
    if op == "+":
        if av == 0:
            return b
        if bv is not None:
            return _add_const(a, bv)
    elif op == "-":
        if a == b:
            return SymConst(0)
        if bv is not None:
            return _add_const(a, -bv)
    elif op == "*":
        if av == 1:
            return b
        if bv == 1:
            return a
        if av == 0 or bv == 0:
            return SymConst(0)
        if bv is not None and (inner := _const_rhs(a, "*")) is not None:
            return binary("*", inner[0], SymConst(inner[1] * bv))
    elif op in ("/", "ceilDiv"):
        if bv == 1:
            return a
        # (x * c) / c -> x, for merges that are split back by the same factor.
        if isinstance(a, SymBinary) and a.op == "*" and bv is not None and bv != 0:
            if a.rhs.value == bv:
                return a.lhs
            if a.lhs.value == bv:
                return a.rhs
    elif op in ("max", "min") and a == b:
        return a
    return SymBinary(op, a, b)


def ceil_div(a: SymExpr | int, b: SymExpr | int) -> SymExpr:
    return binary("ceilDiv", as_sym(a), as_sym(b))


def sym_max(a: SymExpr | int, b: SymExpr | int) -> SymExpr:
    return binary("max", as_sym(a), as_sym(b))


def sym_min(a: SymExpr | int, b: SymExpr | int) -> SymExpr:
    return binary("min", as_sym(a), as_sym(b))


def product(items: list[SymExpr]) -> SymExpr:
    """Left-nested product, printed like nvFuser: ``( ( i0 * i2 ) * i3 )``."""
    result: SymExpr = SymConst(1)
    for item in items:
        result = result * item
    return result


@dataclass(frozen=True, slots=True)
class SymCall(SymExpr):
    """A value computed on the host from other symbolic values: scalar arithmetic that is not size
    arithmetic (``signbit``, ``fmod``, a cast, a float product), known before any op runs. ``op`` is
    the ``fd.ops`` name (``""``: a conversion to a size), ``operands`` / ``result`` the dtype names."""

    op: str
    operands: tuple[str, ...]
    result: str
    fn: Callable[..., Any] = field(compare=False)
    args: tuple[SymExpr, ...]

    def evaluate(self, env: Mapping[str, int]) -> Any:
        return self.fn(*(a.evaluate(env) for a in self.args))

    def free_names(self) -> frozenset[str]:
        return frozenset().union(*(a.free_names() for a in self.args))

    def __str__(self) -> str:
        return f"{self.op or 'size'}({', '.join(map(str, self.args))})"


def sym_call(op: str, operands: tuple[str, ...], result: str, fn: Callable[..., Any],
             args: tuple[SymExpr, ...]) -> SymExpr:
    """``SymCall``, folded to a constant when every argument is one and the result is an int."""
    call = SymCall(op, operands, result, fn, args)
    if not call.free_names():
        value = call.evaluate({})
        if isinstance(value, int) and not isinstance(value, bool):
            return SymConst(value)
    return call
