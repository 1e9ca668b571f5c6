"""Pre-segmentation pass: give every tensor of a multi-device fusion a mesh and a sharding.

Meshes flow forward from producers to consumers, then backward to unplaced inputs. Shardings flow
forward through each expr's ``shard_map``: an output axis is sharded on ``P`` when the input axis that
maps to it is (a reshape maps the outermost axis of each group it regroups where both extents are multiples
of the ranks: the reshape of a shard is the shard of the reshape, and it runs on the shards). For
linear and matmul the weight (``b``) goes first, as nvFuser does, so a column-parallel weight decides the
output's sharding and the activation is gathered to match; other operands then fill the device parallel
types still unused (data parallelism over a batch axis, say). A reduced axis does not propagate: the
result of reducing a sharded axis is replicated, and ``decompose_resharding`` inserts the communication
that makes it so. Then shardings flow backward, as nvFuser's pass does, from each expr's most sharded
output to its intermediate inputs, on the device types they do not use yet (``_back_propagated_axes``).

User annotations win: a tensor the user placed on a mesh (``set_device_mesh``; no device-parallel ID
then means replicated) or whose loop domain the user transformed or parallelized keeps its sharding.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyfuser.ir.analysis.sharding import is_multidevice, shard_map, sharding_of
from pyfuser.ir.base import Expr
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import ParallelType
from pyfuser.ir.ops import LinearOp, MatmulOp
from pyfuser.ir.tensor_view import TensorView, user_scheduled
from pyfuser.options import CompileOptions


def propagate_shardings(fusion: Fusion, options: CompileOptions | None = None) -> None:
    if not is_multidevice(fusion):
        return
    exprs = fusion.exprs()
    annotated = {tv for tv in fusion.tensors() if tv.device_mesh is not None or user_scheduled(tv)}
    _propagate_meshes(exprs)
    for tv in fusion.tensors():
        if tv.device_mesh is None:
            raise ValueError(f"{tv.short_name} is not connected to any tensor with a device mesh; give it one with "
                             "set_device_mesh")
        sharding_of(tv)  # validate every annotation once, with a clear message
    for expr in exprs:
        for out in expr.tensor_outputs:
            if out not in annotated:
                shard(out, _propagated_axes(expr, out))
    for expr in reversed(exprs):
        for inp in dict.fromkeys(expr.tensor_inputs):  # tensors hash by identity
            if inp not in annotated and not inp.is_fusion_input:
                shard(inp, _back_propagated_axes(expr, inp))


def _propagate_meshes(exprs: list[Expr]) -> None:
    for expr in exprs:
        placed = [t for t in _reference_order(expr) if t.device_mesh is not None]
        for out in expr.tensor_outputs:
            if out.device_mesh is None and placed:
                out.set_device_mesh(placed[0].device_mesh)
    for expr in reversed(exprs):
        placed = [t for t in expr.tensor_outputs if t.device_mesh is not None]
        for inp in expr.tensor_inputs:
            if inp.device_mesh is None and placed:
                inp.set_device_mesh(placed[0].device_mesh)


def _reference_order(expr: Expr) -> list[TensorView]:
    """Inputs in the order their shardings are followed: the weight first for linear / matmul."""
    inputs = expr.tensor_inputs
    if isinstance(expr, (LinearOp, MatmulOp)):
        return [inputs[1], inputs[0], *inputs[2:]]
    return inputs


def _propagated_axes(expr: Expr, out: TensorView) -> dict[int, ParallelType]:
    out_pos = {id(i): p for p, i in enumerate(out.get_logical_domain())}
    out_ids = out.get_logical_domain()
    axes: dict[int, ParallelType] = {}
    for inp in _reference_order(expr):
        if inp.device_mesh != out.device_mesh:
            continue
        in_ids = inp.get_logical_domain()
        for axis, ptype in sharding_of(inp).axes.items():
            target = shard_map(expr, inp, ptype, out).get(in_ids[axis])
            if target is None or ptype in axes.values():
                continue
            pos = out_pos[id(target)]
            if pos in axes or out_ids[pos].is_reduction() or out_ids[pos].is_broadcast():
                continue
            axes[pos] = ptype
    return axes


def _back_propagated_axes(expr: Expr, inp: TensorView) -> dict[int, ParallelType]:
    """Axes of ``inp`` (an intermediate nothing annotated) to shard like the output of ``expr`` with the
    most sharded axes maps them, on device types ``inp`` does not use on an iteration axis yet (nvFuser's
    back-propagation: a residual add's sequence sharding reaches the row-parallel linear before it, whose
    partial sums then reduce-scatter instead of all-reduce). Reduced output axes map to nothing."""
    outputs = sorted(expr.tensor_outputs, key=lambda o: -len(sharding_of(o).axes))
    if not outputs or outputs[0].device_mesh != inp.device_mesh:
        return {}
    out = outputs[0]
    in_ids = inp.get_logical_domain()
    in_pos = {id(i): p for p, i in enumerate(in_ids)}
    used = {p for a, p in sharding_of(inp).axes.items() if not in_ids[a].is_reduction()}
    taken = set(sharding_of(inp).axes)
    out_ids = out.get_logical_domain()
    axes: dict[int, ParallelType] = {}
    for axis, ptype in sharding_of(out).axes.items():
        inverse = {id(c): p for p, c in shard_map(expr, inp, ptype, out).items()}
        source = inverse.get(id(out_ids[axis]))
        if source is None or ptype in used or out_ids[axis].is_reduction():
            continue
        pos = in_pos[id(source)]
        if pos in taken or pos in axes or in_ids[pos].is_reduction() or in_ids[pos].is_broadcast():
            continue
        axes[pos] = ptype
        used.add(ptype)
    return axes


def shard(tv: TensorView, axes: Mapping[int, ParallelType]) -> None:
    """Make ``tv`` sharded on ``axes`` (logical positions) by outer-splitting its loop IDs by the mesh size.

    ``tv`` must have a mesh and an unparallelized loop domain equal to its logical domain on those axes.
    """
    mesh = tv.device_mesh
    if mesh is None:
        raise ValueError(f"{tv.short_name} has no device mesh to shard over")
    logical = tv.get_logical_domain()
    for axis, ptype in sorted(axes.items(), reverse=True):
        target = logical[axis]
        pos = tv.loop_position(target)
        if pos < 0:
            raise ValueError(f"{tv.short_name} axis {axis} ({target}) is not in the loop domain; cannot shard it")
        size = mesh.size_of(ptype)
        if target.extent.value == size and not target.is_reduction():
            target.parallelize(ptype)
        else:
            tv.outer_split(pos, size)
            tv.axis(pos).parallelize(ptype)
