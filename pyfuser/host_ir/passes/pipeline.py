"""The ordered list of host passes, in one place."""

from __future__ import annotations

from pyfuser.host_ir.nodes import HostIrContainer
from pyfuser.host_ir.passes.ring_buffers import use_ring_buffers
from pyfuser.host_ir.passes.stream_lowering import lower_stream_parallel
from pyfuser.host_ir.passes.stream_overlap import overlap_stream_loops
from pyfuser.ir.pass_manager import Pass, run_passes
from pyfuser.options import CompileOptions, DisableOption, DumpOption, EnableOption

#: In the order they run: loops first, then what rewrites loops.
HOST_PASSES: list[Pass[HostIrContainer]] = [
    Pass("stream_lowering", lower_stream_parallel),
    Pass("ring_buffers", use_ring_buffers, disabled_by=DisableOption.stream_ring_buffers),
    Pass("stream_overlap", overlap_stream_loops, enabled_by=EnableOption.stream_overlap),
]


def _describe(container: HostIrContainer, name: str) -> str:
    return f"Host IR after host pass {name}:\n{container}"


def run_host_passes(container: HostIrContainer, options: CompileOptions) -> None:
    run_passes(HOST_PASSES, container, options, DumpOption.host_ir_passes, _describe)
