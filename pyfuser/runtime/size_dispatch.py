"""Kernels whose schedule depends on the sizes (reductions and normalizations): one compiled per
size bucket, chosen at launch.

The scheduler decides the buckets (``scheduler/kernel_scheduling.py``); here each launch reads its
bucket from the sizes bound for it. The first launch in a bucket schedules a fresh copy of the
segment for it and compiles it; later launches in the bucket only look it up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from pyfuser.codegen.compiled_kernel import CompiledKernel
from pyfuser.codegen.kernel_sequence import KernelSequence
from pyfuser.codegen.launcher import Bound
from pyfuser.ir.eval_context import EvalContext
from pyfuser.scheduler.kernel_scheduling import Bucket, BucketFunction

Kernel = CompiledKernel | KernelSequence


class SizeDispatchedKernel:
    """Runs like a ``CompiledKernel``; compiles ``build(bucket)`` per size bucket."""

    def __init__(self, name: str, build: Callable[[Bucket], Kernel], bucket: BucketFunction,
                 output_perms: tuple[tuple[int, ...], ...]) -> None:
        self.name = name
        self.output_perms = output_perms
        self._build = build
        self._bucket = bucket
        self._by_bucket: dict[Bucket, Kernel] = {}
        self.last: Kernel | None = None

    def kernel_for(self, env: dict[str, int]) -> Kernel:
        bucket = self._bucket(env)
        kernel = self._by_bucket.get(bucket)
        if kernel is None:
            kernel = self._by_bucket[bucket] = self._build(bucket)
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

    def bind(self, ctx: EvalContext, args: Sequence[Any]) -> tuple[list[torch.Tensor], Bound | None]:
        """The bucket's kernel's ``bind`` (a bound program's sizes keep it in the bucket)."""
        kernel = self.last = self.kernel_for(ctx.env)
        return kernel.bind(ctx, args)
