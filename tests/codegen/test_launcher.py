"""The generated host launcher's direct path (CUDA): compiled variants are keyed by Triton's
argument specializations and launched through the compiled kernel's runner after the first call."""

from __future__ import annotations

from typing import Any

import torch

from pyfuser import FusionDefinition, ParallelType
from pyfuser.codegen.kernel_builder import KernelBuilder
from pyfuser.codegen.launcher import DirectLaunches, launcher_source
from pyfuser.ir.eval_context import EvalContext
from pyfuser.schedule import parallelize_like, transform_like


class _Compiled:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.run = object()

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        return lambda *params, stream: self.log.append(f"direct {grid}")


class _JitFunction:
    """Stands in for a ``triton.jit`` function: dispatch through it compiles (logs) and returns the kernel."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def call(*params: Any, num_warps: int) -> _Compiled:
            self.log.append(f"dispatch {grid}")
            return _Compiled(self.log)
        return call


def test_variants_by_specialization_then_direct_launches() -> None:
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(fd.define_tensor([-1, -1])))
    fusion = fd.fusion
    out = fusion.outputs()[0]
    out.merge(0)
    out.split(0, 128)
    out.axis(0).parallelize(ParallelType.grid_x)
    out.axis(1).parallelize(ParallelType.block_x)
    transform_like(out)
    parallelize_like(out)
    source = KernelBuilder(fusion, "k", "cuda", {}, out).build()
    code, namespace = launcher_source(source, 4, direct=True)
    fn = _JitFunction()
    namespace["fn"] = fn
    namespace["launches"] = DirectLaunches(fn, 4)
    exec(compile(code, "<launcher>", "exec"), namespace)
    run = namespace["run"]
    ctx = EvalContext(device=torch.device("cpu"))
    x = torch.randn(64, 33)
    run(ctx, x)
    run(ctx, x)
    run(ctx, torch.randn(64, 32))  # a size now a multiple of 16: another variant
    run(ctx, torch.randn(64, 34)[:, 1:])  # an unaligned tensor (and a stride of 34): another variant
    assert fn.log == ["dispatch (17, 1, 1)", "direct (17, 1, 1)", "dispatch (16, 1, 1)", "dispatch (17, 1, 1)"]
