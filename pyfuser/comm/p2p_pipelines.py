"""Host pass ``p2p_pipelines`` (with ``CommunicatorBackend.cuda``): all-gather + GEMM and GEMM +
reduce-scatter become P2P pipelines in which every rank computes on its own block at once and on each
peer's block as soon as that block has landed.

All-gather + GEMM (docs/allgather_gemm.md; a loop body, or the top level when there is no stream loop)::

    Communication (type=Allgather, input=X, output=G)          Fork (X is ready)
    Wait                                                 ->    O[me] = linear(X, W)            # starts at once
    O = linear(G, W)                                           P2PCommunication (type=send, buffer=X, remote=G[me],
                                                                   after the fork) to each peer, in rotated order
                                                               P2PCommunication (type=recv, buffer=G[p]); Wait
                                                               O[p] = linear(G[p], W)          # as G[p] lands

``G`` becomes a symmetric buffer (``SymmetricAllocate``) that peers write; ``G[p]`` is peer ``p``'s block
along the gathered dim and ``O[p]`` the output rows it produces, written in place. Where ``G`` is also read after the
GEMMs (a program output: the activations a training forward saves for its weight gradients), or several
GEMMs read it, at the top level, the blocks land in a symmetric buffer of their own and each is copied into
``G`` (``BlockUpdate``, this rank's shard too) and multiplied by every GEMM as it lands. Each rank sends to
``team[pos - j]`` and receives from ``team[pos + j]`` at step ``j``: a permutation, so every GPU serves one
peer per step (what a ring achieves on a ring topology, with no forwarding hop on an NVLink switch).

GEMM + reduce-scatter (row-parallel linear with a sharded output)::

    P = linear(X, W)                                           P[p] = linear(X[p], W) for the next peers first,
    Communication (type=ReduceScatter, input=P, output=O)  ->       each sent into R[me] of that peer at once
    Wait                                                       O = linear(X[me], W)            # own partial sum
                                                               per peer q: recv R[q]; Wait; O += R[q]

``R`` is a symmetric receive buffer shaped like ``P``. A stream loop keeps its chunking: each iteration
pipelines its own chunk, and its transfers use the iteration as their signal slot. The channel is
released (``P2PRelease``) after the loop. Where the CUDA transport cannot run, the same program runs its
transfers over the process group (gloo on CPUs, NCCL otherwise) after one warning naming why.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from pyfuser.comm.comm_plan import CommunicationType
from pyfuser.comm.communicator import Communicator
from pyfuser.comm.nodes import Communication, Wait
from pyfuser.comm.overlap_model import Decision, Pattern, decide, forced
from pyfuser.comm.p2p import (
    BlockUpdate,
    P2PCommunication,
    P2PCommunicationType,
    P2PFork,
    P2PRelease,
    P2PStep,
    P2PWait,
    ShardSelect,
    SymmetricAllocate,
)
from pyfuser.comm.symmetric_memory import cuda_transport_problem
from pyfuser.host_ir.nodes import Allocate, AtenCall, ForLoop, HirAliasSelect, HostIrContainer, HostNode, tensor_shape
from pyfuser.ir.analysis.allocation_order import allocation_perm
from pyfuser.ir.base import Val
from pyfuser.ir.iter_domain import IterDomain
from pyfuser.ir.ops import LinearOp, MatmulOp
from pyfuser.ir.symbolic import SymConst
from pyfuser.ir.tensor_domain import TensorDomain
from pyfuser.ir.tensor_view import MemoryType, TensorView
from pyfuser.options import CommunicatorBackend, CompileOptions, DumpOption, dump

_SEND, _RECV = P2PCommunicationType.SEND, P2PCommunicationType.RECV

#: The transport of each (team, device) in this process ("cuda", or the process group's backend).
_TRANSPORTS: dict[tuple[tuple[int, ...], str], str] = {}


def lower_p2p_pipelines(container: HostIrContainer, options: CompileOptions) -> None:
    if options.backend is CommunicatorBackend.cuda:
        _P2PLowering(container, options).run()


@dataclass
class _Body:
    """A node list being rewritten: the top level (``loop`` None) or a stream loop's body."""

    nodes: list[HostNode]
    loop: ForLoop | None


class _P2PLowering:
    def __init__(self, container: HostIrContainer, options: CompileOptions) -> None:
        self.container = container
        self.fusion = container.fusion
        self.options = options
        self.comm = Communicator.instance()
        #: per loop, the releases that go right after it; per Allocate replaced, its symmetric version
        self.after_loop: dict[int, list[HostNode]] = {}
        self.replaced: dict[int, HostNode] = {}
        #: per pattern (its first GEMM node), whether to pipeline it (``overlap_model``)
        self.decided: dict[int, Decision] = {}

    def run(self) -> None:
        top = _Body(self.container.nodes, None)
        self._rewrite(top)
        for node in list(self.container.nodes):
            if isinstance(node, ForLoop):
                self._rewrite(_Body(node.body, node))
        result: list[HostNode] = []
        for node in self.container.nodes:
            result.append(self.replaced.get(id(node), node))
            result.extend(self.after_loop.get(id(node), []))
        self.container.nodes = result

    # --- shared helpers ----------------------------------------------------------------------------------
    def _users(self, val: Val) -> list[HostNode]:
        return [n for n in self.container.walk()
                if not isinstance(n, ForLoop) and any(v is val for v in (*n.inputs, *n.outputs))]

    def _only_used_by(self, val: Val, allowed: list[HostNode]) -> bool:
        return all(any(n is a for a in allowed) for n in self._users(val))

    def _select_of(self, body: _Body, chunk: TensorView) -> HirAliasSelect | None:
        return next((n for n in body.nodes if isinstance(n, HirAliasSelect) and n.out is chunk), None)

    def _dropped(self, body: _Body, tv: TensorView) -> int | None:
        """The run-time dim of ``tv`` (a loop's chunk) missing from its logical domain, if any."""
        select = self._select_of(body, tv)
        if select is None:
            return None
        whole = len(select.src.get_logical_domain(no_reductions=True))
        return select.dim if len(tv.get_logical_domain(no_reductions=True)) < whole else None

    def _block(self, body: _Body, tv: TensorView, dim: int, parts: int, index: int,
               like: TensorView | None = None) -> ShardSelect:
        """``_shard_select`` of a tensor of ``body`` (chunked like ``like``, by default itself)."""
        return _shard_select(tv, dim, parts, index, self._dropped(body, like if like is not None else tv))

    def _is_output(self, tv: TensorView) -> bool:
        return any(tv is out for out in self.container.outputs)

    def _allocation(self, tv: TensorView) -> Allocate | None:
        return next((n for n in self.container.nodes if type(n) is Allocate and n.tv is tv
                     and n.mem_type is MemoryType.Global), None)

    def _whole(self, body: _Body, value: TensorView) -> tuple[TensorView, HirAliasSelect | None, Allocate | None] | None:
        """The whole tensor behind ``value`` (a chunk in a loop), its select and its allocation; None when it
        is not a buffer of the program's own (a fusion input or output, say)."""
        if body.loop is None:
            return None if self._is_output(value) else (value, None, None)
        select = self._select_of(body, value)
        if select is None or select.ring or self._is_output(select.src):
            return None
        alloc = self._allocation(select.src)
        if alloc is None or not self._only_used_by(select.src, [alloc, select]):
            return None
        return select.src, select, alloc

    def _operand_blocks(self, body: _Body, gemm: AtenCall, sliced: dict[int, int], parts: int,
                        index: int) -> tuple[list[Val], list[HostNode]]:
        """The GEMM's operands for output block ``index``: blocks of the operands in ``sliced``, the rest whole."""
        operands: list[Val] = []
        selects: list[HostNode] = []
        for position, value in enumerate(gemm.inputs):
            if position in sliced:
                assert isinstance(value, TensorView)
                select = self._block(body, value, sliced[position], parts, index)
                selects.append(select)
                operands.append(select.out)
            else:
                operands.append(value)
        return operands, selects

    def _transport(self, team: tuple[int, ...]) -> str:
        """``cuda`` when the copy-engine transport runs over ``team``, else the process group's backend; decided
        (and warned about) once per team and device in a process."""
        key = (team, str(self.options.device))
        chosen = _TRANSPORTS.get(key)
        if chosen is None:
            chosen = _TRANSPORTS[key] = self._choose_transport(team)
        return chosen

    def _choose_transport(self, team: tuple[int, ...]) -> str:
        device, fallback = self.options.device, self.comm.backend
        problem: str | None
        if device.type != "cuda":
            problem = f"the program runs on {device.type} tensors"
        else:
            info = self.comm.info
            problem = cuda_transport_problem(team, info.rank, info.local_rank, info.local_size, device,
                                             self.comm.group(team))
        if problem is None:
            return "cuda"
        warnings.warn(f"pyfuser: CommunicatorBackend.cuda cannot run over team ({' '.join(map(str, team))}): "
                      f"{problem}; its P2P transfers use {fallback.upper()}", RuntimeWarning, stacklevel=3)
        return fallback

    def _symmetric(self, tv: TensorView, like: TensorView, alloc: Allocate | None, team: tuple[int, ...],
                   body: _Body, backend: str, source: str) -> SymmetricAllocate:
        """``tv``'s channel, laid out like ``like`` (allocated by ``alloc`` when in a loop); each peer makes one
        transfer into it per loop iteration."""
        perm = alloc.perm if alloc is not None else tuple(allocation_perm(self.fusion, like))
        shape = alloc.shape if alloc is not None else tensor_shape(like)
        slots = body.loop.stop if body.loop is not None else SymConst(1)
        return SymmetricAllocate(tv, perm, list(shape), team, slots, backend, source)

    def _released(self, body: _Body, whole: TensorView, team: tuple[int, ...], backend: str) -> list[HostNode]:
        """The release of ``whole``'s channel: after the loop, or (returned) after the top-level pipeline."""
        release = P2PRelease(whole, team, backend)
        if body.loop is None:
            return [release]
        self.after_loop.setdefault(id(body.loop), []).append(release)
        return []

    def _pays(self, pattern: Pattern, body: _Body, gemms: list[AtenCall], ranks: int) -> bool:
        """Whether to pipeline ``gemms`` (one pattern's, sharing their rows), by ``overlap_model.decide`` on the
        sizes when they are known at compile time; with symbolic sizes the pipeline asked for runs. The
        sizes and the device kind are the same on every rank, so every rank takes the same decision."""
        known = self.decided.get(id(gemms[0]))
        if known is not None:  # the single- and several-GEMM matchers may both reach one all-gather
            return known.pipelined
        decision = self.decided[id(gemms[0])] = forced(self.options) or self._estimate(pattern, body, gemms, ranks)
        dump(DumpOption.host_ir_passes, lambda: f"p2p_pipelines: {pattern.value} into "
             f"{', '.join(v.short_name for g in gemms for v in g.outputs[:1] if isinstance(v, TensorView))}: "
             f"{decision}\n")
        return decision.pipelined

    def _estimate(self, pattern: Pattern, body: _Body, gemms: list[AtenCall], ranks: int) -> Decision:
        rows_tv, out = gemms[0].inputs[0], gemms[0].outputs[0]
        assert isinstance(rows_tv, TensorView) and isinstance(out, TensorView)
        # K from the whole tensor a loop's chunk selects: its sharding, which the chunk does not carry, says
        # how much of K this rank holds
        select = self._select_of(body, rows_tv) if body.loop is not None else None
        whole = select.src if select is not None else rows_tv
        shapes = [_static_shape(whole), _static_shape(out), *(_static_shape(g.outputs[0]) for g in gemms[1:])]
        chunks = body.loop.stop if body.loop is not None else SymConst(1)
        if any(shape is None for shape in shapes) or not isinstance(chunks, SymConst):
            return Decision(True, None, None, "sizes unknown at compile time: the pipeline asked for")
        rows, first, *rest = shapes
        assert rows is not None and first is not None
        m = 1
        for extent in first[:-1]:
            m *= extent
        n = sum(shape[-1] for shape in (first, *rest) if shape is not None)
        return decide(pattern, m * chunks.val, rows[-1], n, rows_tv.dtype.torch_dtype, ranks, chunks.val, self.options)

    def _rewrite(self, body: _Body) -> None:
        k = 0
        while k < len(body.nodes):
            node = body.nodes[k]
            if isinstance(node, Communication) and (self._allgather_gemm(body, k) or self._allgather_gemms(body, k)):
                continue
            if isinstance(node, AtenCall) and self._gemm_reduce_scatter(body, k):
                continue
            k += 1

    # --- all-gather + GEMM ---------------------------------------------------------------------------------
    def _allgather_gemm(self, body: _Body, k: int) -> bool:
        comm = body.nodes[k]
        assert isinstance(comm, Communication)
        plan = comm.plan
        if (plan.type is not CommunicationType.Allgather or plan.root_from_loop or not comm.sends
                or not comm.receives or len(plan.team) < 2 or k + 1 >= len(body.nodes)):
            return False
        wait = body.nodes[k + 1]
        gathered = comm.output_tv
        gemm = next((n for n in body.nodes[k + 2:] if isinstance(n, AtenCall) and any(v is gathered for v in n.inputs)),
                    None)
        if (not isinstance(wait, Wait) or wait.communication.handle is not comm.handle or gemm is None
                or not isinstance(gemm.expr, (LinearOp, MatmulOp)) or gemm.inputs[0] is not gathered
                or any(v is gathered for v in gemm.inputs[1:]) or len(gemm.outputs) != 1):
            return False
        g = plan.dim or 0
        g_out = _output_dim(gemm, 0, g)
        whole = self._whole(body, gathered)
        allowed: list[HostNode] = [comm, gemm] + ([whole[1]] if whole is not None and whole[1] is not None else [])
        if (g_out is None or whole is None or not self._only_used_by(gathered, allowed)
                or not self._pays(Pattern.allgather_gemm, body, [gemm], len(plan.team))):
            return False
        buffer, _, alloc = whole
        team, rank = plan.team, comm.rank
        parts, pos = len(team), team.index(rank)
        backend = self._transport(team)
        index = body.loop.index if body.loop is not None else None
        label = str(comm.handle.number)
        symmetric = self._symmetric(buffer, buffer, alloc, team, body, backend,
                                    f"the all-gather of {comm.expr.tensor_inputs[0].short_name}")
        steps = [P2PStep(f"{label}.{j}") for j in range(1, parts)]
        out = gemm.outputs[0]
        assert isinstance(out, TensorView)
        compute: list[HostNode] = []
        if not gemm.into:
            compute.append(Allocate(out, allocation_perm(self.fusion, out)))
        # This rank's GEMM first, its sends after it but waiting only for the fork before it (a send's copy
        # otherwise waits for everything issued before it on this stream, the GEMM included); then each
        # peer's block as it lands.
        mine = self._block(body, gathered, g, parts, pos)
        fork = P2PFork(label, [comm.input_tv], backend)
        sends = [P2PCommunication(_SEND, comm.input_tv, buffer, team[(pos - j) % parts], backend, steps[j - 1],
                                  f"{label}.{2 * j - 1}", remote=mine.out, loop_index=index, fork=fork)
                 for j in range(1, parts)]
        own = self._block(body, out, g_out, parts, pos)
        compute += [mine, fork, own, AtenCall(gemm.expr, [comm.input_tv, *gemm.inputs[1:]], [own.out], into=True),
                    *sends]
        for j in range(1, parts):
            q = (pos + j) % parts
            block, rows = self._block(body, gathered, g, parts, q), self._block(body, out, g_out, parts, q)
            recv = P2PCommunication(_RECV, block.out, buffer, team[q], backend, steps[j - 1], f"{label}.{2 * j}",
                                    loop_index=index)
            compute += [block, recv, P2PWait(recv), rows,
                        AtenCall(gemm.expr, [block.out, *gemm.inputs[1:]], [rows.out], into=True)]
        compute += [P2PWait(s) for s in sends]
        compute += self._released(body, buffer, team, backend)
        at = body.nodes.index(gemm)
        body.nodes[at:at + 1] = compute
        if alloc is None:
            body.nodes[k:k + 2] = [symmetric]
        else:
            self.replaced[id(alloc)] = symmetric
            body.nodes[k:k + 2] = []
        return True

    def _allgather_gemms(self, body: _Body, k: int) -> bool:
        """All-gather + several GEMMs, the gathered tensor also read after them (a program output: the
        activations a training forward saves for its weight gradients), at the top level. The blocks land in
        a channel of their own; each is copied into the gathered tensor and multiplied by every GEMM as it
        lands, this rank's shard at once."""
        comm = body.nodes[k]
        assert isinstance(comm, Communication)
        plan = comm.plan
        if (body.loop is not None or plan.type is not CommunicationType.Allgather or plan.root_from_loop
                or not comm.sends or not comm.receives or len(plan.team) < 2 or k + 1 >= len(body.nodes)):
            return False
        wait, gathered = body.nodes[k + 1], comm.output_tv
        if not isinstance(wait, Wait) or wait.communication.handle is not comm.handle:
            return False
        readers = [(i, n) for i, n in enumerate(body.nodes) if i > k + 1 and any(v is gathered for v in n.inputs)]
        gemms = [(i, n) for i, n in readers if isinstance(n, AtenCall) and isinstance(n.expr, (LinearOp, MatmulOp))
                 and n.inputs[0] is gathered and not any(v is gathered for v in n.inputs[1:]) and len(n.outputs) == 1]
        if not gemms or any(isinstance(n, ForLoop) for _, n in readers):
            return False
        first = gemms[0][0]
        # The pipeline runs where the first GEMM was: every GEMM's other operands exist by then, and whatever
        # else reads the gathered tensor comes after it.
        made_between = {id(v) for n in body.nodes[first:] for v in n.outputs}
        g = plan.dim or 0
        dims = [_output_dim(gemm, 0, g) for _, gemm in gemms]
        if (any(d is None for d in dims) or any(id(v) in made_between for _, gemm in gemms for v in gemm.inputs[1:])
                or any(i < first for i, _ in readers)
                or not self._pays(Pattern.allgather_gemm, body, [g for _, g in gemms], len(plan.team))):
            return False
        team, rank = plan.team, comm.rank
        parts, pos = len(team), team.index(rank)
        backend = self._transport(team)
        label = str(comm.handle.number)
        received = _like(gathered)
        symmetric = self._symmetric(received, gathered, None, team, body, backend,
                                    f"the all-gather of {comm.expr.tensor_inputs[0].short_name}")
        steps = [P2PStep(f"{label}.{j}") for j in range(1, parts)]
        compute: list[HostNode] = []
        if not comm.into:
            compute.append(Allocate(gathered, allocation_perm(self.fusion, gathered)))
        for _, gemm in gemms:
            out = gemm.outputs[0]
            assert isinstance(out, TensorView)
            if not gemm.into:
                compute.append(Allocate(out, allocation_perm(self.fusion, out)))
        mine = self._block(body, received, g, parts, pos)
        fork = P2PFork(label, [comm.input_tv], backend)
        sends = [P2PCommunication(_SEND, comm.input_tv, received, team[(pos - j) % parts], backend, steps[j - 1],
                                  f"{label}.{2 * j - 1}", remote=mine.out, fork=fork) for j in range(1, parts)]
        own = self._block(body, gathered, g, parts, pos)
        compute += [mine, fork, own, BlockUpdate(own.out, comm.input_tv, "copy")]
        compute += self._gemm_blocks(body, gemms, dims, comm.input_tv, parts, pos)
        compute += sends
        for j in range(1, parts):
            q = (pos + j) % parts
            block, kept = self._block(body, received, g, parts, q), self._block(body, gathered, g, parts, q)
            recv = P2PCommunication(_RECV, block.out, received, team[q], backend, steps[j - 1], f"{label}.{2 * j}")
            compute += [block, recv, P2PWait(recv), kept, BlockUpdate(kept.out, block.out, "copy")]
            compute += self._gemm_blocks(body, gemms, dims, block.out, parts, q)
        compute += [P2PWait(s) for s in sends]
        compute += self._released(body, received, team, backend)
        for i, _ in reversed(gemms[1:]):
            del body.nodes[i]
        body.nodes[first:first + 1] = compute
        body.nodes[k:k + 2] = [symmetric]
        return True

    def _gemm_blocks(self, body: _Body, gemms: list[tuple[int, AtenCall]], dims: list[int | None], rows: Val,
                     parts: int, index: int) -> list[HostNode]:
        """Every GEMM of ``gemms`` on the rows of block ``index`` (``rows``), into that block of its output."""
        nodes: list[HostNode] = []
        for (_, gemm), dim in zip(gemms, dims, strict=True):
            out = gemm.outputs[0]
            assert isinstance(out, TensorView) and dim is not None
            block = self._block(body, out, dim, parts, index)
            nodes += [block, AtenCall(gemm.expr, [rows, *gemm.inputs[1:]], [block.out], into=True)]
        return nodes

    # --- GEMM + reduce-scatter ---------------------------------------------------------------------------
    def _gemm_reduce_scatter(self, body: _Body, k: int) -> bool:
        gemm = body.nodes[k]
        assert isinstance(gemm, AtenCall)
        if not isinstance(gemm.expr, (LinearOp, MatmulOp)) or len(gemm.outputs) != 1:
            return False
        partial = gemm.outputs[0]
        at = next((i for i in range(k + 1, len(body.nodes)) if isinstance(node := body.nodes[i], Communication)
                   and node.input_tv is partial), None)
        if at is None or at + 1 >= len(body.nodes):
            return False
        comm, wait = body.nodes[at], body.nodes[at + 1]
        assert isinstance(comm, Communication) and isinstance(partial, TensorView)
        plan = comm.plan
        if (plan.type is not CommunicationType.ReduceScatter or plan.reduce_op != "sum" or not comm.sends
                or not comm.receives or len(plan.team) < 2 or not isinstance(wait, Wait)
                or wait.communication.handle is not comm.handle):
            return False
        g = plan.dim or 0
        sliced = _operand_dims(gemm, g)
        whole = self._whole(body, partial)
        allowed: list[HostNode] = [gemm, comm, wait] + ([whole[1]] if whole is not None and whole[1] is not None else [])
        if (not sliced or whole is None or not self._only_used_by(partial, allowed)
                or not self._pays(Pattern.gemm_reduce_scatter, body, [gemm], len(plan.team))):
            return False
        buffer, select, alloc = whole
        team, rank = plan.team, comm.rank
        parts, pos = len(team), team.index(rank)
        backend = self._transport(team)
        index = body.loop.index if body.loop is not None else None
        label = str(comm.handle.number)
        received = _like(buffer)
        symmetric = self._symmetric(received, buffer, alloc, team, body, backend,
                                    f"the reduce-scatter into {comm.expr.output.short_name}")
        head: list[HostNode] = []
        if select is None:  # top level: the partial sums of the peers' blocks need a buffer of their own
            chunk = received
            head.append(symmetric)
            if not gemm.into:
                head.append(Allocate(partial, symmetric.perm))
        else:
            assert alloc is not None  # _whole gives a loop's select with the allocation it selects from
            self.container.nodes.insert(self.container.nodes.index(alloc), symmetric)
            chunk = _chunk_like(partial, received)
            axis = received.get_logical_domain(no_reductions=True)[select.dim]
            head.append(HirAliasSelect(chunk, received, axis, select.index, select.dim))
        steps = [P2PStep(f"{label}.{j}") for j in range(1, parts)]
        mine = self._block(body, chunk, g, parts, pos, like=partial)
        head.append(mine)
        sends = []
        for j in range(1, parts):
            target = (pos + j) % parts
            operands, selects = self._operand_blocks(body, gemm, sliced, parts, target)
            block = self._block(body, partial, g, parts, target)
            send = P2PCommunication(_SEND, block.out, received, team[target], backend, steps[j - 1],
                                    f"{label}.{2 * j - 1}", remote=mine.out, loop_index=index)
            head += [*selects, block, AtenCall(gemm.expr, operands, [block.out], into=True), send]
            sends.append(send)
        out = comm.output_tv
        tail: list[HostNode] = []
        if not comm.into:
            tail.append(Allocate(out, allocation_perm(self.fusion, out)))
        operands, selects = self._operand_blocks(body, gemm, sliced, parts, pos)
        tail += [*selects, AtenCall(gemm.expr, operands, [out], into=True)]
        for j in range(1, parts):
            source = (pos - j) % parts
            block = self._block(body, chunk, g, parts, source, like=partial)
            recv = P2PCommunication(_RECV, block.out, received, team[source], backend, steps[j - 1],
                                    f"{label}.{2 * j}", loop_index=index)
            tail += [block, recv, P2PWait(recv), BlockUpdate(out, block.out, "add")]
        tail += [P2PWait(s) for s in sends]
        tail += self._released(body, received, team, backend)
        body.nodes[at:at + 2] = tail
        body.nodes[k:k + 1] = head
        return True

def _static_shape(tv: Val) -> list[int] | None:
    """This rank's extents of ``tv`` when every one is known at compile time, else None."""
    assert isinstance(tv, TensorView)
    shape = tensor_shape(tv)
    if any(extent.free_names() for extent in shape):
        return None
    return [extent.evaluate({}) for extent in shape]


def _output_dim(gemm: AtenCall, operand: int, dim: int) -> int | None:
    """The output dim that ``dim`` of the GEMM's ``operand`` becomes; None for the contracted dim."""
    expr = gemm.expr
    source = expr.inputs[operand]
    assert isinstance(source, TensorView)
    target = expr.logical_map(source).get(source.get_logical_domain(no_reductions=True)[dim])
    if target is None or target.is_reduction():
        return None
    return expr.output.get_logical_domain(no_reductions=True).index(target)


def _operand_dims(gemm: AtenCall, out_dim: int) -> dict[int, int]:
    """Per operand (position) the dim that produces output dim ``out_dim``: what a block of the output reads."""
    expr = gemm.expr
    target = expr.output.get_logical_domain(no_reductions=True)[out_dim]
    found = {}
    for position, source in enumerate(expr.inputs):
        assert isinstance(source, TensorView)
        mapping = expr.logical_map(source)
        for dim, i in enumerate(source.get_logical_domain(no_reductions=True)):
            if mapping.get(i) is target and not i.is_broadcast():
                found[position] = dim
    return found


def _shard_select(tv: TensorView, dim: int, parts: int, index: int, dropped: int | None) -> ShardSelect:
    """Block ``index`` of ``parts`` along run-time dim ``dim`` of ``tv``, with a fresh tensor for the view.
    ``dropped``: the dim a stream loop's chunk keeps at run time but not in its logical domain (a plain
    stream ID), so run-time dims past it are one further right than logical positions."""
    ids = tv.get_logical_domain(no_reductions=True)
    position = dim - 1 if dropped is not None and dim > dropped else dim
    block_ids = [IterDomain(tv.fusion, i.extent // parts, i.iter_type) if d == position
                 else i.clone(keep_parallel=i.is_device_dim) for d, i in enumerate(ids)]
    block = TensorView(tv.fusion, TensorDomain(block_ids), tv.dtype, MemoryType.Local)
    block.device_mesh = tv.device_mesh
    return ShardSelect(block, tv, ids[position], dim, parts, index)


def _like(tv: TensorView) -> TensorView:
    """A new global tensor shaped like ``tv`` (reductions dropped), on its mesh."""
    ids = [i.clone() for i in tv.get_logical_domain(no_reductions=True)]
    fresh = TensorView(tv.fusion, TensorDomain(ids), tv.dtype, MemoryType.Global)
    fresh.device_mesh = tv.device_mesh
    return fresh


def _chunk_like(chunk: TensorView, whole: TensorView) -> TensorView:
    """The per-iteration view of ``whole`` shaped like ``chunk`` (another buffer's chunk)."""
    ids = [i.clone(keep_parallel=i.is_device_dim) for i in chunk.get_logical_domain(no_reductions=True)]
    view = TensorView(whole.fusion, TensorDomain(ids), whole.dtype, MemoryType.Local)
    view.device_mesh = whole.device_mesh
    return view
