"""``LruFusionCache``: a decorator for functions that build a FusionDefinition, so that rebuilding
an equal definition (in a loop, per call of a model) reuses its compiled programs."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from pyfuser.frontend.fusion_definition import FusionDefinition
from pyfuser.runtime.fusion_cache import LRUCache


class LruFusionCache:
    """``@LruFusionCache(max_fusions=...)`` on ``def build(...) -> FusionDefinition``.

    Each definition the function returns gets the executor cache of an equal definition built
    before (``fd.fec``), so it is compiled once. The wrapper has ``stats()`` and ``num_fusions()``.
    """

    def __init__(self, max_fusions: int = 16384) -> None:
        self.cache = LRUCache(max_fusions)

    def __call__(self, create_fusion_definition: Callable[..., FusionDefinition]) -> Callable[..., FusionDefinition]:
        cache = self.cache

        @functools.wraps(create_fusion_definition)
        def wrapper(*args: Any, **kwargs: Any) -> FusionDefinition:
            fd = create_fusion_definition(*args, **kwargs)
            if not isinstance(fd, FusionDefinition):
                raise TypeError(f"{create_fusion_definition.__name__} must return a FusionDefinition for "
                                f"LruFusionCache, got {type(fd).__name__}")
            fd.fec = cache.cache_compile(fd.fusion)
            return fd

        wrapper.stats = cache.stats  # type: ignore[attr-defined]  # a function attribute, as nvFuser's decorator has
        wrapper.num_fusions = cache.num_fusions  # type: ignore[attr-defined]  # likewise
        return wrapper
