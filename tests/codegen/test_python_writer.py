"""The one writer of generated host Python: names, constants and a traceback that shows the code."""

from __future__ import annotations

import traceback

import pytest

from pyfuser.codegen.python_writer import PythonWriter, define_function


def test_constants_are_bound_by_fresh_names_and_blocks_indent() -> None:
    writer = PythonWriter("test function")
    limit, other = writer.constant(3, "_limit"), writer.constant([1], "_limit")
    assert (limit, other) == ("_limit", "_limit1") and writer.env[limit] == 3 and writer.env[other] == [1]
    with writer.block("def f(x):"):
        with writer.block(f"if x > {limit}:"):
            writer.line(f"return {other}")
        writer.line("return x")
    f = writer.define("f")
    assert f(5) == [1] and f(2) == 2
    assert writer.source == f"def f(x):\n    if x > {limit}:\n        return {other}\n    return x\n"


def test_a_traceback_through_generated_code_shows_its_line_and_what_wrote_it() -> None:
    f = define_function("def check(x):", ["y = x + 1", "return y // x"], "checker of T0")
    with pytest.raises(ZeroDivisionError) as caught:
        f(0)
    text = "".join(traceback.format_exception(caught.value))
    assert "<pyfuser checker of T0 #" in text and "return y // x" in text
