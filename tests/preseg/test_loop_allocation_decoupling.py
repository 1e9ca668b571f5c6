"""The last preseg pass (seed 000): Stream / device IDs first in loop domains, allocation in stride
order and whole unless device-sharded, segment-boundary allocations final."""

from __future__ import annotations

import copy

import pytest
import torch

from pyfuser import FusionDefinition, ParallelType
from pyfuser.ir.analysis.segment_boundaries import can_be_segment_boundary
from pyfuser.ir.device_mesh import DeviceMesh
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.tensor_view import TensorView
from pyfuser.options import CompileOptions
from pyfuser.preseg.loop_allocation_decoupling import decouple_loop_and_allocation
from pyfuser.preseg.pipeline import PRESEG_PASSES, run_preseg_passes
from pyfuser.scheduler.tools import set_compute_at


def preseg(fusion: Fusion) -> Fusion:
    copied = copy.deepcopy(fusion)
    run_preseg_passes(copied, CompileOptions())
    return copied


def names(ids: list) -> str:
    return ", ".join(map(str, ids))


def test_it_is_the_last_pass() -> None:
    assert PRESEG_PASSES[-1].name == "decouple_loop_and_allocation"


def test_seed_000_row_then_column_stream_loops() -> None:
    """tv1 is produced row chunk by row chunk and consumed column chunk by column chunk: both loop
    with Stream first, both are allocated whole in row-major order, and both are final."""
    with FusionDefinition() as fd:
        tv0 = fd.define_tensor([-1, -1], contiguity=True)
        tv1 = fd.ops.set(tv0)
        tv2 = fd.ops.set(tv1)
        fd.add_output(tv2)
    tv1.axis(0).parallelize(ParallelType.stream)
    tv2.axis(1).parallelize(ParallelType.stream)
    after = preseg(fd.fusion)
    t0, t1, t2 = after.tensors()
    assert names(t1.get_loop_domain()) == "iStreamIdx2{i0}, iS3{i1}"
    assert names(t1.get_allocation_domain()) == "iStreamIdx2{i0}, iS3{i1}"
    assert names(t2.get_loop_domain()) == "iStreamIdx5{i1}, iS4{i0}"
    assert names(t2.get_allocation_domain()) == "iS4{i0}, iStreamIdx5{i1}"
    assert t2.transforms_string() == (
        "T2_g_float[iStreamIdx5{i1}, iS4{i0}]\n"
        " logical domain : (iS4{i0}, iStreamIdx5{i1})\n"
        " allocation domain : (iS4{i0}, iStreamIdx5{i1}) (hint)\n"
        " contiguity: t t\n"
        " loop domain : (iStreamIdx5{i1}, iS4{i0})")
    assert all(tv.domain().allocation_frozen for tv in (t0, t1, t2)), "host loops make tv1 a segment boundary"
    with pytest.raises(ValueError, match=r"T1: allocation domain is final after pre-segmentation passes"):
        t1.set_allocation_domain(list(reversed(t1.get_logical_domain())), hint=True)
    x = torch.randn(6, 4)
    (out,) = fd.execute([x])
    torch.testing.assert_close(out, x)
    assert out.is_contiguous()


def test_loop_order_devices_then_streams_then_logical() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1, -1])
        t1 = fd.ops.exp(t0)
        fd.add_output(t1)
    t1.set_device_mesh(DeviceMesh(range(2)))
    t1.reorder({0: 2, 2: 0})                     # [i2, i1, i0]
    t1.split(1, 4)                               # [i2, i1/4, 4, i0]
    t1.axis(3).parallelize(ParallelType.stream)  # i0
    t1.outer_split(0, 2)                         # [2, i2/2, i1/4, 4, i0]
    t1.axis(0).parallelize(ParallelType.mesh_x)
    t1.reorder({0: 1, 1: 0})                     # [i2/2, mesh, i1/4, 4, i0]
    fusion = copy.deepcopy(fd.fusion)
    decouple_loop_and_allocation(fusion, CompileOptions())
    out = fusion.outputs()[0]
    assert names(out.get_loop_domain()) == (
        "ideviceIdx.x8{2}, iStreamIdx3{i0}, iS6{( ceilDiv(i1, 4) )}, iS7{4}, iS9{( ceilDiv(i2, 2) )}")
    assert names(out.get_allocation_domain()) == (
        "iStreamIdx3{i0}, iS4{i1}, ideviceIdx.x8{2}, iS9{( ceilDiv(i2, 2) )}"), "sharded on i2, whole on Stream"


def test_stream_split_is_folded_out_of_the_allocation() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1], contiguity=True)
        t1 = fd.ops.exp(t0)
        fd.add_output(t1)
    t1.outer_split(0, 3)
    t1.axis(0).parallelize(ParallelType.stream)
    t1.set_allocation_domain(t1.get_loop_domain())  # the user allocated along the loop
    after = preseg(fd.fusion)
    out = after.outputs()[0]
    assert names(out.get_allocation_domain()) == "iS2{i0}, iS3{i1}"
    assert out.allocation_is_required, "folding an adjacent Stream split keeps the layout, so the requirement stands"
    assert names(out.get_loop_domain()) == "iStreamIdx4{3}, iS5{( ceilDiv(i0, 3) )}, iS3{i1}"
    x = torch.randn(7, 5)
    torch.testing.assert_close(fd.execute([x])[0], x.exp())


def test_stream_split_that_shapes_the_layout_is_rejected() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1], contiguity=True)
        t1 = fd.ops.exp(t0)
        fd.add_output(t1)
    t1.outer_split(0, 3)
    t1.axis(0).parallelize(ParallelType.stream)
    chunks, rows, cols = t1.get_loop_domain()
    t1.set_allocation_domain([chunks, cols, rows])  # a blocked layout: chunk-major, then columns
    with pytest.raises(ValueError, match=r"T1: allocation domain \(iStreamIdx4\{3\}, iS3\{i1\}, .*\) holds Stream "
                                         r"split .* whose halves are not adjacent"):
        fd.execute([torch.randn(6, 4)])


def test_device_split_that_is_not_a_split_of_an_allocation_id_is_rejected() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        t1 = fd.ops.exp(t0)
        fd.add_output(t1)
    t1.set_device_mesh(DeviceMesh(range(2)))
    t1.merge(0)
    t1.outer_split(0, 2)
    t1.axis(0).parallelize(ParallelType.mesh_x)
    fusion = copy.deepcopy(fd.fusion)
    with pytest.raises(ValueError, match=r"T1: device-parallel loop ID ideviceIdx.x\d+\{2\} is not a split of an ID of "
                                         r"the allocation domain"):
        decouple_loop_and_allocation(fusion, CompileOptions())


def test_compute_at_position_keeps_the_loop_order() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        t1 = fd.ops.exp(t0)
        t2 = fd.ops.neg(t1)
        fd.add_output(t2)
    t1.reorder({0: 1})
    set_compute_at(t1, 1)
    fusion = copy.deepcopy(fd.fusion)
    decouple_loop_and_allocation(fusion, CompileOptions())
    c1 = fusion.tensors()[1]
    assert names(c1.get_loop_domain()) == "iS3{i1}, iS2{i0}"
    assert not c1.domain().allocation_frozen and not c1.has_allocation_domain(), "inlined: open to schedulers"


def boundaries(fusion: Fusion) -> list[str]:
    return [tv.short_name for tv in fusion.tensors() if can_be_segment_boundary(tv)]


def test_which_intermediates_can_be_segment_boundaries() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        t1 = fd.define_tensor([-1, -1])
        t2 = fd.ops.exp(t0)                 # pointwise, consumed by a reduction: inlined
        t3 = fd.ops.sum(t2, [1])            # reduction result: boundary
        t4 = fd.ops.broadcast(t3, [False, True])
        t5 = fd.ops.mul(t0, t4)             # pointwise into matmul: boundary
        t6 = fd.ops.matmul(t5, t1)          # ATen result: boundary
        t7 = fd.ops.segment_set(fd.ops.neg(t6))  # T7 = neg feeds segment_set: boundary
        fd.add_output(fd.ops.relu(t7))
    assert [t2.short_name, t4.short_name] == ["T2", "T4"]
    assert boundaries(fd.fusion) == ["T0", "T1", "T3", "T5", "T6", "T7", "T8", "T9"]
    after = preseg(fd.fusion)
    frozen = [tv.short_name for tv in after.tensors() if tv.domain().allocation_frozen]
    assert frozen == boundaries(after)
    open_tv = next(tv for tv in after.tensors() if tv.short_name == "T2")
    open_tv.set_allocation_domain(list(reversed(open_tv.get_logical_domain())), hint=True)  # a scheduler may


def test_finalized_allocations_reject_every_change() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1], contiguity=True, stride_order=[0, 1])
        t1 = fd.ops.sum(t0, [0])
        fd.add_output(t1)
    after = preseg(fd.fusion)
    t0c, t1c = after.inputs()[0], after.outputs()[0]
    assert isinstance(t0c, TensorView) and isinstance(t1c, TensorView)
    for tv in (t0c, t1c):
        with pytest.raises(ValueError, match=rf"{tv.short_name}: allocation domain is final"):
            tv.set_allocation_domain(tv.get_logical_domain())
        with pytest.raises(ValueError, match=rf"{tv.short_name}: allocation domain is final and cannot be cleared"):
            tv.clear_allocation_domain()
    assert not t0.domain().allocation_frozen, "the user's definition is not frozen"


def test_the_pipeline_is_idempotent() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1, -1, -1], contiguity=True, stride_order=[3, 0, 2, 1])
        t1 = fd.ops.relu(t0)
        fd.add_output(t1)
        fd.add_output(fd.ops.sum(t1, [2]), stride_order=[0, 1, 2])
    t1.axis(2).parallelize(ParallelType.stream)
    once = preseg(fd.fusion)
    text = once.transforms_string()
    run_preseg_passes(once, CompileOptions())
    assert once.transforms_string() == text
