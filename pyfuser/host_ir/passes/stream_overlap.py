"""Stream overlap (on by default; ``_disable_options=["stream_overlap"]`` keeps the program of docs/stream_lowering.md): let
iterations of a stream loop run concurrently.

In docs/stream_lowering.md's loop every iteration starts with its worker waiting for the user's stream and ends
with the user's stream waiting for the worker, so iteration ``i + 1`` waits for iteration ``i``:
the loop runs on several streams but one iteration at a time. This pass moves the join out of the
loop: workers wait only for the work issued before the loop, and the user's stream waits for every
worker the loop used once, after it::

    GetCurrentStream into Stream 0
    FOR StreamIdx in <stream ID>:
      SetCurrentStream to Stream ( StreamIdx % numberOfStreams )
      Synchronize Stream 0
      ...body...
    SetCurrentStream to Stream 0
    FOR WorkerIdx in iS{( min(<iterations>, numberOfStreams) )}:
      Synchronize Stream ( WorkerIdx % numberOfStreams )

Memory stays safe: buffers are allocated on the user's stream before the loop and the user's stream
joins every worker before anything after the loop; slot ``k`` of a ring buffer is only ever used by
worker ``k``, so its reuse is stream-ordered.

Where it is safe: a loop is overlapped only when every node of its body is ``chunk_local`` (its effects
stay within its iteration's chunks, as for ATen calls, kernels, selects, stream syncs and
communications); a loop holding any other node (a custom node registered at run time, say) keeps the
per-iteration joins.
"""

from __future__ import annotations

from typing import TypeGuard

from pyfuser.host_ir.nodes import NUMBER_OF_STREAMS, ForLoop, HostIrContainer, HostNode, LoopIndex
from pyfuser.host_ir.stream_nodes import GetCurrentStream, SetCurrentStream, Synchronize
from pyfuser.ir.iter_domain import IterDomain
from pyfuser.ir.symbolic import SymConst, sym_min
from pyfuser.options import CompileOptions


def _is_stream_loop(node: HostNode) -> TypeGuard[ForLoop]:
    """A loop as stream lowering emits it: Get / Set worker / Synchronize main ... Set main / Synchronize worker."""
    if not isinstance(node, ForLoop) or len(node.body) < 5:
        return False
    first, last = node.body[:3], node.body[-2:]
    return (isinstance(first[0], GetCurrentStream) and isinstance(first[1], SetCurrentStream)
            and isinstance(first[2], Synchronize) and isinstance(last[0], SetCurrentStream)
            and isinstance(last[1], Synchronize))


def _iterations_independent(loop: ForLoop) -> bool:
    return all(type(n).chunk_local for n in loop.body)


def overlap_stream_loops(container: HostIrContainer, options: CompileOptions) -> None:
    result: list[HostNode] = []
    for node in container.nodes:
        if not _is_stream_loop(node) or not _iterations_independent(node):
            result.append(node)
            continue
        get_main, set_worker, wait_main = node.body[:3]
        set_main = node.body[-2]  # the per-iteration join (body[-1]) becomes the join loop below
        node.body = [set_worker, wait_main, *node.body[3:-2]]
        workers = sym_min(node.stop, NUMBER_OF_STREAMS)
        join_index = LoopIndex(workers, SymConst(1), name="WorkerIdx")
        join_worker_stream = container.new_worker_stream(join_index)
        join = ForLoop(join_index, IterDomain(container.fusion, workers), SymConst(0), workers,
                       [Synchronize(join_worker_stream)])
        result += [get_main, node, set_main, join]
    container.nodes = result
