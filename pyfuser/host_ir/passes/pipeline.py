"""The ordered list of host passes, in one place."""

from __future__ import annotations

from collections.abc import Sequence

from pyfuser.host_ir.nodes import HostIrContainer
from pyfuser.host_ir.passes.capture_graph import capture_graph
from pyfuser.host_ir.passes.ring_buffers import use_ring_buffers
from pyfuser.host_ir.passes.stream_lowering import lower_stream_parallel
from pyfuser.host_ir.passes.stream_overlap import overlap_stream_loops
from pyfuser.ir.pass_manager import Pass, run_passes
from pyfuser.options import CompileOptions, DisableOption, DumpOption, EnableOption

HostPass = Pass[HostIrContainer]


def host_passes(communication: Sequence[HostPass] = ()) -> list[HostPass]:
    """In the order they run: loops first, then the communication layer's rewrites of loop bodies
    (``communication``, given by ``runtime/backends.py``: this layer cannot import them), then what
    rewrites loops, last what captures the whole program into a CUDA graph."""
    return [
        Pass("stream_lowering", lower_stream_parallel),
        *communication,
        Pass("ring_buffers", use_ring_buffers, disabled_by=DisableOption.stream_ring_buffers),
        Pass("stream_overlap", overlap_stream_loops, disabled_by=DisableOption.stream_overlap),
        Pass("capture_graph", capture_graph, enabled_by=EnableOption.cuda_graph),
    ]


#: The passes of a single-device program.
HOST_PASSES: list[HostPass] = host_passes()


def _describe(container: HostIrContainer, name: str) -> str:
    return f"Host IR after host pass {name}:\n{container}"


def run_host_passes(container: HostIrContainer, options: CompileOptions,
                    passes: Sequence[HostPass] = HOST_PASSES) -> None:
    run_passes(passes, container, options, DumpOption.host_ir_passes, _describe)
