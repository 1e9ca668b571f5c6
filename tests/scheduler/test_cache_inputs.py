"""Cached inputs (seed 003): on-chip caches derive their allocation from their loop domain, global
caches keep their input's; seed 003's fusion runs correctly with its permuted input."""

from __future__ import annotations

import pytest
import torch

from pyfuser import FusionDefinition, ParallelType
from pyfuser.ir.device_mesh import DeviceMesh
from pyfuser.ir.tensor_view import MemoryType, TensorView
from pyfuser.scheduler.cache import (
    allocated_ids,
    cache_inputs,
    check_allocation_matches_loop,
    derive_allocation_from_loop,
)
from pyfuser.scheduler.tools import set_compute_at


def seed_003_fusion(shape: list[int], stride_order: list[int]) -> tuple[FusionDefinition, list[TensorView]]:
    """T0 [1, M, N] -> squeeze, sum, broadcast, add, squeeze, sum; outputs T4 and T6."""
    with FusionDefinition() as fd:
        # contiguity is listed in allocation order (outermost first): None where axis 0 is placed
        places = sorted(range(3), key=lambda d: -stride_order[d])
        t0 = fd.define_tensor(shape, contiguity=[None if d == 0 else True for d in places], stride_order=stride_order)
        t1 = fd.ops.squeeze(t0, [0])
        t2 = fd.ops.sum(t1, [1])
        t3 = fd.ops.broadcast(t2, [True, False, True])
        t4 = fd.ops.add(t0, t3)
        t5 = fd.ops.squeeze(t4, [0])
        t6 = fd.ops.sum(t5, [0])
        fd.add_output(t4)
        fd.add_output(t6)
    return fd, [t0, t1, t2, t3, t4, t5, t6]


def reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    t4 = x + x.squeeze(0).sum(1)[None, :, None]
    return t4, t4.squeeze(0).sum(0)


def test_seed_003_fusion_prints_like_the_seed() -> None:
    fd, (t0, *_) = seed_003_fusion([1, 4096, 4096], [1, 2, 0])
    assert t0.transforms_string() == (
        "T0_g_float[bS0{1}, iS1{4096}, iS2{4096}]\n"
        " logical domain : (bS0{1}, iS1{4096}, iS2{4096})\n"
        " allocation domain : (iS1{4096}, bS0{1}, iS2{4096})\n"
        " contiguity: t n t\n"
        " loop domain : (bS0{1}, iS1{4096}, iS2{4096})")
    assert "T6_g_float[rS15{4096}, iS16{4096}]\n   = reduction( T5_l_float[iS13{4096}, iS14{4096}], op = add" \
        in fd.fusion.math_string()


@pytest.mark.parametrize("make", [
    lambda: torch.randn(64, 1, 48).permute(1, 0, 2),  # the seed's (iS1, bS0, iS2) allocation
    lambda: torch.randn(1, 64, 48),                   # same memory order: bS0 has no footprint
])
def test_seed_003_fusion_runs_with_the_permuted_input(make: object) -> None:
    fd, _ = seed_003_fusion([1, 64, 48], [1, 2, 0])
    x = make()  # type: ignore[operator]
    t4, t6 = fd.execute([x])
    ref4, ref6 = reference(x)
    torch.testing.assert_close(t4, ref4)
    torch.testing.assert_close(t6, ref6)
    assert t4.stride()[1:] == (48, 1)


def test_seed_003_fusion_with_a_column_major_input() -> None:
    """A truly permuted variant: T0 allocated (iS2, bS0, iS1); T4 inherits the layout as a hint."""
    fd, _ = seed_003_fusion([1, 64, 48], [1, 0, 2])
    x = torch.randn(48, 1, 64).permute(1, 2, 0)
    t4, t6 = fd.execute([x])
    ref4, ref6 = reference(x)
    torch.testing.assert_close(t4, ref4)
    torch.testing.assert_close(t6, ref6)
    assert t4.stride()[1:] == (1, 64)


def schedule_cache_like_the_normalization_scheduler(cache: TensorView) -> None:
    """The seed's T7: split 4096 by 2, by 132, by 2; blockIdx.y; shared memory; TMA; ca_pos 2."""
    cache.set_memory_type(MemoryType.Shared)
    cache.split(1, 2)           # [b, 2048, 2, 4096]
    cache.split(1, 132)         # [b, 16, 132, 2, 4096]
    cache.split(1, 2)           # [b, 8, 2, 132, 2, 4096]
    cache.reorder({3: 0, 1: 1, 2: 2, 4: 3, 0: 4})
    cache.axis(0).parallelize(ParallelType.grid_y)
    cache.axis(5).parallelize(ParallelType.tma)
    set_compute_at(cache, 2)


SEED_003_CACHE = (
    "T7_s_float[iblockIdx.y23{132}, iS24{8}, iS25{2}, iS21{2}, bS17{1}, iB19{4096}] ca_pos( 2 )\n"
    " logical domain : (bS17{1}, iS18{4096}, iB19{4096})\n"
    " allocation domain : (iblockIdx.y23{132}, iS24{8}, iS25{2}, iS21{2}, bS17{1}, iB19{4096}) (hint)\n"
    " contiguity: t t t t n t\n"
    "  Split: iS18{4096} by factor 2 -> iS20{2048}, iS21{2}\n"
    "  Split: iS20{2048} by factor 132 -> iS22{16}, iblockIdx.y23{132}\n"
    "  Split: iS22{16} by factor 2 -> iS24{8}, iS25{2}\n"
    " loop domain : (iblockIdx.y23{132}, iS24{8}, iS25{2}, iS21{2}, bS17{1}, iB19{4096})")


def test_shared_memory_cache_allocation_follows_its_loop() -> None:
    fd, (t0, t1, *_rest) = seed_003_fusion([1, 4096, 4096], [1, 2, 0])
    t4 = _rest[2]
    (t7,) = cache_inputs(fd.fusion, propagate_allocation_domain=True)
    assert t7.short_name == "T7" and t1.definition.inputs[0] is t7 and t4.definition.inputs[0] is t7
    assert [str(i) for i in t7.get_allocation_domain()] == ["iS18{4096}", "bS17{1}", "iS19{4096}"]
    schedule_cache_like_the_normalization_scheduler(t7)

    # the layout the seed found: the global input's allocation copied to a shared-memory cache
    with pytest.raises(ValueError, match=r"T7: allocation domain \(iS18\{4096\}, bS17\{1\}, iB19\{4096\}\) does not "
                                         r"match its loop domain: loop IDs iblockIdx.y23\{132\}, iS24\{8\} left of "
                                         r"compute-at position 2 are not in it"):
        check_allocation_matches_loop(t7)

    derive_allocation_from_loop(t7)
    check_allocation_matches_loop(t7)
    assert t7.transforms_string() == SEED_003_CACHE
    # what the seed says shared memory should hold: iS120{2}, iS116{2}, bS20{1}, iB22{4096}
    assert [str(i) for i in allocated_ids(t7)] == ["iS25{2}", "iS21{2}", "bS17{1}", "iB19{4096}"]
    assert t0.get_allocation_domain()[0] is t0.get_logical_domain()[1], "the global input keeps its allocation"

    small, _ = seed_003_fusion([1, 64, 48], [1, 2, 0])
    (small_cache,) = cache_inputs(small.fusion, propagate_allocation_domain=True)
    schedule_cache_like_the_normalization_scheduler(small_cache)  # non-divisible splits of 64
    derive_allocation_from_loop(small_cache)
    x = torch.randn(64, 1, 48).permute(1, 0, 2)
    t4_out, t6_out = small.execute([x])
    ref4, ref6 = reference(x)
    torch.testing.assert_close(t4_out, ref4)
    torch.testing.assert_close(t6_out, ref6)


def test_derived_allocation_keeps_the_stride_order_of_a_permuted_cache() -> None:
    """A column-major input: each logical ID is replaced in place by its loop IDs, in stride order."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1], contiguity=True, stride_order=[0, 1])
        fd.add_output(fd.ops.exp(t0))
    (cache,) = cache_inputs(fd.fusion, propagate_allocation_domain=True)
    _rows, cols = cache.get_logical_domain()
    cache.split(0, 4)  # [i0/4, 4, i1]
    set_compute_at(cache, 1)
    derive_allocation_from_loop(cache)
    outer, inner = cache.get_loop_domain()[:2]
    assert cache.get_allocation_domain() == [cols, outer, inner]
    assert allocated_ids(cache) == [cols, inner]


def test_merged_loop_makes_the_allocation_follow_the_loop() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1], contiguity=True, stride_order=[0, 1])
        fd.add_output(fd.ops.exp(t0))
    (cache,) = cache_inputs(fd.fusion, propagate_allocation_domain=True)
    cache.merge(0)
    cache.split(0, 8)
    derive_allocation_from_loop(cache)
    assert cache.get_allocation_domain() == cache.get_loop_domain()


def test_global_cache_keeps_the_input_allocation() -> None:
    """Transpose / matmul staging caches live in global memory and keep the input's layout."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1, -1], contiguity=True, stride_order=[0, 2, 1])
        fd.add_output(fd.ops.neg(t0))
    (cache,) = cache_inputs(fd.fusion, propagate_allocation_domain=True, memory_type=MemoryType.Global)
    logical = cache.get_logical_domain()
    assert cache.get_allocation_domain() == [logical[1], logical[2], logical[0]]
    assert not cache.allocation_is_required
    with pytest.raises(ValueError, match=r"T2 is in global memory: its allocation is its input's"):
        derive_allocation_from_loop(cache)
    x = torch.randn(3, 5, 2).permute(2, 0, 1)  # axis 1 outermost, axis 0 innermost
    torch.testing.assert_close(fd.execute([x])[0], -x)


def test_cache_without_propagation_starts_row_major() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1], contiguity=True, stride_order=[0, 1])
        t1 = fd.define_tensor([-1, -1], contiguity=True)
        fd.add_output(fd.ops.add(t0, t1))
    caches = cache_inputs(fd.fusion, propagate_allocation_domain=False)
    assert [c.short_name for c in caches] == ["T3", "T4"]
    assert not any(c.has_allocation_domain() for c in caches)


def test_cache_before_keeps_the_output_layout() -> None:
    """Moving a reduction into a cache renews the output's IDs but keeps its (required) layout."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1, -1])
        t1 = fd.ops.sum(t0, [1])
        fd.add_output(t1)
    a, r, c = t1.get_logical_domain()
    t1.set_allocation_domain([c, r, a])
    cache = t1.cache_before()
    assert cache.memory_type is MemoryType.Local and not cache.has_allocation_domain()
    assert any(i.is_reduction() for i in cache.get_logical_domain())
    new_a, new_c = t1.get_logical_domain()
    assert t1.get_allocation_domain() == [new_c, new_a] and t1.allocation_is_required
    x = torch.randn(3, 4, 5)
    (out,) = fd.execute([x])
    torch.testing.assert_close(out, x.sum(1))
    assert out.stride() == (1, 3)


def test_bad_cache_and_compute_at_arguments() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        t1 = fd.ops.exp(t0)
        fd.add_output(t1)
    with pytest.raises(TypeError, match=r"T0: cache_after expects a MemoryType or a LoadStoreOpType, got str"):
        t0.cache_after("shared")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"T1: compute-at position 3 is out of range for a loop domain of 2 IDs"):
        set_compute_at(t1, 3)
    with pytest.raises(ValueError, match=r"T0 has no definition \(it is a fusion input\); use cache_after"):
        t0.cache_before()


def test_cache_of_a_sharded_input_replays_the_device_split() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1], contiguity=True)
        fd.add_output(fd.ops.exp(t0))
    t0.set_device_mesh(DeviceMesh(range(2)))
    t0.outer_split(1, 2)
    t0.axis(1).parallelize(ParallelType.mesh_x)
    t0.set_allocation_domain(t0.get_loop_domain())
    cache = t0.cache_after(MemoryType.Global)
    rows, cols = cache.get_logical_domain()
    mesh_id, local = cache.get_allocation_domain()[1:]
    assert cache.get_allocation_domain()[0] is rows
    assert mesh_id.parallel_type is ParallelType.mesh_x and mesh_id.definition.inputs == (cols,)
    assert str(mesh_id.extent) == "2" and local.definition is mesh_id.definition


def test_cache_before_a_split_allocation_is_rejected_without_changing_the_fusion() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        t1 = fd.ops.sum(t0, [1])
        fd.add_output(t1)
    t1.split(0, 2)
    outer, inner, red = t1.get_loop_domain()
    t1.set_allocation_domain([outer, inner, red])
    before = fd.fusion.math_string()
    with pytest.raises(ValueError, match=r"T1: cache_before cannot move a reduction out of a tensor whose allocation "
                                         r"domain \(iS4\{\( ceilDiv\(i0, 2\) \)\}, iS5\{2\}, rS3\{i1\}\) is transformed"):
        t1.cache_before()
    assert fd.fusion.math_string() == before
