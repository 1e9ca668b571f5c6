"""Host IR passes, in the order they run (one pass per module)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pyfuser.host_ir.nodes import HostIrContainer
from pyfuser.host_ir.passes.ring_buffers import use_ring_buffers
from pyfuser.host_ir.passes.stream_lowering import lower_stream_parallel
from pyfuser.host_ir.passes.stream_overlap import overlap_stream_loops
from pyfuser.multidevice.stream_roots import bind_loop_roots

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion
    from pyfuser.runtime.executor import CompileOptions

HostPass = Callable[[HostIrContainer, "Fusion", "CompileOptions | None"], None]

#: (name, pass) in the order they run.
HOST_PASSES: list[tuple[str, HostPass]] = [
    ("stream_lowering", lower_stream_parallel),
    ("bind_loop_roots", bind_loop_roots),  # multi-device: broadcasts rooted at the stream index
    ("ring_buffers", use_ring_buffers),
    ("stream_overlap", overlap_stream_loops),
]


def run_host_passes(container: HostIrContainer, fusion: Fusion, options: CompileOptions | None) -> None:
    for _name, run in HOST_PASSES:
        run(container, fusion, options)
