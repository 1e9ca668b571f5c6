"""Ring buffers: an intermediate produced and consumed inside one stream loop keeps only
``numberOfStreams`` chunks (the "possible future optimization" of docs/stream_lowering.md).

Iteration ``i`` uses slot ``i % numberOfStreams``, on worker stream ``i % numberOfStreams``.
Before writing a slot the iteration waits for the stream that last released it (``WaitSlot``);
after the slot's last use it records that release (``ReleaseSlot``). With the default stream
assignment the releasing and the waiting stream coincide, so the wait costs nothing; the events
keep reuse safe for any other assignment.
"""

from __future__ import annotations

from pyfuser.host_ir.nodes import NUMBER_OF_STREAMS, Allocate, ForLoop, HirAliasSelect, HostIrContainer, HostNode
from pyfuser.host_ir.stream_nodes import SlotRelease, SlotWait
from pyfuser.ir.base import Val
from pyfuser.ir.symbolic import sym_min
from pyfuser.ir.tensor_view import MemoryType
from pyfuser.options import CompileOptions


def _references(nodes: list[HostNode], skip: set[int]) -> set[int]:
    """ids of Vals read or written by ``nodes`` (recursing into loops), except nodes in ``skip``."""
    refs: set[int] = set()
    for node in nodes:
        if id(node) in skip:
            continue
        if isinstance(node, ForLoop):
            refs |= _references(node.body, skip)
        else:
            refs.update(id(v) for v in (*node.inputs, *node.outputs))
    return refs


def _ring_candidates(container: HostIrContainer, loop: ForLoop,
                     allocations: dict[int, Allocate]) -> list[HirAliasSelect]:
    """Selects in ``loop`` of buffers that live only inside it: written there, read nowhere else."""
    written = {id(v) for node in loop.body if not isinstance(node, HirAliasSelect) for v in node.outputs}
    outputs = {id(v) for v in container.outputs}
    selects = [n for n in loop.body if isinstance(n, HirAliasSelect) and id(n.out) in written
               and id(n.src) in allocations and id(n.src) not in outputs]
    result = []
    for select in selects:
        skip = {id(loop), id(allocations[id(select.src)])}
        if id(select.src) in _references(container.nodes, skip):
            continue
        if any(id(select.src) in {id(v) for v in (*n.inputs, *n.outputs)}
               for n in loop.body if n is not select):
            continue  # read whole inside the loop as well
        result.append(select)
    return result


def _last_use(body: list[HostNode], chunk: Val) -> int:
    return max(k for k, n in enumerate(body) if any(v is chunk for v in (*n.inputs, *n.outputs)))


def use_ring_buffers(container: HostIrContainer, options: CompileOptions) -> None:
    # Only plain global buffers: a symmetric one is written by peers, whose writes no local event orders.
    allocations = {id(n.tv): n for n in container.nodes if isinstance(n, Allocate) and n.mem_type is MemoryType.Global}
    for loop in [n for n in container.nodes if isinstance(n, ForLoop)]:
        for select in _ring_candidates(container, loop, allocations):
            tv = select.src
            alloc = allocations[id(tv)]
            shape = list(alloc.shape)
            shape[select.dim] = sym_min(NUMBER_OF_STREAMS * loop.index.chunk, shape[select.dim])
            container.nodes[container.nodes.index(alloc)] = Allocate(tv, alloc.perm, shape, alloc.mem_type,
                                                                     alloc.zero_init)
            select.ring = True
            body = loop.body
            release_at = _last_use(body, select.out) + 1
            body.insert(release_at, SlotRelease(tv, loop.index))
            body.insert(body.index(select), SlotWait(tv, loop.index))
