"""``repr(fd)`` is an executable Python definition (nvFuser's ``translate_fusion``): executed, it
rebuilds a fusion that computes the same outputs with the same strides and prints the same text
(up to the numbering of its tensors, which is their IR names, as nvFuser prints them).
``fd.repro_script_for`` / ``fd.last_repro_script`` add inputs of the recorded layouts."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from pyfuser import DataType, FusionDefinition, translate_fusion
from pyfuser.ir.base import Expr
from pyfuser.ir.python_definition import float_literal


def rebuild(fd: FusionDefinition) -> FusionDefinition:
    namespace: dict[str, Any] = {"FusionDefinition": FusionDefinition, "DataType": DataType}
    exec(repr(fd), namespace)
    with FusionDefinition() as again:
        namespace["nvfuser_fusion"](again)
    return again


def renumbered(text: str) -> str:
    """``text`` with its tensors numbered in the order they first appear."""
    names: dict[str, str] = {}
    return re.sub(r"\btv\d+\b", lambda m: names.setdefault(m.group(0), f"tv{len(names)}"), text)


def check_round_trip(build: Callable[[FusionDefinition], None], inputs: list[Any]) -> str:
    with FusionDefinition() as fd:
        build(fd)
    text = repr(fd)
    again = rebuild(fd)
    # Tensors print as their IR names (nvFuser's): a rebuilt fusion numbers them in printed order.
    assert renumbered(repr(again)) == renumbered(text), "the rebuilt definition prints the same statements"
    assert repr(rebuild(again)) == repr(again), "the printed definition of a rebuilt fusion is a fixed point"
    want = fd.execute(inputs)
    got = again.execute(inputs)
    assert len(want) == len(got)
    for w, g in zip(want, got, strict=True):
        assert w.dtype == g.dtype and w.stride() == g.stride()
        torch.testing.assert_close(g, w, equal_nan=True)
    return text


def test_the_nvfuser_form_of_a_definition() -> None:
    inputs = [torch.ones(2, 4, 8), torch.ones(2, 4, 8)]
    with FusionDefinition() as fd:
        t0, t1 = fd.from_pytorch(inputs[0]), fd.from_pytorch(inputs[1])
        t3 = fd.ops.mul(fd.ops.add(t0, t1), fd.define_scalar(3.0))
        fd.add_output(fd.ops.sum(t3, [1], False, DataType.Float))
    assert repr(fd) == translate_fusion(fd.fusion) == """\
def nvfuser_fusion(fd : FusionDefinition) -> None :
    tv0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float, is_cpu=False)
    tv1 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float, is_cpu=False)
    tv2 = fd.ops.add(tv0, tv1)
    tv3 = fd.ops.mul(tv2, 3.00000)
    tv4 = fd.ops.sum(tv3, dims=[1], dtype=DataType.Float)
    fd.add_output(tv4)
"""
    assert "T0_g_float" in str(fd), "str(fd) stays the kernel math"


def _pointwise(fd: FusionDefinition) -> None:
    x = fd.define_tensor([-1, -1], contiguity=[True, True])
    b = fd.define_tensor([-1], dtype=DataType.Half)
    zero_dim = fd.define_tensor([], dtype=DataType.Double)  # promotes like a number: x * t0d is float
    s = fd.define_scalar(dtype=DataType.Double)
    y = fd.ops.gelu(fd.ops.add(x, b), approximate="tanh")
    z = fd.ops.where(fd.ops.gt(y, 0.5), fd.ops.mul(y, zero_dim), fd.ops.cast(b, DataType.Float))
    fd.add_output(fd.ops.clamp(fd.ops.sub(z, s), -1.25, fd.define_scalar(2, dtype=DataType.Int32)))
    fd.add_output(fd.ops.div(fd.ops.cast(x, DataType.Int), 3))
    fd.add_output(s)  # a scalar output: full([], s)


def _reductions(fd: FusionDefinition) -> None:
    x = fd.define_tensor([-1, -1, 4], contiguity=True, stride_order=[0, 2, 1])
    fd.add_output(fd.ops.sum(x, [0, 2], keepdim=True))
    var, mean = fd.ops.var_mean(x, [1], correction=0)
    fd.add_output(var)
    fd.add_output(mean, stride_order=[0, 1])
    fd.add_output(fd.ops.max(x, 1, dtype=DataType.Double))
    fd.add_output(fd.ops.mean(fd.ops.permute(x, [2, 0, 1]), [0]))


def _shapes(fd: FusionDefinition) -> None:
    x = fd.define_tensor([-1, -1])
    one = fd.define_tensor([1, -1], contiguity=[None, True])
    n = fd.define_scalar(dtype=DataType.Int)
    rows = fd.ops.size(x, 0)
    fd.add_output(fd.ops.reshape(x, [fd.ops.mul(rows, fd.ops.size(x, 1)), 1]))
    fd.add_output(fd.ops.reshape(x, [-1]))
    fd.add_output(fd.ops.slice(x, [1, 0], [-1, n]))
    fd.add_output(fd.ops.pad(x, [1, fd.ops.sub(n, 1), 0, 2], 7.5))
    fd.add_output(fd.ops.cat([x, fd.ops.cast(x, DataType.Double)], -1))
    fd.add_output(fd.ops.expand(fd.ops.squeeze(one, [0]), [-1]))
    fd.add_output(fd.ops.broadcast_in_dim(fd.ops.squeeze(one, [0]), [rows, fd.ops.size(x, 1)], [1]))
    fd.add_output(fd.ops.full([n, 2], 1.5, DataType.BFloat16))
    fd.add_output(fd.ops.iota(fd.ops.size(x, 1), 2, 3, DataType.Int))
    fd.add_output(fd.ops.segment_set(fd.ops.set(fd.ops.stride_order(x, [0, 1]))))


def _contractions(fd: FusionDefinition) -> None:
    a = fd.define_tensor([-1, -1, -1])
    w = fd.define_tensor([-1, -1])
    bias = fd.define_tensor([-1])
    fd.add_output(fd.ops.linear(a, w, bias))
    fd.add_output(fd.ops.linear(a, w))
    fd.add_output(fd.ops.matmul(a, fd.ops.permute(w, [1, 0])))


@pytest.mark.parametrize(("build", "inputs"), [
    (_pointwise, [torch.randn(3, 5), torch.randn(5, dtype=torch.half), torch.tensor(2.5, dtype=torch.double), 0.25]),
    (_reductions, [torch.randn(5, 4, 3).permute(2, 0, 1)]),  # axis 1 outermost, axis 0 innermost
    (_shapes, [torch.randn(4, 6), torch.randn(1, 6), 3]),
    (_contractions, [torch.randn(2, 3, 4), torch.randn(5, 4), torch.randn(5)]),
], ids=["pointwise", "reductions", "shapes", "contractions"])
def test_printed_definitions_rebuild_equal_fusions(build: Callable[[FusionDefinition], None], inputs: list[Any]) -> None:
    check_round_trip(build, inputs)


def test_implicit_broadcasts_are_not_printed() -> None:
    """A pointwise op aligns ranks with a broadcast the user never wrote: the definition passes the
    operand itself, so a 0-dim operand still promotes like a number when rebuilt."""
    text = check_round_trip(_pointwise, [torch.randn(3, 5), torch.randn(5, dtype=torch.half),
                                         torch.tensor(2.5, dtype=torch.double), 0.25])
    assert "broadcast" not in text
    # The broadcasts keep their IR names (T3, T7), so the printed names skip them.
    assert "tv4 = fd.ops.add(tv0, tv1)" in text and "tv8 = fd.ops.mul(tv5, tv2)" in text
    assert 'tv5 = fd.ops.gelu(tv4, approximate="tanh")' in text


def test_expanded_input_and_in_place_output_print_back() -> None:
    x = torch.randn(1, 5).expand(4, 5)
    acc = torch.zeros(4, 5)

    def build(fd: FusionDefinition) -> None:
        t = fd.from_pytorch(x)
        a = fd.define_tensor([-1, -1])
        out = fd.ops.add(a, t)
        fd.add_output(out, alias_input=a)
        fd.add_output(out)

    with FusionDefinition() as fd:
        build(fd)
    text = repr(fd)
    assert "contiguity=[None, True]" in text and "alias_input=tv1" in text
    (returned,) = rebuild(fd).execute([x, acc])
    torch.testing.assert_close(acc, x + 0)
    torch.testing.assert_close(returned, x + 0)


def test_cpu_scalar_tensor_and_non_default_constants() -> None:
    def build(fd: FusionDefinition) -> None:
        t = fd.define_tensor([-1], dtype=DataType.Half)
        s = fd.define_tensor([], dtype=DataType.Float, is_cpu=True)
        fd.add_output(fd.ops.mul(fd.ops.add(t, s), fd.define_scalar(0.1, dtype=DataType.Float)))
        fd.add_output(fd.ops.add(fd.ops.cast(t, DataType.Float), complex(1.5, -2)))

    text = check_round_trip(build, [torch.randn(6, dtype=torch.half), torch.tensor(2.0)])
    assert "is_cpu=True" in text and "fd.define_scalar(0.100000, dtype=DataType.Float)" in text
    assert "complex(1.50000, -2.00000)" in text


@pytest.mark.parametrize(("value", "text"), [
    (3.0, "3.00000"), (0.1, "0.100000"), (1e-10, "1.00000e-10"), (3.14159265358979, "3.14159265358979"),
    (float("inf"), 'float("inf")'), (-float("inf"), 'float("-inf")'), (float("nan"), 'float("nan")'),
])
def test_float_constants_print_exactly(value: float, text: str) -> None:
    assert float_literal(value) == text
    if value == value:
        assert eval(text) == value


def test_repro_scripts_record_layouts() -> None:
    x, y = torch.ones(2, 4, 8), torch.randn(8, 4).t()
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.add(fd.from_pytorch(x), fd.from_pytorch(y)))
    with pytest.raises(ValueError, match=r"fd.last_repro_script\(\) cannot provide a repro because "
                                         r"fd.execute\(inputs, save_repro_inputs=True\) was not executed!"):
        fd.last_repro_script()
    without = fd.repro_script_for()
    assert repr(fd) in without and "inputs = [" not in without
    fd.execute([x, y], save_repro_inputs=True)
    script = fd.last_repro_script()
    assert script == fd.repro_script_for([x, y])
    assert "torch.testing.make_tensor((2, 4, 8), dtype=torch.float32, device='cpu')," in script
    assert "torch.randn(32, dtype=torch.float32, device='cpu').as_strided((4, 8), (1, 4))," in script
    exec(script, {})  # runs standalone


def test_an_op_without_a_python_form_is_named() -> None:
    class Opaque(Expr):
        def evaluate(self, ctx: Any, *args: Any) -> list[Any]:
            return list(args)

        def to_string(self, indent: int = 0) -> str:
            return "opaque\n"

    with FusionDefinition() as fd:
        t = fd.define_tensor([-1])
        out, extra = fd.ops.neg(t), fd.ops.neg(t)
        Opaque(fd.fusion, [out], [extra])  # extra is now defined by an op fd.ops does not have
        fd.add_output(extra)
    with pytest.raises(NotImplementedError, match="Opaque has no Python definition form"):
        repr(fd)


def test_tensors_print_as_their_ir_names_in_nvfusers_order() -> None:
    """nvFuser's text: the exprs in ``Fusion.exprs`` order (each output's inputs first, in operand
    order), every tensor ``tv<N>`` for its IR name ``T<N>``, so the names are not in printed order
    and skip the broadcasts a pointwise op adds (T6, T8)."""
    def build(fd: FusionDefinition) -> None:
        x, y = fd.define_tensor([-1, -1]), fd.define_tensor([-1])
        e = fd.ops.exp(y)
        m = fd.ops.max(x, [1])
        n = fd.ops.neg(x)
        fd.add_output(fd.ops.mul(fd.ops.add(m, fd.ops.sum(e, [0])), fd.ops.sum(fd.ops.add(n, e), [1])))

    text = check_round_trip(build, [torch.randn(3, 5), torch.randn(5)])
    assert text.split("\n", 3)[3] == """\
    tv3 = fd.ops.max(tv0, dims=[1], dtype=DataType.Float)
    tv2 = fd.ops.exp(tv1)
    tv5 = fd.ops.sum(tv2, dims=[0], dtype=DataType.Float)
    tv7 = fd.ops.add(tv3, tv5)
    tv4 = fd.ops.neg(tv0)
    tv9 = fd.ops.add(tv4, tv2)
    tv10 = fd.ops.sum(tv9, dims=[1], dtype=DataType.Float)
    tv11 = fd.ops.mul(tv7, tv10)
    fd.add_output(tv11)
"""


def test_slices_print_normalized_and_trivial_sums_as_squeezes() -> None:
    """As nvFuser prints them: a slice's bounds normalized (negative ones counted from the end,
    clamped) with ``manual_normalization=True``; a sum of an axis sliced to one element (a
    broadcast, beside an axis left to iterate) is a squeeze. Bounds against a symbolic extent are printed
    as given, without the flag."""
    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([3, 8], dtype=DataType.BFloat16)
        fd.add_output(fd.ops.sum(fd.ops.slice(x, [-1, 2], [3, -2]), [0]))
        fd.add_output(fd.ops.slice(fd.define_tensor([-1]), [1], [-1]))

    x, z = torch.randn(3, 8, dtype=torch.bfloat16), torch.randn(6)
    text = check_round_trip(build, [x, z])
    assert "tv1 = fd.ops.slice(tv0, start_indices=[2, 2], end_indices=[3, 6], strides=[1, 1], " \
        "manual_normalization=True)\n    tv2 = fd.ops.squeeze(tv1, dims=[0])\n" in text
    assert "tv4 = fd.ops.slice(tv3, start_indices=[1], end_indices=[-1], strides=[1])\n" in text
    with FusionDefinition() as fd:
        build(fd)
    summed, sliced = fd.execute([x, z])
    torch.testing.assert_close(summed, x[-1:3, 2:-2].sum(0))
    torch.testing.assert_close(sliced, z[1:-1])
