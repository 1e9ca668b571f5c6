"""What one compiled step of a zoo model runs, counted from the compiled program (no timing): pyfuser's
generated kernels by scheduler, the ATen calls inside its regions and the eager ops between them by kind,
and the host synchronizations (ATen calls that read a value back: on a GPU, each waits for the device).

Runs on a CPU (kernels through Triton's interpreter) at the zoo's tiny size: fusion decisions do not depend
on the sizes, but for reductions of at most 7 elements, which are pointwise math
(``preseg/unrolled_reductions.py``): the tiny size's 4 experts make Mixtral's router softmax pointwise, the
default size's 8 do not. Inductor's fusion of the same step: ``TORCH_LOGS=output_code`` on ``backend="inductor"``.

    python benchmarks/fusion_counts.py --models llama,gpt2 --modes training,inference
    python benchmarks/fusion_counts.py --device cuda   # host syncs as a GPU step has them
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch._dynamo

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.model_zoo import build_model, make_batch
from pyfuser.host_ir.nodes import AtenCall, LaunchKernel
from pyfuser.integrations.torch_compile import PyfuserBackend
from pyfuser.integrations.torch_compile.region import FusionRegion

#: ATen ops that compute nothing (a view of their operand's memory): in regions, and in eager
_VIEW_EXPRS = ("Reshape", "Permute", "Squeeze", "Broadcast", "Expand", "Slice", "View", "Select", "Set")
_EAGER_VIEWS = ("view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "expand", "permute", "t", "transpose",
                "detach", "alias", "slice", "select", "as_strided")


@dataclass
class StepCounts:
    """What one step ran: kernels by scheduler, ATen calls in regions and eager ops by kind, host syncs."""

    kernels: collections.Counter[str] = field(default_factory=collections.Counter)
    region_aten: collections.Counter[str] = field(default_factory=collections.Counter)
    eager: collections.Counter[str] = field(default_factory=collections.Counter)
    syncs: collections.Counter[str] = field(default_factory=collections.Counter)
    regions: int = 0

    def compute_eager(self) -> collections.Counter[str]:
        """The eager ops that compute (views and view chains left out)."""
        return collections.Counter({k: n for k, n in self.eager.items()
                                    if k.split(".")[0] not in _EAGER_VIEWS and not k.startswith("view_chain")})

    def line(self) -> str:
        def show(c: collections.Counter[str]) -> str:
            return ", ".join(f"{k} x{n}" for k, n in c.most_common()) or "-"
        compute = {k: n for k, n in self.region_aten.items() if not k.startswith(_VIEW_EXPRS)}
        eager = self.compute_eager()
        return (f"regions {self.regions}; kernels {sum(self.kernels.values())} ({show(self.kernels)}); "
                f"ATen calls in regions (not views) {sum(compute.values())} ({show(collections.Counter(compute))}); "
                f"eager ops (not views) {sum(eager.values())} ({show(collections.Counter(eager))}); "
                f"host syncs {sum(self.syncs.values())} ({show(self.syncs)})")


def _kernel_kind(node: LaunchKernel) -> str:
    params = getattr(node.segment, "scheduler_params", None)
    kind = getattr(params, "scheduler_type", None)
    if kind is not None:
        return str(kind.name)
    return type(params).__name__.removesuffix("Params").lower() if params is not None else node.segment.name


def count_program(backend: PyfuserBackend) -> StepCounts:
    """The kernels and ATen calls of every region's latest program, and the eager ops of every graph."""
    counts = StepCounts()
    for graph in backend.graphs:
        for region in graph.regions:
            counts.regions += 1
            program = region.fec.last_program
            program = getattr(program, "program", program)
            container = getattr(program, "container", None)
            if container is None:
                continue
            for node in container.walk():
                if isinstance(node, LaunchKernel):
                    counts.kernels[_kernel_kind(node)] += 1
                elif isinstance(node, AtenCall):
                    counts.region_aten[type(node.expr).__name__.removesuffix("Op")] += 1
        for node in graph.graph_module.graph.nodes:
            if node.op not in ("call_function", "call_method") or isinstance(node.target, FusionRegion):
                continue
            name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
            if name in ("getitem",):
                continue
            counts.eager[str(name)] += 1
    return counts


#: the profiler's names of the ATen ops that read a device value back to the host (a synchronization on a GPU)
SYNC_EVENTS = ("aten::_local_scalar_dense", "aten::nonzero")


@contextmanager
def counting_syncs() -> Iterator[collections.Counter[str]]:
    """Counts the ATen calls of the block that read a value back to the host (torch.profiler: a dispatch
    mode would make dynamo run the compiled frames eagerly)."""
    syncs: collections.Counter[str] = collections.Counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        yield syncs
    for event in prof.events():
        if event.name in SYNC_EVENTS:
            syncs[event.name.removeprefix("aten::")] += 1


def _step(run: Callable[..., Any], model: torch.nn.Module, kwargs: dict[str, Any], training: bool) -> None:
    if training:
        model.zero_grad(set_to_none=True)
        run(**kwargs).loss.backward()
    else:
        with torch.no_grad():
            run(**kwargs)


def pyfuser_counts(name: str, training: bool, dtype: torch.dtype = torch.float32, device: str = "cpu") -> StepCounts:
    """Counts of one cached step (the third call: regions run their bound programs); on a CPU the kernels
    run through Triton's interpreter, and the host syncs counted are the CPU's (the index checks read back)."""
    torch._dynamo.reset()
    model = build_model(name, "tiny", device).to(dtype).train(training)
    batch = make_batch(name, "tiny", device, dtype=dtype)
    backend = PyfuserBackend(triton_interpreter=torch.device(device).type == "cpu")
    compiled = torch.compile(model, backend=backend)
    for _ in range(2):
        _step(compiled, model, batch.kwargs(training), training)
    with counting_syncs() as syncs:
        _step(compiled, model, batch.kwargs(training), training)
    counts = count_program(backend)
    counts.syncs = syncs
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="llama,gpt2,qwen2,mistral")
    parser.add_argument("--modes", default="training,inference")
    parser.add_argument("--device", default="cpu", help="cpu (Triton's interpreter) or cuda")
    args = parser.parse_args()
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            training = mode == "training"
            counts = pyfuser_counts(name, training, device=args.device)
            print(f"{name} {mode}: {counts.line()}", flush=True)


if __name__ == "__main__":
    main()
