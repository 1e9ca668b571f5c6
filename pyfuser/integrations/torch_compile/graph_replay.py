"""The ``cuda_graph`` option on a whole compiled graph: the partitioned ATen graph (its regions and
the eager ops between them, attention and views included) captured into one CUDA graph per input
signature and replayed (what Inductor's ``mode="reduce-overhead"`` does).

One replay costs one graph launch plus the copies of the inputs that move from call to call (the
layer's input, the backward's incoming gradient): parameters, views of them and results of another
captured graph (the activations the forward saved for the backward) are read where they live
(``host_ir.cuda_graph``). A graph that cannot be captured (an op that waits for the host, a CPU
tensor computed in it) runs as before, each region replayed from graphs of its own.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx import GraphModule

from pyfuser.host_ir.cuda_graph import CaptureError, CudaGraphRunner
from pyfuser.integrations.torch_compile.collective_matmul import CollectiveMatmul
from pyfuser.integrations.torch_compile.region import FusionRegion


def capturable(gm: GraphModule) -> str | None:
    """Why ``gm`` cannot be one CUDA graph (None: it can be tried): a value on another device would be
    computed once, at capture."""
    for node in gm.graph.nodes:
        if isinstance(node.target, CollectiveMatmul):
            return f"{node.name} runs a multi-device pipeline, whose transfers are not captured"
        values = node.meta.get("val")
        for v in values if isinstance(values, list | tuple) else [values]:
            if isinstance(v, torch.Tensor) and v.device.type != "cuda":
                return f"{node.name} is a {v.device.type} tensor"
    return None


class GraphReplay:
    """A boxed callable (``fn(args)``, AOTAutograd's convention) running ``forward`` by replay."""

    def __init__(self, forward: Callable[..., Any], regions: Sequence[FusionRegion], name: str,
                 static_inputs: Sequence[int] = (), saved_from: int | None = None) -> None:
        """``static_inputs``: positions AOTAutograd knows keep their address (buffers too, which are no
        parameters), read in place; ``saved_from``: where a training forward's outputs saved for the
        backward start (handed out as the graph's buffers, even small ones)."""
        # On the instance: wrappers AOTAutograd puts around the backward copy the instance's __dict__.
        self._boxed_call = True
        self.forward = forward
        self.regions = list(regions)
        self.name = name
        self.runner: CudaGraphRunner | None = CudaGraphRunner(self._run, static_inputs, name=name,
                                                               handed_from=saved_from)
        for region in self.regions:
            region.use_cuda_graphs(False)

    def _run(self, args: list[Any]) -> list[Any]:
        return list(self.forward(*args))

    def __call__(self, args: list[Any]) -> Any:
        if self.runner is not None:
            try:
                return self.runner(args)
            except CaptureError as e:
                self.fall_back(str(e))
        return self.forward(*args)

    def fall_back(self, why: str) -> None:
        """Run the graph's ops as they come, each region replayed from graphs of its own."""
        warnings.warn(f"{why}; each region is replayed from CUDA graphs of its own instead", stacklevel=3)
        self.runner = None
        for region in self.regions:
            region.use_cuda_graphs(True)

    @property
    def captures(self) -> int:
        """Input signatures captured so far (0 once the graph fell back)."""
        return self.runner.captures if self.runner is not None else 0
