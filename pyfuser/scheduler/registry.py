"""The schedulers, by type, and how a segment finds one that accepts it.

Every scheduler module has the same three entry points (nvFuser's ``registry.h``):

* ``can_schedule(fusion) -> (bool, reason)``: whether it can run this segment, and why not;
* ``compute_heuristics(fusion, inputs) -> params``: a frozen, printable dataclass that is also
  the kernel cache key (``PYFUSER_DUMP=scheduler_params``); ``inputs`` are the fusion's input
  values or, from the runtime, ``SizeHints`` (the size bucket a kernel is compiled for);
* ``schedule(fusion, params)``: transform the segment's loop domains with the same public API a
  user calls. It never writes kernel text: the code generator turns the scheduled segment into
  a kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, TypeVar, runtime_checkable
from weakref import WeakKeyDictionary

import torch

from pyfuser.codegen.values import L2Hint
from pyfuser.ir.base import Expr, Val
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.tensor_view import TensorView


class SchedulerType(Enum):
    """nvFuser's member names, so code that names a scheduler reads the same: a name only. What a
    scheduler is (kernel or not, size-dependent) its ``Scheduler`` declares, and
    ``scheduler/schedulers.py`` registers each member but ``communication`` (a segment of the comm
    layer, not a scheduler) exactly once."""

    #: no scheduler (nvFuser's ``SchedulerType.none``, a segment not yet given one): never registered
    none = "none"
    #: one generated kernel over the output's iteration space (pointwise, broadcast, shape ops)
    pointwise = "pointwise"
    #: like pointwise, tiled in 2-D where inputs and outputs disagree on the innermost axis
    transpose = "transpose"
    #: the segment runs as ATen calls, one per expr (matmul, linear, and what no kernel takes)
    expr_eval = "expr_eval"
    #: a resharding ``set``: a collective between ranks
    communication = "communication"
    #: reductions with pointwise prologue and epilogue, the reduced axes inner or outer in memory
    reduction = "reduction"
    #: a reduction read back over the axes it reduced (softmax, layernorm), reduced axes innermost
    inner_persistent = "inner_persistent"
    #: the same with the reduced axes outermost (batchnorm-like)
    outer_persistent = "outer_persistent"
    #: a reduction per row and a reduction across rows in one pass (layernorm backward, docs/cached_inputs.md)
    inner_outer_persistent = "inner_outer_persistent"
    #: rows added into a tensor at indexed rows with atomic adds (``index_put_accumulate``, an embedding's
    #: backward; not one of nvFuser's: there, an ATen call)
    scatter = "scatter"


@dataclass(frozen=True)
class Machine:
    """What schedulers size tiles by: programs that run at once, how many elements a tile may
    hold when a reduced extent stays on chip (persistent) or is looped over, and the shared memory a
    program may take (the buffers of a software-pipelined loop's loads)."""

    sm_count: int
    max_persistent: int
    loop_tile: int
    shared_bytes: int = 227 * 1024

    @staticmethod
    def of(device: torch.device) -> Machine:
        if device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            shared = getattr(props, "shared_memory_per_block_optin", 0) or 48 * 1024
            return Machine(props.multi_processor_count, 16384, 2048, shared)
        # Triton's interpreter: small tiles, so small tests take every path (split, multi-pass).
        return Machine(4, 1024, 128)


@dataclass(frozen=True)
class SizeHints:
    """The sizes a size-dependent schedule is made for (the runtime passes the bucket's: powers of
    two), or None where unknown: the schedule then works for any size."""

    reduced: int | None
    kept: int | None
    machine: Machine


class FusionLike(Protocol):
    """What schedulers read of a fusion: a whole ``Fusion`` or a ``SegmentView`` of one."""

    def inputs(self) -> list[Val]: ...

    def outputs(self) -> list[Val]: ...

    def exprs(self) -> list[Expr]: ...

    def tensors(self) -> list[TensorView]: ...


class SegmentView:
    """Exprs of a larger fusion seen as a fusion of their own, for ``can_schedule`` while segmenting
    (reading only: nothing is copied)."""

    def __init__(self, exprs: Sequence[Expr], inputs: Sequence[Val], outputs: Sequence[Val]) -> None:
        self._exprs = list(exprs)
        self._inputs = list(inputs)
        self._outputs = list(outputs)

    def inputs(self) -> list[Val]:
        return list(self._inputs)

    def outputs(self) -> list[Val]:
        return list(self._outputs)

    def exprs(self) -> list[Expr]:
        return list(self._exprs)

    def tensors(self) -> list[TensorView]:
        seen: dict[int, TensorView] = {}
        for v in self._inputs:
            if isinstance(v, TensorView):
                seen.setdefault(id(v), v)
        for e in self._exprs:
            for v in (*e.inputs, *e.outputs):
                if isinstance(v, TensorView):
                    seen.setdefault(id(v), v)
        return list(seen.values())


_Result = TypeVar("_Result")


def once_per_view(analysis: Callable[[FusionLike], _Result]) -> Callable[[FusionLike], _Result]:
    """``analysis`` computed once per ``SegmentView``: while segmenting, several schedulers' ``can_schedule``
    ask the same analysis of one view (the pointwise and transpose schedulers both check it is pointwise),
    and a view reads a graph that does not change while it lives. A whole ``Fusion`` (a scheduler may
    transform it between calls) is analyzed every time."""
    results: WeakKeyDictionary[SegmentView, _Result] = WeakKeyDictionary()

    @functools.wraps(analysis)
    def per_view(fusion: FusionLike) -> _Result:
        if not isinstance(fusion, SegmentView):
            return analysis(fusion)
        if fusion not in results:
            results[fusion] = analysis(fusion)
        return results[fusion]

    return per_view


class SchedulerParams(Protocol):
    """What ``compute_heuristics`` returns: printable and hashable (the kernel cache key)."""

    def __hash__(self) -> int: ...


@runtime_checkable
class KernelParams(SchedulerParams, Protocol):
    """What the code generator reads of a kernel scheduler's params: the tensor whose loop nest the
    kernel runs, warps per program (and in the variants whose rows load narrower than 16 bytes, 0: the
    same), software-pipelining stages of its serial loops (0: none) and what its loads ask of L2."""

    @property
    def reference(self) -> int: ...

    @property
    def num_warps(self) -> int: ...

    @property
    def narrow_warps(self) -> int: ...

    @property
    def num_stages(self) -> int: ...

    @property
    def l2(self) -> L2Hint: ...


@dataclass(frozen=True)
class Scheduler:
    """One scheduler: its type (name), its three entry points and its facts, declared together in
    its module. ``size_dependent``: the schedule depends on the sizes, so the runtime compiles it per
    size bucket at launch; ``is_kernel``: its segments run as one generated kernel (False: as ATen
    calls); ``split_at``: for a size-dependent scheduler, the tensors a segment is split at for sizes
    its kernel does not serve (the runtime launches the parts one after another, each scheduled by a
    scheduler that takes it; none: one kernel serves every size); ``partial_columns``: for a scheduler
    whose kernels reduce across programs, the extent of the partial results' columns for a size bucket
    (what a grid reduction's final step splits into column blocks; None: unknown)."""

    type: SchedulerType
    can_schedule: Callable[[FusionLike], tuple[bool, str]]
    compute_heuristics: Callable[[FusionLike, Sequence[Any] | SizeHints], SchedulerParams]
    schedule: Callable[[Fusion, Any], None]
    size_dependent: bool = field(kw_only=True)
    is_kernel: bool = field(default=True, kw_only=True)
    split_at: Callable[[FusionLike, SizeHints], list[TensorView]] | None = field(default=None, kw_only=True)
    partial_columns: Callable[[SizeHints], int | None] = field(default=lambda hints: None, kw_only=True)

    def kernel_heuristics(self, fusion: FusionLike, inputs: Sequence[Any] | SizeHints = ()) -> KernelParams:
        """``compute_heuristics`` of a kernel scheduler: the params the code generator reads."""
        params = self.compute_heuristics(fusion, inputs)
        if not self.is_kernel or not isinstance(params, KernelParams):
            raise TypeError(f"the {self.type.name} scheduler makes no kernel: its {type(params).__name__} lacks "
                            "a kernel's reference, num_warps, num_stages and l2")
        return params
