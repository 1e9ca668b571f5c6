"""Kernels whose schedule depends on the sizes (reductions and normalizations): one compiled per
size bucket, chosen at launch.

The bucket is the next power of two of the reduced extent and of the kept extent (capped: past
it no heuristic changes), read from the sizes bound for the launch. The first launch in a bucket
schedules a fresh copy of the segment for it and compiles it; later launches in the bucket only
look it up (nvFuser compiles per heuristic parameters the same way).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from pyfuser.codegen.compiled_kernel import CompiledKernel
from pyfuser.codegen.kernel_sequence import KernelSequence
from pyfuser.codegen.launcher import BoundRun
from pyfuser.codegen.python_writer import define_function
from pyfuser.codegen.triton_support import host_int_expr
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.symbolic import SymBinary, SymConst, SymExpr, SymVar
from pyfuser.scheduler.registry import Machine, SizeHints
from pyfuser.utils import next_power_of_2

#: Kept extents from here on schedule alike (every SM busy many times over).
KEPT_CAP = 1 << 16

Kernel = CompiledKernel | KernelSequence


class SizeDispatchedKernel:
    """Runs like a ``CompiledKernel``; compiles ``build(hints)`` per size bucket."""

    def __init__(self, name: str, build: Callable[[SizeHints], Kernel], reduced: SymExpr, kept: SymExpr,
                 machine: Machine, output_perms: tuple[tuple[int, ...], ...]) -> None:
        self.name = name
        self.output_perms = output_perms
        self._build = build
        self._bucket = _bucket_function(reduced, kept)
        self._machine = machine
        self._by_bucket: dict[tuple[int, int], Kernel] = {}
        self.last: Kernel | None = None

    def kernel_for(self, env: dict[str, int]) -> Kernel:
        bucket = self._bucket(env)
        kernel = self._by_bucket.get(bucket)
        if kernel is None:
            kernel = self._by_bucket[bucket] = self._build(SizeHints(*bucket, self._machine))
        return kernel

    @property
    def code(self) -> str:
        return self.last.code if self.last is not None else ""

    @property
    def scheduler_params(self) -> object:
        return self.last.scheduler_params if self.last is not None else None

    @property
    def scheduled_ir(self) -> str:
        return self.last.scheduled_ir if self.last is not None else ""

    def run(self, ctx: EvalContext, *args: Any, out: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        kernel = self.last = self.kernel_for(ctx.env)
        return kernel.run(ctx, *args, out=out)

    def bind(self, ctx: EvalContext, args: Sequence[Any]) -> tuple[list[torch.Tensor], BoundRun | None]:
        """The bucket's kernel's ``bind`` (a bound program's sizes keep it in the bucket)."""
        kernel = self.last = self.kernel_for(ctx.env)
        return kernel.bind(ctx, args)


def _symbols(e: SymExpr) -> set[str]:
    if isinstance(e, SymVar):
        return {e.name}
    if isinstance(e, SymBinary):
        return _symbols(e.lhs) | _symbols(e.rhs)
    return set()


def _plain(e: SymExpr) -> bool:
    """Whether ``e`` is size arithmetic only (host scalar arithmetic, ``SymCall``, evaluates instead)."""
    if isinstance(e, SymBinary):
        return _plain(e.lhs) and _plain(e.rhs)
    return isinstance(e, (SymConst, SymVar))


def _bucket_function(reduced: SymExpr, kept: SymExpr) -> Callable[[dict[str, int]], tuple[int, int]]:
    """``env -> (reduced bucket, kept bucket)`` as straight-line Python (it runs on every launch)."""
    names = sorted(_symbols(reduced) | _symbols(kept))
    if not all(n.isidentifier() for n in names) or not (_plain(reduced) and _plain(kept)):
        return lambda env: (next_power_of_2(max(1, int(reduced.evaluate(env)))),
                            min(next_power_of_2(max(1, int(kept.evaluate(env)))), KEPT_CAP))
    body = [*(f"{n} = env[{n!r}]" for n in names),
            f"return (_pow2(max(1, {host_int_expr(reduced)})), min(_pow2(max(1, {host_int_expr(kept)})), {KEPT_CAP}))"]
    return define_function("def bucket(env):", body, "size bucket", {"_pow2": next_power_of_2})
