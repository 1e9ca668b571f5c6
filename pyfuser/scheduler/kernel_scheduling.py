"""What the runtime asks of the schedulers to compile a kernel segment, in one place: the params and
schedule for the sizes it is compiled for, the launches the scheduled segment runs (a grid reduction's
partial and final steps, the final step scheduled here), and for a size-dependent scheduler the size
bucket a launch's sizes fall in. Every one of these is a scheduling decision: the runtime applies them
(it keeps a kernel per bucket and picks it at launch) and the code generator compiles the launches it
is given; neither decides any.

The bucket is the next power of two of the reduced extent and of the kept extent (the kept one
capped: past it no heuristic changes), so a schedule is made for a bucket's sizes once and serves
every size in it (nvFuser compiles per heuristic parameters the same way).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pyfuser.codegen.kernel_sequence import KernelPart
from pyfuser.codegen.python_writer import define_function
from pyfuser.codegen.triton_support import host_int_expr
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.symbolic import SymBinary, SymConst, SymExpr, SymVar
from pyfuser.ir.tensor_view import TensorView
from pyfuser.scheduler.grid_reduction import FinishStep, split_at_grid_reductions
from pyfuser.scheduler.reduction import schedule_final_step
from pyfuser.scheduler.reduction_analysis import analyze
from pyfuser.scheduler.registry import FusionLike, KernelParams, Machine, Scheduler, SchedulerType, SizeHints
from pyfuser.scheduler.schedulers import SCHEDULERS
from pyfuser.utils import next_power_of_2

#: Kept extents from here on schedule alike (every SM busy many times over).
KEPT_CAP = 1 << 16

#: A size bucket: (reduced extent, kept extent), each a power of two.
Bucket = tuple[int, int]

#: ``env -> bucket`` of a segment's sizes bound for a launch (``EvalContext.env``).
BucketFunction = Callable[[dict[str, int]], Bucket]


def size_bucket(reduced: int, kept: int) -> Bucket:
    """The bucket of a reduced and a kept extent."""
    return next_power_of_2(max(1, reduced)), min(next_power_of_2(max(1, kept)), KEPT_CAP)


def _final_step(machine: Machine, kept: int | None = None) -> FinishStep:
    """How a grid reduction's final step is scheduled on ``machine``: the reduction scheduler's rule, for a
    scheduler's schedule (``fd.execute``'s, and ``manual_execute`` given one); ``kept``: the first launch's
    kept extent, which the final step's columns are sized by."""
    return lambda fusion: schedule_final_step(fusion, machine, kept)


def manual_launches(fusion: Fusion, reference: TensorView, machine: Machine | None) -> list[KernelPart]:
    """The launches of a schedule applied by hand (``manual_execute``): a grid reduction's final step
    scheduled by the reduction scheduler's rule on ``machine`` where a scheduler's params made the
    schedule, else (None) the user's own, its reductions' grid axes turned into loops."""
    return split_at_grid_reductions(fusion, reference, None if machine is None else _final_step(machine))


@dataclass(frozen=True)
class KernelScheduling:
    """One kernel scheduler on one machine, as the runtime compiles its segments."""

    scheduler: Scheduler
    machine: Machine

    @staticmethod
    def of(scheduler_type: SchedulerType, device: torch.device) -> KernelScheduling:
        return KernelScheduling(SCHEDULERS[scheduler_type], Machine.of(device))

    def buckets(self, fusion: FusionLike) -> BucketFunction | None:
        """The bucket function of an unscheduled segment; None where one schedule serves every size."""
        if not self.scheduler.size_dependent:
            return None
        analysis, reason = analyze(fusion)
        if analysis is None:
            raise ValueError(f"the {self.scheduler.type.name} scheduler depends on the sizes, but the segment has "
                             f"no reduction to bucket its sizes by: {reason}")
        return _bucket_function(*analysis.extents())

    def heuristics(self, fusion: FusionLike, bucket: Bucket | None) -> KernelParams:
        """The params for a bucket's sizes (None: for any size)."""
        return self.scheduler.kernel_heuristics(fusion, () if bucket is None else SizeHints(*bucket, self.machine))

    def split_at(self, fusion: FusionLike, bucket: Bucket | None) -> list[TensorView]:
        """The tensors a segment is split at for a bucket's sizes, its parts launched one after another
        (``Scheduler.split_at``); none where one kernel serves the bucket."""
        if bucket is None or self.scheduler.split_at is None:
            return []
        return self.scheduler.split_at(fusion, SizeHints(*bucket, self.machine))

    def schedule(self, fusion: Fusion, params: KernelParams) -> None:
        self.scheduler.schedule(fusion, params)

    def launches(self, fusion: Fusion, params: KernelParams, bucket: Bucket | None) -> list[KernelPart]:
        """The launches of ``fusion`` scheduled by ``params`` for a bucket's sizes: one, or a grid reduction's
        partial and final steps, each final step scheduled for the partials' columns
        (``Scheduler.partial_columns``)."""
        reference = next(tv for tv in fusion.tensors() if tv.name == params.reference)
        columns = None if bucket is None else self.scheduler.partial_columns(SizeHints(*bucket, self.machine))
        return split_at_grid_reductions(fusion, reference, _final_step(self.machine, columns))


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


def _bucket_function(reduced: SymExpr, kept: SymExpr) -> BucketFunction:
    """``size_bucket`` of the extents bound in ``env``, as straight-line Python (it runs on every launch)."""
    names = sorted(_symbols(reduced) | _symbols(kept))
    if not all(n.isidentifier() for n in names) or not (_plain(reduced) and _plain(kept)):
        return lambda env: size_bucket(int(reduced.evaluate(env)), int(kept.evaluate(env)))
    body = [*(f"{n} = env[{n!r}]" for n in names),
            f"return (_pow2(max(1, {host_int_expr(reduced)})), min(_pow2(max(1, {host_int_expr(kept)})), {KEPT_CAP}))"]
    return define_function("def bucket(env):", body, "size bucket", {"_pow2": next_power_of_2})
