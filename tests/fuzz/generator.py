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
from typing import Any

import torch

from .case import (
    PRELUDE,
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


SIZES = [0, 1, 1, 2, 2, 3, 3, 4, 5, 6, 7]
FLOATS = [torch.float32] * 6 + [torch.float64, torch.float16, torch.bfloat16]
DTYPES = [*FLOATS, torch.int64, torch.int32, torch.bool]
CAST_TARGETS = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool]
NUMBERS: list[Any] = [2, -1, 0, 3, 0.5, -1.5, 2.5, True, False]

UNARY = {
    "neg": "torch.neg({})", "abs": "torch.abs({})", "exp": "torch.exp({})", "log": "torch.log({})",
    "sqrt": "torch.sqrt({})", "rsqrt": "torch.rsqrt({})", "reciprocal": "torch.reciprocal({})",
    "sin": "torch.sin({})", "cos": "torch.cos({})", "tanh": "torch.tanh({})", "sigmoid": "torch.sigmoid({})",
    "relu": "torch.relu({})", "silu": "F.silu({})", "erf": "torch.erf({})", "logical_not": "torch.logical_not({})",
}
#: binary kinds: the reference as an expression of ``{a}`` and ``{b}`` (numbers become 0-dim tensors
#: where torch takes tensors only, as fd.ops documents)
BINARY = {
    "add": "{a} + {b}", "sub": "{a} - {b}", "mul": "{a} * {b}", "truediv": "{a} / {b}",
    "div": "div_like_nvfuser({a}, {b})", "pow": "torch.pow({a}, {b})",
    "maximum": "torch.maximum({A}, {B})", "minimum": "torch.minimum({A}, {B})",
    "eq": "{a} == {b}", "ne": "{a} != {b}", "lt": "{a} < {b}", "le": "{a} <= {b}", "gt": "{a} > {b}",
    "ge": "{a} >= {b}", "logical_and": "torch.logical_and({A}, {B})", "logical_or": "torch.logical_or({A}, {B})",
}
REDUCTIONS = {"sum": "torch.sum", "prod": "prod_dims", "max": "torch.amax", "min": "torch.amin", "mean": "torch.mean"}

#: Float ops whose last bits depend on the kernel (vectorized or not, blocking, summation order), which
#: a stream chunk or another layout may change: their results are "inexact".
INEXACT_OPS = {"exp", "log", "sin", "cos", "tanh", "sigmoid", "silu", "gelu", "erf", "rsqrt", "pow", "sum", "prod",
               "mean", "var", "var_mean", "matmul", "linear"}
#: Ops that turn a last-bit difference into a different value (``x == 0``, ``x.to(int)``): they only
#: get exact operands, so a mismatch is pyfuser's and not the kernel's rounding.
DISCONTINUOUS_OPS = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "div"}


class _Rejected(Exception):
    """A candidate step that cannot be used (torch rejects it, or it is too large)."""


class _Generator:
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
        return [i.is_broadcast for i in tv.get_logical_domain(no_reductions=True)]

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
        ]
        make = self.rng.choices([f for f, _ in families], weights=[w for _, w in families])[0]
        candidate = make()
        if candidate is not None:
            self.try_step(*candidate)

    # --- op families: each returns (fusion code, reference code, number of outputs) ---------------
    def unary(self) -> tuple[str, str, int] | None:
        x = self.pick()
        if x is None:
            return None
        if self.rng.random() < 0.12:
            tanh = self.rng.random() < 0.5
            return (f"fd.ops.gelu({x}, approximate={'tanh' if tanh else 'none'!r})",
                    f"F.gelu({x}, approximate={'tanh' if tanh else 'none'!r})", 1)
        name = self.rng.choice(list(UNARY))
        return f"fd.ops.{name}({x})", UNARY[name].format(x), 1

    def cast(self) -> tuple[str, str, int] | None:
        x = self.pick()
        if x is None:
            return None
        dtype = self.rng.choice(CAST_TARGETS)
        return f"fd.ops.cast({x}, {fd_dtype(dtype)})", f"{x}.to({dtype})", 1

    def _compatible(self, a: str, b: str) -> bool:
        """``a`` and ``b`` broadcast under pyfuser's rule: aligned right, equal sizes or a broadcast axis."""
        sa, sb = self.ref(a).shape, self.ref(b).shape
        fa, fb = self.bcast(a), self.bcast(b)
        for k in range(1, min(len(sa), len(sb)) + 1):
            if sa[-k] != sb[-k] and not (fa[-k] and sa[-k] == 1) and not (fb[-k] and sb[-k] == 1):
                return False
        return True

    def partner(self, a: str, dtype: torch.dtype | None = None) -> str:
        """A tensor that broadcasts with ``a``: an existing one, or a new input shaped like it."""
        if self.rng.random() < 0.7:
            b = self.pick(lambda n: self._compatible(a, n))
            if b is not None:
                return b
        if len(self.inputs) >= self.config.max_inputs:
            return a
        shape = list(self.ref(a).shape)
        shape = shape[self.rng.randint(0, len(shape)):] if self.rng.random() < 0.3 else shape
        flags = [self.rng.random() < 0.3 for _ in shape]
        shape = [1 if f else s for s, f in zip(shape, flags, strict=True)]
        return self.tensor_input(shape, dtype, [True] * len(shape))

    def binary(self) -> tuple[str, str, int] | None:
        a = self.pick()
        if a is None:
            return None
        name = self.rng.choice(list(BINARY))
        if self.rng.random() < 0.3:
            fd_b, ref_b = self.operand()
            tensor_b = False
        else:
            fd_b = ref_b = self.partner(a)
            tensor_b = True
        fd_args, ref_args = [a, fd_b], [a, ref_b]
        if self.rng.random() < 0.25:
            fd_args.reverse()
            ref_args.reverse()
        wrapped = [r if tensor else f"torch.as_tensor({r})"
                   for r, tensor in zip(ref_args, [True, tensor_b] if ref_args[0] == a else [tensor_b, True],
                                        strict=True)]
        ref = BINARY[name].format(a=ref_args[0], b=ref_args[1], A=wrapped[0], B=wrapped[1])
        return f"fd.ops.{name}({fd_args[0]}, {fd_args[1]})", ref, 1

    def ternary(self) -> tuple[str, str, int] | None:
        x = self.pick()
        if x is None:
            return None
        if self.rng.random() < 0.5:
            lo, hi = sorted(self.rng.sample([-2, -1, -0.5, 0, 0.5, 1, 2], 2))
            if self.rng.random() < 0.2:
                lo, hi = hi, lo
            return f"fd.ops.clamp({x}, {lo!r}, {hi!r})", f"torch.clamp({x}, {lo!r}, {hi!r})", 1
        cond = self.pick(lambda n: self.ref(n).dtype is torch.bool and self._compatible(x, n))
        if cond is None:
            return None
        other_fd, other_ref = self.operand() if self.rng.random() < 0.5 else (self.partner(x),) * 2
        return f"fd.ops.where({cond}, {x}, {other_fd})", f"torch.where({cond}, {x}, {other_ref})", 1

    def broadcast(self) -> tuple[str, str, int] | None:
        x = self.pick(lambda n: self.ref(n).dim() < 4)
        if x is None:
            return None
        rank = self.ref(x).dim()
        flags = [False] * rank
        for _ in range(self.rng.randint(1, 2)):
            flags.insert(self.rng.randint(0, len(flags)), True)
        index = ", ".join("None" if f else ":" for f in flags)
        return f"fd.ops.broadcast({x}, {flags})", f"{x}[{index}]", 1

    def broadcast_in_dim(self) -> tuple[str, str, int] | None:
        x = self.pick(lambda n: self.ref(n).dim() < 4)
        if x is None:
            return None
        sizes, flags = list(self.ref(x).shape), self.bcast(x)
        out_rank = len(sizes) + self.rng.randint(0, 2)
        dims = sorted(self.rng.sample(range(out_rank), len(sizes)))
        shape = [self.rng.choice([1, 2, 3]) for _ in range(out_rank)]
        view = [1] * out_rank
        for d, size, flag in zip(dims, sizes, flags, strict=True):
            shape[d] = self.rng.choice([1, 3]) if flag and size == 1 else size
            view[d] = size
        return (f"fd.ops.broadcast_in_dim({x}, {shape}, {dims})", f"{x}.reshape({view}).expand({shape})", 1)

    def expand(self) -> tuple[str, str, int] | None:
        x = self.pick(lambda n: self.ref(n).dim() > 0)
        if x is None:
            return None
        sizes, flags = list(self.ref(x).shape), self.bcast(x)
        shape = []
        for size, flag in zip(sizes, flags, strict=True):
            if flag and size == 1:
                shape.append(self.rng.choice([1, 2, 3, 5]))
            else:
                shape.append(self.rng.choice([-1, size]))
        sizes = "[" + ", ".join("-1" if v == -1 else self.size(v) for v in shape) + "]"
        return f"fd.ops.expand({x}, {sizes})", f"{x}.expand({sizes})", 1

    def squeeze(self) -> tuple[str, str, int] | None:
        x = self.pick(lambda n: 1 in self.ref(n).shape)
        if x is None:
            return None
        ones = [d for d, s in enumerate(self.ref(x).shape) if s == 1]
        dims = sorted(self.rng.sample(ones, self.rng.randint(1, len(ones))))
        return f"fd.ops.squeeze({x}, {dims})", f"{x}.squeeze({tuple(dims)})", 1

    def permute(self) -> tuple[str, str, int] | None:
        x = self.pick(lambda n: self.ref(n).dim() > 1)
        if x is None:
            return None
        perm = list(range(self.ref(x).dim()))
        self.rng.shuffle(perm)
        return f"fd.ops.permute({x}, {perm})", f"{x}.permute({perm})", 1

    def reshape(self) -> tuple[str, str, int] | None:
        x = self.pick()
        if x is None:
            return None
        n = self.ref(x).numel()
        divisors = [d for d in range(1, n + 1) if n % d == 0] if n else [0, 2, 3]
        options = [[n], [1, n], [n, 1]]
        options += [[d, n // d] for d in divisors if n] + [[0, 2], [3, 0]] * (n == 0)
        options += [[d, 1, n // d] for d in divisors if n]
        shape = self.rng.choice(options)
        if n and len(shape) > 1 and self.rng.random() < 0.3:
            shape[self.rng.randrange(len(shape))] = -1
        return f"fd.ops.reshape({x}, {shape})", f"{x}.reshape({shape})", 1

    def slice(self) -> tuple[str, str, int] | None:
        x = self.pick(lambda n: self.ref(n).dim() > 0)
        if x is None:
            return None
        starts, ends, steps, index = [], [], [], []
        for size in self.ref(x).shape:
            start = self.rng.choice([0, 0, 1, -1, -2, size])
            end = self.rng.choice([size, size, size - 1, 2, -1, size + 3])
            step = self.rng.choice([1, 1, 1, 2, 3])
            start_code = self.size(start) if start >= 0 else repr(start)  # input scalars index from the front
            end_code = self.size(end) if end >= 0 else repr(end)
            starts.append(start_code)
            ends.append(end_code)
            steps.append(step)
            index.append(f"{start_code}:{end_code}:{step}")
        return (f"fd.ops.slice({x}, [{', '.join(starts)}], [{', '.join(ends)}], {steps})",
                f"{x}[{', '.join(index)}]", 1)

    def cat(self) -> tuple[str, str, int] | None:
        x = self.pick(lambda n: self.ref(n).dim() > 0)
        if x is None:
            return None
        shape = self.ref(x).shape
        dim = self.rng.randrange(len(shape))

        def fits(n: str) -> bool:
            other = self.ref(n).shape
            return len(other) == len(shape) and all(a == b for d, (a, b) in enumerate(zip(shape, other, strict=True))
                                                    if d != dim)

        others = [self.pick(fits) or x for _ in range(self.rng.randint(1, 2))]
        tensors = ", ".join([x, *others])
        return f"fd.ops.cat([{tensors}], {dim})", f"torch.cat([{tensors}], {dim})", 1

    def pad(self) -> tuple[str, str, int] | None:
        x = self.pick(lambda n: self.ref(n).dim() > 0)
        if x is None:
            return None
        rank = self.ref(x).dim()
        widths = self.sizes([self.rng.choice([-1, 0, 1, 1, 2]) for _ in range(2 * self.rng.randint(1, rank))])
        value = self.rng.choice([None, 0, 1.5, -2])
        fd_value = "" if value is None else f", {value!r}"
        ref_value = "" if value is None else f", value={value!r}"
        return f"fd.ops.pad({x}, {widths}{fd_value})", f"F.pad({x}, {widths}{ref_value})", 1

    def _dims(self, x: str) -> list[int] | None:
        rank = self.ref(x).dim()
        if rank == 0 or self.rng.random() < 0.15:
            return None
        return sorted(self.rng.sample(range(rank), self.rng.randint(1, rank)))

    def reduction(self) -> tuple[str, str, int] | None:
        x = self.pick()
        if x is None:
            return None
        kind = self.rng.choice(list(REDUCTIONS))
        dims = self._dims(x)
        keepdim = self.rng.random() < 0.3
        ref_dims = dims if dims is not None else list(range(self.ref(x).dim()))
        dtype = self.rng.choice([None, None, None, torch.float64, torch.float32]) if kind in ("sum", "prod",
                                                                                              "mean") else None
        fd_dtype_arg = "" if dtype is None else f", dtype={fd_dtype(dtype)}"
        ref_dtype_arg = "" if dtype is None else f", dtype={dtype}"
        if self.ref(x).dim() == 0:  # torch reduces a 0-dim tensor over no dims; fd.ops with dims=None
            return (f"fd.ops.{kind}({x}, None, keepdim={keepdim}{fd_dtype_arg})",
                    f"{REDUCTIONS[kind]}({x}, [0], keepdim={keepdim}{ref_dtype_arg})" if kind != "prod"
                    else f"torch.prod({x}{ref_dtype_arg})", 1)
        return (f"fd.ops.{kind}({x}, {dims}, keepdim={keepdim}{fd_dtype_arg})",
                f"{REDUCTIONS[kind]}({x}, {ref_dims}, keepdim={keepdim}{ref_dtype_arg})", 1)

    def var_mean(self) -> tuple[str, str, int] | None:
        x = self.pick(lambda n: self.ref(n).dtype.is_floating_point and self.ref(n).dim() > 0)
        if x is None:
            return None
        dims = self._dims(x)
        ref_dims = dims if dims is not None else list(range(self.ref(x).dim()))
        correction = self.rng.choice([0, 1, 1, 2])
        keepdim = self.rng.random() < 0.3
        if self.rng.random() < 0.4:
            return (f"fd.ops.var({x}, {dims}, {correction}, keepdim={keepdim})",
                    f"torch.var({x}, {ref_dims}, correction={correction}, keepdim={keepdim})", 1)
        return (f"fd.ops.var_mean({x}, {dims}, {correction}, keepdim={keepdim})",
                f"torch.var_mean({x}, {ref_dims}, correction={correction}, keepdim={keepdim})", 2)

    def _matrix_partner(self, shape: Sequence[int], dtype: torch.dtype, pred: Callable[[str], bool]) -> str:
        found = self.pick(lambda n: self.ref(n).dtype == dtype and pred(n)) if self.rng.random() < 0.6 else None
        if found is not None or len(self.inputs) >= self.config.max_inputs:
            return found or ""
        return self.tensor_input(shape, dtype, [False] * len(shape))

    def matmul(self) -> tuple[str, str, int] | None:
        a = self.pick(lambda n: self.ref(n).dim() > 0 and self.ref(n).dtype in FLOATS[:7])
        if a is None:
            return None
        sa = list(self.ref(a).shape)
        k = sa[-1]
        if len(sa) == 1:
            shape = self.rng.choice([[k], [k, self.rng.choice([1, 2, 3])], [2, k, 3]])
        else:
            batch = sa[:-2]
            shape = self.rng.choice([[k], [k, self.rng.choice([2, 3, 5])], [*batch, k, 2]])

        def fits(n: str) -> bool:
            sb, fb = list(self.ref(n).shape), self.bcast(n)
            if not sb or sb[0 if len(sb) == 1 else -2] != k:
                return False
            batch_a, batch_b = sa[:-2], sb[:-2]
            flags_a, flags_b = self.bcast(a)[:-2], fb[:-2]
            for j in range(1, min(len(batch_a), len(batch_b)) + 1):
                if batch_a[-j] != batch_b[-j] and not (flags_a[-j] or flags_b[-j]):
                    return False
            return True

        b = self._matrix_partner(shape, self.ref(a).dtype, fits)
        if not b:
            return None
        return f"fd.ops.matmul({a}, {b})", f"torch.matmul({a}, {b})", 1

    def linear(self) -> tuple[str, str, int] | None:
        x = self.pick(lambda n: self.ref(n).dim() > 0 and self.ref(n).dtype in FLOATS[:7])
        if x is None:
            return None
        dtype, k = self.ref(x).dtype, self.ref(x).shape[-1]
        n = self.rng.choice([1, 2, 3, 4])
        w_shape = [n, k] if self.rng.random() < 0.85 else [k]
        w = self._matrix_partner(w_shape, dtype, lambda t: list(self.ref(t).shape) == w_shape)
        if not w:
            return None
        n = self.ref(w).shape[0] if self.ref(w).dim() == 2 else None
        if n is not None and self.rng.random() < 0.5:
            b = self._matrix_partner([n], dtype, lambda t: list(self.ref(t).shape) == [n])
            if b:
                return f"fd.ops.linear({x}, {w}, {b})", f"F.linear({x}, {w}, {b})", 1
        return f"fd.ops.linear({x}, {w})", f"F.linear({x}, {w})", 1

    def full(self) -> tuple[str, str, int] | None:
        shape = self.sizes([self.rng.choice(SIZES) for _ in range(self.rng.randint(0, 3))])
        value_fd, value_ref = self.operand()
        dtype = self.rng.choice(DTYPES)
        return (f"fd.ops.full({shape}, {value_fd}, {fd_dtype(dtype)})",
                f"torch.full({shape}, {value_ref}, dtype={dtype})", 1)

    def iota(self) -> tuple[str, str, int] | None:
        length = self.size(self.rng.choice(SIZES))
        dtype = self.rng.choice([torch.int64, torch.int32, torch.float32, torch.float64])
        start, step = self.rng.choice([0, 1, -2]), self.rng.choice([1, 2, -1])
        if dtype.is_floating_point:
            start, step = float(start), float(step) / 2
        return (f"fd.ops.iota({length}, {start!r}, {step!r}, {fd_dtype(dtype)})",
                f"iota_values({length}, {start!r}, {step!r}, {dtype})", 1)

    def copy(self) -> tuple[str, str, int] | None:
        x = self.pick()
        if x is None:
            return None
        return f"fd.ops.{self.rng.choice(['set', 'set', 'segment_set'])}({x})", f"{x}.clone()", 1

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
        for out in outputs:
            extra = "" if out.stride_order is None else f", stride_order={list(out.stride_order)}"
            exec(f"fd.add_output({out.name}{extra})", self.fd_ns)
        return outputs

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
        if rng.random() < self.config.stream:
            # Mostly what a stream loop can run: an iteration axis of a tensor computed chunk-wise.
            chunkable = [n for n in scheduled if self._chunkable(n)]
            targets = ([o.name for o in outputs if o.name in chunkable] or chunkable) if rng.random() < 0.8 else []
            name = rng.choice(targets or scheduled)
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
        return lines

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


__all__ = ["PRELUDE", "GeneratorConfig", "generate"]
