"""DTensor interop: run a definition on ``torch.distributed.tensor.DTensor`` inputs.

``execute_with_dtensors(fd, dtensors)`` (nvFuser's) runs a fusion whose inputs the user already placed
and sharded as the DTensors are (checked: a mismatch is a ValueError naming the tensor), on their local
shards, and wraps the local outputs into DTensors by the outputs' compiled shardings.

``DTensorFusion(define)`` takes a function that defines a fusion with global shapes (``define(fd)``
declares inputs, ops and outputs). Called with DTensors, it places every input on the DTensor's mesh and
shards it as its placements say -- ``Shard(d)`` is ``outer_split(d, mesh size)`` parallelized on the mesh
axis (``mesh_x`` for the last one), ``Replicate()`` is nothing -- propagates shardings to the outputs, runs
on the local shards and wraps the local outputs back into DTensors. One definition is built per
combination of input placements.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

from pyfuser.frontend import FusionDefinition
from pyfuser.ir.analysis.sharding import sharding_of, tensor_dim
from pyfuser.ir.device_mesh import DeviceMesh
from pyfuser.ir.tensor_view import TensorView
from pyfuser.preseg.propagate_shardings import propagate_shardings, shard

PlacementKey = tuple[tuple[str, ...], ...]


def execute_with_dtensors(fd: FusionDefinition, in_dtensors: Sequence[DTensor]) -> list[DTensor]:
    """Execute ``fd`` on DTensor inputs; each fusion input must be on the DTensor's mesh and sharded as
    its placements say (``Shard(d)``: logical dim d sharded on the mesh axis's device parallel type)."""
    inputs = list(in_dtensors)
    for k, t in enumerate(inputs):
        if not isinstance(t, DTensor):
            raise TypeError(f"execute_with_dtensors: input {k} must be a DTensor, got {type(t).__name__}")
    if not inputs:
        raise ValueError("execute_with_dtensors needs at least one DTensor input")
    torch_mesh = inputs[0].device_mesh
    names = torch_mesh.mesh_dim_names
    for k, t in enumerate(inputs):
        if t.device_mesh.mesh_dim_names != names or not torch.equal(t.device_mesh.mesh, torch_mesh.mesh):
            raise ValueError(f"execute_with_dtensors: input {k} is on {t.device_mesh} but input 0 is on {torch_mesh}; "
                             "all DTensor inputs must share one device mesh")
    tvs = fd.fusion.inputs()
    if len(tvs) != len(inputs):
        raise ValueError(f"execute_with_dtensors: the fusion has {len(tvs)} inputs but {len(inputs)} DTensors were "
                         "passed")
    mesh = DeviceMesh(torch_mesh.mesh)
    for tv, t in zip(tvs, inputs, strict=True):
        if not isinstance(tv, TensorView):
            raise TypeError(f"execute_with_dtensors: fusion input {tv} is a scalar; only tensor inputs take DTensors")
        _check_placed(tv, t, mesh)
    outputs = fd.execute([t.to_local() for t in inputs])
    return [_wrap(local, tv, torch_mesh) for local, tv in zip(outputs, fd.fec.compiled_outputs(), strict=True)]


def _check_placed(tv: TensorView, t: DTensor, mesh: DeviceMesh) -> None:
    """``tv`` must be on ``mesh`` and sharded as ``t``'s placements: else its local shard is read wrongly."""
    if tv.device_mesh != mesh:
        raise ValueError(f"execute_with_dtensors: {tv.short_name} is on {tv.device_mesh} but its DTensor is on "
                         f"{mesh}; call set_device_mesh with the DTensor's mesh")
    want = _axes_of(tv, t.placements, mesh)
    got = dict(sharding_of(tv).axes)
    if got != want:
        def show(axes: dict[int, Any]) -> str:
            return ", ".join(f"axis {a} on {p}" for a, p in sorted(axes.items())) or "replicated"
        raise ValueError(f"execute_with_dtensors: {tv.short_name} is sharded [{show(got)}] but its DTensor's placements "
                         f"{tuple(t.placements)} mean [{show(want)}]")


class DTensorFusion:
    def __init__(self, define: Callable[[FusionDefinition], None]) -> None:
        self.define = define
        self._built: dict[tuple[Any, ...], FusionDefinition] = {}

    def __call__(self, *inputs: DTensor) -> list[DTensor]:
        for k, t in enumerate(inputs):
            if not isinstance(t, DTensor):
                raise TypeError(f"DTensorFusion input {k} must be a DTensor, got {type(t).__name__}")
        torch_mesh = inputs[0].device_mesh
        for k, t in enumerate(inputs):
            if t.device_mesh != torch_mesh:
                raise ValueError(f"DTensorFusion input {k} is on {t.device_mesh} but input 0 is on {torch_mesh}; "
                                 "all inputs must share one device mesh")
        for k, t in enumerate(inputs):  # torch shards unevenly; pyfuser's shards are equal (global = local * d)
            for mesh_axis, placement in enumerate(t.placements):
                parts = torch_mesh.size(mesh_axis)
                if isinstance(placement, Shard) and t.shape[placement.dim] % parts:
                    raise ValueError(f"DTensorFusion input {k}: dim {placement.dim % t.dim()} has extent "
                                     f"{t.shape[placement.dim]}, which is not divisible by the {parts} ranks of mesh "
                                     f"axis {mesh_axis} it is sharded over (Shard({placement.dim})); pyfuser needs "
                                     "equal shards: pad the tensor or replicate that dim")
        key = (tuple(tuple(repr(p) for p in t.placements) for t in inputs),
               tuple((t.dtype, t.dim()) for t in inputs))
        fd = self._built.get(key)
        if fd is None:
            fd = self._build(inputs)
            self._built[key] = fd
        outputs = fd.execute([t.to_local() for t in inputs])
        # cast: FusionDefinition.add_output makes every output a tensor (a scalar one a 0-dim tensor)
        tvs = cast(list[TensorView], fd.fusion.outputs())
        return [_wrap(local, tv, torch_mesh) for local, tv in zip(outputs, tvs, strict=True)]

    def _build(self, inputs: tuple[DTensor, ...]) -> FusionDefinition:
        fd = FusionDefinition()
        self.define(fd)
        tvs = [v for v in fd.fusion.inputs() if isinstance(v, TensorView)]
        if len(tvs) != len(inputs):
            raise ValueError(f"the definition declares {len(tvs)} tensor inputs but {len(inputs)} DTensors were "
                             "passed")
        mesh = DeviceMesh(inputs[0].device_mesh.mesh)
        for tv, t in zip(tvs, inputs, strict=True):
            tv.set_device_mesh(mesh)
            shard(tv, _axes_of(tv, t.placements, mesh))
        propagate_shardings(fd.fusion)  # outputs' shardings decide the returned placements
        return fd


def _axes_of(tv: TensorView, placements: tuple[Placement, ...], mesh: DeviceMesh) -> dict[int, Any]:
    ptypes = mesh.parallel_types()  # outermost mesh axis first
    axes: dict[int, Any] = {}
    logical = [p for p, i in enumerate(tv.get_logical_domain()) if not i.is_reduction()]
    for mesh_axis, placement in enumerate(placements):
        if isinstance(placement, Shard):
            axis = logical[placement.dim % tv.ndim]
            if axis in axes:
                raise ValueError(f"{tv.short_name} axis {axis} is sharded over two mesh axes; one is supported")
            axes[axis] = ptypes[mesh_axis]
        elif not isinstance(placement, Replicate):
            raise ValueError(f"{tv.short_name}: placement {placement} on mesh axis {mesh_axis} is not supported "
                             "(only Shard(d) and Replicate())")
    return axes


def _wrap(local: torch.Tensor, tv: TensorView, torch_mesh: Any) -> DTensor:
    sharding = sharding_of(tv)
    mesh = sharding.mesh
    placements: list[Placement] = [Replicate() for _ in range(torch_mesh.ndim)]
    shape = list(local.shape)
    if mesh is not None:
        for axis, ptype in sharding.axes.items():
            if tv.get_logical_domain()[axis].is_reduction():
                continue
            dim = tensor_dim(tv, axis)
            placements[mesh.axis_of(ptype)] = Shard(dim)
            shape[dim] *= mesh.size_of(ptype)
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(local, torch_mesh, placements, run_check=False, shape=torch.Size(shape), stride=stride)
