"""Specialization: per input signature, record one run's geometry, then replay it.

A caller that vouches for its inputs' signature (a bound program: sizes, strides, dtypes and device
fixed from call to call, as dynamo's guards fix a static-shape graph's) gets code written for that
signature: its first run records what every value looked like (``Recording``: sizes, strides,
storage offset, which storage), later runs replay what was written from the recording, without the
checks the first run made. The same mechanism, keyed by signature (``Specializations``), serves
every level:

* a kernel launch (``host_ir/steps.py`` ``BoundLaunches``): the launch's parameters, grid and
  compiled variant (``codegen/launcher.py`` ``BoundLaunch``);
* a Host IR program (``host_ir/evaluator.py``): its run as one straight-line function
  (``host_ir/straight_line.py``), the launches inlined;
* a torch.compile graph (``integrations/torch_compile/bound_graph.py``): one generated function with
  its regions' straight-line bodies in place, views as reinterpretations; each region keeps its
  bound programs the same way (``region.py``);
* a ``CaptureGraph``'s step and a CUDA-graph runner (``host_ir/cuda_graph.py`` ``Captures``): the graphs
  captured per key.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

#: Signatures remembered per specialized thing (a graph of static shapes sees few: an incoming
#: gradient's strides may vary): one more forgets them all, so a caller cycling through signatures costs recordings, not memory.
SPECIALIZATION_LIMIT = 8

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Specializations(dict[K, V]):
    """What each signature's first run recorded (or wrote from its recording), by signature. A dict
    (its ``get`` is the hot path's lookup, without a call of ours); ``record`` keeps at most
    ``SPECIALIZATION_LIMIT`` of them."""

    __slots__ = ()

    def record(self, key: K, value: V) -> V:
        if key not in self and len(self) >= SPECIALIZATION_LIMIT:
            self.clear()
        self[key] = value
        return value


@dataclass(frozen=True, slots=True)
class Seen:
    """A tensor as a recorded run produced it."""

    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    storage: int
    dtype: torch.dtype
    numel: int

    @staticmethod
    def of(value: Any) -> Seen | None:
        if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
            return None
        return Seen(tuple(value.shape), value.stride(), int(value.storage_offset()), value.untyped_storage().data_ptr(),
                    value.dtype, value.numel())


class Recording:
    """The geometry of each value one run produced (``Seen``; None for what is not a strided
    tensor), by key: a program's input or node result, an FX node."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen: dict[Hashable, Seen | None] = {}

    def note(self, key: Hashable, value: Any) -> Seen | None:
        seen = self.seen[key] = Seen.of(value)
        return seen

    def __getitem__(self, key: Hashable) -> Seen | None:
        return self.seen[key]

    def get(self, key: Hashable) -> Seen | None:
        return self.seen.get(key)
