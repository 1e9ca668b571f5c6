"""The schedule API on TensorView: loop transforms, allocation domains, memory types and caches."""

from __future__ import annotations

import pytest
import torch

from pyfuser import FusionDefinition, MemoryType, ParallelType, TensorView
from pyfuser.ir.symbolic import SymConst


def pointwise() -> tuple[FusionDefinition, TensorView, TensorView]:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1, -1])
        t1 = fd.ops.sin(t0)
        t2 = fd.ops.mul(t1, 2.0)
        fd.add_output(t2)
    return fd, t1, t2


def check(fd: FusionDefinition, shape: tuple[int, ...] = (3, 5, 7)) -> None:
    x = torch.randn(shape)
    (out,) = fd.execute([x])
    torch.testing.assert_close(out, torch.sin(x) * 2)


def loop_strings(tv: TensorView) -> list[str]:
    return [str(i) for i in tv.get_loop_domain()]


def test_axis_extent_and_parallel_type() -> None:
    _, t1, _ = pointwise()
    assert str(t1.axis(-1).extent) == "i2"
    assert t1.axis(0).parallel_type is ParallelType.serial
    assert t1.axis(1).parallelize(ParallelType.unroll) is t1.axis(1)
    assert t1.axis(1).parallel_type is ParallelType.unroll
    assert t1.get_loop_domain() is not t1.domain().loop, "getters return copies"


def test_split_variants() -> None:
    fd, t1, t2 = pointwise()
    t1.inner_split(2, 4)
    assert loop_strings(t1)[2:] == ["iS9{( ceilDiv(i2, 4) )}", "iS10{4}"]
    t1.outer_split(0, 2)
    assert loop_strings(t1)[:2] == ["iS11{2}", "iS12{( ceilDiv(i0, 2) )}"]
    t2.split(-1, 3, inner_split=False)
    assert loop_strings(t2)[-2:] == ["iS13{3}", "iS14{( ceilDiv(i2, 3) )}"]
    assert [str(i) for i in t1.get_logical_domain()] == ["iS3{i0}", "iS4{i1}", "iS5{i2}"], "logical never changes"
    check(fd)


def test_merge_default_and_explicit_axis2() -> None:
    fd, t1, t2 = pointwise()
    t1.merge(1)  # with the next axis
    assert loop_strings(t1) == ["iS3{i0}", "iS9{( i1 * i2 )}"]
    t2.merge(0, 2)  # non-adjacent: the merged ID takes the first position
    assert loop_strings(t2) == ["iS10{( i0 * i2 )}", "iS7{i1}"]
    check(fd)


def test_reorder_partial_and_negative() -> None:
    fd, t1, _ = pointwise()
    t1.reorder({0: -1})
    assert loop_strings(t1) == ["iS4{i1}", "iS5{i2}", "iS3{i0}"]
    t1.reorder({2: 0, 0: 2})
    assert loop_strings(t1) == ["iS3{i0}", "iS5{i2}", "iS4{i1}"]
    check(fd)


def test_split_by_symbolic_scalar_factor() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1])
        t1 = fd.ops.exp(t0)
        fd.add_output(t1)
    t1.split(0, fd.define_scalar(4))
    assert loop_strings(t1) == ["iS2{( ceilDiv(i0, 4) )}", "iS3{4}"]
    x = torch.randn(9)
    torch.testing.assert_close(fd.execute([x])[0], x.exp())


def test_static_split_folds_and_tracks_divisibility() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([4096, 10])
        fd.add_output(t0)
    t0.split(0, 2).split(0, 132).split(1, 3)
    assert loop_strings(t0) == ["iS4{16}", "iS6{44}", "iS7{3}", "iS3{2}", "iS1{10}"]
    first, second, third = (i.definition for i in (t0.axis(3), t0.axis(0), t0.axis(2)))
    assert first.is_divisible() is True
    assert second.is_divisible() is False, "2048 is not a multiple of 132: the last chunk is partial"
    assert third.is_divisible() is True


def test_set_allocation_domain_with_bool_and_list_contiguity() -> None:
    fd, t1, t2 = pointwise()
    ids = t2.get_logical_domain()
    t2.set_allocation_domain([ids[2], ids[0], ids[1]], True)
    assert t2.get_allocation_domain() == [ids[2], ids[0], ids[1]]
    assert t2.contiguity == [True, True, True]
    assert t2.has_allocation_domain()
    x = torch.randn(3, 5, 7)
    (out,) = fd.execute([x])
    torch.testing.assert_close(out, torch.sin(x) * 2)
    assert out.stride() == (5, 1, 15), "a user allocation domain on an output is a requirement"
    t1.set_allocation_domain(t1.get_logical_domain(), [True, False, True])
    assert t1.contiguity == [True, False, True]


def test_allocation_domain_of_split_ids() -> None:
    """Allocation may be a transform of logical too (like a sharded axis), independent of the loop."""
    _, t1, _ = pointwise()
    t1.split(0, 2)
    outer, inner, *rest = t1.get_loop_domain()
    t1.set_allocation_domain([inner, outer, *rest], True)
    t1.reorder({0: 3})
    assert t1.get_allocation_domain()[:2] == [inner, outer]
    assert t1.transforms_string().count("Split:") == 1, "a split shared by loop and allocation prints once"


def test_get_allocation_domain_defaults_to_logical() -> None:
    _, t1, _ = pointwise()
    assert t1.get_allocation_domain() == t1.get_logical_domain()
    assert not t1.has_allocation_domain()
    assert t1.domain().logical == t1.get_logical_domain()


def test_set_memory_type_prints() -> None:
    fd, t1, _ = pointwise()
    t1.set_memory_type(MemoryType.Shared)
    assert str(t1).startswith("T1_s_float[")
    check(fd)


def test_cache_after_inserts_a_set_read_by_all_consumers() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        t1 = fd.ops.exp(t0)
        t2 = fd.ops.add(t0, t1)
        fd.add_output(t2)
    cache = t0.cache_after()
    assert cache.definition is not None and cache.definition.inputs == [t0]
    assert t1.definition.inputs == [cache] and t2.definition.inputs[0] is cache
    text = fd.fusion.math_string()
    assert text.startswith(f"%kernel_math {{\n{cache}\n   = Set( {t0}, cache_op=Streaming )\n")
    cache.split(1, 2)
    x = torch.randn(3, 4)
    torch.testing.assert_close(fd.execute([x])[0], x + x.exp())


def test_cache_before_moves_the_definition() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        t1 = fd.ops.sum(t0, [1])
        fd.add_output(t1)
    cache = t1.cache_before()
    assert cache.definition is not None and cache.definition.inputs == [t0]
    assert t1.definition.inputs == [cache]
    assert cache.axis(1).is_reduction(), "the reduction happens in the cache"
    assert not any(i.is_reduction() for i in t1.get_logical_domain()), "the output only copies"
    cache.split(1, 3)
    x = torch.randn(4, 7)
    torch.testing.assert_close(fd.execute([x])[0], x.sum(1))


def test_cache_before_of_an_input_is_rejected() -> None:
    fd, _, _ = pointwise()
    t0 = fd.fusion.inputs()[0]
    with pytest.raises(ValueError, match="T0 has no definition"):
        t0.cache_before()
    check(fd)


def test_schedule_change_recompiles() -> None:
    fd, t1, _ = pointwise()
    check(fd)
    compiled = fd.fec.compile_count
    t1.split(0, 2)
    check(fd)
    assert fd.fec.compile_count == compiled + 1
    check(fd)
    assert fd.fec.compile_count == compiled + 1


def test_parallelized_schedule_executes_on_cpu() -> None:
    """Kernel / stream / device parallel types describe how to run; the reference result is the same."""
    fd, t1, t2 = pointwise()
    t2.merge(1).split(1, 4)
    t2.axis(0).parallelize(ParallelType.grid_x)
    t2.axis(1).parallelize(ParallelType.block_x)
    t2.axis(2).parallelize(ParallelType.vectorize)
    t1.split(0, 3)
    t1.axis(0).parallelize(ParallelType.unswitch)
    assert t2.axis(0).extent == t2.get_logical_domain()[0].extent
    assert t2.axis(2).extent == SymConst(4)
    check(fd, (4, 3, 5))
    check(fd, (2, 1, 9))
