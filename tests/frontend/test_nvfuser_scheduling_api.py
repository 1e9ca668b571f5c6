"""nvFuser's scheduling-side Python API as its tutorial uses it (issue 34): caches by copy kind,
the IdModel view, KernelExecutor, ``fd.ke`` / ``fd.fec.is_compiled`` and the enum spellings; what
pyfuser does not implement fails where it is asked, with the reason."""

from __future__ import annotations

import pytest
import torch

from pyfuser import (
    CompileParams,
    DataType,
    FusionDefinition,
    IdMappingMode,
    KernelExecutor,
    LoadStoreOpType,
    MemoryType,
    ParallelType,
    SchedulerType,
    idm,
    schedule,
)
from pyfuser.ir.base import UnsupportedFeatureError


def test_cache_after_and_before_take_nvfusers_copy_kind() -> None:
    """``set`` is a local cache; a manually scheduled kernel through it matches torch."""
    x = torch.randn(6, 70)[:, 3:67]  # non-contiguous rows
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        t1 = fd.ops.exp(t0)
        fd.add_output(t1)
        cached = t0.cache_after(LoadStoreOpType.set)
        before = t1.cache_before(LoadStoreOpType.set)
        assert cached.memory_type is MemoryType.local and before.memory_type is MemoryType.Local
        t1.merge(0, 1)
        t1.split(0, 32)
        t1.axis(1).parallelize(ParallelType.block_x)
        fd.sched.transform_like(t1)
        fd.sched.parallelize_like(t1)
    (out,) = fd.manual_execute([x])
    torch.testing.assert_close(out, torch.exp(x))
    assert MemoryType.shared is MemoryType.Shared


@pytest.mark.parametrize("kind", [LoadStoreOpType.tma, LoadStoreOpType.load_matrix, LoadStoreOpType.cp_async])
def test_hardware_copies_are_refused_where_asked(kind: LoadStoreOpType) -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        t1 = fd.ops.set(t0)
        fd.add_output(t1)
        with pytest.raises(UnsupportedFeatureError, match=rf"pyfuser does not implement T0.cache_after\("
                                                          rf"LoadStoreOpType.{kind.name}\) .*; use cache_after\(\)"):
            t0.cache_after(kind)
        with pytest.raises(NotImplementedError, match=rf"T1.cache_before\(LoadStoreOpType.{kind.name}\)"):
            t1.cache_before(kind)
        with pytest.raises(ValueError, match=r"takes LoadStoreOpType\.set"):
            t0.cache_after(LoadStoreOpType.segment_set)
        with pytest.raises(TypeError, match="T0: cache_after expects a MemoryType or a LoadStoreOpType, got str"):
            t0.cache_after("shared")  # type: ignore[arg-type]
    assert len(fd.fusion.exprs()) == 1  # nothing refused left a cache behind


def test_id_model_exact_graph_maps_through_exprs_and_transforms() -> None:
    """Exact: producer and consumer IDs of a pointwise op are one class, a broadcast is not mapped
    to the axis it meets (the permissive graph maps it); map_vals propagates through equal splits."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1])
        b = fd.define_tensor([-1, -1])
        row = fd.define_tensor([1, -1])
        c = fd.ops.add(a, row)
        d = fd.ops.neg(b)
        fd.add_output(c)
        fd.add_output(d)
    c.split(1, 4)
    d.split(1, 4)
    model = idm.IdModel(fd.fusion)
    exact = model.maybe_build_graph(IdMappingMode.exact)
    assert model.maybe_build_graph(IdMappingMode.exact) is exact
    sets = exact.disjoint_val_sets()
    assert sets.strict_are_mapped(a.axis(0), c.get_logical_domain()[0])
    assert not sets.strict_are_mapped(row.axis(0), c.get_logical_domain()[0])
    assert model.maybe_build_graph(IdMappingMode.permissive).disjoint_val_sets().strict_are_mapped(
        row.axis(0), c.get_logical_domain()[0])
    assert not sets.strict_are_mapped(c.axis(2), d.axis(2))
    for x, y in zip(a.get_logical_domain(), b.get_logical_domain(), strict=True):
        exact.map_vals(x, y)
    # a ~ b, so c ~ d on their logical axes and their equal splits' outputs
    assert sets.strict_are_mapped(c.axis(1), d.axis(1)) and sets.strict_are_mapped(c.axis(2), d.axis(2))
    assert "IdGraph exact" in str(exact) and "disjoint sets{" in str(sets) and "IdModel {" in str(model)
    with FusionDefinition() as other:
        stranger = other.define_tensor([-1])
        other.add_output(other.ops.neg(stranger))
    with pytest.raises(ValueError, match=r"strict_are_mapped: iS\d+\{i\d+\} \(of T0\) is not an ID of this graph"):
        sets.strict_are_mapped(stranger.axis(0), a.axis(0))
    with pytest.raises(TypeError, match="map_vals takes IterDomains"):
        exact.map_vals(a, b)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedFeatureError, match="almost_exact"):
        model.maybe_build_graph(IdMappingMode.almost_exact)


def test_kernel_executor_compiles_then_runs(kernel_options: list[str]) -> None:
    x = torch.randn(5, 3, 33)
    y = torch.randn(33).to(torch.bfloat16)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        t1 = fd.from_pytorch(y)
        t2 = fd.ops.add(t0, fd.ops.cast(t1, DataType.Float))
        fd.add_output(t2)
        t2.merge(0, 1)
        t2.merge(0, 1)
        t2.split(0, 64)
        t2.axis(0).parallelize(ParallelType.grid_x)
        t2.axis(1).parallelize(ParallelType.block_x)
    ke = KernelExecutor()
    assert not ke.is_compiled()
    with pytest.raises(ValueError, match=r"KernelExecutor.run: nothing is compiled; call compile"):
        ke.run([x, y])
    ke.compile(fd.fusion, [x, y], compile_params=CompileParams(index_type=DataType.Int32, maxrregcount=255,
                                                               enable_magic_zero=False))
    assert ke.is_compiled() and ke.compile_params.index_type is DataType.Int32
    (out,) = ke.run([x, y])
    torch.testing.assert_close(out, x + y.float())
    with pytest.raises(ValueError, match=r"index_type must be DataType\.Int32, DataType\.Int or None"):
        CompileParams(index_type=DataType.Float)
    with pytest.raises(UnsupportedFeatureError, match="programmatic dependent launch"):
        ke.is_programmatic_dependent_launch_enabled()


def test_fd_ke_and_fec_is_compiled() -> None:
    inputs = [torch.randn(2, 4, 8), torch.randn(2, 4, 8)]
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[2, 4, 8])
        t1 = fd.define_tensor(shape=[2, 4, 8])
        fd.add_output(fd.ops.add(t0, t1))
    assert not fd.ke.is_compiled() and not fd.fec.is_compiled(inputs)
    (out,) = fd.manual_execute(inputs)
    torch.testing.assert_close(out, inputs[0] + inputs[1])
    assert fd.ke.is_compiled()
    fd.execute(inputs)
    assert fd.fec.is_compiled(inputs)
    assert not fd.fec.is_compiled([inputs[0].transpose(0, 2), inputs[1].transpose(0, 2)])  # another layout


def test_scheduler_type_none() -> None:
    """nvFuser's tutorial lists schedulers through ``__entries`` and filters ``none``. (IDs answer
    ``is_reduction`` / ``is_broadcast`` as plain bool attributes, not nvFuser's method calls: the compiler
    compares them by identity on hot paths; docs/architecture.md section 11.)"""
    entries = SchedulerType.__entries  # type: ignore[attr-defined]
    assert entries["none"][0] is SchedulerType.none
    with pytest.raises(ValueError, match="none is not a scheduler of a fusion"):
        schedule.can_schedule(FusionDefinition().fusion, SchedulerType.none)
