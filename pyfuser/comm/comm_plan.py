"""Which collective a resharding ``set`` is, seen from one rank.

A ``set`` whose input and output differ in mesh or sharding moves data; this module names the move
(Allgather, ReduceScatter, Allreduce, Broadcast, SendRecv, Reduce, Gather, Scatter, AllToAll when the
sharding moves from one axis to another, or a local slice when a replicated tensor becomes sharded on the
same mesh) and who takes part. A sharded reduction ID on the input means partial results, so the move
reduces. Anything else has no path here and raises a ValueError naming both tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from pyfuser.ir.analysis.sharding import Sharding, sharding_of, tensor_dim
from pyfuser.ir.analysis.stream_axes import StreamAxis, stream_axis_of, walk_outer_splits
from pyfuser.ir.device_mesh import DeviceMesh
from pyfuser.ir.iter_domain import ParallelType
from pyfuser.ir.ops import LoadStoreOp, ReductionOp
from pyfuser.ir.symbolic import SymConst
from pyfuser.ir.tensor_view import TensorView


class CommunicationType(Enum):
    Allgather = "Allgather"
    ReduceScatter = "ReduceScatter"
    Allreduce = "Allreduce"
    Broadcast = "Broadcast"
    SendRecv = "SendRecv"
    Reduce = "Reduce"
    Gather = "Gather"
    Scatter = "Scatter"
    #: The sharding moves from one axis to another (expert parallelism's dispatch and combine): every
    #: rank sends each peer the slice of its shard that the peer holds afterwards.
    AllToAll = "AllToAll"
    #: A swizzled stream loop over the shards (nvFuser's ring all-gather): iteration ``i`` on team position
    #: ``p`` sends the rank's shard to position ``(p - i) % n`` and receives position ``(p + i) % n``'s.
    CollectivePermute = "CollectivePermute"
    #: Not a collective: a replicated tensor becomes sharded on the same mesh; each rank keeps its slice.
    LocalSlice = "LocalSlice"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class CommPlan:
    """What one rank does for one resharding ``set``.

    ``team``: participating ranks in order (a rank's position is its shard index). ``root``: the source
    (Broadcast, Scatter, SendRecv) or destination (Reduce, Gather) rank. ``dim``: tensor dim gathered,
    scattered or sliced (of the output for Allgather / Gather, of the input otherwise; for AllToAll the
    input dim split among the team). ``concat_dim``: AllToAll's output dim the received pieces fill.
    """

    type: CommunicationType
    team: tuple[int, ...]
    root: int | None = None
    dim: int | None = None
    reduce_op: str = "sum"
    peer: int | None = None  # SendRecv: the receiver
    #: Broadcast inside a stream loop over the sharded axis itself: iteration ``i`` broadcasts the shard
    #: of ``team[i]`` (the broadcast-based pipeline of the "shard outermost" all-gather + GEMM); a
    #: CollectivePermute's peers follow the loop's index the same way.
    root_from_loop: bool = False
    concat_dim: int | None = None

    @property
    def is_local(self) -> bool:
        return self.type is CommunicationType.LocalSlice


def reduce_op_of(tv: TensorView) -> str:
    """How partial results of ``tv`` combine: the op of the reduction that produced them."""
    definition = tv.definition
    if isinstance(definition, ReductionOp):
        return definition.kind.spec.combine
    return "sum"  # linear / matmul contractions


def plan_communication(expr: LoadStoreOp, rank: int) -> CommPlan | None:
    """The plan of ``expr`` for ``rank``; None when ``rank`` takes no part (or nothing moves)."""
    src, dst = expr.inputs[0], expr.output
    if not isinstance(src, TensorView):
        raise TypeError(f"{dst.short_name}: a communication needs a tensor input, got {src}")
    plan = _plan(src, dst, rank)
    if plan is None or rank not in plan.team:
        return None
    return plan


def _plan(src: TensorView, dst: TensorView, rank: int) -> CommPlan | None:
    s, d = sharding_of(src), sharding_of(dst)
    if s.mesh is None or d.mesh is None:
        return None
    ins, outs = _by_ptype(src, s), _by_ptype(dst, d)
    partial = {p: a for p, a in ins.items() if src.get_logical_domain()[a].is_reduction()}
    ins = {p: a for p, a in ins.items() if p not in partial}
    outs = {p: a for p, a in outs.items() if not dst.get_logical_domain()[a].is_reduction()}
    moved = {p for p in set(ins) | set(outs) if ins.get(p) != outs.get(p)} | set(partial)
    if s.mesh == d.mesh:
        return _same_mesh_plan(src, dst, s.mesh, rank, ins, outs, partial, moved)
    return _cross_mesh_plan(src, dst, s.mesh, d.mesh, ins, outs, partial)


def _by_ptype(tv: TensorView, sharding: Sharding) -> dict[ParallelType, int]:
    """Device parallel type -> the logical axis it shards. Where a reduction and an iteration axis share
    a type (the output of a reduce-scatter, nvFuser's form of it), the iteration axis: the reduction
    there is complete."""
    logical = tv.get_logical_domain()
    ordered = sorted(sharding.axes.items(), key=lambda item: not logical[item[0]].is_reduction())
    return {p: a for a, p in ordered}


def _same_mesh_plan(src: TensorView, dst: TensorView, mesh: DeviceMesh, rank: int, ins: dict[ParallelType, int],
                    outs: dict[ParallelType, int], partial: dict[ParallelType, int],
                    moved: set[ParallelType]) -> CommPlan | None:
    if not moved:
        return None
    if len(moved) > 1:
        raise _no_path(src, dst, f"it changes the sharding along {len(moved)} device parallel types "
                       f"({', '.join(sorted(str(p) for p in moved))}); reshard one mesh axis at a time")
    (ptype,) = moved
    team = mesh.team(rank, ptype) if rank in mesh else tuple(mesh.ranks)
    if ptype in partial:
        op = reduce_op_of(src)
        if ptype in outs:
            dim = tensor_dim(src, _logical_pos(dst, src, outs[ptype]))
            return CommPlan(CommunicationType.ReduceScatter, team, dim=dim, reduce_op=op)
        return CommPlan(CommunicationType.Allreduce, team, reduce_op=op)
    if ptype in ins and ptype not in outs:
        axis = _logical_pos(src, dst, ins[ptype])
        if src.get_logical_domain()[ins[ptype]].is_device_dim and dst.get_logical_domain()[axis].is_stream:
            return CommPlan(CommunicationType.Broadcast, team, dim=tensor_dim(dst, axis), root_from_loop=True)
        stream = _stream_over_the_shards(src, dst, ptype, ins[ptype], axis, len(team))
        if stream is not None:
            if stream.swizzle not in (None, ptype):
                raise _no_path(src, dst, f"its stream loop is swizzled along {stream.swizzle}, but the shards it "
                               f"gathers are along {ptype}")
            kind = CommunicationType.Broadcast if stream.swizzle is None else CommunicationType.CollectivePermute
            return CommPlan(kind, team, dim=tensor_dim(dst, axis), root_from_loop=True)
        return CommPlan(CommunicationType.Allgather, team, dim=tensor_dim(dst, axis))
    if ptype in outs and ptype not in ins:
        return CommPlan(CommunicationType.LocalSlice, team, dim=tensor_dim(src, _logical_pos(dst, src, outs[ptype])))
    return CommPlan(CommunicationType.AllToAll, team, dim=tensor_dim(src, _logical_pos(dst, src, outs[ptype])),
                    concat_dim=tensor_dim(dst, _logical_pos(src, dst, ins[ptype])))


def _cross_mesh_plan(src: TensorView, dst: TensorView, smesh: DeviceMesh, dmesh: DeviceMesh,
                     ins: dict[ParallelType, int], outs: dict[ParallelType, int],
                     partial: dict[ParallelType, int]) -> CommPlan:
    if smesh.ndim > 1 or dmesh.ndim > 1:
        raise _no_path(src, dst, "moving data between different multi-dimensional meshes is not supported")
    union = tuple(dict.fromkeys((*smesh.ranks, *dmesh.ranks)))
    if not ins and not outs and not partial:
        root = smesh.ranks[0]
        if len(dmesh) == 1:
            receiver = dmesh.ranks[0]
            sender = receiver if receiver in smesh else root
            return CommPlan(CommunicationType.SendRecv, tuple(dict.fromkeys((sender, receiver))), root=sender,
                            peer=receiver)
        return CommPlan(CommunicationType.Broadcast, tuple(dict.fromkeys((root, *dmesh.ranks))), root=root)
    if len(dmesh) == 1 and not outs and set(smesh.ranks) >= set(dmesh.ranks):
        root = dmesh.ranks[0]
        if partial and not ins:
            return CommPlan(CommunicationType.Reduce, smesh.ranks, root=root, reduce_op=reduce_op_of(src))
        if ins and not partial and len(ins) == 1:
            (axis,) = ins.values()
            return CommPlan(CommunicationType.Gather, smesh.ranks, root=root,
                            dim=tensor_dim(dst, _logical_pos(src, dst, axis)))
    if len(smesh) == 1 and not ins and not partial and len(outs) == 1 and set(dmesh.ranks) >= set(smesh.ranks):
        (axis,) = outs.values()
        return CommPlan(CommunicationType.Scatter, dmesh.ranks, root=smesh.ranks[0],
                        dim=tensor_dim(src, _logical_pos(dst, src, axis)))
    raise _no_path(src, dst, f"between {smesh} and {dmesh} only replicated moves (Broadcast, SendRecv), "
                   f"Gather / Reduce onto one rank of the source mesh and Scatter from one rank of the "
                   f"destination mesh are supported (ranks involved: {list(union)})")


def _stream_over_the_shards(src: TensorView, dst: TensorView, ptype: ParallelType, src_axis: int, dst_axis: int,
                            parts: int) -> StreamAxis | None:
    """``dst``'s stream axis where its loop iterates ``src``'s shards: ``src`` splits logical axis ``src_axis``
    once into ``parts`` shards along ``ptype`` and ``dst`` splits the same axis once into ``parts`` chunks on
    stream, so iteration ``i`` gathers the shard of team position ``i`` (nvFuser's broadcast-based
    all-gather of a stream loop; the "shard outermost" form has both as logical IDs), or of position
    ``(p + i) % parts`` on position ``p`` where the stream ID is swizzled (``swizzle1d``)."""
    stream = stream_axis_of(dst)
    if stream is None or stream.logical is not dst.get_logical_domain()[dst_axis] or len(stream.splits) != 1:
        return None
    device = next((i for i in src.get_loop_domain() if i.parallel_type is ptype), None)
    if device is None:
        return None
    reached, splits = walk_outer_splits(device, src.get_logical_domain())
    if (reached is src.get_logical_domain()[src_axis] and len(splits) == 1 and device.extent == SymConst(parts)
            and stream.count == SymConst(parts)):
        return stream
    return None


def _logical_pos(from_tv: TensorView, to_tv: TensorView, axis: int) -> int:
    """Position in ``to_tv`` of ``from_tv``'s logical ``axis``: a set keeps the axis order, reductions aside."""
    from_dim = sum(1 for i in from_tv.get_logical_domain()[:axis] if not i.is_reduction())
    kept = [p for p, i in enumerate(to_tv.get_logical_domain()) if not i.is_reduction()]
    return kept[from_dim]


def _no_path(src: TensorView, dst: TensorView, why: str) -> ValueError:
    return ValueError(f"no resharding path from {src.short_name} ({sharding_of(src)}) to {dst.short_name} "
                      f"({sharding_of(dst)}): {why}")
