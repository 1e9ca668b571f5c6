"""CUDA-graph capture (``_enable_options=["cuda_graph"]``, the last host pass): the program's nodes
become the body of one ``CaptureGraph``, whose step captures them into a CUDA graph per key of what
they read and replays it (``host_ir/cuda_graph.py``)::

    CaptureGraph( inputs = ( T0, T1 ), outputs = ( T3 ) ):
      ...the program's nodes...

What runs after the node stays outside the graph: the evaluator's conforming of the outputs (a copy
of one sharing memory with an input or another output, a restride), which it reads through the body.
A program on another device than CUDA is left as it is, with a warning. A multi-device program's
block is ``collective``: its communications (NCCL collectives, the CUDA P2P transport's copies and
stream-side signals) are captured with its kernels, so every rank must call it with the same input
signatures (as for any collective), and its first call of each signature runs without a graph.
"""

from __future__ import annotations

import warnings

from pyfuser.host_ir.cuda_graph import outside_pyfuser
from pyfuser.host_ir.nodes import CaptureGraph, HostIrContainer, HostVal
from pyfuser.ir.analysis.sharding import is_multidevice
from pyfuser.options import CompileOptions


def capture_graph(container: HostIrContainer, options: CompileOptions) -> None:
    device = options.device
    if device.type != "cuda":
        warnings.warn(f"_enable_options=['cuda_graph']: CUDA graphs capture CUDA work only; the fusion runs on "
                      f"{device.type} without one", RuntimeWarning, stacklevel=outside_pyfuser())
        return
    if not container.nodes:  # outputs that are inputs: nothing to capture
        return
    written = {v for node in container.walk() for v in node.outputs}
    outputs: dict[HostVal, None] = {v: None for v in container.outputs if v in written}
    container.nodes = [CaptureGraph(container.nodes, list(outputs), collective=is_multidevice(container.fusion))]
