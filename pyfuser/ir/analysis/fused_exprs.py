"""Several exprs run as one (a kernel segment), seen as one expr by the analyses that read
operands and ID maps: stream axes and host loops take a segment's inputs and outputs chunk by chunk
the way they take one expr's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pyfuser.ir.base import Expr, Val, as_tensor

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
        return [t for v in self.inputs if (t := as_tensor(v)) is not None]

    @property
    def tensor_outputs(self) -> list[TensorView]:
        return [t for v in self.outputs if (t := as_tensor(v)) is not None]

    @property
    def output(self) -> TensorView:
        return self.tensor_outputs[0]

    @property
    def op_description(self) -> str:
        return "kernel of " + ", ".join(e.op_description for e in self.exprs)

    def operand_map(self, position: int) -> dict[IterDomain, IterDomain]:
        """The map of the input at ``position`` (a kernel reads each of its inputs once)."""
        tv = as_tensor(self.inputs[position])
        if tv is None:
            raise TypeError(f"{self.op_description}: input {position} is the scalar {self.inputs[position]}; "
                            "only a tensor operand has a logical map")
        return self.logical_map(tv)

    def _trace(self, producer: TensorView) -> tuple[dict[int, list[IterDomain]], Callable[[int], int]]:
        """Through the exprs: every ID's logical IDs of ``producer`` it comes from (in the order they
        reach it), and the exact classes of the IDs (``root``: an ID's class by ``id``)."""
        origins: dict[int, list[IterDomain]] = {id(i): [i] for i in producer.get_logical_domain()}
        parent: dict[int, int] = {}

        def root(k: int) -> int:
            while parent.get(k, k) != k:
                k = parent[k]
            return k

        def follow(a: IterDomain, b: IterDomain) -> None:
            if not (a.is_broadcast() or b.is_broadcast()):  # exact: a broadcast maps to any extent
                parent[root(id(a))] = root(id(b))
            if id(a) in origins:
                found = origins.setdefault(id(b), [])
                found.extend(i for i in origins[id(a)] if all(i is not j for j in found))

        for expr in self.exprs:
            for operand in expr.tensor_inputs:
                for p, c in expr.logical_map(operand).items():
                    follow(p, c)
            outs = expr.tensor_outputs
            for other in outs[1:]:
                for a, b in zip(outs[0].get_logical_domain(), other.get_logical_domain(), strict=True):
                    follow(a, b)
        return origins, root

    def producer_ids_reaching(self, producer: TensorView, consumer_id: IterDomain) -> list[IterDomain]:
        """Every non-broadcast logical ID of ``producer`` that the exprs map onto ``consumer_id`` (an ID
        of the first output) or onto an ID exactly mapped to it (another output's: one loop iterates
        both): two when the kernel reads ``producer`` both directly and transposed (``where(t.permute(1,
        0), t, ...)``, or ``t.permute(1, 0)`` returned beside ``pow(t.permute(1, 0), t)``), so no single
        chunk of ``producer`` serves both reads."""
        origins, root = self._trace(producer)
        return _reaching(origins, root, root(id(consumer_id)))

    def whole_reader(self, producer: TensorView, consumer_id: IterDomain) -> Expr | None:
        """An expr that reads ``producer`` whole along the axis the exprs map onto ``consumer_id`` (its
        map drops the ID of ``producer`` that reaches it, as a ``take_along_axis`` its lookup's gathered
        axis) while its own output iterates that axis: where another expr reads ``producer`` chunked
        along it, one chunk cannot serve both reads. None where there is none."""
        origins, root = self._trace(producer)
        axis = root(id(consumer_id))
        reaching = _reaching(origins, root, axis)
        if not reaching:
            return None
        for expr in self.exprs:
            outs = expr.tensor_outputs
            if not outs or not any(root(id(i)) == axis for i in outs[0].get_logical_domain()):
                continue
            for k, operand in enumerate(expr.inputs):
                if operand is producer and any(i not in expr.operand_map(k) for i in reaching):
                    return expr
        return None

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        """``producer`` logical ID -> first output's logical ID, composed through the exprs (the first
        ID that reaches it); an ID that reaches the first output only through another one (``t9 =
        set(x); t11 = ne(t9, y)``: y's axis meets t9's at t11) maps to the first output's ID exactly
        mapped to it (both iterate one axis: a host loop chunks them together)."""
        origins, root = self._trace(producer)
        result = {origins[id(c)][0]: c for c in self.output.get_logical_domain() if id(c) in origins}
        by_class = {root(id(c)): c for c in reversed(self.output.get_logical_domain())}
        for p in producer.get_logical_domain():
            c = by_class.get(root(id(p)))
            if p not in result and c is not None and not p.is_broadcast() and c not in result.values():
                result[p] = c
        return result


def _reaching(origins: dict[int, list[IterDomain]], root: Callable[[int], int], axis: int) -> list[IterDomain]:
    """The non-broadcast IDs among ``origins`` of the IDs in class ``axis`` (``FusedExprs._trace``)."""
    found: list[IterDomain] = []
    for k, ids in origins.items():
        if root(k) != axis:
            continue
        for i in ids:
            if not i.is_broadcast() and all(i is not j for j in found):
                found.append(i)
    return found
