"""CUDA-graph replay of compiled programs: a program's kernels, ATen calls and stream switches are
captured once per input signature and replayed, so a cached execution costs one graph launch plus
the copies in and out instead of one host dispatch per node.

A graph reads fixed addresses, so each captured graph owns static copies of its inputs (one
batched copy before each replay), except the inputs the caller declares *static* (a model's
parameters): those are read where they live, and their addresses are part of the graph's key (a
moved parameter is a new capture, never a stale read). Outputs are copied out of the graph's
buffers after each replay (one batched copy), so a result never changes under the caller when the
graph runs again. Scalar inputs are baked into the captured kernels' arguments: their values are
part of the key too. One graph per key, so a new input size (or bucket of sizes the caller rounds
to) captures once and replays from then on; at most ``max_graphs`` are kept (least recently used
dropped, freeing its memory).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.tensor_view import TensorView

Run = Callable[[list[Any]], list[torch.Tensor]]


class CaptureError(RuntimeError):
    """The program cannot be captured (it synchronizes with the host, say); it names the program."""


def _span(t: torch.Tensor) -> int:
    """Elements between a tensor's first and last addressed element, inclusive."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))


class _StaticInput:
    """A graph-owned buffer with an input's sizes and strides, refreshed before each replay."""

    def __init__(self, example: torch.Tensor) -> None:
        self.overlapping = any(s == 0 and n > 1 for n, s in zip(example.shape, example.stride(), strict=True))
        if self.overlapping:  # expanded (stride 0): copy the addressed span, view it the same way
            self.flat = torch.empty(_span(example), dtype=example.dtype, device=example.device)
            self.view = self.flat.as_strided(example.shape, example.stride(), 0)
        else:
            self.view = torch.empty_strided(example.shape, example.stride(), dtype=example.dtype, device=example.device)
            self.flat = self.view

    def source(self, arg: torch.Tensor) -> torch.Tensor:
        if self.overlapping:
            return arg.as_strided((self.flat.numel(),), (1,), arg.storage_offset())
        return arg


class CapturedGraph:
    """One captured execution: static inputs, the graph, its output buffers."""

    def __init__(self, run: Run, args: Sequence[Any], static_inputs: frozenset[int], pool: Any, name: str) -> None:
        self.inputs: list[Any] = []
        self.copies: list[tuple[int, _StaticInput]] = []
        for k, a in enumerate(args):
            if isinstance(a, torch.Tensor) and k not in static_inputs and a.device.type == "cuda":
                buffer = _StaticInput(a)
                buffer.flat.copy_(buffer.source(a))
                self.copies.append((k, buffer))
                self.inputs.append(buffer.view)
            else:
                self.inputs.append(a)
        device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"), None)
        if device is None:
            raise CaptureError(f"{name}: no CUDA tensor among the inputs; only CUDA programs are captured")
        self.graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm up: lazy initialization, kernel compilation, workspaces
            run(list(self.inputs))
        torch.cuda.current_stream(device).wait_stream(side)
        try:
            with torch.cuda.graph(self.graph, pool=pool):
                self.outputs = run(list(self.inputs))
        except RuntimeError as e:
            raise CaptureError(f"{name}: the program cannot be captured into a CUDA graph: {e}") from e
        self._copy_dst = [b.flat for _, b in self.copies]

    def replay(self, args: Sequence[Any]) -> list[torch.Tensor]:
        if self.copies:
            sources = [b.source(args[k]) if b.overlapping else args[k] for k, b in self.copies]
            torch._foreach_copy_(self._copy_dst, sources)
        self.graph.replay()
        results = [torch.empty_like(o) for o in self.outputs]
        if results:
            torch._foreach_copy_(results, self.outputs)
        return results


class CudaGraphRunner:
    """Runs ``run(args)`` by replaying a CUDA graph captured for the arguments' signature."""

    def __init__(self, run: Run, static_inputs: Sequence[int] = (), max_graphs: int = 8, name: str = "program") -> None:
        self.run = run
        self.static_inputs = frozenset(static_inputs)
        self.max_graphs = max_graphs
        self.name = name
        self._graphs: OrderedDict[Hashable, CapturedGraph] = OrderedDict()
        self._pool: Any = None
        #: how many graphs were captured (a test counts re-captures with it)
        self.captures = 0

    def key(self, args: Sequence[Any]) -> tuple[Any, ...]:
        """What a captured graph depends on: every tensor's signature, a static input's address, and
        the values the kernels take as arguments (scalars, 0-dim CPU tensors)."""
        return tuple(self._entry(k, a) for k, a in enumerate(args))

    def _entry(self, k: int, a: Any) -> Hashable:
        if not isinstance(a, torch.Tensor):
            return type(a), a
        if a.device.type == "cpu" and a.dim() == 0:
            return a.dtype, a.device, a.item()
        return a.dtype, a.shape, a.stride(), a.device, a.data_ptr() if k in self.static_inputs else None

    def __call__(self, args: Sequence[Any]) -> list[torch.Tensor]:
        key = self.key(args)
        graph = self._graphs.get(key)
        if graph is None:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = CapturedGraph(self.run, args, self.static_inputs, self._pool, self.name)
            self.captures += 1
            self._graphs[key] = graph
            if len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        return graph.replay(args)


class CudaGraphProgram:
    """A compiled program (``runtime.executor.Program``) for one input signature, run by CUDA-graph
    replay: what ``_enable_options=["cuda_graph"]`` gives ``fd.execute``."""

    def __init__(self, program: Any) -> None:
        self.program = program
        self.output_tvs: list[TensorView] = program.output_tvs
        self._ctx: EvalContext | None = None
        self._runner = CudaGraphRunner(self._run, name=f"the program of {len(self.output_tvs)} outputs")

    def _run(self, args: list[Any]) -> list[torch.Tensor]:
        assert self._ctx is not None  # set by run
        return self.program.run(args, self._ctx)

    def run(self, args: Sequence[Any], ctx: EvalContext) -> list[torch.Tensor]:
        if torch.cuda.is_current_stream_capturing():  # inside a caller's capture (a backend region's): be captured
            return self.program.run(args, ctx)
        self._ctx = ctx  # sizes are the signature's; scalar values are in the graph key
        return self._runner(args)

    @property
    def captures(self) -> int:
        return self._runner.captures

    def __str__(self) -> str:
        return str(self.program)
