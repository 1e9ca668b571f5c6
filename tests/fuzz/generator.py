"""Random fuzz cases: programs over the ops ``fd.ops`` offers, random inputs and random schedules.

A case is grown one op at a time from a seed. Each candidate op is run at once, with torch on the
reference values (a step torch rejects is dropped, or rarely kept as a case that must be rejected)
and with ``fd.ops`` on the fusion being defined, whose tensors say which axes are broadcast: operands
are picked to follow pyfuser's broadcasting (only broadcast axes stretch), so most programs are valid
and a rejection is worth a look. Shapes stay small; sizes 0 and 1, non-divisible extents, permuted,
strided and expanded inputs and mixed dtypes are all drawn.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .case import (
    Case,
    Input,
    Output,
    ScalarInput,
    Step,
    TensorInput,
    fd_dtype,
    fusion_namespace,
    prelude_namespace,
)
from .op_families import DTYPES, NUMBERS, SIZES, OpFamilies


@dataclass(frozen=True)
class GeneratorConfig:
    max_ops: int = 12
    max_inputs: int = 4
    #: largest element count of any value (keeps cases fast)
    max_numel: int = 512
    #: chance that a step torch rejects is kept (the case must then be rejected, with a clear error)
    keep_rejected: float = 0.03
    #: chance of a stream-parallel schedule
    stream: float = 0.5


#: Float ops whose last bits depend on the kernel (vectorized or not, blocking, summation order), which
#: a stream chunk or another layout may change: their results are "inexact".
INEXACT_OPS = {"exp", "log", "sin", "cos", "tanh", "sigmoid", "silu", "gelu", "erf", "rsqrt", "pow", "sum", "prod",
               "mean", "var", "var_mean", "matmul", "linear", "index_put_accumulate"}
#: Ops that turn a last-bit difference into a different value (``x == 0``, ``x.to(int)``): they only
#: get exact operands, so a mismatch is pyfuser's and not the kernel's rounding.
DISCONTINUOUS_OPS = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "div"}


class _Rejected(Exception):
    """A candidate step that cannot be used (torch rejects it, or it is too large)."""


class _Generator(OpFamilies):
    def __init__(self, seed: int, config: GeneratorConfig) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.config = config
        self.fd_ns = fusion_namespace()
        self.ref_ns = prelude_namespace()
        self.inputs: list[Input] = []
        self.steps: list[Step] = []
        self.tensors: list[str] = []
        #: tensors whose values every correct execution computes bit for bit (see ``INEXACT_OPS``)
        self.exact: set[str] = set()
        self.scalars: list[str] = []
        self.count = 0
        self.done = False
        self.expect_rejection = False
        self.last_outs: tuple[str, ...] = ()

    # --- values ----------------------------------------------------------------------------------
    def _name(self, prefix: str = "t") -> str:
        self.count += 1
        return f"{prefix}{self.count - 1}"

    def ref(self, name: str) -> torch.Tensor:
        return self.ref_ns[name]

    def bcast(self, name: str) -> list[bool]:
        tv = self.fd_ns[name]
        return [i.is_broadcast() for i in tv.get_logical_domain(no_reductions=True)]

    def pick(self, pred: Callable[[str], bool] = lambda n: True) -> str | None:
        """A tensor value, recent ones more likely."""
        names = [n for n in self.tensors if pred(n)]
        if not names:
            return None
        return self.rng.choices(names, weights=[k + 1 for k in range(len(names))])[0]

    # --- inputs ----------------------------------------------------------------------------------
    def tensor_input(self, shape: Sequence[int] | None = None, dtype: torch.dtype | None = None,
                     broadcast: Sequence[bool] | None = None) -> str:
        rng = self.rng
        if shape is None:
            shape = [rng.choice(SIZES) for _ in range(rng.choice([0, 1, 1, 2, 2, 2, 3, 3, 4]))]
            while math.prod(shape) > self.config.max_numel:
                shape = [max(1, s // 2) for s in shape]
        shape = tuple(shape)
        rank = len(shape)
        dtype = dtype or rng.choice(DTYPES)
        order = list(range(rank))
        if rank > 1 and rng.random() < 0.35:
            rng.shuffle(order)
        strided = rng.choice([d for d in range(rank) if shape[d] > 1] or [None]) if rng.random() < 0.2 else None
        expanded = tuple(d for d in range(rank) if shape[d] > 1 and d != strided and rng.random() < 0.1)
        name = self._name()
        spec = TensorInput(name, shape, dtype, self.seed * 100 + len(self.inputs), tuple(order), strided, expanded)
        spec = TensorInput(**{**spec.__dict__, "declaration": self._declaration(spec, broadcast)})
        self.inputs.append(spec)
        self.fd_ns[name] = eval(spec.declaration, self.fd_ns)
        self.ref_ns[name] = spec.make()
        self.tensors.append(name)
        self.exact.add(name)
        return name

    def _declaration(self, spec: TensorInput, broadcast: Sequence[bool] | None) -> str:
        rng = self.rng
        if broadcast is None and rng.random() < 0.25:
            return f"fd.from_pytorch({spec.make_code()})"
        dims = []
        for d, size in enumerate(spec.shape):
            wants_broadcast = broadcast[d] if broadcast is not None else rng.random() < 0.75
            if size == 1 and wants_broadcast:
                dims.append(1)
            elif size != 1 and rng.random() < 0.15:
                dims.append(size)  # a static extent
            else:
                dims.append(-1)
        dense = spec.strided_axis is None and not spec.expanded
        args = [str(dims)]
        if dense and rng.random() < 0.5:
            args.append("contiguity=True")
            if list(spec.memory_order) != sorted(spec.memory_order):
                rank = len(spec.shape)
                args.append(f"stride_order={[rank - 1 - spec.memory_order.index(d) for d in range(rank)]}")
        args.append(f"dtype={fd_dtype(spec.dtype)}")
        return f"fd.define_tensor({', '.join(args)})"

    def scalar_input(self) -> str:
        dtype, value = self.rng.choice([(torch.float64, 1.5), (torch.float64, -0.5), (torch.int64, 3),
                                        (torch.int64, -2), (torch.bool, True)])
        name = self._name("s")
        self.inputs.append(ScalarInput(name, dtype, value))
        self.fd_ns[name] = eval(f"fd.define_scalar(dtype={fd_dtype(dtype)})", self.fd_ns)
        self.ref_ns[name] = value
        self.scalars.append(name)
        return name

    def size(self, value: int) -> str:
        """An int argument (a size, index, width or split factor): a literal, or now and then an input
        scalar bound to ``value`` at execution (the same name in both programs)."""
        if self.rng.random() >= 0.2 or len(self.inputs) >= self.config.max_inputs + 2:
            return repr(value)
        name = self._name("s")
        self.inputs.append(ScalarInput(name, torch.int64, value))
        self.fd_ns[name] = eval("fd.define_scalar(dtype=DataType.Int)", self.fd_ns)
        self.ref_ns[name] = value
        self.scalars.append(name)
        return name

    def sizes(self, values: Sequence[int]) -> str:
        return "[" + ", ".join(self.size(v) for v in values) + "]"

    def operand(self) -> tuple[str, str]:
        """A non-tensor operand: (fusion code, reference code)."""
        rng = self.rng
        if self.scalars and rng.random() < 0.3:
            name = rng.choice(self.scalars)
            return name, name
        if len([i for i in self.inputs if isinstance(i, ScalarInput)]) < 2 and rng.random() < 0.1:
            name = self.scalar_input()
            return name, name
        value = rng.choice(NUMBERS)
        if rng.random() < 0.15:
            return f"fd.define_scalar({value!r})", repr(value)
        return repr(value), repr(value)

    # --- steps -----------------------------------------------------------------------------------
    def try_step(self, fd_expr: str, ref_expr: str, n_outs: int = 1) -> None:
        op = fd_expr[len("fd.ops."):fd_expr.index("(")]
        exact_operands = all(t in self.exact for t in re.findall(r"\bt\d+\b", fd_expr))
        to_discrete = op == "cast" and not any(f"DataType.{k}" in fd_expr for k in ("Float", "Double", "Half",
                                                                                    "BFloat16", "Complex"))
        if not exact_operands and (op in DISCONTINUOUS_OPS or to_discrete):
            raise _Rejected("a discontinuous op of an inexact value")
        outs = tuple(self._name() for _ in range(n_outs))
        target = ", ".join(outs)
        try:
            exec(f"{target} = {ref_expr}", self.ref_ns)
            results = [self.ref_ns[o] for o in outs]
            if any(not isinstance(r, torch.Tensor) for r in results):
                raise _Rejected("not a tensor")
        except Exception as e:
            if isinstance(e, _Rejected) or self.rng.random() >= self.config.keep_rejected:
                raise _Rejected(str(e)) from None
            self.expect_rejection = True  # kept: the case must be rejected
            results = []
        if any(r.numel() > self.config.max_numel for r in results):
            raise _Rejected("too large")
        self.steps.append(Step(outs, fd_expr, ref_expr))
        self.last_outs = outs
        try:
            exec(f"{target} = {fd_expr}", self.fd_ns)
        except Exception:
            self.done = True  # pyfuser rejects (or fails on) the definition: the case ends here
            return
        if self.expect_rejection:
            self.done = True
            return
        self.tensors.extend(outs)
        for out, result in zip(outs, results, strict=True):
            if not (result.is_floating_point() or result.is_complex()) or (exact_operands and op not in INEXACT_OPS):
                self.exact.add(out)

    def grow(self) -> None:
        families: list[tuple[Callable[[], tuple[str, str, int] | None], int]] = [
            (self.unary, 12), (self.cast, 4), (self.binary, 20), (self.ternary, 5), (self.broadcast, 3),
            (self.broadcast_in_dim, 2), (self.expand, 3), (self.squeeze, 3), (self.permute, 4), (self.reshape, 5),
            (self.slice, 5), (self.cat, 4), (self.pad, 4), (self.reduction, 9), (self.var_mean, 3),
            (self.matmul, 5), (self.linear, 4), (self.full, 2), (self.iota, 2), (self.copy, 2),
            (self.indexed_read, 4), (self.index_put, 2),
        ]
        make = self.rng.choices([f for f, _ in families], weights=[w for _, w in families])[0]
        candidate = make()
        if candidate is not None:
            self.try_step(*candidate)

    # --- outputs and schedules ---------------------------------------------------------------------
    def outputs(self) -> list[Output]:
        if self.done:
            return [Output(self.last_outs[0])] if self.last_outs and self.last_outs[0] in self.fd_ns else []
        produced = [n for n in self.tensors if not any(i.name == n for i in self.inputs)] or self.tensors
        chosen = list(dict.fromkeys([produced[-1], *self.rng.sample(self.tensors, min(len(self.tensors),
                                                                                     self.rng.randint(0, 2)))]))
        outputs = []
        for name in chosen:
            rank = self.ref(name).dim()
            order = None
            if rank > 1 and self.rng.random() < 0.2:
                order = list(range(rank))
                self.rng.shuffle(order)
            outputs.append(Output(name, None if order is None else tuple(order)))
        added = []
        for out in outputs:
            extra = "" if out.stride_order is None else f", stride_order={list(out.stride_order)}"
            try:
                exec(f"fd.add_output({out.name}{extra})", self.fd_ns)
            except (ValueError, TypeError):
                continue  # one tensor (a no-op expand returns its input) required in two stride orders
            added.append(out)
        return added

    def schedule(self, outputs: Sequence[Output]) -> list[str]:
        rng = self.rng
        lines: list[str] = []
        scheduled = [n for n in self.tensors if self.ref(n).dim() > 0]
        if not scheduled:
            return lines

        def apply(line: str) -> None:
            try:
                exec(line, self.fd_ns)
            except (ValueError, TypeError):
                return  # a schedule call the API rejects: not part of the case
            lines.append(line)

        if rng.random() < 0.15:  # a required memory layout of a computed tensor
            name = rng.choice([n for n in scheduled if self.fd_ns[n].definition is not None] or scheduled)
            perm = list(range(len(self.fd_ns[name].get_logical_domain())))
            rng.shuffle(perm)
            apply(f"{name}.set_allocation_domain([{name}.get_logical_domain()[i] for i in {perm}], True)")
        for _ in range(rng.randint(0, 2)):
            name = rng.choice(scheduled)
            loop = len(self.fd_ns[name].get_loop_domain())
            what = rng.choice(["split", "merge", "reorder"])
            if what == "split":
                apply(f"{name}.split({rng.randrange(loop)}, {rng.choice([1, 2, 3, 4])}, "
                      f"inner_split={rng.random() < 0.5})")
            elif what == "merge" and loop > 1:
                apply(f"{name}.merge({rng.randrange(loop - 1)})")
            elif loop > 1:
                apply(f"{name}.reorder({{{rng.randrange(loop)}: {rng.randrange(loop)}}})")
        plans = 0 if rng.random() >= self.config.stream else rng.choice([1, 1, 1, 2])
        for _ in range(plans):
            self._stream_plan(outputs, scheduled, apply)
        if rng.random() < 0.05:  # a cache copy in front of an input's uses, or behind an output's definition
            name = rng.choice(scheduled)
            apply(f"{name}.cache_after()" if self.fd_ns[name].definition is None else f"{name}.cache_before()")
        return lines

    def _stream_plan(self, outputs: Sequence[Output], scheduled: Sequence[str], apply: Callable[[str], None]) -> None:
        """Parallelize one axis on stream (outer-split or not) on a tensor and a few others of that extent."""
        rng = self.rng
        # Mostly what a stream loop can run: an iteration axis of a tensor computed chunk-wise.
        chunkable = [n for n in scheduled if self._chunkable(n)]
        targets = ([o.name for o in outputs if o.name in chunkable] or chunkable) if rng.random() < 0.8 else []
        name = rng.choice(targets or list(scheduled))
        extent = self.ref(name).shape
        iterating = [d for d, b in enumerate(self.bcast(name)) if not b]
        axis = rng.choice(iterating) if iterating and rng.random() < 0.9 else rng.randrange(len(extent))
        factor = rng.choice([None, 1, 2, 3, 4])
        group = [name] + [n for n in scheduled if n != name and rng.random() < 0.3 and self.ref(n).dim() > axis
                          and self.ref(n).shape[axis] == extent[axis] and not self.bcast(n)[axis]]
        for tv in group:
            position = self._loop_position(tv, axis)
            if position is None:
                continue
            if factor is not None:
                apply(f"{tv}.outer_split({position}, {self.size(factor) if tv == name else factor})")
            apply(f"{tv}.axis({position}).parallelize(ParallelType.stream)")

    def _chunkable(self, name: str) -> bool:
        definition = self.fd_ns[name].definition
        return definition is None or type(definition).chunkable

    def _loop_position(self, name: str, axis: int) -> int | None:
        """Loop position of logical (non-reduction) axis ``axis`` of ``name``, if still in the loop domain."""
        tv = self.fd_ns[name]
        logical = tv.get_logical_domain(no_reductions=True)[axis]
        position = tv.loop_position(logical)
        return position if position >= 0 else None


def generate(seed: int, config: GeneratorConfig | None = None) -> Case:
    """The case of ``seed`` (deterministic)."""
    gen = _Generator(seed, config or GeneratorConfig())
    for _ in range(gen.rng.randint(1, 2)):
        gen.tensor_input()
    target = gen.rng.randint(1, gen.config.max_ops)
    for _ in range(target * 3):  # candidates torch rejects are retried
        if gen.done or len(gen.steps) >= target:
            break
        try:
            gen.grow()
        except _Rejected:
            continue
    outputs = gen.outputs() if gen.steps or not gen.done else []
    if not outputs:
        outputs = [Output(gen.tensors[-1])]
        exec(f"fd.add_output({gen.tensors[-1]})", gen.fd_ns)
    schedule = gen.schedule(outputs) if not gen.done else []
    return Case(seed, tuple(gen.inputs), tuple(gen.steps), tuple(outputs), tuple(schedule),
                expect_rejection=gen.expect_rejection)


__all__ = ["GeneratorConfig", "generate"]
