"""A process-wide cache of compiled fusions keyed by their structure (nvFuser's ``LRUCache``).

A definition rebuilt in a loop is a new Fusion object each time; ``cache_compile`` finds the
executor cache compiled for an equal definition and returns it, so the program is compiled once.
Two fusions are equal when their Python definitions (``translate_fusion``: every input, op,
attribute and output) and their schedules (every tensor's domains, transforms, parallel types,
memory types and meshes) print the same. The least recently used entry is evicted when the cache
is full. The cache keeps a copy of the fusion it was given, so a later edit of that fusion never
changes what a cached entry runs.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from pyfuser.ir.fusion import Fusion
from pyfuser.ir.python_definition import translate_fusion
from pyfuser.runtime.executor import FusionExecutorCache


def fusion_key(fusion: Fusion) -> str:
    """Everything that decides what a fusion computes and how it is scheduled, as text."""
    return f"{translate_fusion(fusion)}\n{fusion.transforms_string()}"


@dataclass
class _Entry:
    executor: FusionExecutorCache
    hits: int = 0


class LRUCache:
    """``cache_compile(fusion)`` -> the FusionExecutorCache of an equal fusion, created on a miss."""

    def __init__(self, max_fusions: int = 16384) -> None:
        if isinstance(max_fusions, bool) or not isinstance(max_fusions, int) or max_fusions <= 0:
            raise ValueError(f"LRUCache: max_fusions must be a positive int, got {max_fusions!r}")
        self.max_fusions = max_fusions
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # most recently used last
        self._lookups = 0
        self._hits = 0
        self._lock = threading.Lock()

    def cache_compile(self, fusion: Fusion) -> FusionExecutorCache:
        if not isinstance(fusion, Fusion):
            raise TypeError(f"LRUCache.cache_compile expects a Fusion, got {type(fusion).__name__}")
        key = fusion_key(fusion)
        with self._lock:
            self._lookups += 1
            entry = self._entries.get(key)
            if entry is not None:
                self._hits += 1
                entry.hits += 1
                self._entries.move_to_end(key)
                return entry.executor
            if len(self._entries) >= self.max_fusions:
                self._entries.popitem(last=False)
            entry = self._entries[key] = _Entry(FusionExecutorCache(fusion.clone()))
            return entry.executor

    def num_fusions(self) -> int:
        with self._lock:
            return len(self._entries)

    def stats(self) -> str:
        """nvFuser's report: capacity, size, compilations, hits per entry (most recent first)."""
        with self._lock:
            lines = [f"Max Fusions Allowed: {self.max_fusions}"]
            if not self._entries:
                return "\n".join([*lines, "The fusion cache is empty.", ""])
            rate = 100.0 * self._hits / self._lookups if self._lookups else 0.0
            lines += [f"Total Fusions in Cache: {len(self._entries)}",
                      f"Total Unique Fusions Compiled: {self._lookups - self._hits}",
                      "Cache Hits by LRU ordering:"]
            lines += [f"\t{k} -> {e.hits} hits" for k, e in enumerate(reversed(self._entries.values()))]
            lines += [f"Cache Lookups: {self._lookups}", f"Cache Hits: {self._hits}", f"Hit Rate: {rate:g}%", ""]
            return "\n".join(lines)
