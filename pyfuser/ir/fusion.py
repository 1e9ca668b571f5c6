"""Fusion: a graph of Exprs between input and output Vals, plus layout requirements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyfuser.ir.base import Expr, Val
from pyfuser.ir.cloning import clone_graph
from pyfuser.ir.iter_domain import IdTransform, IterDomain
from pyfuser.ir.layout import check_stride_order
from pyfuser.ir.tensor_domain import TensorDomain
from pyfuser.ir.tensor_view import MemoryType, TensorView


class Fusion:
    def __init__(self) -> None:
        self._counters: dict[str, int] = {}
        self._inputs: list[Val] = []
        self._outputs: list[Val] = []
        #: Stride orders the user required of outputs (docs/layout_requirements.md): kept apart from allocation
        #: domains that passes infer, so a requirement can always be told from a hint.
        self._output_stride_order: dict[int, list[int]] = {}  # keyed by TV name: survives deepcopy
        #: Output position -> the input tensor it is written into in place (nvFuser's
        #: ``aliasOutputToInput``): such an output is computed, copied into the input after the
        #: fusion runs, and not returned.
        self._output_aliases: dict[int, TensorView] = {}
        #: Bumped by every change to the graph or a schedule, so compiled programs know to go stale.
        self.version = 0

    def mark_changed(self) -> None:
        self.version += 1

    def clone(self, memo: dict[int, object] | None = None) -> Fusion:
        """A deep copy of the whole graph (flat, so fusions of any length copy); ``memo`` receives
        ``id(original node) -> copy``."""
        return clone_graph(self, (Val, Expr, IterDomain, IdTransform, TensorDomain, Fusion), memo)

    def clone_segment(self, inputs: Sequence[Val], outputs: Sequence[Val],
                      memo: dict[int, Any] | None = None) -> Fusion:
        """A copy computing ``outputs`` from ``inputs`` only (``restrict`` of a copy), made without
        walking the rest of the graph: a model's region copies it once per segment it compiles, so
        a copy costs what the segment holds, not what the fusion does. The copy of the fusion itself
        is made here (its inputs and outputs are the segment's), so the graph copy never follows the
        whole fusion's inputs and outputs."""
        kept = {id(e) for e in self.exprs_between(inputs, outputs)}
        memo = {} if memo is None else memo
        copy = memo[id(self)] = object.__new__(Fusion)
        # Every attribute but the graph's ends (set by ``restrict``) is plain data: a shallow copy each.
        copy.__dict__.update({k: v.copy() if isinstance(v, dict) else v for k, v in vars(self).items()})
        copy._inputs, copy._outputs, copy._output_aliases = [], [], {}
        clone_graph(self, (Val, Expr, IterDomain, IdTransform, TensorDomain, Fusion), memo, (Expr, kept),
                    also=[*inputs, *outputs])
        copy.restrict([memo[id(v)] for v in inputs], [memo[id(v)] for v in outputs])
        return copy

    def __deepcopy__(self, memo: dict[int, object]) -> Fusion:
        return self.clone()

    def restrict(self, inputs: Sequence[Val], outputs: Sequence[Val]) -> None:
        """Make this fusion compute ``outputs`` from ``inputs`` only (a segment of a larger one): the
        inputs lose their definitions and every use outside the exprs between them is dropped."""
        self._inputs, self._outputs = [], []
        for v in inputs:
            v.definition = None
        self._inputs = list(inputs)
        self._outputs = list(outputs)
        live = {id(e) for e in self.exprs()}
        for v in self.vals():
            v.uses = [e for e in v.uses if id(e) in live]
        names = {v.name for v in outputs}
        self._output_stride_order = {k: o for k, o in self._output_stride_order.items() if k in names}
        self._output_aliases = {}  # the whole fusion's executor writes in-place outputs, not a segment
        self.mark_changed()

    def inputs_read_by(self, outputs: Sequence[Val], stops: Sequence[Val] = ()) -> list[Val]:
        """What ``outputs`` are computed from: ``stops`` (values a launch of a segment reads as given,
        say an earlier launch's result), then the fusion inputs the walk back from ``outputs``
        reaches, each once."""
        boundary = {id(v) for v in (*self._inputs, *stops)}
        found: set[int] = set()
        stack, seen = list(outputs), set()
        while stack:
            v = stack.pop()
            if id(v) in seen:
                continue
            seen.add(id(v))
            if id(v) in boundary:
                found.add(id(v))
            elif v.definition is not None:
                stack.extend(v.definition.inputs)
        stopped = {id(v) for v in stops}
        return [*stops, *(v for v in self._inputs if id(v) in found and id(v) not in stopped)]

    # --- naming ------------------------------------------------------------------------------
    def next_name(self, kind: str) -> int:
        n = self._counters.get(kind, 0)
        self._counters[kind] = n + 1
        return n

    # --- inputs / outputs ------------------------------------------------------------------------
    def inputs(self) -> list[Val]:
        return list(self._inputs)

    def outputs(self) -> list[Val]:
        return list(self._outputs)

    def add_input(self, val: Val) -> None:
        self._check_owned(val, "fusion input")
        if val.definition is not None:
            raise ValueError(f"{val} is produced by an expression and cannot be a fusion input")
        self._inputs.append(val)
        self.mark_changed()

    def add_output(self, val: Val) -> None:
        self._check_owned(val, "fusion output")
        if not isinstance(val, TensorView):
            raise TypeError(f"fusion outputs must be tensors, got {val}")
        val.memory_type = MemoryType.Global
        self._outputs.append(val)
        self.mark_changed()

    def replace_output(self, old: Val, new: Val) -> None:
        """Make ``new`` the output in ``old``'s places (a pass that recomputes an output another way)."""
        self._check_owned(new, "fusion output")
        if not isinstance(new, TensorView):
            raise TypeError(f"fusion outputs must be tensors, got {new}")
        if any(o is old for o in self._outputs):
            new.memory_type = MemoryType.Global
            self._outputs = [new if o is old else o for o in self._outputs]
            self.mark_changed()

    def alias_output_to_input(self, out: Val, inp: Val) -> None:
        """Add ``out`` as an output written in place into input ``inp`` (not returned). Takes any Val:
        it checks that both are tensors, as the frontend passes what the user gave."""
        self._check_owned(out, "aliased output")
        self._check_owned(inp, "alias input")
        if not (isinstance(inp, TensorView) and inp.is_fusion_input):
            what = inp.short_name if isinstance(inp, TensorView) else str(inp)
            raise ValueError(f"add_output: alias_input {what} must be a tensor input of the fusion")
        if not isinstance(out, TensorView):
            raise TypeError(f"add_output: only a tensor can be written into input {inp.short_name}, got {out}")
        if out.dtype != inp.dtype:
            raise TypeError(f"add_output {out.short_name}: its dtype {out.dtype} differs from alias_input "
                            f"{inp.short_name}'s {inp.dtype}; cast it first (fd.ops.cast)")
        if out.ndim != inp.ndim:
            raise ValueError(f"add_output {out.short_name}: rank {out.ndim} differs from alias_input "
                             f"{inp.short_name}'s rank {inp.ndim}; an output written in place has the input's shape")
        if any(pos_inp is inp for pos_inp in self._output_aliases.values()):
            raise ValueError(f"add_output {out.short_name}: input {inp.short_name} is already written in place by "
                             "another output")
        self.add_output(out)
        self._output_aliases[len(self._outputs) - 1] = inp

    def output_alias(self, position: int) -> TensorView | None:
        """The input that output ``position`` is written into, if it is an in-place output."""
        return self._output_aliases.get(position)

    def _check_owned(self, val: Val, what: str) -> None:
        if not isinstance(val, Val):
            raise TypeError(f"{what} must be a tensor or scalar of this fusion, got {type(val).__name__}")
        if val.fusion is not self:
            raise ValueError(f"{val} belongs to another FusionDefinition and cannot be a {what} here")

    def set_output_stride_order(self, tv: TensorView, stride_order: Sequence[int]) -> None:
        """Require output ``tv`` to be produced with ``stride_order`` (dim i's place from innermost)."""
        if not tv.is_fusion_output:
            raise ValueError(f"{tv.short_name} is not a fusion output; only outputs take a required stride order")
        rank = len(tv.get_logical_domain(no_reductions=True))
        self._output_stride_order[tv.name] = check_stride_order(stride_order, rank, tv.short_name)
        self.mark_changed()

    def get_output_stride_order(self, tv: TensorView) -> list[int] | None:
        order = self._output_stride_order.get(tv.name)
        return list(order) if order is not None else None

    # --- traversal -------------------------------------------------------------------------------
    def exprs(self) -> list[Expr]:
        """Exprs needed to compute the outputs, in topological order (depth-first from outputs)."""
        return self.exprs_between(self._inputs, self._outputs)

    @staticmethod
    def exprs_between(inputs: Sequence[Val], outputs: Sequence[Val]) -> list[Expr]:
        """Exprs needed to compute ``outputs`` from ``inputs``, in topological order."""
        input_ids = {id(v) for v in inputs}
        order: list[Expr] = []
        done: set[int] = set()
        # Iterative post-order DFS: (expr, expanded?) entries.
        stack: list[tuple[Expr, bool]] = []
        for out in reversed(outputs):
            if out.definition is not None and id(out) not in input_ids:
                stack.append((out.definition, False))
        while stack:
            expr, expanded = stack.pop()
            if id(expr) in done:
                continue
            if expanded:
                done.add(id(expr))
                order.append(expr)
                continue
            stack.append((expr, True))
            for inp in reversed(expr.inputs):
                d = inp.definition
                if d is not None and id(inp) not in input_ids and id(d) not in done:
                    stack.append((d, False))
        return order

    def vals(self) -> list[Val]:
        """Every Val reachable from the outputs (inputs first, then in definition order)."""
        result: list[Val] = list(self._inputs)
        seen = {id(v) for v in result}
        for expr in self.exprs():
            for v in (*expr.inputs, *expr.outputs):
                if id(v) not in seen:
                    seen.add(id(v))
                    result.append(v)
        return result

    def tensors(self) -> list[TensorView]:
        return [v for v in self.vals() if isinstance(v, TensorView)]

    # --- printing ---------------------------------------------------------------------------------
    def math_string(self) -> str:
        body = "".join(e.to_string() for e in self.exprs())
        return f"%kernel_math {{\n{body}}} // %kernel_math \n"

    def print_math(self) -> str:
        """Print and return the fusion as nvFuser's ``print_math`` does: its inputs and outputs, then
        the kernel math and a blank line."""
        text = f"{self}\n"
        print(text, end="")
        return text

    def transforms_string(self) -> str:
        return "\n".join(tv.transforms_string() for tv in self.tensors())

    def print_transforms(self) -> str:
        text = self.transforms_string()
        print(text)
        return text

    def __str__(self) -> str:
        ins = "".join(f"  {v}\n" for v in self._inputs)
        outs = "".join(f"  {v}\n" for v in self._outputs)
        return f"Inputs:\n{ins}Outputs:\n{outs}\n{self.math_string()}"
