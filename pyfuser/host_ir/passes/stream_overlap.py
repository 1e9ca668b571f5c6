"""Stream overlap (opt-in, ``_enable_options=["stream_overlap"]``): let iterations of a stream loop run
concurrently.

In seed 002's loop every iteration starts with its worker waiting for the user's stream and ends
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
    FOR StreamIdx in iS{( min(<iterations>, numberOfStreams) )}:
      Synchronize Stream ( StreamIdx % numberOfStreams )

Memory stays safe: buffers are allocated on the user's stream before the loop and the user's stream
joins every worker before anything after the loop; slot ``k`` of a ring buffer is only ever used by
worker ``k``, so its reuse is stream-ordered.
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


def overlap_stream_loops(container: HostIrContainer, options: CompileOptions) -> None:
    result: list[HostNode] = []
    for node in container.nodes:
        if not _is_stream_loop(node):
            result.append(node)
            continue
        get_main, set_worker, wait_main = node.body[:3]
        set_main = node.body[-2]  # the per-iteration join (body[-1]) becomes the join loop below
        node.body = [set_worker, wait_main, *node.body[3:-2]]
        workers = sym_min(node.stop, NUMBER_OF_STREAMS)
        join_index = LoopIndex(workers, SymConst(1))
        join_worker_stream = container.new_worker_stream(join_index)
        join = ForLoop(join_index, IterDomain(container.fusion, workers), SymConst(0), workers,
                       [Synchronize(join_worker_stream)])
        result += [get_main, node, set_main, join]
    container.nodes = result
