"""A bound program's run as one generated Python function (Inductor's wrapper code, per program).

Under a binding (``EvalContext.binding``) the caller vouches that every run has the same sizes and
input strides, and the program computes every intermediate the same way from those: so each
top-level node of a straight-line program does the same thing on every run. The binding's first
run goes through the steps and records what each node produced (sizes, strides, storage offset,
which storage); then this module writes the run as one function of the inputs:

* a view (an ATen call whose result shares storage with a tensor operand, with its dtype) becomes one
  reinterpretation of the nearest tensor that is not a view (Inductor's ``reinterpret_tensor``), so a
  chain of views costs one call, and a view only other views read costs none;
* any other ATen call calls its torch function without the size checks the first run made, else its
  expr's ``evaluate``; a GEMM (``torch.matmul``, ``F.linear``) whose operands torch folds into one
  ``mm`` / ``addmm`` / ``bmm`` makes that call on reinterpreted operands (``blas_calls.py``), as
  Inductor's ``extern_kernels.mm`` does; a kernel launch is its bound launch
  (recorded by the same first run) inlined, or the launcher where an argument's alignment changed;
* allocations with the recorded sizes and strides; each intermediate is dropped after its last use.

No value slots, steps, frames or per-node dispatch are left on the path: a run is the torch calls and
the launches. Programs with loops, stream switches or communications keep their steps.

The same body can be written into a caller's generated function instead of one of its own
(``StraightLineFunction.inline``): a compiled torch.compile graph writes its regions' bodies into one
function per input signature (``integrations/torch_compile/bound_graph.py``), as Inductor's wrapper
calls kernels, with no call, argument list or device check per region.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pyfuser.codegen.launcher import BoundLaunch, reinterpret_tensor
from pyfuser.codegen.python_writer import PythonWriter, dropped_after_last_use
from pyfuser.host_ir.blas_calls import Geometry, blas_call
from pyfuser.host_ir.nodes import Allocate, AtenCall, Deallocate, HostNode, LaunchKernel
from pyfuser.host_ir.specialization import Seen
from pyfuser.host_ir.steps import BoundLaunches, launch_with_fallback
from pyfuser.ir.base import Val
from pyfuser.ir.eval_context import EvalContext

#: Node types a straight-line function can run (any other one keeps the program on its steps).
STRAIGHT_LINE_NODES = (AtenCall, LaunchKernel, Allocate, Deallocate)

_current_device = getattr(torch._C, "_cuda_getDevice", None)

#: ``run(args)``: a program's run under its binding (None: another current device, the steps run).
StraightLineRun = Callable[[Sequence[Any]], "list[Any] | None"]


@dataclass(frozen=True, slots=True)
class InlinedBody:
    """A program's body written into a caller's function: its lines, the expression of each output
    (a name the lines define, or one of the input expressions), and the lines the caller runs once
    before every body (by the name they define: ``_stream``, the current stream, which the bodies of
    one device share)."""

    lines: list[str]
    outputs: list[str]
    head: dict[str, str]


#: ``inline(writer, inputs, prefix, fixed)``: the body written into ``writer``'s function on the input
#: expressions ``inputs``, its own names starting with ``prefix`` (None: it cannot be written so);
#: ``fixed``: per input, whether the caller obtains its memory itself (aligned alike on every run)
InlineWriter = Callable[[PythonWriter, Sequence[str], str, Sequence[bool]], "InlinedBody | None"]


@dataclass(frozen=True, slots=True)
class StraightLineFunction:
    """A program's run under one binding as a generated function, with its source (what a reader or
    a test checks of it), and the same run written into a caller's function (``inline``)."""

    run: StraightLineRun
    source: str
    inline: InlineWriter


@dataclass
class _Line:
    text: str
    defines: list[str]
    uses: list[str]
    #: a view nothing but other views needs is dropped (they read its base instead)
    view: bool = False


class StraightLine:
    """Writes one program's run under one binding: ``build`` as a function of its own, ``inline`` as
    lines of a caller's function (each None where a node cannot be replayed as straight-line code).

    ``writer``: the caller's writer (``inline``), whose globals the body's constants join; ``prefix``
    starts every name the body defines, so bodies written into one function never share one."""

    def __init__(self, slot_of: Callable[[Val], int], constants: Sequence[Any], device: torch.device,
                 bound_launches: Callable[[LaunchKernel], BoundLaunches | None],
                 writer: PythonWriter | None = None, prefix: str = "") -> None:
        self._slot_of = slot_of
        #: a top-level launch's bound launches, which the binding's first run recorded
        self._bound_launches = bound_launches
        self._constants = constants
        self._device = device
        #: ``__name__``: the module of the functions it writes (how torch.fx names a call of one)
        self._writer = writer or PythonWriter("straight-line program", {"__name__": __name__})
        self._writer.env.setdefault("_reinterpret", reinterpret_tensor)
        self._prefix = prefix
        #: slot -> the global name of a value the program does not compute (a constant, or None)
        self._constant_names: dict[int, str] = {}
        self._ctx = ""
        self._lines: list[_Line] = []
        #: slot -> (the slot of the tensor it is a view of, that tensor's recorded geometry), for
        #: views and for tensors that are their own base
        self._base: dict[int, tuple[int, Seen]] = {}
        #: slot -> the recorded geometry of the tensor the function holds there
        self._seen: dict[int, Seen] = {}
        self._written: set[int] = set()
        #: lines run before the body, by what they define
        self._head: dict[str, str] = {}
        self._input_storages: set[int] = set()

    def _local(self, slot: int) -> str:
        return f"{self._prefix}v{slot}"

    def _name(self, v: Val) -> str:
        slot = self._slot_of(v)
        if slot in self._written:
            return self._local(slot)
        name = self._constant_names.get(slot)
        if name is None:  # not computed by the program: a constant of the program (or None)
            value = self._constants[slot] if slot < len(self._constants) else None
            name = self._constant_names[slot] = self._writer.constant(value, f"_{self._prefix}c{slot}")
        return name

    def _constant(self, value: Any, prefix: str) -> str:
        return self._writer.constant(value, f"_{prefix}")

    def _define(self, v: Val, seen: Seen | None) -> str:
        slot = self._slot_of(v)
        self._written.add(slot)
        self._base.pop(slot, None)
        self._seen.pop(slot, None)
        if seen is not None:
            self._base[slot] = (slot, seen)
            self._seen[slot] = seen
        return self._local(slot)

    def _body(self, inputs: Sequence[Val], inputs_seen: Sequence[Seen | None], nodes: Sequence[HostNode],
              seen: Sequence[Sequence[Seen | None]], outputs: Sequence[Val], ctx: EvalContext,
              fixed: Sequence[bool] = ()) -> tuple[list[str], list[str], list[str]] | None:
        """(the inputs' names, the body's lines, the outputs' expressions), or None; the lines of
        ``_head`` come before the body's. ``fixed``: the inputs whose alignment cannot change."""
        self._ctx = self._writer.constant(ctx, "_ctx")
        self._input_storages = {seen.storage for k, seen in enumerate(inputs_seen)
                                if seen is not None and not (k < len(fixed) and fixed[k])}
        names = [self._define(v, s) for v, s in zip(inputs, inputs_seen, strict=True)]
        for node, results in zip(nodes, seen, strict=True):
            if not self._node(node, results, ctx):
                return None
        returned = [self._name(v) for v in outputs]
        return names, self._release(returned), returned

    def build(self, inputs: Sequence[Val], inputs_seen: Sequence[Seen | None], nodes: Sequence[HostNode],
              seen: Sequence[Sequence[Seen | None]], outputs: Sequence[Val], ctx: EvalContext,
              inline: InlineWriter) -> StraightLineFunction | None:
        """The run as a function of its own (``run(args)``; None on another current device), with
        ``inline`` the caller's way of writing the same run into another function."""
        written = self._body(inputs, inputs_seen, nodes, seen, outputs, ctx)
        if written is None:
            return None
        names, body, returned = written
        head = []
        if self._device.type == "cuda" and _current_device is not None:
            check = self._writer.constant(_current_device, "_current_device")
            head = [f"if {check}() != {self._device.index}:", "    return None"]
        unpack = f"{', '.join(names)}, = args" if names else "del args"
        writer = self._writer
        writer.function("def run(args):", [unpack, *head, *self._head.values(), *body,
                                           f"return [{', '.join(returned)}]"])
        return StraightLineFunction(writer.define("run"), writer.source, inline)

    def inline(self, inputs: Sequence[Val], inputs_seen: Sequence[Seen | None], nodes: Sequence[HostNode],
               seen: Sequence[Sequence[Seen | None]], outputs: Sequence[Val], ctx: EvalContext,
               given: Sequence[str], fixed: Sequence[bool]) -> InlinedBody | None:
        """The run as lines of the caller's function, on the input expressions ``given``; the caller
        vouches that it runs on the program's device (no device check is written), and that the inputs
        ``fixed`` marks are memory it obtains itself, aligned as recorded on every run (no alignment
        check of theirs is written)."""
        written = self._body(inputs, inputs_seen, nodes, seen, outputs, ctx, fixed)
        if written is None:
            return None
        names, body, returned = written
        return InlinedBody([*(f"{name} = {value}" for name, value in zip(names, given, strict=True)), *body],
                           returned, dict(self._head))

    # --- nodes ---------------------------------------------------------------------------------------
    def _node(self, node: HostNode, results: Sequence[Seen | None], ctx: EvalContext) -> bool:
        if isinstance(node, AtenCall):
            return self._aten_call(node, results)
        if isinstance(node, LaunchKernel):
            return self._launch(node, results, ctx)
        if isinstance(node, Allocate):
            (result,) = results
            if result is None:
                return False
            fill = ".zero_()" if node.zero_init else ""
            alloc = self._constant(torch.empty_strided, "empty")
            device = self._constant(self._device, "device")
            args = f"{result.sizes}, {result.strides}, dtype={self._constant(result.dtype, 'dtype')}, device={device}"
            out = self._define(node.tv, result)
            self._emit(f"{out} = {alloc}({args}){fill}", [out], [])
            return True
        if isinstance(node, Deallocate):
            return True  # every intermediate is dropped after its last use (below)
        return False

    def _aten_call(self, node: AtenCall, results: Sequence[Seen | None]) -> bool:
        expr = node.expr
        ins = [self._name(v) for v in node.inputs]
        if node.into:
            if len(node.outputs) != 1:
                return False
            out = self._name(node.outputs[0])
            self._emit(f"{self._constant(expr.evaluate_into, 'into')}({self._ctx}, {', '.join([out, *ins])})", [],
                       [out, *ins])
            return True
        base = self._viewed(node, results)
        if base is not None:
            (result,) = results
            assert result is not None
            root, root_seen = self._base[base]
            out = self._define(node.outputs[0], None)
            self._base[self._slot_of(node.outputs[0])] = (root, root_seen)
            self._seen[self._slot_of(node.outputs[0])] = result
            self._emit(f"{out} = _reinterpret({self._local(root)}, {result.sizes}, {result.strides}, "
                       f"{result.offset - root_seen.offset})", [out], [self._local(root)], view=True)
            return True
        outs = [self._define(v, s) for v, s in zip(node.outputs, results, strict=True)]
        unchecked = expr.unchecked_call() if len(outs) == 1 else None
        if unchecked is not None:  # the recorded run checked these sizes
            blas = blas_call(unchecked, [self._seen.get(self._slot_of(v)) for v in node.inputs], results[0])
            if blas is None:
                self._emit(f"{outs[0]} = {self._constant(unchecked, 'call')}({', '.join(ins)})", outs, ins)
                return True
            args = [self._reinterpreted(ins[k], view) for k, view in zip(blas.operands, blas.views, strict=True)]
            call = self._reinterpreted(f"{self._constant(blas.function, blas.function.__name__)}({', '.join(args)})", blas.result)
            self._emit(f"{outs[0]} = {call}", outs, ins)
            return True
        call = f"{self._constant(expr.evaluate, 'evaluate')}({self._ctx}, {', '.join(ins)})"
        self._emit(f"{outs[0]} = {call}[0]" if len(outs) == 1 else f"{', '.join(outs)}, = {call}", outs, ins)
        return True

    @staticmethod
    def _reinterpreted(value: str, view: Geometry) -> str:
        return value if view is None else f"_reinterpret({value}, {view[0]}, {view[1]}, 0)"

    def _viewed(self, node: AtenCall, results: Sequence[Seen | None]) -> int | None:
        """The slot of the tensor operand whose storage the call's one result shares (a view), if any."""
        if len(results) != 1 or results[0] is None or results[0].numel == 0:
            return None
        result = results[0]
        for v in node.inputs:
            slot = self._slot_of(v)
            operand = self._base.get(slot)
            if operand is not None and operand[1].storage == result.storage and operand[1].dtype == result.dtype:
                return slot
        return None

    def _launch(self, node: LaunchKernel, results: Sequence[Seen | None], ctx: EvalContext) -> bool:
        ins = [self._name(v) for v in node.inputs]
        unbound = self._constant(launch_with_fallback(node), "launch")
        if node.into:
            outs = [self._name(v) for v in node.outputs]
            self._emit(f"{unbound}({self._ctx}, [{', '.join(ins)}], [{', '.join(outs)}])", [], [*ins, *outs])
            return True
        bound = self._bound_launches(node)
        replay = bound.by_binding.get(ctx.binding) if bound is not None else None
        outs = [self._define(v, s) for v, s in zip(node.outputs, results, strict=True)]
        targets = f"{outs[0]}," if len(outs) == 1 else ", ".join(outs)
        arguments = f"[{', '.join(ins)}]"
        if replay is None:
            self._emit(f"{targets} = {unbound}({self._ctx}, {arguments}, None)", outs, ins)
            return True
        if not isinstance(replay, BoundLaunch):  # a replay of its own (a sequence of launches): called
            # It returns None where an argument's 16-byte alignment differs from the recorded run's
            # (part of the compiled variant): the launcher runs then.
            self._emit(f"_r = {self._constant(replay.run, 'bound')}({arguments})\n"
                       f"if _r is None:\n    _r = {unbound}({self._ctx}, {arguments}, None)\n{targets} = _r", outs, ins)
            return True
        plan = replay
        n_args = plan.n_args
        made = [outs[plan.results.index(n_args + j)] if n_args + j in plan.results else self._writer.fresh("_t")
                for j in range(len(plan.made))]
        slots = [*ins, *made]
        lines = plan.write(ins, made, self._stream(plan), self._writer)
        lines += [f"{out} = {slots[r]}" for out, r in zip(outs, plan.results, strict=True) if slots[r] != out]
        check = plan.misaligned(ins, [self._fixed_alignment(v) for v in node.inputs])
        if check:  # an argument's alignment differs from the recorded run's: the launcher runs
            lines = [f"if {check}:", f"    {targets} = {unbound}({self._ctx}, {arguments}, None)", "else:",
                     *("    " + line for line in lines)]
        self._emit("\n".join(lines), outs, ins)
        return True

    def _fixed_alignment(self, v: Val) -> bool:
        """Whether ``v`` is memory the program obtains itself (an allocation, a result, a view of one at
        a recorded offset): aligned the same on every run, unlike an input's offset."""
        slot = self._slot_of(v)
        base = self._base.get(slot) if slot in self._written else None
        return base is not None and base[1].storage not in self._input_storages

    def _stream(self, plan: BoundLaunch) -> str:
        """``_stream``: the current stream, read once before the body (a straight-line program
        switches none; the bodies a caller writes into one function run on one device)."""
        if "_stream" not in self._head:
            expression = plan.stream_expression(self._writer)
            if expression == "None":  # (not a CUDA launch)
                return expression
            self._head["_stream"] = f"_stream = {expression}"
        return "_stream"

    def _emit(self, text: str, defines: list[str], uses: list[str], view: bool = False) -> None:
        self._lines.append(_Line(text, defines, uses, view))

    def _release(self, returned: list[str]) -> list[str]:
        """The lines, without the views no line reads, each intermediate dropped after its last use."""
        needed = set(returned)
        kept: list[_Line] = []
        for line in reversed(self._lines):
            if line.view and not needed.intersection(line.defines):
                continue
            needed.update(line.uses)
            kept.append(line)
        kept.reverse()
        local = f"{self._prefix}v"
        return dropped_after_last_use([(line.text, line.uses, line.defines) for line in kept], returned,
                                      lambda name: name.startswith(local))
