"""Kernels compiled per alignment of their integer arguments (``kernel_source.alignment_param``): each
stride and size enters the kernel as a multiple of its alignment class, so a launch that passed the
wrong class would index the wrong elements. Every class, on views whose strides and sizes differ in it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from pyfuser import DataType, FusionDefinition, ParallelType, schedule
from pyfuser.codegen.compiled_kernel import load_kernel
from pyfuser.codegen.kernel_builder import KernelBuilder
from pyfuser.codegen.kernel_source import ALIGNMENTS, KernelSource
from pyfuser.codegen.launcher import launcher_source
from pyfuser.ir.eval_context import EvalContext
from pyfuser.schedule import parallelize_like, transform_like
from pyfuser.scheduler.registry import SchedulerType


def test_alignment_classes() -> None:
    assert [ALIGNMENTS[x & 15] for x in (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 1000, 1500, 4097, 32)] == \
        [16, 1, 2, 1, 4, 2, 8, 4, 16, 8, 8, 4, 1, 16]


@pytest.mark.parametrize("cols", [40, 41, 42, 44, 48])
@pytest.mark.parametrize("pad", [0, 1, 2, 4, 8])
def test_rows_of_every_alignment_normalize_and_sum(cols: int, pad: int, device: str, run_kernels) -> None:
    """A layer norm of bf16 rows (inner) and the column sums of the same view (outer), where the row
    stride (``cols + pad``) and the row length fall in different classes."""
    base = torch.randn(7, cols + pad, generator=torch.Generator().manual_seed(cols * 16 + pad))
    x = base.bfloat16().to(device)[:, :cols]
    with FusionDefinition() as fd:
        tx = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        var, mean = fd.ops.var_mean(tx, [1], correction=0, keepdim=True)
        y = fd.ops.mul(fd.ops.sub(tx, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
        fd.add_output(fd.ops.cast(y, DataType.BFloat16))
    (got,) = run_kernels(fd, [x])
    torch.testing.assert_close(got, torch.nn.functional.layer_norm(x.float(), (cols,)).bfloat16(), rtol=2e-2, atol=2e-2)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.sum(fd.ops.cast(fd.from_pytorch(x), DataType.Float), [0]))
    (got,) = run_kernels(fd, [x])
    torch.testing.assert_close(got, x.float().sum(0))


def _ptx_on_an_h100(source: KernelSource, inputs: list[torch.Tensor], force_alignment: int | None = None) -> str:
    """The PTX of ``source`` compiled for sm_90 on this machine (no GPU needed) with the specializations
    its launcher keys the variant on for ``inputs`` (Triton's: 16-byte aligned pointers, integers equal to
    1 or multiples of 16; pyfuser's: each integer's alignment class, or ``force_alignment``)."""
    triton = pytest.importorskip("triton")
    pytest.importorskip("triton.backends.nvidia")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    code, namespace = launcher_source(source)
    exec(compile(code, "<launcher>", "exec"), namespace)
    _, _, params = namespace["prepare"](EvalContext(device=torch.device("cpu")), inputs, None)
    fn = load_kernel(source.name, source.source)
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], Any] = {}
    for k, (param, value) in enumerate(zip(fn.params, params, strict=True)):
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constexprs[param.name] = force_alignment or value
        elif isinstance(value, torch.Tensor):
            signature[param.name], attrs[(k,)] = _POINTERS[value.dtype], [["tt.divisibility", 16]]
        elif value == 1:
            signature[param.name], constexprs[param.name] = "constexpr", 1
        else:
            signature[param.name] = "i32"
            if value % 16 == 0:
                attrs[(k,)] = [["tt.divisibility", 16]]
    compiled = triton.compile(ASTSource(fn, signature, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    return str(compiled.asm["ptx"])


_POINTERS = {torch.bfloat16: "*bf16", torch.float32: "*fp32"}


def _global_loads_on_an_h100(cols: int, force_alignment: int | None = None) -> set[str]:
    """The PTX global loads of a bf16 kernel over rows of ``cols`` (a row per program along x, 1024
    columns per program along y)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.cast(x, DataType.Float), 2.0), DataType.BFloat16))
    out = fd.fusion.outputs()[0]
    out.split(1, 1024)
    for axis, ptype in enumerate((ParallelType.grid_x, ParallelType.grid_y, ParallelType.block_x)):
        out.axis(axis).parallelize(ptype)
    transform_like(out)
    parallelize_like(out)
    source = KernelBuilder(fd.fusion, "rows_kernel", "cuda", {}, out).build()
    ptx = _ptx_on_an_h100(source, [torch.zeros(4, cols).bfloat16()], force_alignment)
    return {line.split()[1] for line in ptx.splitlines() if "ld.global" in line}


def test_rows_of_a_multiple_of_8_load_16_bytes_at_a_time_on_a_gpu() -> None:
    """bf16 rows of 1000 elements (a row stride and a bound that are multiples of 8, not of 16) load 16
    bytes at a time as rows of 1008 do; compiled as if every integer were of alignment 1 (Triton's own
    specialization alone), each load is an element wide, as rows of 1001 are."""
    wide = _global_loads_on_an_h100(1000)
    assert wide and all(".v4.b32" in load for load in wide), wide
    assert _global_loads_on_an_h100(1008) == wide
    for narrow in (_global_loads_on_an_h100(1000, force_alignment=1), _global_loads_on_an_h100(1001)):
        assert narrow and all(load.endswith(".b16") and ".v" not in load for load in narrow), narrow


@pytest.mark.parametrize(("dtype", "stride", "pipelined"), [
    (torch.float32, 1280, True), (torch.float32, 1282, True), (torch.float32, 1281, False),
    (torch.bfloat16, 1280, True), (torch.bfloat16, 1282, False), (torch.bfloat16, 1281, True)])
def test_a_loop_over_rows_loaded_in_4_byte_pieces_is_not_pipelined(dtype: torch.dtype, stride: int,
                                                                     pipelined: bool) -> None:
    """A row sum looped in steps and software-pipelined three deep, compiled for sm_90 on this machine: its
    variant for a row stride whose alignment makes each load 4 bytes (float32 rows of odd stride, bf16 rows of
    2 mod 4) issues no ``cp.async`` (an asynchronous copy per element; measured 2.4x slower on an H200);
    8- and 16-byte pieces are, and 2-byte pieces load plainly (never asynchronously) in either case."""
    x = torch.zeros(6, stride, dtype=dtype)[:, :1200]
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.sum(fd.ops.cast(fd.from_pytorch(x), DataType.Float), [1]))
        params = schedule.compute_heuristics(fd.fusion, SchedulerType.reduction, [x])
        params = dataclasses.replace(params, shape="loop", tile=256, num_stages=3)
        schedule.schedule(fd.fusion, SchedulerType.reduction, params)
    reference = next(t for t in fd.fusion.tensors() if t.name == params.reference)
    source = KernelBuilder(fd.fusion, "row_sum", "cuda", {}, reference, loop_stages=3).build()
    assert "num_stages=(3 - 2 * (1 - (1 - " in source.source, source.source
    ptx = _ptx_on_an_h100(source, [x])
    assert ("cp.async" in ptx) is (pipelined and not (dtype is torch.bfloat16 and stride % 2)), stride
