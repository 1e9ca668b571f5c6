"""A fusion as an executable Python definition: ``repr(fd)``, nvFuser's ``translate_fusion``.

The text is a function ``nvfuser_fusion(fd)`` that rebuilds an equal fusion: inputs in order,
every expr reachable from the outputs as its ``fd.ops`` call (``Expr.python_call``), in the order
``Fusion.exprs`` visits them, then the outputs with their stride orders and aliases: nvFuser's
text. A tensor ``T<N>`` is ``tv<N>`` as nvFuser prints its IR names, so a rebuilt fusion, whose
tensors are numbered in the printed order, prints the same text up to that renumbering. Scalars
are ``c<N>``, numbered in the order they are printed (size arithmetic has no IR scalar to name
it); constants of Python's own types (bool, int, float, complex) are written inline.
Size arguments (reshape shapes, slice bounds, pad widths) are symbolic extents: they are written
as scalar arithmetic on ``fd.ops.size`` of the input they come from, so a definition with
symbolic shapes rebuilds the same extents. Schedules are not part of a definition.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from pyfuser.ir.base import Expr, Scalar, Val
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.layout import stride_order_of_permutation
from pyfuser.ir.ops.shape import BroadcastOp
from pyfuser.ir.symbolic import SymBinary, SymCall, SymConst, SymExpr, SymVar
from pyfuser.ir.tensor_view import TensorView

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion

#: Dtypes a Python literal stands for (``fd.ops.mul(t, 2.0)`` makes a Double): other constants
#: are defined with ``fd.define_scalar(value, dtype=...)``.
_LITERAL_DTYPES = (DataType.Bool, DataType.Int, DataType.Double, DataType.ComplexDouble)

#: Size arithmetic as the ``fd.ops`` call on integer scalars that builds it again.
_SIZE_OPS = {"+": "add", "-": "sub", "*": "mul", "/": "div", "max": "maximum", "min": "minimum"}

HEADER = "def nvfuser_fusion(fd : FusionDefinition) -> None :\n"


def translate_fusion(fusion: Fusion) -> str:
    """The Python definition of ``fusion`` (raises for an expr that has no ``fd.ops`` form)."""
    return _Printer(fusion).run()


def float_literal(value: float) -> str:
    """nvFuser's spelling (``3.00000``, six significant digits) when it reads back as the same
    float, else Python's shortest exact one; infinities and NaN as ``float("inf")``."""
    if math.isinf(value):
        return 'float("-inf")' if value < 0 else 'float("inf")'
    if math.isnan(value):
        return 'float("nan")'
    short = f"{value:#g}"
    return short if float(short) == value else repr(value)


def literal(value: Any) -> str:
    """A Python number as source text that evaluates to exactly that number."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return float_literal(value)
    if isinstance(value, complex):
        return f"complex({float_literal(value.real)}, {float_literal(value.imag)})"
    raise TypeError(f"no Python literal for {value!r}")


class _Printer:
    def __init__(self, fusion: Fusion) -> None:
        self.fusion = fusion
        self.lines: list[str] = []
        self.names: dict[int, str] = {}
        #: the output of an implicit (rank-aligning) broadcast -> the operand it broadcasts
        self.aliases: dict[int, Val] = {}
        #: symbolic extents of input tensors: symbol -> (tensor, axis)
        self.axes: dict[str, tuple[TensorView, int]] = {}
        #: input scalars by the symbol they bind
        self.scalar_symbols: dict[str, Scalar] = {}
        self.size_names: dict[SymExpr, str] = {}
        self.counts = {"c": 0}
        self.tensor_names: set[str] = set()

    def run(self) -> str:
        for v in self.fusion.inputs():
            if isinstance(v, TensorView):
                self._define_tensor(v)
            elif isinstance(v, Scalar):
                self.scalar_symbols[v.symbol] = v
                self._emit(f"{self._name(v)} = fd.define_scalar(None, dtype={self._arg(v.dtype)})")
        for expr in self.fusion.exprs():
            if isinstance(expr, BroadcastOp) and expr.implicit:
                self.aliases[id(expr.output)] = expr.inputs[0]
                continue
            self._expr(expr)
        for pos, out in enumerate(self.fusion.outputs()):
            self._output(pos, out)
        return HEADER + "".join(f"    {line}\n" for line in self.lines)

    # --- statements ------------------------------------------------------------------------------
    def _emit(self, line: str) -> None:
        self.lines.append(line)

    def _define_tensor(self, tv: TensorView) -> None:
        logical = tv.get_logical_domain(no_reductions=True)
        shape = [i.extent.value if i.extent.is_const else -1 for i in logical]
        alloc = [i for i in tv.get_allocation_domain() if not i.is_reduction()]
        contiguity = [None if i.expanded else c for i, c in zip(alloc, tv.contiguity, strict=True)]
        position = {id(i): d for d, i in enumerate(logical)}
        kwargs: dict[str, Any] = {"shape": shape, "contiguity": contiguity, "dtype": tv.dtype, "is_cpu": tv.is_cpu}
        if tv.has_allocation_domain() and all(id(i) in position for i in alloc):
            perm = [position[id(i)] for i in alloc]
            if perm != sorted(perm):
                kwargs["stride_order"] = stride_order_of_permutation(perm)
        self._emit(f"{self._name(tv)} = fd.define_tensor({self._kwargs(kwargs)})")
        for d, i in enumerate(logical):
            if isinstance(i.extent, SymVar):
                self.axes.setdefault(i.extent.name, (tv, d))

    def _expr(self, expr: Expr) -> None:
        call = expr.python_call()
        args = [self._arg(a) for a in call.args]
        kwargs = self._kwargs(call.kwargs)
        inner = ", ".join(args + ([kwargs] if kwargs else []))
        outs = ", ".join(self._name(o) for o in expr.outputs)
        self._emit(f"{outs} = fd.ops.{call.op}({inner})")

    def _output(self, pos: int, out: Val) -> None:
        kwargs: dict[str, Any] = {}
        alias = self.fusion.output_alias(pos)
        if alias is not None:
            kwargs["alias_input"] = alias
        # a fusion's outputs are tensors (``Fusion.add_output`` checks), typed as the Vals they are
        order = self.fusion.get_output_stride_order(out) if isinstance(out, TensorView) else None
        if order is not None:
            kwargs["stride_order"] = order
        extra = self._kwargs(kwargs)
        self._emit(f"fd.add_output({self._arg(out)}{', ' + extra if extra else ''})")

    # --- arguments ---------------------------------------------------------------------------------
    def _fresh(self, prefix: str) -> str:
        number = self.counts[prefix]
        self.counts[prefix] = number + 1
        return f"{prefix}{number}"

    def _name(self, v: Val) -> str:
        name = self.names.get(id(v))
        if name is None:
            name = self._tensor_name(v) if isinstance(v, TensorView) else self._fresh("c")
            self.names[id(v)] = name
        return name

    def _tensor_name(self, tv: TensorView) -> str:
        """``tv<N>`` for the tensor ``T<N>``, as nvFuser names it; a name another tensor of the
        definition already has (a fusion whose tensors were renumbered) gets a number above all."""
        name = f"tv{tv.name}"
        if name in self.tensor_names:
            name = f"tv{max(t.name for t in self.fusion.tensors()) + 1 + len(self.tensor_names)}"
        self.tensor_names.add(name)
        return name

    def _kwargs(self, kwargs: dict[str, Any]) -> str:
        return ", ".join(f"{k}={self._arg(v)}" for k, v in kwargs.items() if v is not None)

    def _arg(self, a: Any) -> str:
        if a is None:
            return "None"
        if isinstance(a, Val):
            while id(a) in self.aliases:
                a = self.aliases[id(a)]
            if isinstance(a, Scalar) and a.is_const and a.definition is None:
                return self._constant(a)
            return self._name(a)
        if isinstance(a, SymExpr):
            return self._size(a)
        if isinstance(a, DataType):
            return f"DataType.{a.name}"
        if isinstance(a, str):
            return f'"{a}"' if a.isidentifier() else repr(a)
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(self._arg(x) for x in a) + "]"
        return literal(a)

    def _constant(self, c: Scalar) -> str:
        if c.dtype in _LITERAL_DTYPES:
            return literal(c.value)
        name = self.names.get(id(c))
        if name is None:  # defined where first used
            name = self._name(c)
            self._emit(f"{name} = fd.define_scalar({literal(c.value)}, dtype={self._arg(c.dtype)})")
        return name

    def _size(self, e: SymExpr) -> str:
        """A size expression as an int, or the name of a scalar that computes it (emitted once)."""
        if isinstance(e, SymConst):
            return str(e.val)
        name = self.size_names.get(e)
        if name is not None:
            return name
        if isinstance(e, SymVar):
            if e.name in self.scalar_symbols:
                return self._name(self.scalar_symbols[e.name])
            if e.name not in self.axes:
                raise ValueError(f"size {e.name} is neither an input scalar nor an extent of an input tensor")
            tv, dim = self.axes[e.name]
            line = f"fd.ops.size({self._name(tv)}, dim={dim})"
        elif isinstance(e, SymBinary):
            line = self._size_arithmetic(e)
        elif isinstance(e, SymCall):
            args = [self._host_value(a) for a in e.args]
            if not e.op:  # a floating value used as a size: the op takes it as it is
                return args[0]
            line = f"fd.ops.cast({args[0]}, dtype=DataType.{e.result})" if e.op == "cast" else \
                f"fd.ops.{e.op}({', '.join(args)})"
        else:
            raise TypeError(f"cannot print size expression {e}")
        name = self._fresh("c")
        self._emit(f"{name} = {line}")
        self.size_names[e] = name
        return name

    def _host_value(self, e: SymExpr) -> str:
        """An operand of host scalar arithmetic: a constant of any type as a literal, else a size."""
        return literal(e.val) if isinstance(e, SymConst) else self._size(e)

    def _size_arithmetic(self, e: SymBinary) -> str:
        a, b = self._size(e.lhs), self._size(e.rhs)
        if e.op in _SIZE_OPS:
            return f"fd.ops.{_SIZE_OPS[e.op]}({a}, {b})"
        if e.op == "ceilDiv":  # (a + b - 1) / b
            return f"fd.ops.div({self._size(e.lhs + (e.rhs - 1))}, {b})"
        if e.op == "%":  # a - (a / b) * b, with C's truncating division as nvFuser's extents
            return f"fd.ops.sub({a}, {self._size((e.lhs // e.rhs) * e.rhs)})"
        raise TypeError(f"cannot print size expression {e}")
