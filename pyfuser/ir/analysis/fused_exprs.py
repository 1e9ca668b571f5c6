"""Several exprs run as one (a kernel segment), seen as one expr by the analyses that read
operands and ID maps: stream axes and host loops take a segment's inputs and outputs chunk by chunk
the way they take one expr's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyfuser.ir.base import Expr, Val

if TYPE_CHECKING:
    from pyfuser.ir.iter_domain import IterDomain
    from pyfuser.ir.tensor_view import TensorView


class FusedExprs:
    """``exprs`` (topological order) computing ``outputs`` from ``inputs``."""

    def __init__(self, exprs: Sequence[Expr], inputs: Sequence[Val], outputs: Sequence[Val]) -> None:
        self.exprs = list(exprs)
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.chunkable = all(e.chunkable for e in self.exprs)

    @property
    def tensor_inputs(self) -> list[TensorView]:
        return [v for v in self.inputs if v.is_tensor]  # type: ignore[misc]

    @property
    def tensor_outputs(self) -> list[TensorView]:
        return [v for v in self.outputs if v.is_tensor]  # type: ignore[misc]

    @property
    def output(self) -> TensorView:
        return self.tensor_outputs[0]

    @property
    def op_description(self) -> str:
        return "kernel of " + ", ".join(e.op_description for e in self.exprs)

    def operand_map(self, position: int) -> dict[IterDomain, IterDomain]:
        """The map of the input at ``position`` (a kernel reads each of its inputs once)."""
        return self.logical_map(self.inputs[position])  # type: ignore[arg-type]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        """``producer`` logical ID -> first output's logical ID, composed through the exprs."""
        origin: dict[int, IterDomain] = {id(i): i for i in producer.get_logical_domain()}
        for expr in self.exprs:
            for operand in expr.tensor_inputs:
                for p, c in expr.logical_map(operand).items():
                    if id(p) in origin:
                        origin.setdefault(id(c), origin[id(p)])
            outs = expr.tensor_outputs
            for other in outs[1:]:
                for a, b in zip(outs[0].get_logical_domain(), other.get_logical_domain(), strict=True):
                    if id(a) in origin:
                        origin.setdefault(id(b), origin[id(a)])
        return {origin[id(c)]: c for c in self.output.get_logical_domain() if id(c) in origin}
