"""Host pass: give loop-rooted broadcasts their loop index (the "shard outermost" pipeline).

When a stream loop runs over a tensor's device-sharded axis, iteration ``i`` needs the shard that rank
``team[i]`` holds. Stream lowering selected a chunk of that input like any other; but each rank holds
only its own shard, so the select is dropped and the broadcast reads the whole local shard, rooted at
``team[StreamIdx]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyfuser.host_ir.nodes import ForLoop, HirAliasSelect, HostIrContainer
from pyfuser.multidevice.communication import Communication, Wait

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion
    from pyfuser.runtime.executor import CompileOptions


def bind_loop_roots(container: HostIrContainer, fusion: Fusion, options: CompileOptions | None) -> None:
    for loop in (n for n in container.walk() if isinstance(n, ForLoop)):
        for comm in [n for n in loop.body if isinstance(n, Communication) and n.plan.root_from_loop]:
            comm.loop_index = loop.index
            select = next((n for n in loop.body if isinstance(n, HirAliasSelect) and n.out is comm.input_tv), None)
            if select is None:
                continue
            waits = [n for n in loop.body if isinstance(n, Wait) and n.communication.handle is comm.handle]
            readers = [n for n in loop.body
                       if n is not select and n is not comm and n not in waits and select.out in n.inputs]
            if readers:
                raise ValueError(f"{select.src.short_name} is sharded along the stream loop's axis, so a host loop "
                                 f"cannot take chunks of it, but {len(readers)} other node(s) read its chunk")
            loop.body.remove(select)
            comm.read_whole_input(select.src)
            for wait in waits:
                wait.inputs = list(comm.inputs)
