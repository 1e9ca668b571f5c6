"""The op families of the fuzz generator: each draws one ``fd.ops`` call and its eager torch twin.

A family returns ``(fusion code, reference code, number of outputs)``, or None when no value suits
it; ``_Generator.try_step`` runs both. Operands are picked to follow pyfuser's broadcasting: two
axes line up when their sizes are equal or one is a broadcast axis (size 1, declared so).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from .case import fd_dtype

if TYPE_CHECKING:
    import random

    from .case import Input
    from .generator import GeneratorConfig

Candidate = tuple[str, str, int]
SIZES = [0, 1, 1, 2, 2, 3, 3, 4, 5, 6, 7]
FLOATS = [torch.float32] * 6 + [torch.float64, torch.float16, torch.bfloat16]
DTYPES = [*FLOATS, torch.int64, torch.int32, torch.bool]
CAST_TARGETS = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool]
NUMBERS: list[bool | int | float] = [2, -1, 0, 3, 0.5, -1.5, 2.5, True, False]

UNARY = {
    "neg": "torch.neg({})", "abs": "torch.abs({})", "exp": "torch.exp({})", "log": "torch.log({})",
    "sqrt": "torch.sqrt({})", "rsqrt": "torch.rsqrt({})", "reciprocal": "torch.reciprocal({})",
    "sin": "torch.sin({})", "cos": "torch.cos({})", "tanh": "torch.tanh({})", "sigmoid": "torch.sigmoid({})",
    "relu": "torch.relu({})", "silu": "F.silu({})", "erf": "torch.erf({})", "logical_not": "torch.logical_not({})",
    "exp2": "torch.exp2({})", "log2": "torch.log2({})", "log10": "torch.log10({})", "log1p": "torch.log1p({})",
    "expm1": "torch.expm1({})",
}
#: binary kinds: the reference as an expression of ``{a}`` and ``{b}`` (numbers become 0-dim tensors
#: where torch takes tensors only, as fd.ops documents)
BINARY = {
    "add": "{a} + {b}", "sub": "{a} - {b}", "mul": "{a} * {b}", "truediv": "{a} / {b}",
    "div": "div_like_nvfuser({a}, {b})", "fmod": "torch.fmod({A}, {B})", "pow": "torch.pow({a}, {b})",
    "maximum": "torch.maximum({A}, {B})", "minimum": "torch.minimum({A}, {B})",
    "eq": "{a} == {b}", "ne": "{a} != {b}", "lt": "{a} < {b}", "le": "{a} <= {b}", "gt": "{a} > {b}",
    "ge": "{a} >= {b}", "logical_and": "torch.logical_and({A}, {B})", "logical_or": "torch.logical_or({A}, {B})",
}
REDUCTIONS = {"sum": "torch.sum", "prod": "prod_dims", "max": "torch.amax", "min": "torch.amin", "mean": "torch.mean"}


class OpFamilies(ABC):
    """The op families, mixed into the generator, whose values and operands they draw on."""

    rng: random.Random
    config: GeneratorConfig
    inputs: list[Input]

    @abstractmethod
    def pick(self, pred: Callable[[str], bool] = lambda n: True) -> str | None:
        """A tensor value satisfying ``pred``, recent ones more likely."""

    @abstractmethod
    def ref(self, name: str) -> torch.Tensor:
        """The reference value of tensor ``name``."""

    @abstractmethod
    def bcast(self, name: str) -> list[bool]:
        """Which logical axes of ``name`` are broadcast axes in the fusion."""

    @abstractmethod
    def operand(self) -> tuple[str, str]:
        """A number or scalar operand: (fusion code, reference code)."""

    @abstractmethod
    def size(self, value: int) -> str:
        """Code of an int argument bound to ``value``."""

    @abstractmethod
    def sizes(self, values: Sequence[int]) -> str:
        """Code of a list of int arguments."""

    @abstractmethod
    def tensor_input(self, shape: Sequence[int] | None = None, dtype: torch.dtype | None = None,
                     broadcast: Sequence[bool] | None = None) -> str:
        """A new input tensor (random where not given)."""

    # --- op families: each returns (fusion code, reference code, number of outputs) ---------------
    def unary(self) -> Candidate | None:
        x = self.pick()
        if x is None:
            return None
        if self.rng.random() < 0.12:
            tanh = self.rng.random() < 0.5
            return (f"fd.ops.gelu({x}, approximate={'tanh' if tanh else 'none'!r})",
                    f"F.gelu({x}, approximate={'tanh' if tanh else 'none'!r})", 1)
        name = self.rng.choice(list(UNARY))
        return f"fd.ops.{name}({x})", UNARY[name].format(x), 1

    def cast(self) -> Candidate | None:
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

    def binary(self) -> Candidate | None:
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

    def ternary(self) -> Candidate | None:
        x = self.pick()
        if x is None:
            return None
        if self.rng.random() < 0.5:
            lo, hi = sorted(self.rng.sample([-2, -1, -0.5, 0, 0.5, 1, 2], 2))
            if self.rng.random() < 0.2:
                lo, hi = hi, lo
            if self.rng.random() < 0.7:
                return f"fd.ops.clamp({x}, {lo!r}, {hi!r})", f"torch.clamp({x}, {lo!r}, {hi!r})", 1
            # a tensor bound: torch.clamp takes all-tensor bounds, numbers as 0-dim tensors (as fd.ops documents)
            bound = self.partner(x)
            return (f"fd.ops.clamp({x}, {bound}, {hi!r})",
                    f"torch.clamp({x}, {bound}, torch.as_tensor({hi!r}))", 1)
        cond = self.pick(lambda n: self.ref(n).dtype is torch.bool and self._compatible(x, n))
        if cond is None:
            return None
        other_fd, other_ref = self.operand() if self.rng.random() < 0.5 else (self.partner(x),) * 2
        branches_fd, branches_ref = [x, other_fd], [x, other_ref]
        if self.rng.random() < 0.3:
            branches_fd.reverse()
            branches_ref.reverse()
        return (f"fd.ops.where({cond}, {', '.join(branches_fd)})", f"torch.where({cond}, {', '.join(branches_ref)})", 1)

    def broadcast(self) -> Candidate | None:
        x = self.pick(lambda n: self.ref(n).dim() < 4)
        if x is None:
            return None
        rank = self.ref(x).dim()
        flags = [False] * rank
        for _ in range(self.rng.randint(1, 2)):
            flags.insert(self.rng.randint(0, len(flags)), True)
        index = ", ".join("None" if f else ":" for f in flags)
        return f"fd.ops.broadcast({x}, {flags})", f"{x}[{index}]", 1

    def broadcast_in_dim(self) -> Candidate | None:
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

    def expand(self) -> Candidate | None:
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

    def squeeze(self) -> Candidate | None:
        x = self.pick(lambda n: 1 in self.ref(n).shape)
        if x is None:
            return None
        ones = [d for d, s in enumerate(self.ref(x).shape) if s == 1]
        dims = sorted(self.rng.sample(ones, self.rng.randint(1, len(ones))))
        return f"fd.ops.squeeze({x}, {dims})", f"{x}.squeeze({tuple(dims)})", 1

    def permute(self) -> Candidate | None:
        x = self.pick(lambda n: self.ref(n).dim() > 1)
        if x is None:
            return None
        perm = list(range(self.ref(x).dim()))
        self.rng.shuffle(perm)
        return f"fd.ops.permute({x}, {perm})", f"{x}.permute({perm})", 1

    def reshape(self) -> Candidate | None:
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

    def slice(self) -> Candidate | None:
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

    def cat(self) -> Candidate | None:
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

    def pad(self) -> Candidate | None:
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

    def reduction(self) -> Candidate | None:
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

    def var_mean(self) -> Candidate | None:
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

    def matmul(self) -> Candidate | None:
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

    def linear(self) -> Candidate | None:
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

    def indexed_read(self) -> Candidate | None:
        """gather, take_along_axis, index_select, embedding or index of a value at index inputs brought into
        range by ``remainder`` (an index read or computed where the kernel reads the value)."""
        x = self.pick(lambda n: self.ref(n).dim() > 0)
        if x is None or len(self.inputs) >= self.config.max_inputs:
            return None
        shape = list(self.ref(x).shape)
        kind = self.rng.choice(["gather", "take_along_axis", "index_select", "embedding", "index"])
        if kind == "index":
            return self._advanced_index(x, shape)
        if kind == "embedding" and len(shape) != 2:
            kind = "index_select"
        dim = 0 if kind == "embedding" else self.rng.randrange(len(shape))
        if shape[dim] == 0:
            return None
        count = self.rng.choice(SIZES)
        if kind == "gather":  # at most arg's extent off ``dim``
            index_shape = [count if d == dim else self.rng.randint(0, s) for d, s in enumerate(shape)]
        elif kind == "take_along_axis":
            index_shape = [count if d == dim else s for d, s in enumerate(shape)]
        elif kind == "index_select":
            index_shape = [count]
        else:
            index_shape = [self.rng.choice(SIZES) for _ in range(self.rng.randint(0, 2))]
        dtype = torch.int64 if kind in ("gather", "take_along_axis") else self.rng.choice([torch.int64, torch.int32])
        raw = self.tensor_input(index_shape, dtype)
        index_fd, index_ref = f"fd.ops.remainder({raw}, {shape[dim]})", f"torch.remainder({raw}, {shape[dim]})"
        if kind == "index_select":
            return (f"fd.ops.index_select({x}, {index_fd}, {dim})", f"torch.index_select({x}, {dim}, {index_ref})", 1)
        if kind == "embedding":
            return f"fd.ops.embedding_fwd({index_fd}, {x})", f"F.embedding({index_ref}, {x})", 1
        ref = "torch.gather({x}, {dim}, {i})" if kind == "gather" else "torch.take_along_dim({x}, {i}, {dim})"
        return f"fd.ops.{kind}({x}, {index_fd}, {dim})", ref.format(x=x, dim=dim, i=index_ref), 1

    def index_put(self) -> Candidate | None:
        """``x`` with rows of a new value input put at indices: ``index_put`` of distinct rows (an
        ``iota`` wrapped into range, counted from the end half the time: stores to one row twice land in
        an unspecified order) or ``index_put_accumulate`` of rows brought into range by ``remainder``
        (repeats add)."""
        x = self.pick(lambda n: self.ref(n).dim() > 0 and self.ref(n).shape[0] > 0 and self.ref(n).dtype != torch.bool)
        if x is None or len(self.inputs) + 2 > self.config.max_inputs:
            return None
        shape = list(self.ref(x).shape)
        rows, dtype = shape[0], self.ref(x).dtype
        value = self.tensor_input([self.rng.randint(0, rows), *shape[1:]], dtype)
        count = self.ref(value).shape[0]
        if self.rng.random() < 0.5:
            shift, wrap = self.rng.randrange(rows), self.rng.random() < 0.5
            index_fd = f"fd.ops.remainder(fd.ops.iota({count}, {shift}, 1, DataType.Int), {rows})"
            index_ref = f"torch.remainder(torch.arange({shift}, {shift + count}), {rows})"
            if wrap:
                index_fd, index_ref = f"fd.ops.sub({index_fd}, {rows})", f"({index_ref} - {rows})"
            return (f"fd.ops.index_put({x}, {index_fd}, {value}, wrap_negative={wrap})",
                    f"{x}.index_put(({index_ref},), {value})", 1)
        raw = self.tensor_input([count], self.rng.choice([torch.int64, torch.int32]))
        return (f"fd.ops.index_put_accumulate({x}, fd.ops.remainder({raw}, {rows}), {value})",
                f"{x}.index_put((torch.remainder({raw}, {rows}).long(),), {value}, accumulate=True)", 1)

    def _advanced_index(self, x: str, shape: list[int]) -> Candidate | None:
        """``aten.index(x, [..., i0, ..., i1])``: one or two axes (adjacent or apart) by integer tensors whose
        shapes broadcast together (suffixes of one shape, some extents 1, 0-dim ones too), values in
        ``[-size, size)``."""
        axes = sorted(self.rng.sample(range(len(shape)), min(len(shape), self.rng.choice([1, 1, 2]))))
        if any(shape[d] == 0 for d in axes) or len(self.inputs) + len(axes) > self.config.max_inputs:
            return None
        common = [self.rng.choice(SIZES) for _ in range(self.rng.randint(0, 2))]
        keys_fd: list[str] = ["None"] * (axes[-1] + 1)
        keys_ref: list[str] = ["None"] * (axes[-1] + 1)
        for d in axes:
            own = [self.rng.choice([1, e]) for e in common[self.rng.randint(0, len(common)):]]
            raw = self.tensor_input(own, self.rng.choice([torch.int64, torch.int32]))
            keys_fd[d] = f"fd.ops.sub(fd.ops.remainder({raw}, {2 * shape[d]}), {shape[d]})"
            keys_ref[d] = f"(torch.remainder({raw}, {2 * shape[d]}) - {shape[d]})"
        # ATen's op, not Python's ``x[...]``, which takes a 0-dim index tensor for an integer (a select)
        return (f"fd.ops.index({x}, [{', '.join(keys_fd)}])", f"torch.ops.aten.index.Tensor({x}, [{', '.join(keys_ref)}])",
                1)

    def full(self) -> Candidate | None:
        shape = self.sizes([self.rng.choice(SIZES) for _ in range(self.rng.randint(0, 3))])
        value_fd, value_ref = self.operand()
        dtype = self.rng.choice(DTYPES)
        return (f"fd.ops.full({shape}, {value_fd}, {fd_dtype(dtype)})",
                f"torch.full({shape}, {value_ref}, dtype={dtype})", 1)

    def iota(self) -> Candidate | None:
        length = self.size(self.rng.choice(SIZES))
        dtype = self.rng.choice([torch.int64, torch.int32, torch.float32, torch.float64])
        start, step = self.rng.choice([0, 1, -2]), self.rng.choice([1, 2, -1])
        if dtype.is_floating_point:
            start, step = float(start), float(step) / 2
        return (f"fd.ops.iota({length}, {start!r}, {step!r}, {fd_dtype(dtype)})",
                f"iota_values({length}, {start!r}, {step!r}, {dtype})", 1)

    def copy(self) -> Candidate | None:
        x = self.pick()
        if x is None:
            return None
        return f"fd.ops.{self.rng.choice(['set', 'set', 'segment_set'])}({x})", f"{x}.clone()", 1

