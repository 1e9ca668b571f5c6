"""Stream lowering (docs/stream_lowering.md): put stream-parallel exprs into host ``FOR`` loops over CUDA streams.

Walking the top-level program in order, an expr whose output has a stream axis opens a loop (or
joins the open one when its stream axis maps exactly onto a tensor already chunked there); any
other node closes the open loop. A loop is emitted as::

    ALLOCATE of each output produced in the loop (whole, once)
    FOR StreamIdx in <stream ID>:
      GetCurrentStream into Stream k
      SetCurrentStream to Stream ( StreamIdx % numberOfStreams )
      Synchronize Stream k
      HirAliasSelect of each input / output chunk, then the expr on the chunks, per expr
      SetCurrentStream to Stream k
      Synchronize Stream ( StreamIdx % numberOfStreams )
"""

from __future__ import annotations

from pyfuser.host_ir.nodes import Allocate, AtenCall, ForLoop, HirAliasSelect, HostIrContainer, HostNode, LoopIndex
from pyfuser.host_ir.stream_nodes import GetCurrentStream, SetCurrentStream, Synchronize
from pyfuser.ir.analysis.allocation_order import allocation_perm
from pyfuser.ir.analysis.fused_exprs import FusedExprs
from pyfuser.ir.analysis.sharding import sharding_of
from pyfuser.ir.analysis.stream_axes import (
    StreamAxis,
    expr_stream_axis,
    fusion_stream_axes,
    operand_id,
    stream_axis_of,
    tensor_operands,
)
from pyfuser.ir.base import Expr, Val
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import IterDomain
from pyfuser.ir.symbolic import SymConst
from pyfuser.ir.tensor_domain import TensorDomain
from pyfuser.ir.tensor_view import MemoryType, TensorView
from pyfuser.options import CompileOptions


class _OpenLoop:
    """A stream loop being built: its chunking and every tensor chunked in it so far."""

    def __init__(self, axis: StreamAxis, rank: int) -> None:
        self.axis = axis
        self.index = LoopIndex(axis.logical.extent, axis.chunk, rotation=_rotation(axis, rank))
        self.preamble: list[HostNode] = []
        self.body: list[HostNode] = []
        #: full tensor -> (chunked logical ID, chunk tensor)
        self.chunks: dict[TensorView, tuple[IterDomain, TensorView]] = {}
        self.produced: set[TensorView] = set()
        #: tensors some node of the loop reads whole in every iteration
        self.read_whole: set[Val] = set()

    def accepts(self, expr: Expr, axis: StreamAxis) -> bool:
        """True when ``axis`` maps exactly onto a tensor chunked here and nothing needs a whole
        tensor (or another axis) of one produced here."""
        if not axis.maps_to(self.axis):
            return False
        linked = False
        for position, p in tensor_operands(expr):
            entry = self.chunks.get(p)
            if entry is None:
                continue
            mapped = operand_id(expr, position, axis.logical)
            if mapped is entry[0]:
                linked = True
            elif mapped is not None or p in self.produced:
                return False
        return linked


class _StreamLowering:
    def __init__(self, container: HostIrContainer, fusion: Fusion, rank: int) -> None:
        self.container = container
        self.fusion = fusion
        self.rank = rank
        self.allocated: set[Val] = {n.tv for n in container.nodes if isinstance(n, Allocate)}
        self.result: list[HostNode] = []
        self.loop: _OpenLoop | None = None
        #: chunkings propagated from stream-parallel inputs through consumers without a schedule
        self.inherited = fusion_stream_axes(fusion)

    def run(self) -> None:
        joined_last = False
        for node in self.container.nodes:
            if node.binds_to_previous and joined_last and self.loop is not None:
                self.loop.body.append(node.substitute(self._loop_mapping(self.loop, node), self.loop.index))
                continue
            expr = node.source_expr
            axis = expr_stream_axis(expr, self.inherited) if expr is not None else None
            joined_last = expr is not None and axis is not None
            if expr is None or axis is None:
                if self.loop is not None and _loop_invariant(node):
                    self.loop.preamble.append(node)
                else:
                    self._close()
                    self.result.append(node)
                continue
            if self.loop is None or not self.loop.accepts(expr, axis):
                self._close()
                self.loop = _OpenLoop(axis, self.rank)
            self._add(self.loop, node, expr, axis)
        self._close()
        self.container.nodes = self.result

    @staticmethod
    def _loop_mapping(loop: _OpenLoop, node: HostNode) -> dict[Val, Val]:
        return {v: loop.chunks[v][1] for v in (*node.inputs, *node.outputs)
                if isinstance(v, TensorView) and v in loop.chunks}

    def _add(self, loop: _OpenLoop, node: HostNode, expr: Expr, axis: StreamAxis) -> None:
        for p in node.whole_inputs:
            if p in loop.chunks:
                _read_whole_and_chunked(p, axis)
            loop.read_whole.add(p)
        #: the expr's inputs, position by position, as this iteration reads them
        operands: list[Val] = list(expr.inputs)
        for position, p in tensor_operands(expr):
            if isinstance(expr, FusedExprs) and len(reaching := expr.producer_ids_reaching(p, axis.logical)) > 1:
                raise ValueError(f"{axis.describe()} is parallelized on stream, but the {expr.op_description} reads "
                                 f"{p.short_name} along axes {', '.join(map(str, reaching))}, which all map to it: a "
                                 f"chunk of one is not a chunk of the others; copy {p.short_name} (segment_set) for "
                                 "one of the reads, or split another axis on stream")
            mapped = operand_id(expr, position, axis.logical)
            if (mapped is not None and isinstance(expr, FusedExprs)
                    and (reader := expr.whole_reader(p, axis.logical)) is not None):
                raise ValueError(f"{axis.describe()} is parallelized on stream, but the {expr.op_description} reads "
                                 f"{p.short_name} whole along that axis ({reader.op_description} computing "
                                 f"{reader.tensor_outputs[0].short_name}) and other ops of it read {p.short_name} "
                                 f"chunked: one chunk cannot serve both; copy {p.short_name} (segment_set) for one of "
                                 "the reads, or split another axis on stream")
            if mapped is None or p in node.whole_inputs:
                continue  # read whole: e.g. the weight of a row-chunked matmul
            if p not in loop.chunks:
                if p in loop.read_whole:
                    _read_whole_and_chunked(p, axis)
                self._select(loop, p, mapped)
            operands[position] = loop.chunks[p][1]
        # A tensor read chunked at one position and whole at another (``matmul(x, x)`` by rows) is
        # substituted position by position.
        mapping: dict[Val, Val] = {p: c for p, c in zip(expr.inputs, operands, strict=True) if c is not p}
        by_position = any(mapping.get(p, p) is not c for p, c in zip(expr.inputs, operands, strict=True))
        for out in expr.tensor_outputs:  # outputs of one expr (var_mean) are chunked at the same position
            ids = out.get_logical_domain(no_reductions=True)
            if axis.dim >= len(ids) or ids[axis.dim].extent != axis.logical.extent:
                raise ValueError(f"{axis.describe()} is parallelized on stream, but {out.short_name}, another output "
                                 f"of the same {expr.op_description}, has no matching axis {axis.dim} to chunk")
            logical = ids[axis.dim]
            if out not in self.allocated:
                loop.preamble.append(Allocate(out, allocation_perm(self.fusion, out)))
                self.allocated.add(out)
            self._select(loop, out, logical)
            loop.produced.add(out)
            mapping[out] = loop.chunks[out][1]
        if not by_position:
            loop.body.append(node.substitute(mapping, loop.index))
        elif isinstance(node, AtenCall):
            loop.body.append(node.substitute(mapping, loop.index, operands=operands))
        else:
            raise ValueError(f"{axis.describe()} is parallelized on stream, but the {expr.op_description} reads one "
                             f"tensor both chunked and whole, which only an ATen-evaluated op can take; copy the "
                             f"tensor (segment_set) for one of the reads")

    @staticmethod
    def _select(loop: _OpenLoop, tv: TensorView, logical: IterDomain) -> None:
        _check_not_split_sharded(tv, logical, loop.axis)
        axis = loop.axis.on(tv, logical)
        chunk = _chunk_tensor(tv, logical, axis)
        own = stream_axis_of(tv)
        shown = own.loop_id if own is not None and own.logical is logical else logical
        loop.body.append(HirAliasSelect(chunk, tv, shown, loop.index, axis.dim))
        loop.chunks[tv] = (logical, chunk)

    def _close(self) -> None:
        loop, self.loop = self.loop, None
        if loop is None:
            return
        main = self.container.new_stream()
        worker = self.container.new_worker_stream(loop.index)
        body = [GetCurrentStream(main), SetCurrentStream(worker), Synchronize(main), *loop.body,
                SetCurrentStream(main), Synchronize(worker)]
        self.result.extend(loop.preamble)
        self.result.append(ForLoop(loop.index, loop.axis.loop_id, SymConst(0), loop.axis.count, body))


def _check_not_split_sharded(tv: TensorView, logical: IterDomain, axis: StreamAxis) -> None:
    """A rank holds one contiguous shard of an axis split over the mesh: a loop over chunks of the
    global axis cannot take them from the local shard (a logical ID sharded one element per rank is the
    "shard outermost" form, whose broadcast reads the whole shard)."""
    if tv.device_mesh is None or logical.is_device_dim:
        return
    position = next(p for p, i in enumerate(tv.get_logical_domain()) if i is logical)
    ptype = sharding_of(tv).axes.get(position)
    if ptype is not None and tv.device_mesh.size_of(ptype) > 1:
        raise ValueError(f"{axis.describe()} is parallelized on stream, and the loop would take chunks of "
                         f"{tv.short_name} axis {position} ({logical}), which is sharded on {ptype}: each rank "
                         "holds one contiguous shard of it, not the global chunks the loop iterates; stream-"
                         "parallelize another axis, or reshard (gather) the tensor before the loop")


def _read_whole_and_chunked(tv: Val, axis: StreamAxis) -> None:
    """A tensor sharded along the loop's axis is read whole (this rank's shard) by one node of the
    loop; a chunk of it would be a chunk of the local shard, not of the global axis."""
    raise ValueError(f"{axis.describe()} is parallelized on stream and {tv} is read whole in every iteration "
                     "(it is sharded along the loop's axis), so a host loop cannot also take chunks of it")


def _loop_invariant(node: HostNode) -> bool:
    """Nodes an open loop can hoist instead of closing: allocations and scalar-only work."""
    if isinstance(node, Allocate):
        return True
    return not node.binds_to_previous and not any(isinstance(v, TensorView) for v in (*node.inputs, *node.outputs))


def _chunk_tensor(tv: TensorView, logical: IterDomain, axis: StreamAxis) -> TensorView:
    """The per-iteration view's tensor: the chunked ID dropped (one index) or shrunk to the chunk."""
    ids = []
    for i in tv.get_logical_domain(no_reductions=True):
        if i is not logical:
            ids.append(i.clone(keep_parallel=i.is_device_dim))
        elif axis.splits:
            ids.append(IterDomain(tv.fusion, axis.chunk, i.iter_type))
    chunk = TensorView(tv.fusion, TensorDomain(ids), tv.dtype, MemoryType.Local)
    chunk.device_mesh = tv.device_mesh  # a chunk lives where its tensor does (printed as in docs/allgather_gemm.md)
    return chunk


def lower_stream_parallel(container: HostIrContainer, options: CompileOptions) -> None:
    _StreamLowering(container, container.fusion, options.rank).run()


def _rotation(axis: StreamAxis, rank: int) -> tuple[int, int] | None:
    """The ``LoopIndex`` rotation of a swizzled stream axis on ``rank``: its position in the team along the
    swizzle's parallel type, and the team's size; the loop must take one chunk per member."""
    if axis.swizzle is None:
        return None
    mesh = axis.tv.device_mesh
    if mesh is None or rank not in mesh:
        raise ValueError(f"{axis.describe()} is swizzled along {axis.swizzle} (swizzle1d), but "
                         f"{axis.tv.short_name} has no device mesh holding rank {rank}")
    team = mesh.team(rank, axis.swizzle)
    if not (isinstance(axis.count, SymConst) and axis.count.val == len(team)):
        raise ValueError(f"{axis.describe()} is swizzled along {axis.swizzle} (swizzle1d): its loop must take one "
                         f"chunk per rank of the team ({len(team)}), got {axis.count}")
    return team.index(rank), len(team)
