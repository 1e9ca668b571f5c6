"""Pre-segmentation pass: split every expr that both communicates and computes.

After this pass each expr is either *local* -- all its tensors on one mesh, each output axis sharded
exactly like the input axes that map to it -- or a *communication*: a ``set`` whose input and output
differ in mesh or sharding. The plan for one expr ``out = op(ins)``:

1. Partial reductions. When every operand axis contracted into one reduction ID of ``out`` is sharded on
   the same ``P`` (or unsharded, and then sliced locally), the op runs on the shards and produces partial
   results: a copy of ``out`` whose reduction ID is sharded on ``P``. A following ``set`` combines them
   (Allreduce, or ReduceScatter when ``out`` is sharded on ``P`` along another axis). This is the
   row-parallel linear.
2. Every input whose mesh or sharding differs from what the op needs to run locally gets a resharding
   ``set`` in front (Allgather for sequence parallelism, a local slice when only the consumer is sharded,
   Broadcast / SendRecv / Scatter between meshes).
3. Ops that read an axis' global extent (full, iota, expand of a broadcast axis, the axes a slice, pad or
   cat resizes, a reshape's axes other than the ones ``shard_map`` pairs, other ops that are not chunkable)
   cannot produce a shard of that axis: they compute it whole and a local slice follows. A reshape that
   runs on shards is told its output's shard factors, so it reshapes to the local sizes.

When a consumer loops over a stream-parallel ID, the inserted ``set`` is stream-parallelized on the mapped
axis too, so stream lowering puts the communication of chunk ``i`` in the same host loop as the compute
of chunk ``i``: the all-gather + GEMM pipeline of docs/allgather_gemm.md, or, when the loop runs over the sharded axis
itself ("shard outermost"), a broadcast of rank ``i``'s shard in iteration ``i``. Likewise partial results
are chunked like the stream-parallel output they reduce into (GEMM + Allreduce per chunk).
"""

from __future__ import annotations

from collections.abc import Mapping

from pyfuser.ir.analysis.sharding import is_multidevice, shard_factors, shard_map, sharding_of
from pyfuser.ir.analysis.stream_axes import walk_outer_splits
from pyfuser.ir.base import Expr
from pyfuser.ir.device_mesh import DeviceMesh
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import IterDomain, IterType, ParallelType
from pyfuser.ir.ops import (
    BinaryOp,
    BinaryOpType,
    BroadcastOp,
    ExpandOp,
    FullOp,
    IotaOp,
    LinearOp,
    LoadStoreOp,
    MatmulOp,
    ReductionOp,
    ReshapeOp,
)
from pyfuser.ir.tensor_domain import TensorDomain
from pyfuser.ir.tensor_view import TensorView, new_like
from pyfuser.options import CompileOptions
from pyfuser.preseg.propagate_shardings import shard


def decompose_resharding(fusion: Fusion, options: CompileOptions | None = None) -> None:
    if not is_multidevice(fusion):
        return
    for expr in fusion.exprs():
        if isinstance(expr, LoadStoreOp) or not expr.tensor_outputs:
            continue
        _decompose(expr)


def _decompose(expr: Expr) -> None:
    out = expr.tensor_outputs[0]
    out_axes = dict(sharding_of(out).axes)
    partial, mesh = _partial_axes(expr, out)
    if partial and isinstance(expr, LinearOp) and expr.has_bias:
        expr, bias_add = _detach_bias(expr)
        _decompose(expr)
        _decompose(bias_add)
        return
    if mesh == out.device_mesh:
        global_axes = _global_extent_axes(expr, out_axes)
        compute_axes = {a: p for a, p in out_axes.items() if p not in partial.values() and a not in global_axes}
        compute_axes |= partial
    else:  # partial results stay on the operands' mesh; the communication moves them to out's
        compute_axes = dict(partial)
    for inp in _distinct(expr.tensor_inputs):
        required = _required_input_axes(expr, inp, out, compute_axes)
        if inp.device_mesh == mesh and _complete_axes(inp) == required:
            continue
        expr.replace_input(inp, _resharded_copy(expr, inp, out, mesh, required))
    if compute_axes != out_axes or mesh != out.device_mesh:
        for old in expr.tensor_outputs:
            new = _partial_copy(old, mesh, compute_axes)
            if partial:
                _copy_stream_schedule(old, new)  # chunk i's partial sums are reduced while chunk i+1 computes
            expr.replace_output(old, new)
            LoadStoreOp(expr.fusion, old, new)
    if isinstance(expr, ReshapeOp):
        expr.run_on_shards(shard_factors(expr.output))


def _complete_axes(tv: TensorView) -> dict[int, ParallelType]:
    """``tv``'s sharded axes, less a sharded reduction ID whose device type also shards an iteration ID:
    the output of a reduce-scatter, whose sums are complete."""
    logical = tv.get_logical_domain()
    axes = dict(sharding_of(tv).axes)
    iteration_types = {p for a, p in axes.items() if not logical[a].is_reduction()}
    return {a: p for a, p in axes.items() if not (logical[a].is_reduction() and p in iteration_types)}


def _detach_bias(linear: LinearOp) -> tuple[LinearOp, BinaryOp]:
    """``out = linear(x, w, b)`` -> ``y = linear(x, w)``, ``out = y + broadcast(b)``: with partial sums
    every rank would add the bias, so it is added once, after the reduction."""
    fusion = linear.fusion
    x, w, bias = (linear.tensor_input(k) for k in range(3))
    out = linear.output
    for inp in (x, w, bias):
        inp.uses[:] = [e for e in inp.uses if e is not linear]
    reduced = _partial_copy(out, out.device_mesh, dict(sharding_of(out).axes))
    _copy_stream_schedule(out, reduced)
    bare = LinearOp(fusion, reduced, x, w, None)
    rank = len(reduced.get_logical_domain(no_reductions=True))
    # bias [n] or [*wb, n] (a weight of rank >= 3): it broadcasts over the input's axes before n
    own = bias.get_logical_domain(no_reductions=True)
    flags = [False] * (len(own) - 1) + [True] * (rank - len(own)) + [False]
    bias_ids = [i.clone() for i in own[:-1]] + [IterDomain(fusion, 1, IterType.Broadcast) for _ in range(rank - len(own))]
    bias_ids.append(own[-1].clone())
    broadcast_bias = TensorView(fusion, TensorDomain(bias_ids), bias.dtype)
    broadcast_bias.set_device_mesh(out.device_mesh)
    BroadcastOp(fusion, broadcast_bias, bias, flags)
    # The bias operand first: its broadcast is then ordered before the linear, so a stream loop over out
    # holds the linear, its communication and the add together.
    return bare, BinaryOp(fusion, BinaryOpType.add, out, broadcast_bias, reduced)


def _global_extent_axes(expr: Expr, out_axes: Mapping[int, ParallelType]) -> set[int]:
    """Output axes whose extent the op reads from the bound (global) sizes: it cannot produce a shard of
    them, so it runs replicated there and a local slice follows. ``out_axes``: the output's sharding (a
    reshape computes a shard of an axis only where ``shard_map`` pairs it for that axis's mesh size)."""
    out = expr.tensor_outputs[0]
    every = set(range(len(out.get_logical_domain())))
    if isinstance(expr, (FullOp, IotaOp)):
        return every
    if isinstance(expr, ExpandOp):
        inp = expr.tensor_input(0).get_logical_domain(no_reductions=True)
        return {d for d, (i, o) in enumerate(zip(inp, out.get_logical_domain(), strict=False))
                if i.is_broadcast() and not o.is_broadcast()}
    if isinstance(expr, ReshapeOp):
        ids = out.get_logical_domain()
        paired = {a for a, p in out_axes.items() if ids[a] in shard_map(expr, expr.tensor_input(0), p).values()}
        return every - paired
    return every - expr.shardable_axes()


def _supports_partial(expr: Expr) -> bool:
    if isinstance(expr, (LinearOp, MatmulOp)):
        return True
    return isinstance(expr, ReductionOp)  # every reduction kind has a combine op


def _partial_axes(expr: Expr, out: TensorView) -> tuple[dict[int, ParallelType], DeviceMesh | None]:
    """Reduction positions of ``out`` whose contracted operand axes are sharded on one device type (the
    others unsharded), and the mesh the partial results are computed on: the sharded operands' mesh,
    else ``out``'s."""
    if not _supports_partial(expr):
        return {}, out.device_mesh
    partial: dict[int, ParallelType] = {}
    meshes: set[DeviceMesh | None] = set()
    for pos, rid in enumerate(out.get_logical_domain()):
        if not rid.is_reduction():
            continue
        sources = [(inp, sharding_of(inp).axes.get(axis)) for inp in expr.tensor_inputs
                   for axis, pid in enumerate(inp.get_logical_domain()) if expr.logical_map(inp).get(pid) is rid]
        sharded = {(inp.device_mesh, ptype) for inp, ptype in sources if ptype is not None}
        requested = sharding_of(out).axes.get(pos)
        if not sharded and requested is not None:  # out asks for partial sums of locally sliced operands
            sharded = {(out.device_mesh, requested)}
        if len(sharded) == 1:
            ((source_mesh, ptype),) = sharded
            if ptype not in partial.values():
                partial[pos] = ptype
                meshes.add(source_mesh)
    if len(meshes) != 1:
        return {}, out.device_mesh
    return partial, meshes.pop()


def _required_input_axes(expr: Expr, inp: TensorView, out: TensorView,
                         compute_axes: dict[int, ParallelType]) -> dict[int, ParallelType]:
    """Sharding ``inp`` needs so that ``expr`` runs on local shards and produces ``compute_axes``.
    An input of a multi-output expr may map to another output than ``out`` (sdpa's backward: ``k`` to
    its gradient); outputs of one expr share their leading axes, so its position there counts."""
    out_pos = {id(i): p for o in reversed(expr.tensor_outputs) for p, i in enumerate(o.get_logical_domain())}
    out_pos |= {id(i): p for p, i in enumerate(out.get_logical_domain())}
    required: dict[int, ParallelType] = {}
    for ptype in dict.fromkeys(compute_axes.values()):
        mapping = shard_map(expr, inp, ptype)
        for axis, pid in enumerate(inp.get_logical_domain()):
            target = mapping.get(pid)
            if target is not None and not pid.is_broadcast() and compute_axes.get(out_pos[id(target)]) is ptype:
                required[axis] = ptype
    return dict(sorted(required.items()))


def _resharded_copy(expr: Expr, inp: TensorView, out: TensorView, mesh: DeviceMesh | None,
                    axes: dict[int, ParallelType]) -> TensorView:
    """``copy = set(inp)`` on ``mesh``, sharded on ``axes`` and stream-parallel where ``out`` is. On one
    mesh, a change along several device parallel types is a chain of sets, one type each: local slices
    first (less to move), then all-to-alls, then all-gathers."""
    for step in _one_type_at_a_time(inp, mesh, axes):
        inp = _plain_copy(inp, mesh, step)
    copy = new_like(inp)
    copy.set_device_mesh(mesh)
    shard(copy, axes)
    stream_axis = _mapped_stream_axis(expr, inp, out)
    if stream_axis is not None and stream_axis not in axes and _chunkable(inp, stream_axis):
        copy.get_logical_domain()[stream_axis].parallelize(ParallelType.stream)
    LoadStoreOp(inp.fusion, copy, inp)
    return copy


def _one_type_at_a_time(inp: TensorView, mesh: DeviceMesh | None,
                        axes: dict[int, ParallelType]) -> list[dict[int, ParallelType]]:
    """The shardings between ``inp``'s and ``axes`` (the last excluded), each differing from the one
    before along one device parallel type; none when at most one type changes or the mesh does."""
    current = _complete_axes(inp)
    if inp.device_mesh != mesh or any(inp.get_logical_domain()[a].is_reduction() for a in current):
        return []
    have = {p: a for a, p in current.items()}
    want = {p: a for a, p in axes.items()}
    moved = [p for p in dict.fromkeys((*have, *want)) if have.get(p) != want.get(p)]
    moved.sort(key=lambda p: 0 if p not in have else (1 if p in want else 2))
    steps = []
    for ptype in moved[:-1]:
        current = {a: p for a, p in current.items() if p is not ptype}
        if ptype in want:
            current[want[ptype]] = ptype
        steps.append(dict(current))
    return steps


def _plain_copy(inp: TensorView, mesh: DeviceMesh | None, axes: dict[int, ParallelType]) -> TensorView:
    """``set(inp)`` on ``mesh`` sharded on ``axes``: one step of a chain (no stream loop of its own)."""
    copy = new_like(inp)
    copy.set_device_mesh(mesh)
    shard(copy, axes)
    LoadStoreOp(inp.fusion, copy, inp)
    return copy


def _chunkable(inp: TensorView, axis: int) -> bool:
    """A stream loop can take ``inp``'s ``axis`` chunk by chunk: it is not sharded, or it is sharded one
    element per rank (iteration ``i`` then broadcasts rank ``i``'s shard)."""
    return axis not in sharding_of(inp).axes or inp.get_logical_domain()[axis].is_device_dim


def _mapped_stream_axis(expr: Expr, inp: TensorView, out: TensorView) -> int | None:
    stream = next((i for i in out.get_loop_domain() if i.is_stream), None)
    if stream is None or stream not in out.get_logical_domain():
        return None
    mapping = expr.logical_map(inp)
    return next((axis for axis, pid in enumerate(inp.get_logical_domain())
                 if not pid.is_reduction() and mapping.get(pid) is stream), None)


def _partial_copy(tv: TensorView, mesh: DeviceMesh | None, axes: dict[int, ParallelType]) -> TensorView:
    """A fresh tensor with ``tv``'s full logical domain (reductions kept), on ``mesh``, sharded on ``axes``."""
    logical: list[IterDomain] = [i.clone() for i in tv.get_logical_domain()]
    copy = TensorView(tv.fusion, TensorDomain(logical), tv.dtype)
    copy.set_device_mesh(mesh)
    shard(copy, axes)
    return copy


def _copy_stream_schedule(src: TensorView, dst: TensorView) -> None:
    """Give ``dst`` ``src``'s stream loop ID (same logical position, same chain of outer-split outputs), so
    the expr producing ``dst`` joins the host loop that consumes it chunk by chunk."""
    stream = next((i for i in src.get_loop_domain() if i.is_stream), None)
    if stream is None:
        return
    logical = src.get_logical_domain()
    node, splits = walk_outer_splits(stream, logical)
    if node not in logical:
        return  # not a chunking a host loop can take; stream lowering reports it on src
    target = dst.get_logical_domain()[logical.index(node)]
    pos = dst.loop_position(target)
    if pos < 0:
        return
    for split in splits:
        dst.split(pos, split.factor, inner_split=split.inner_split)
    dst.axis(pos).parallelize(ParallelType.stream)


def _distinct(tvs: list[TensorView]) -> list[TensorView]:
    return list(dict.fromkeys(tvs))  # tensors hash by identity
