"""Symbolic extents: printing, evaluation, simplification (and that it never changes a value)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyfuser.ir.symbolic import (
    SymBinary,
    SymConst,
    SymExpr,
    SymVar,
    as_sym,
    binary,
    ceil_div,
    product,
    sym_max,
    sym_min,
)

i0, i1, i2 = SymVar("i0"), SymVar("i1"), SymVar("i2")


@pytest.mark.parametrize(("expr", "text"), [
    (i0, "i0"),
    (i0 * i1, "( i0 * i1 )"),
    (product([i0, i1, i2]), "( ( i0 * i1 ) * i2 )"),
    (ceil_div(i0, 3), "( ceilDiv(i0, 3) )"),
    (ceil_div(ceil_div(i0, 3), 4), "( ceilDiv(( ceilDiv(i0, 3) ), 4) )"),
    (3 * ceil_div(i1, 2), "( 3 * ( ceilDiv(i1, 2) ) )"),
    (sym_max(i0 - 3, 0), "( max(( i0 - 3 ), 0) )"),
    (i0 // 2 + i1 % 3, "( ( i0 / 2 ) + ( i1 % 3 ) )"),
])
def test_printing(expr: SymExpr, text: str) -> None:
    assert str(expr) == text


@pytest.mark.parametrize(("expr", "simplified"), [
    (i0 + 0, i0), (0 + i0, i0), (i0 - 0, i0), (i0 - i0, SymConst(0)),
    (i0 * 1, i0), (1 * i0, i0), (i0 * 0, SymConst(0)),
    (ceil_div(i0, 1), i0), (i0 // 1, i0),
    (ceil_div(i0 * 4, 4), i0), ((4 * i0) // 4, i0),
    ((i0 + 1) + 2, i0 + 3), ((i0 - 5) + 2, i0 - 3), ((i0 + 2) - 2, i0), (i0 + -3, i0 - 3), (i0 - -3, i0 + 3),
    ((i0 * 2) * 3, i0 * 6),
    (sym_max(i0, i0), i0), (sym_min(i1, i1), i1),
    (ceil_div(10, 4), SymConst(3)), (SymConst(7) // 2, SymConst(3)), (sym_min(3, 5), SymConst(3)),
])
def test_simplification(expr: SymExpr, simplified: SymExpr) -> None:
    assert expr == simplified
    assert str(expr) == str(simplified)


def test_division_by_zero_is_not_folded_away() -> None:
    zero_div = ceil_div(i0 * 0 + 4, 0)
    assert isinstance(zero_div, SymBinary)
    with pytest.raises(ZeroDivisionError):
        zero_div.evaluate({})
    assert isinstance(binary("/", i0 * 0, SymConst(0)), SymBinary)


def test_evaluation_and_free_names() -> None:
    expr = ceil_div(i0 * i1, 3) + sym_max(i2, 2)
    assert expr.evaluate({"i0": 4, "i1": 5, "i2": 1}) == 7 + 2
    assert expr.free_names() == frozenset({"i0", "i1", "i2"})
    assert not expr.is_const and expr.value is None
    assert SymConst(4).is_const and SymConst(4).value == 4


def test_unbound_symbol_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="symbolic extent i1 is not bound to a size"):
        (i0 + i1).evaluate({"i0": 2})


@pytest.mark.parametrize("bad", [1.5, "4", True, None])
def test_as_sym_rejects_non_integers(bad: object) -> None:
    with pytest.raises(TypeError, match="expected an int or a symbolic extent"):
        as_sym(bad)  # type: ignore[arg-type]


def test_expressions_are_hashable_values() -> None:
    assert {i0 * 2: "a"}[SymVar("i0") * 2] == "a"
    assert ceil_div(i0, 3) != ceil_div(i0, 4)


# --- property: simplification never changes the value ---------------------------------------------
OPS = ["+", "-", "*", "/", "%", "ceilDiv", "max", "min"]
NAMES = ["i0", "i1", "i2"]


def naive(op: str, a: SymExpr, b: SymExpr) -> SymExpr:
    return SymBinary(op, a, b)


@st.composite
def expression_pairs(draw: st.DrawFn, depth: int = 4) -> tuple[SymExpr, SymExpr]:
    """The same random expression built twice: simplified (``binary``) and naive (``SymBinary``)."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        leaf: SymExpr = SymVar(draw(st.sampled_from(NAMES))) if draw(st.booleans()) else \
            SymConst(draw(st.integers(-6, 12)))
        return leaf, leaf
    op = draw(st.sampled_from(OPS))
    a_s, a_n = draw(expression_pairs(depth - 1))
    b_s, b_n = draw(expression_pairs(depth - 1))
    return binary(op, a_s, b_s), naive(op, a_n, b_n)


def evaluate_or_error(expr: SymExpr, env: dict[str, int]) -> int | type[Exception]:
    try:
        return expr.evaluate(env)
    except ZeroDivisionError as e:
        return type(e)


@settings(max_examples=300, deadline=None)
@given(expression_pairs(), st.fixed_dictionaries({n: st.integers(0, 50) for n in NAMES}))
def test_simplified_evaluates_like_naive(pair: tuple[SymExpr, SymExpr], env: dict[str, int]) -> None:
    simplified, naive_expr = pair
    want = evaluate_or_error(naive_expr, env)
    if want is ZeroDivisionError:
        return  # simplification may only make an undefined expression defined, never the reverse
    assert evaluate_or_error(simplified, env) == want, (str(simplified), str(naive_expr), env)
