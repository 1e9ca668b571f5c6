"""Random tensors: uniform and normal (and rand_like / randn_like), evaluated with torch's
generators.

With ``rng_seed`` (and ``rng_offset``) the values are a function of those two numbers only: the
same seed and offset give the same tensor on every run, and a different offset an independent
one, as nvFuser's Philox-based ops (the seed and offset are mixed into the seed of a private
generator on the op's device; values differ from nvFuser's own). Without a seed the op draws from
torch's default generator of its device, so ``torch.manual_seed`` makes a run repeatable.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any

import torch

from pyfuser.ir.base import Expr, PythonCall, Val
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.ops.common import call_string
from pyfuser.ir.symbolic import SymExpr

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion
    from pyfuser.ir.tensor_view import TensorView

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """A 64-bit mixing function (SplitMix64's finalizer): nearby inputs give unrelated outputs."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def seeded_generator(device: torch.device, seed: int, offset: int) -> torch.Generator:
    """A generator on ``device`` whose stream depends on ``seed`` and ``offset`` only."""
    generator = torch.Generator(device=device)
    generator.manual_seed(_splitmix64(_splitmix64(int(seed) & _MASK64) ^ (int(offset) & _MASK64)) >> 1)
    return generator


class RandomOpType(Enum):
    """The distribution; its two parameters are (minval, maxval) or (mean, std)."""

    uniform = "uniform"
    normal = "normal"


class RandomOp(Expr):
    """``out ~ distribution(a, b)`` of the output's shape; inputs ``a, b[, seed, offset]``."""

    #: a chunk would draw other values than the whole tensor does
    chunkable = False

    def __init__(self, fusion: Fusion, kind: RandomOpType, out: TensorView, a: Val, b: Val,
                 shape: list[SymExpr], seed: Val | None, offset: Val | None) -> None:
        super().__init__(fusion, [a, b, *((seed, offset) if seed is not None else ())], [out])
        self.kind = kind
        self.shape = list(shape)

    @property
    def seeded(self) -> bool:
        return len(self.inputs) == 4

    def evaluate(self, ctx: EvalContext, a: Any, b: Any, seed: Any = None, offset: Any = None) -> list[Any]:
        sizes = [e.evaluate(ctx.env) for e in self.shape]
        out = torch.empty(sizes, dtype=self.output.dtype.torch_dtype, device=ctx.device)
        generator = seeded_generator(ctx.device, seed, offset) if self.seeded else None
        if self.kind is RandomOpType.uniform:
            return [out.uniform_(float(a), float(b), generator=generator)]
        if float(b) < 0:
            raise ValueError(f"normal: std must be non-negative, got {b} (producing {self.output.short_name})")
        return [out.normal_(float(a), float(b), generator=generator)]

    def python_call(self) -> PythonCall:
        a, b = self.inputs[:2]
        seed, offset = self.inputs[2:] if self.seeded else (None, None)
        return PythonCall(self.kind.name, (a, b, self.shape), {"rng_seed": seed, "rng_offset": offset,
                                                               "dtype": self.output.dtype})

    def to_string(self, indent: int = 0) -> str:
        extents = ", ".join(str(e) for e in self.shape)
        return call_string(self.output, f"rng_{self.kind.name}", [f"{{{extents}}}", *self.inputs],
                           f"dtype = {self.output.dtype}", indent)
