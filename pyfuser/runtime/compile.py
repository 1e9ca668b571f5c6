"""The compile pipeline: fusion -> (preseg passes) -> program, with dumps along the way."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from pyfuser.ir.fusion import Fusion
from pyfuser.ir.tensor_view import TensorView
from pyfuser.preseg.pipeline import run_preseg_passes
from pyfuser.runtime.context import EvalContext
from pyfuser.runtime.options import dump_enabled
from pyfuser.runtime.outputs import OutputLayout

if TYPE_CHECKING:
    from pyfuser.runtime.executor import CompileOptions


def compile_fusion(fusion: Fusion, options: CompileOptions) -> ReferenceProgram:
    """Passes rewrite a private copy: the user's definition and schedule stay as written."""
    if dump_enabled("fusion_ir"):
        print(fusion)
        print(fusion.transforms_string())
    if dump_enabled("fusion_ir_math"):
        fusion.print_math()
    fusion = copy.deepcopy(fusion)
    run_preseg_passes(fusion, options)
    return ReferenceProgram(fusion)


class ReferenceProgram:
    """Evaluates the fusion's exprs in order with their torch reference implementations."""

    def __init__(self, fusion: Fusion) -> None:
        self.exprs = fusion.exprs()
        self.inputs = fusion.inputs()
        self.outputs = fusion.outputs()
        self.layouts = [OutputLayout.of(fusion, tv) for tv in self.outputs if isinstance(tv, TensorView)]
        self._consts = {id(v): v.value for e in self.exprs for v in e.inputs
                        if getattr(v, "is_const", False)}

    def run(self, args: Sequence[Any], ctx: EvalContext) -> list[torch.Tensor]:
        values: dict[int, Any] = dict(self._consts)
        for val, arg in zip(self.inputs, args, strict=True):
            values[id(val)] = arg
        for expr in self.exprs:
            results = expr.evaluate(ctx, *[values[id(v)] for v in expr.inputs])
            for out, result in zip(expr.outputs, results, strict=True):
                values[id(out)] = result
        storages = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        return [layout.conform(values[id(tv)], storages) for tv, layout in zip(self.outputs, self.layouts, strict=True)]
