"""Grid reductions: a reduction whose reduction axis is parallelized across programs.

Programs of one Triton launch cannot wait for each other, so a grid reduction is two launches
(nvFuser does it in one, with a grid synchronization): the first computes each program's partial
result into a global buffer, the second finishes the reduction over the programs' partials, in
program order (deterministic), together with everything downstream of it.

The partial is the reduction's producer: when the reduction also reduces axes that are not on the
grid, those are factored out first (``rfactor``), so each program reduces them itself. In the
finishing launch the grid axes of the reduction are loops. Both launches are ordinary kernels of
the code generator; ``split_at_grid_reductions`` returns their fusions in launch order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyfuser.codegen.kernel_source import KernelError
from pyfuser.ir.base import Val
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import ParallelType
from pyfuser.ir.ops import ReductionOp, VarMeanOp
from pyfuser.ir.tensor_view import MemoryType, TensorView

GRID_TYPES = frozenset({ParallelType.grid_x, ParallelType.grid_y, ParallelType.grid_z})


@dataclass
class KernelPart:
    """One launch of a split kernel: its fusion and the tensor whose loop nest it runs."""

    fusion: Fusion
    reference: TensorView


def _grid_reduction(fusion: Fusion) -> TensorView | None:
    for expr in fusion.exprs():
        if not isinstance(expr, ReductionOp | VarMeanOp):
            continue
        out = expr.output
        grid = [i for i in out.get_loop_domain() if i.is_reduction and i.parallel_type in GRID_TYPES]
        if not grid:
            continue
        if isinstance(expr, VarMeanOp):
            raise KernelError(f"{out.short_name} axis {out.loop_position(grid[0])} ({grid[0]}) reduces var_mean "
                              f"across programs ({grid[0].parallel_type.name}); Welford's partial results cannot be "
                              "finished in a second step here: reduce it on a tile axis or in a loop")
        return out
    return None


#: Schedules a grid reduction's second launch afresh and returns its reference (automatic schedules;
#: a manual schedule keeps the user's, with the grid axes of the reduction turned into loops).
FinishStep = Callable[[Fusion], TensorView]


def split_at_grid_reductions(fusion: Fusion, reference: TensorView, finish: FinishStep | None = None,
                             ) -> list[KernelPart]:
    """The launches that compute scheduled ``fusion`` (one, unless it has grid reductions)."""
    tv = _grid_reduction(fusion)
    if tv is None:
        return [KernelPart(fusion, reference)]
    loop = tv.get_loop_domain()
    local = [k for k, i in enumerate(loop) if i.is_reduction and i.parallel_type not in GRID_TYPES]
    if local:
        tv.rfactor(local)
    partial = tv.definition.inputs[0]  # type: ignore[union-attr]
    assert isinstance(partial, TensorView)
    if any(partial is v for v in fusion.inputs()):
        # Nothing to compute before the final step: every program reduces its share in a loop.
        _grid_to_loops(tv)
        return split_at_grid_reductions(fusion, reference, finish)
    _check_partial_is_per_program(tv, partial)
    first = fusion.clone(memo := {})
    first_partial = memo[id(partial)]
    assert isinstance(first_partial, TensorView)
    first_partial.memory_type = MemoryType.Global
    independent = [memo[id(o)] for o in fusion.outputs() if not _depends_on(o, tv)]
    first.restrict(_used_inputs(first, [first_partial, *independent]), [first_partial, *independent])  # type: ignore[list-item]
    second = fusion.clone(memo := {})
    second_partial = memo[id(partial)]
    second_tv = memo[id(tv)]
    assert isinstance(second_partial, TensorView) and isinstance(second_tv, TensorView)
    second_partial.memory_type = MemoryType.Global
    rest = [memo[id(o)] for o in fusion.outputs() if _depends_on(o, tv)]
    _grid_to_loops(second_tv)
    second.restrict(_used_inputs(second, rest, stop=second_partial), rest)
    if finish is not None:
        second_reference = finish(second)
    else:
        second_reference = memo[id(reference)] if _depends_on(reference, tv) else rest[0]  # type: ignore[assignment]
    assert isinstance(second_reference, TensorView)
    return [KernelPart(first, first_partial),
            *split_at_grid_reductions(second, second_reference, finish)]


def _grid_to_loops(tv: TensorView) -> None:
    for i in tv.get_loop_domain():
        if i.is_reduction and i.parallel_type in GRID_TYPES:
            i.parallel_type = ParallelType.serial
    tv.fusion.mark_changed()


def _check_partial_is_per_program(tv: TensorView, partial: TensorView) -> None:
    """Each grid axis the final step reduces must be an axis the partial's programs iterate on the
    same parallel type, so every program writes its own partial results."""
    expr = tv.definition
    assert expr is not None
    mapping = expr.logical_map(partial)
    inverse = {id(c): p for p, c in mapping.items()}
    partial_loop = partial.get_loop_domain()
    for i in tv.get_loop_domain():
        if not (i.is_reduction and i.parallel_type in GRID_TYPES):
            continue
        p = inverse.get(id(i))
        if p is None or not any(p is j for j in partial_loop) or p.parallel_type is not i.parallel_type:
            raise KernelError(f"{tv.short_name} axis {tv.loop_position(i)} ({i}) is a grid reduction, but its "
                              f"producer {partial.short_name} does not iterate that axis on {i.parallel_type.name}: "
                              "the partial results per program have no legal final step; parallelize the "
                              f"producer's axis like the reduction's (or rfactor {tv.short_name})")


def _depends_on(val: Val, tv: TensorView) -> bool:
    stack, seen = [val], set()
    while stack:
        v = stack.pop()
        if v is tv:
            return True
        if id(v) in seen or v.definition is None:
            continue
        seen.add(id(v))
        stack.extend(v.definition.inputs)
    return False


def _used_inputs(fusion: Fusion, outputs: list[Val], stop: Val | None = None) -> list[Val]:
    """The fusion inputs (and ``stop``, a tensor computed by an earlier launch) ``outputs`` read."""
    inputs = fusion.inputs()
    input_ids = {id(v) for v in inputs}
    found: dict[int, Val] = {}
    stack, seen = list(outputs), set()
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if v is stop or id(v) in input_ids:
            found[id(v)] = v
            continue
        if v.definition is not None:
            stack.extend(v.definition.inputs)
    ordered = [v for v in inputs if id(v) in found]
    return [stop, *ordered] if stop is not None and id(stop) in found else ordered
