"""Val and Expr: the nodes of the fusion graph."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, cast

from pyfuser.ir.dtypes import DataType, KindFlag, python_scalar_type
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.symbolic import SymConst, SymExpr, SymVar, sym_call

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion
    from pyfuser.ir.iter_domain import IterDomain
    from pyfuser.ir.tensor_view import TensorView


class FusionRuleError(RuntimeError):
    """A fusion that breaks one of nvFuser's rules for what a fusion may compute (an output computed only
    from CPU scalar tensors beside device tensors: its issue 2853), raised as nvFuser raises it (a
    ``RuntimeError``), naming the values concerned: a rejection of the definition, not an internal error."""


class UnsupportedFeatureError(NotImplementedError):
    """A feature of nvFuser's CUDA code generator or GPU hardware (TMA bulk copies, ldmatrix, warp
    specialization) that pyfuser's Triton kernels do not express: raised where the user asks for it,
    so nvFuser code fails at that line with what to use instead, never later in a kernel."""

    def __init__(self, feature: str, instead: str) -> None:
        super().__init__(f"pyfuser does not implement {feature}; {instead}")


class Val:
    """A value of the fusion: a TensorView or a Scalar."""

    #: True for TensorView: lets modules below tensor_view.py tell tensors from scalars.
    is_tensor: ClassVar[KindFlag] = KindFlag(False)
    #: The number the fusion gave the value, unique among its kind (printed ``T3``, ``i2``).
    name: int

    def __init__(self, fusion: Fusion, dtype: DataType) -> None:
        self.fusion = fusion
        self.dtype = dtype
        self.definition: Expr | None = None
        self.uses: list[Expr] = []

    @property
    def short_name(self) -> str:
        """How an error names the value: ``T3`` for a tensor, the printed scalar otherwise."""
        return str(self)

    @property
    def is_fusion_input(self) -> bool:
        return any(v is self for v in self.fusion.inputs())

    @property
    def is_fusion_output(self) -> bool:
        return any(v is self for v in self.fusion.outputs())


class Scalar(Val):
    """A scalar value: a constant, a fusion input (``value`` None), or an extent."""

    def __init__(self, fusion: Fusion, dtype: DataType, value: Any = None) -> None:
        super().__init__(fusion, dtype)
        self.value = None if value is None else python_scalar_type(dtype)(value)
        self.name = fusion.next_name("scalar")
        #: For an input scalar used where small values are meaningless (a size, a slice index: >= 0;
        #: a split factor: >= 1): the smallest valid value and the use to name when a value below
        #: it is bound.
        self.lower_bound: tuple[int, str] | None = None
        #: For an integer scalar computed from sizes (``fd.ops.size``, arithmetic of sizes and
        #: constants): the size expression it stands for, so it can size an op (reshape to a
        #: computed shape, dynamic pad widths and slice bounds) like a constant or an input.
        self.extent_expr: SymExpr | None = None

    def require_at_least(self, minimum: int, use: str) -> None:
        """Record that this input scalar must be at least ``minimum`` at execution (``use`` names why)."""
        if self.lower_bound is None or minimum > self.lower_bound[0]:
            self.lower_bound = (minimum, use)

    @property
    def is_const(self) -> bool:
        return self.value is not None

    @property
    def symbol(self) -> str:
        """Name under which an input scalar is bound at execution (and usable as an extent)."""
        return f"{_SCALAR_PREFIX.get(self.dtype, 's')}{self.name}"

    @property
    def is_size_like(self) -> bool:
        """Whether the value is known before any op runs: a constant, an input, or a size expression."""
        return self.is_const or self.is_fusion_input or self.extent_expr is not None

    def host_expr(self) -> SymExpr | None:
        """The value as a host expression when it is known before any op runs (a constant, an
        integer input, scalar arithmetic of those and sizes), else None."""
        if self.value is not None:
            return SymConst(self.value)
        if self.extent_expr is not None:
            return self.extent_expr
        if self.is_fusion_input and self.dtype.is_integral:
            return SymVar(self.symbol)
        return None

    def as_extent(self) -> SymExpr:
        if self.dtype.is_floating and self.extent_expr is not None:
            # nvFuser sizes ops with floating scalars computed on the host (192 * (1 / 32)): usable when whole
            return sym_call("", (self.dtype.name,), "Int", _whole_size(str(self)), (self.extent_expr,))
        if not (self.dtype.is_integral):
            raise TypeError(f"scalar {self} of type {self.dtype} cannot be used as a size; expected an integer")
        if self.value is not None:
            return SymConst(int(self.value))
        if self.extent_expr is not None:
            return self.extent_expr
        return SymVar(self.symbol)

    def __str__(self) -> str:
        if self.is_const:
            value = self.value
            if isinstance(value, bool):
                value = str(value).lower()
            return f"{self.dtype.value}({value})"
        return self.symbol

    __repr__ = __str__


_SCALAR_PREFIX = {
    DataType.Double: "d", DataType.Float: "f", DataType.Int: "i", DataType.Int32: "i", DataType.UInt64: "i",
    DataType.Bool: "b", DataType.ComplexDouble: "c", DataType.ComplexFloat: "c",
    DataType.Half: "h", DataType.BFloat16: "h",
}


@dataclass(frozen=True)
class PythonCall:
    """How the Python definition (``repr(fd)``) rebuilds one expr: ``fd.ops.<op>(*args, **kwargs)``.

    Arguments are Vals (printed by name), size expressions (printed as scalar arithmetic on
    ``fd.ops.size``), DataTypes, Python literals, or lists of those; a keyword whose value is
    None is left out.
    """

    op: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


class Expr(ABC):
    """An operation of the fusion: inputs -> outputs, with a torch reference implementation."""

    #: False for ops whose attributes depend on the full extent of every axis (reshape, ...);
    #: such an op cannot run on chunks of a stream-parallel loop.
    chunkable: ClassVar[bool] = True
    #: True for ops whose torch reference always returns new memory, never a view of an operand (the
    #: Host IR evaluator then needs no aliasing check for a fusion output derived from it).
    returns_new_memory: ClassVar[bool] = False

    def __init__(self, fusion: Fusion, inputs: Sequence[Val], outputs: Sequence[Val]) -> None:
        self.fusion = fusion
        self.inputs: list[Val] = list(inputs)
        #: Inputs as defined: positional attributes (runtime size checks) refer to these, and stay valid
        #: when a pass replaces an input or a host loop runs the expr on per-chunk copies.
        self.defined_inputs: tuple[Val, ...] = tuple(inputs)
        self.outputs: list[Val] = list(outputs)
        self.name = fusion.next_name("expr")
        for out in self.outputs:
            out.definition = self
        for inp in self.inputs:
            inp.uses.append(self)
        fusion.mark_changed()

    # --- graph edits ---------------------------------------------------------------------
    def replace_input(self, old: Val, new: Val) -> None:
        for i, v in enumerate(self.inputs):
            if v is old:
                self.inputs[i] = new
                new.uses.append(self)
        old.uses[:] = [e for e in old.uses if e is not self]
        self.fusion.mark_changed()

    def replace_output(self, old: Val, new: Val) -> None:
        for i, v in enumerate(self.outputs):
            if v is old:
                self.outputs[i] = new
                new.definition = self
        old.definition = None
        self.fusion.mark_changed()

    @property
    def tensor_inputs(self) -> list[TensorView]:
        return [cast("TensorView", v) for v in self.inputs if v.is_tensor]

    @property
    def tensor_outputs(self) -> list[TensorView]:
        return [cast("TensorView", v) for v in self.outputs if v.is_tensor]

    def tensor_input(self, position: int, *, as_defined: bool = False) -> TensorView:
        """The input at ``position`` of an op whose operand there is always a tensor; ``as_defined``
        reads ``defined_inputs`` (what runtime size-check messages name). Typed, so callers reach
        tensor attributes without a cast, and a scalar there fails naming the op and position."""
        v = (self.defined_inputs if as_defined else self.inputs)[position]
        if not v.is_tensor:
            raise TypeError(f"{self.op_description}: input {position} must be a tensor, got scalar {v}")
        return cast("TensorView", v)

    @property
    def output(self) -> TensorView:
        return self.outputs[0]  # type: ignore[return-value]  # a tensor op's; unchecked on this hot path

    @property
    def op_description(self) -> str:
        """What computes the outputs, as error messages name it."""
        return type(self).__name__

    # --- semantics -------------------------------------------------------------------------
    @abstractmethod
    def evaluate(self, ctx: EvalContext, *args: Any) -> list[Any]:
        """Run the op with torch on concrete inputs (tensors / Python numbers)."""

    def evaluate_into(self, ctx: EvalContext, out: Any, *args: Any) -> None:
        """Write the (single) result into a preallocated ``out``; ops with an ``out=`` overload
        override this to skip the copy."""
        (result,) = self.evaluate(ctx, *args)
        out.copy_(result)

    def unchecked_call(self) -> Callable[..., Any] | None:
        """The torch function that computes the expr's one result from its operands (in ``inputs``
        order) without the checks ``evaluate`` makes of their sizes; None for an expr without one.
        For a caller that ran ``evaluate`` on operands of the same sizes before (a bound program's
        straight-line function)."""
        return None

    def shardable_axes(self) -> set[int]:
        """Positions of the (first) output this op can compute a shard of from its operands' shards of
        the axes ``logical_map`` relates to them (a device-sharded axis): every one for an op that runs
        on chunks (``chunkable``), none otherwise, unless the op says which (grouped_mm's ungrouped axes, the
        axes a slice keeps whole). A reshape's depend on the mesh size: ``analysis.sharding.shard_map``."""
        return set(range(len(self.tensor_outputs[0].get_logical_domain()))) if self.chunkable else set()

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        """Producer logical ID -> consumer (first output) logical ID, for IDs the op preserves."""
        return {}

    def output_map(self, producer: TensorView, output: TensorView) -> dict[IterDomain, IterDomain]:
        """Producer logical ID -> ``output``'s logical ID, for IDs the op preserves. By default the first
        output's ``logical_map``, carried by position to another output of the same rank (multi-output ops
        of one shape: var_mean, welford); an output of another rank maps nothing. Ops whose outputs differ
        in shape (sdpa: the attention, its log-sum-exp, the philox state) override it."""
        mapping = self.logical_map(producer)
        first = self.tensor_outputs[0]
        if output is first:
            return mapping
        first_ids, ids = first.get_logical_domain(), output.get_logical_domain()
        if len(first_ids) != len(ids):
            return {}
        position = {id(i): k for k, i in enumerate(first_ids)}
        return {p: ids[position[id(c)]] for p, c in mapping.items() if id(c) in position}

    def operand_map(self, position: int) -> dict[IterDomain, IterDomain]:
        """``logical_map`` of the input at ``position``. Ops that map their operand positions
        differently (matmul's ``a`` and ``b``) override this; their ``logical_map`` of a tensor read
        at several positions (``matmul(x, x)``) keeps only the IDs all those positions map alike."""
        return self.logical_map(self.tensor_input(position))

    def agreed_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        """The IDs of ``producer`` that every position it is read at maps to the same consumer ID."""
        first, *rest = [self.operand_map(k) for k, v in enumerate(self.inputs) if v is producer] or [{}]
        return {p: c for p, c in first.items() if all(m.get(p) is c for m in rest)}

    # --- printing --------------------------------------------------------------------------
    @abstractmethod
    def to_string(self, indent: int = 0) -> str:
        """nvFuser's kernel-math print of this op."""

    def accumulated_size(self, env: dict[str, int]) -> int:
        """How many values each output element accumulates besides its reduction IDs (a scan's
        axis): part of the reduction size that validation tolerances grow with."""
        return 1

    def python_call(self) -> PythonCall:
        """The ``fd.ops`` call that rebuilds this expr (``repr(fd)``)."""
        raise NotImplementedError(f"{type(self).__name__} has no Python definition form")

    def __str__(self) -> str:
        return self.to_string()


def downstream_exprs(expr: Expr) -> Iterator[Expr]:
    """Every expr that reads a result of ``expr``, directly or through others, once each."""
    stack = [use for out in expr.outputs for use in out.uses]
    seen: set[int] = set()
    while stack:
        use = stack.pop()
        if id(use) not in seen:
            seen.add(id(use))
            yield use
            stack.extend(u for out in use.outputs for u in out.uses)


def operand_value(v: Val, values: dict[int, Any]) -> Any:
    """``v``'s value: given or computed (``values``, by id), else a constant scalar's."""
    if id(v) in values:
        return values[id(v)]
    if isinstance(v, Scalar):
        return v.value
    raise RuntimeError(f"{v} is neither given nor computed by an earlier op, and no constant")


def evaluate_exprs(exprs: Sequence[Expr], ctx: EvalContext, values: dict[int, Any]) -> None:
    """Each of ``exprs`` in order by its torch reference, its operands read with ``operand_value``,
    its results written to ``values``."""
    for expr in exprs:
        results = expr.evaluate(ctx, *[operand_value(v, values) for v in expr.inputs])
        for out, result in zip(expr.outputs, results, strict=True):
            values[id(out)] = result


def as_tensor(v: Val) -> TensorView | None:
    """``v`` typed as a tensor when it is one, else None: the ``is_tensor`` check as a narrowing, for
    modules that cannot import TensorView at run time (it imports them)."""
    return cast("TensorView", v) if v.is_tensor else None


def indent_str(indent: int) -> str:
    return "  " * indent


def _whole_size(what: str) -> Callable[[Any], int]:
    def whole(value: Any) -> int:
        if float(value) != int(value):
            raise ValueError(f"scalar {what} = {value} sizes an op but is not a whole number")
        return int(value)

    return whole

