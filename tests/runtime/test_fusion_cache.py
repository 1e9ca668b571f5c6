"""The process-wide fusion cache: equal definitions share one compiled executor (LRU eviction),
``LruFusionCache`` as a decorator, and nvFuser's stats report."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from pyfuser import DataType, FusionDefinition, LRUCache, LruFusionCache, ParallelType
from pyfuser.runtime.fusion_cache import fusion_key


def divide(fd: FusionDefinition, flip: bool = False) -> None:
    t0 = fd.define_tensor([-1, -1], contiguity=True)
    t1 = fd.define_tensor([-1, -1], contiguity=True)
    fd.add_output(fd.ops.div(t1, t0) if flip else fd.ops.div(t0, t1))


def test_decorator_reuses_the_compiled_program_and_reports_nvfusers_stats() -> None:
    a, b = torch.randn(2, 4), torch.randn(2, 4) + 3

    @LruFusionCache(max_fusions=10)
    def create_fusion(build: Callable[[FusionDefinition], None]) -> FusionDefinition:
        with FusionDefinition() as fd:
            build(fd)
        return fd

    assert create_fusion.stats() == "Max Fusions Allowed: 10\nThe fusion cache is empty.\n"
    executors = set()
    for _ in range(5):
        fd1 = create_fusion(divide)
        torch.testing.assert_close(fd1.execute([a, b])[0], a / b)
        fd2 = create_fusion(lambda fd: divide(fd, flip=True))
        torch.testing.assert_close(fd2.execute([a, b])[0], b / a)
        executors |= {id(fd1.fec), id(fd2.fec)}
        assert fd1.fec.compile_count == 1 and fd2.fec.compile_count == 1
    assert len(executors) == 2 and create_fusion.num_fusions() == 2
    assert create_fusion.stats() == """Max Fusions Allowed: 10
Total Fusions in Cache: 2
Total Unique Fusions Compiled: 2
Cache Hits by LRU ordering:
\t0 -> 4 hits
\t1 -> 4 hits
Cache Lookups: 10
Cache Hits: 8
Hit Rate: 80%
"""


def test_cache_compile_as_nvfuser_tests_use_it() -> None:
    """``fd.fec = cache.cache_compile(fd.fusion)``: input order is part of the structure."""
    def bcast_first(fd: FusionDefinition) -> None:
        t0 = fd.define_tensor([1, -1], contiguity=[None, True])
        t1 = fd.define_tensor([-1, -1], contiguity=True)
        fd.add_output(fd.ops.sub(t0, t1))

    def bcast_second(fd: FusionDefinition) -> None:
        t1 = fd.define_tensor([-1, -1], contiguity=True)
        t0 = fd.define_tensor([1, -1], contiguity=[None, True])
        fd.add_output(fd.ops.sub(t0, t1))

    cache = LRUCache(max_fusions=10)
    fds = []
    for build in (bcast_first, bcast_second, bcast_first):
        with FusionDefinition() as fd:
            build(fd)
        fd.fec = cache.cache_compile(fd.fusion)
        fds.append(fd)
    assert cache.num_fusions() == 2 and fds[0].fec is fds[2].fec
    row, full = torch.randn(1, 4), torch.randn(2, 4)
    torch.testing.assert_close(fds[0].execute([row, full])[0], row - full)
    torch.testing.assert_close(fds[1].execute([full, row])[0], row - full)


def test_least_recently_used_entry_is_evicted() -> None:
    cache = LRUCache(max_fusions=2)

    def scaled(k: float) -> FusionDefinition:
        with FusionDefinition() as fd:
            fd.add_output(fd.ops.mul(fd.define_tensor([-1]), k))
        return fd

    first = cache.cache_compile(scaled(1.0).fusion)
    cache.cache_compile(scaled(2.0).fusion)
    assert cache.cache_compile(scaled(1.0).fusion) is first  # 1.0 is now the most recent
    cache.cache_compile(scaled(3.0).fusion)  # evicts 2.0
    assert cache.num_fusions() == 2
    assert cache.cache_compile(scaled(1.0).fusion) is first
    assert "Total Unique Fusions Compiled: 3" in cache.stats()
    assert "Total Unique Fusions Compiled: 4" in (cache.cache_compile(scaled(2.0).fusion) and cache.stats())


@pytest.mark.parametrize("change", ["constant", "dtype", "schedule", "stride_order", "scalar dtype", "attribute"])
def test_different_definitions_or_schedules_get_different_entries(change: str) -> None:
    def build(variant: bool) -> FusionDefinition:
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1], dtype=DataType.Half if variant and change == "dtype" else DataType.Float)
            k = fd.define_scalar(2, dtype=DataType.Int32 if variant and change == "scalar dtype" else DataType.Int)
            y = fd.ops.mul(x, 0.5 if variant and change == "constant" else 0.25)
            y = fd.ops.add(y, k)
            z = fd.ops.sum(y, [1] if variant and change == "attribute" else [0])
            fd.add_output(z)
            fd.add_output(y, stride_order=[0, 1] if variant and change == "stride_order" else None)
        if variant and change == "schedule":
            y.outer_split(0, 2)
            y.axis(0).parallelize(ParallelType.stream)
        return fd

    assert fusion_key(build(False).fusion) == fusion_key(build(False).fusion)
    assert fusion_key(build(False).fusion) != fusion_key(build(True).fusion)


def test_a_cached_fusion_is_a_copy() -> None:
    """Editing the fusion given to the cache later never changes what the cached entry runs."""
    cache = LRUCache(4)
    with FusionDefinition() as fd:
        out = fd.ops.neg(fd.define_tensor([-1]))
        fd.add_output(out)
    executor = cache.cache_compile(fd.fusion)
    with fd:  # the definition reopened
        fd.add_output(fd.ops.exp(out))
    assert len(executor.fusion.outputs()) == 1


@pytest.mark.parametrize(("size", "error"), [(0, ValueError), (-1, ValueError), (2.5, ValueError), (True, ValueError)])
def test_bad_cache_size(size: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"LRUCache: max_fusions must be a positive int"):
        LRUCache(size)  # type: ignore[arg-type]


def test_bad_cache_arguments() -> None:
    with pytest.raises(TypeError, match=r"LRUCache.cache_compile expects a Fusion, got FusionDefinition"):
        LRUCache(1).cache_compile(FusionDefinition())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"fd.fec must be a FusionExecutorCache, got int"):
        FusionDefinition().fec = 3  # type: ignore[assignment]

    @LruFusionCache()
    def not_a_definition() -> FusionDefinition:
        return 1  # type: ignore[return-value]

    with pytest.raises(TypeError, match="not_a_definition must return a FusionDefinition for LruFusionCache, got int"):
        not_a_definition()
