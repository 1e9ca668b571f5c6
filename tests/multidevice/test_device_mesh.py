"""DeviceMesh, launcher environment parsing and sharding helpers (single process, no communication)."""

from __future__ import annotations

import pytest
import torch

from pyfuser import DataType, FusionDefinition, ParallelType
from pyfuser.comm.communicator import Communicator
from pyfuser.ir.analysis.sharding import local_sizes, local_static_size
from pyfuser.multidevice import DeviceMesh, shard_tensor, sharding_of
from pyfuser.options import LaunchInfo

X, Y = ParallelType.mesh_x, ParallelType.mesh_y


@pytest.mark.parametrize("ranks", [[0, 1, 2, 3], range(4), torch.arange(4), (0, 1, 2, 3)])
def test_mesh_from_list_range_or_tensor(ranks: object) -> None:
    mesh = DeviceMesh(ranks)  # type: ignore[arg-type]
    assert (mesh.size, mesh.shape, str(mesh)) == (4, (4,), "DeviceMesh{0 1 2 3}")
    assert 3 in mesh and 4 not in mesh
    assert mesh == DeviceMesh([0, 1, 2, 3]) and hash(mesh) == hash(DeviceMesh(range(4)))


def test_2d_mesh_axes_teams_and_indices() -> None:
    mesh = DeviceMesh(torch.arange(6).view(2, 3))
    assert (mesh.size, mesh.shape, str(mesh)) == (6, (2, 3), "DeviceMesh{{0 1 2} {3 4 5}}")
    assert mesh.size_of(X) == 3 and mesh.size_of(Y) == 2  # mesh_x binds the innermost axis
    assert mesh.team(4, X) == (3, 4, 5) and mesh.team(4, Y) == (1, 4)
    assert mesh.index(4, X) == 1 and mesh.index(4, Y) == 1
    assert mesh.parallel_types() == [Y, X]
    with pytest.raises(ValueError, match=r"deviceIdx\.z.*at least 3 dimensions"):
        mesh.size_of(ParallelType.mesh_z)


@pytest.mark.parametrize("ranks, message", [([0, 0], "twice"), ([-1, 0], "non-negative"), ([], "at least one"),
                                             (torch.zeros(1, 1, 1, 1, dtype=torch.int64), "at most 3")])
def test_bad_meshes(ranks: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DeviceMesh(ranks)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="integers"):
        DeviceMesh(torch.tensor([0.0, 1.0]))


def test_mesh_shard_tensor() -> None:
    full = torch.arange(12.0).view(4, 3)
    mesh = DeviceMesh([2, 0])
    torch.testing.assert_close(mesh.shard_tensor(full, 0, rank=0), full[2:])  # rank 0 holds the second shard
    with pytest.raises(ValueError, match="axis 1 has size 3, which is not divisible by the 2 ranks"):
        mesh.shard_tensor(full, 1, rank=0)
    with pytest.raises(ValueError, match="rank 1 is not in DeviceMesh"):
        mesh.shard_tensor(full, 0, rank=1)


def test_launch_info_from_torchrun_and_mpirun() -> None:
    torchrun = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "node0",
                "MASTER_PORT": "1234"}
    assert LaunchInfo.from_env(torchrun) == LaunchInfo(3, 8, 1, 2, "node0", 1234)
    mpirun = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
              "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    assert LaunchInfo.from_env(mpirun) == LaunchInfo(1, 4, 1, 4, "127.0.0.1", 29500)
    assert LaunchInfo.from_env({}) == LaunchInfo(0, 1, 0, 1, "127.0.0.1", 29500)
    with pytest.raises(ValueError, match="rank 4 is outside a world of size 4"):
        LaunchInfo.from_env({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(ValueError, match="must be an integer"):
        LaunchInfo.from_env({"RANK": "x"})


def test_sharding_of_split_and_direct_axes() -> None:
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, 8, -1])
        b = fd.define_tensor([-1, 4])
    mesh = DeviceMesh(range(4))
    a.set_device_mesh(mesh)
    b.set_device_mesh(mesh)
    a.outer_split(1, 4)
    a.axis(1).parallelize(X)
    b.axis(1).parallelize(X)  # extent 4 == mesh size: one element per rank
    assert dict(sharding_of(a).axes) == {1: X} and dict(sharding_of(b).axes) == {1: X}
    assert local_sizes(a, {"i0": 2, "i1": 5}) == [2, 2, 5]
    full = torch.arange(2 * 8 * 5.0).view(2, 8, 5)
    torch.testing.assert_close(shard_tensor(full, a, rank=3), full[:, 6:])
    torch.testing.assert_close(shard_tensor(torch.arange(12.0).view(3, 4), b, rank=2), torch.tensor([[2.0], [6.0],
                                                                                                   [10.0]]))


@pytest.mark.parametrize("schedule, message", [
    (lambda t: (t.split(0, 4), t.axis(1).parallelize(X)), "not a logical ID nor the outer ID of a split"),
    (lambda t: (t.split(0, 4), t.axis(0).parallelize(X)), r"inner_split by 4 of extent 8 gives 2 shards, but the mesh "
                                                           r"has 4 ranks along deviceIdx.x \(the extent must be 4 \* 4\)"),
    (lambda t: (t.outer_split(0, 2), t.axis(0).parallelize(X)), "split factor 2 must equal the mesh size 4"),
    (lambda t: t.axis(1).parallelize(X), "extent must equal the mesh size 4 along deviceIdx.x; got 6"),
])
def test_bad_shardings_name_the_tensor_and_axis(schedule: object, message: str) -> None:
    with FusionDefinition() as fd:
        t = fd.define_tensor([8, 6])
    t.set_device_mesh(DeviceMesh(range(4)))
    schedule(t)  # type: ignore[operator]
    with pytest.raises(ValueError, match=message) as info:
        sharding_of(t)
    assert "T0" in str(info.value)


def test_sharding_through_an_inner_split() -> None:
    """nvFuser's ``split(axis, k)`` with the outer ID on the mesh: contiguous shards of k elements."""
    with FusionDefinition() as fd:
        static = fd.define_tensor([8, 6])
        symbolic = fd.define_tensor([-1, 6])
    mesh = DeviceMesh(range(4))
    for t in (static, symbolic):
        t.set_device_mesh(mesh)
        t.split(0, 2)
        t.axis(0).parallelize(X)
        assert dict(sharding_of(t).axes) == {0: X}
    assert local_sizes(static, {}) == [2, 6]
    assert local_static_size(symbolic, 0) == 2, "the factor is the shard size, also for a symbolic extent"
    full = torch.arange(48.0).view(8, 6)
    torch.testing.assert_close(shard_tensor(full, static, rank=1), full[2:4])
    with FusionDefinition() as fd:
        t = fd.define_tensor([8, 6])
    t.set_device_mesh(mesh)
    t.split(0, fd.define_scalar(dtype=DataType.Int))
    t.axis(0).parallelize(X)
    with pytest.raises(ValueError, match=r"T0 axis 0: an inner split sharded on deviceIdx.x needs a constant factor"):
        sharding_of(t)


def test_parallelized_without_mesh() -> None:
    with FusionDefinition() as fd:
        t = fd.define_tensor([8, 6])
    t.axis(0).parallelize(X)
    with pytest.raises(ValueError, match=r"T0 .* has no device mesh"):
        sharding_of(t)


def test_communicator_backend_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    info = LaunchInfo(0, 2, 0, 2, "127.0.0.1", 29500)
    monkeypatch.setenv("PYFUSER_DIST_BACKEND", "gloo")
    monkeypatch.setenv("PYFUSER_DIST_TIMEOUT", "12")
    comm = Communicator(info)
    assert comm.backend == "gloo" and comm.device() == torch.device("cpu")
    assert comm.timeout.total_seconds() == 12
    assert (comm.rank(), comm.size(), comm.local_rank(), comm.local_size()) == (0, 2, 0, 2)
    with pytest.raises(ValueError, match="backend must be 'nccl' or 'gloo', got 'mpi'"):
        Communicator(info, backend="mpi")
    with pytest.raises(ValueError, match=r"team \[0, 5\] names ranks outside the world of 2 processes"):
        comm.group([0, 5])


def _vector(mesh: DeviceMesh, schedule: str) -> FusionDefinition:
    with FusionDefinition() as fd:
        tv = fd.define_tensor([-1])
        fd.add_output(tv)
    tv.set_device_mesh(mesh)
    if schedule == "inner":  # [n/2, 2], the inner ID on the mesh: ranks take every other element
        tv.inner_split(0, 2)
        tv.axis(1).parallelize(ParallelType.mesh_x)
    elif schedule == "nested":  # [2, n/2] -> [2, 2, n/4], the middle ID on the mesh
        tv.outer_split(0, 2)
        tv.outer_split(1, 2)
        tv.axis(1).parallelize(ParallelType.mesh_x)
    else:  # 2-D mesh [2, 2]: [n/6, 6] -> [2, n/12, 6] -> [2, n/12, 2, 3], mesh_y then mesh_x
        tv.inner_split(0, 6)
        tv.outer_split(0, 2)
        tv.axis(0).parallelize(ParallelType.mesh_y)
        tv.outer_split(2, 2)
        tv.axis(2).parallelize(ParallelType.mesh_x)
    return fd


@pytest.mark.parametrize("schedule", ["inner", "nested", "two_mesh_axes"])
def test_shard_tensor_follows_a_chain_of_splits(schedule: str) -> None:
    """A device ID anywhere in a chain of splits of one axis (nvFuser's ``shard_tensor`` cases): the axis
    viewed as the chain's leaves, each device leaf at the rank's mesh position, the rest flattened back;
    a tensor the chain does not divide is a clear error."""
    mesh = DeviceMesh(torch.arange(4).reshape(2, 2)) if schedule == "two_mesh_axes" else DeviceMesh(range(2))
    tv = _vector(mesh, schedule).fusion.inputs()[0]
    full = torch.arange(24.0)
    for rank in mesh.ranks:
        got = shard_tensor(full, tv, rank=rank)
        if schedule == "inner":
            want = full.view(12, 2)[:, rank]
        elif schedule == "nested":
            want = full.view(2, 2, 6)[:, rank].flatten()
        else:
            y, x = divmod(rank, 2)
            want = full.view(2, 2, 2, 3)[y, :, x].flatten()
        torch.testing.assert_close(got, want)
        assert got.is_contiguous()
    with pytest.raises(ValueError, match=r"T0 axis 0 has extent 13 here, which its split by (2|6) does not divide"):
        shard_tensor(torch.arange(13.0), tv, rank=0)
