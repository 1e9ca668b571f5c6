"""Grid reductions: a reduction whose reduction axis is parallelized across programs, split into the
launches that compute it. Which launches a scheduled segment runs is a scheduling decision, made here
before the code generator sees the segment: it compiles the parts it is handed, in launch order.

A grid reduction is two kernels: the first computes each program's partial result into a global
buffer, the second finishes the reduction over the programs' partials, in program order
(deterministic), together with everything downstream of it. They run as two launches, or, where the
device holds every program of the first at once, as one cooperative launch with a grid
synchronization between them (``codegen/cooperative.py``; nvFuser's grid sync).

The partial is the reduction's producer: when the reduction also reduces axes that are not on the
grid, those are factored out first (``rfactor``), so each program reduces them itself. In the
finishing launch the grid axes of the reduction are loops, scheduled afresh by the reduction
scheduler's rule (``FinishStep``) or, for a schedule written by hand, the user's.
``split_at_grid_reductions`` returns the launches' fusions in launch order.

A var_mean splits into Welford's partial results (each program's mean, sum of squared deviations and
count: ``rfactor_var_mean``), which the final launch combines (Chan's combine, in float64).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from pyfuser.codegen.kernel_sequence import KernelPart
from pyfuser.codegen.kernel_source import KernelError
from pyfuser.ir.base import Val
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import GRID_PARALLEL_TYPES, ParallelType
from pyfuser.ir.ops import ReductionOp, VarMeanOp
from pyfuser.ir.ops.rfactor import WelfordCombineOp, rfactor_var_mean
from pyfuser.ir.tensor_view import MemoryType, TensorView


@dataclass(frozen=True)
class FinalSchedule:
    """How a scheduler scheduled a grid reduction's final step: the tensor whose loop nest it runs and
    the warps its tile was sized for (a final step reads partial results in tiles of its own, not the
    first launch's: run on the first launch's 2 warps, a [64, 128] tile of partials took 254 registers)."""

    reference: TensorView
    num_warps: int


def _grid_reductions(fusion: Fusion) -> list[TensorView]:
    """Reductions with a reduction axis on the grid that no other such reduction feeds."""
    found: list[TensorView] = []
    for expr in fusion.exprs():
        if not isinstance(expr, ReductionOp | VarMeanOp):
            continue
        out = expr.output
        grid = [i for i in out.get_loop_domain() if i.is_reduction() and i.parallel_type in GRID_PARALLEL_TYPES]
        if not grid:
            continue
        if not any(_depends_on(e_input, other) for other in found for e_input in expr.inputs):
            found.append(out)
    return found


#: Schedules a grid reduction's second launch afresh and returns its schedule (automatic schedules;
#: a manual schedule keeps the user's, with the grid axes of the reduction turned into loops), or
#: returns None, leaving it untouched, where the launch keeps the schedule it has (a split
#: normalization: its final step reads the row again, split across programs as the first one).
FinishStep = Callable[[Fusion], FinalSchedule | None]


def split_at_grid_reductions(fusion: Fusion, reference: TensorView, finish: FinishStep | None = None,
                             ) -> list[KernelPart]:
    """The launches that compute scheduled ``fusion`` (one, unless it has grid reductions)."""
    reductions = _grid_reductions(fusion)
    if not reductions:
        return [KernelPart(fusion, reference)]
    split: list[tuple[TensorView, list[TensorView]]] = []  # (reduction, its partial results)
    for tv in reductions:
        local = [k for k, i in enumerate(tv.get_loop_domain()) if i.is_reduction() and i.parallel_type not in GRID_PARALLEL_TYPES]
        if isinstance(tv.definition, VarMeanOp) and not isinstance(tv.definition, WelfordCombineOp):
            if not local:
                grid = next(i for i in tv.get_loop_domain() if i.is_reduction() and i.parallel_type in GRID_PARALLEL_TYPES)
                raise KernelError(f"{tv.short_name} axis {tv.loop_position(grid)} ({grid}) reduces var_mean across "
                                  f"programs ({grid.parallel_type.name}) with no axis reduced within a program: "
                                  "Welford's partial results come from a program's own share (a loop or a tile axis)")
            partials = list(rfactor_var_mean(tv, local))
        else:
            if local:
                tv.rfactor(local)
            partials = _partials_of(tv)
            if any(p is v for p in partials for v in fusion.inputs()):
                _grid_to_loops(tv)  # nothing to compute first: each program reduces its share in a loop
                continue
        for partial in partials:
            _check_partial_is_per_program(tv, partial)
            _grid_axes_outermost(tv, partial)
        split.append((tv, partials))
    if not split:
        return split_at_grid_reductions(fusion, reference, finish)
    # Each launch is a segment's copy: it copies what the launch computes, not the whole fusion twice.
    originals = [p for _, partials in split for p in partials]
    independent = [o for o in fusion.outputs() if not any(_depends_on(o, tv) for tv, _ in split)]
    memo: dict[int, object] = {}
    first = fusion.clone_segment(fusion.inputs_read_by([*originals, *independent]), [*originals, *independent], memo)
    partials = [_copy_of(memo, p) for p in originals]
    for p in partials:
        p.memory_type = MemoryType.Global
    parts = [KernelPart(first, _widest(first, partials[0]))]
    rest = [o for o in fusion.outputs() if any(_depends_on(o, tv) for tv, _ in split)]
    owners = [[tv for tv, _ in split if _depends_on(o, tv)] for o in rest]
    if finish is not None and all(len(owner) == 1 for owner in owners):
        # Each final step on its own, scheduled afresh for its shape.
        for tv, partials in split:
            mine = [o for o, owner in zip(rest, owners, strict=True) if owner[0] is tv]
            parts.extend(_final_step(fusion, mine, partials, _fresh_schedule(finish, tv, reference)))
        return parts
    return [*parts, *_final_step(fusion, rest, originals, lambda f, m: FinalSchedule(
        _keep_schedule(f, m, [tv for tv, _ in split], reference), 0))]


#: Schedules a final step's fusion (given the copy's memo of the original graph) and returns its schedule.
ScheduleStep = Callable[[Fusion, dict[int, object]], FinalSchedule]


def _fresh_schedule(finish: FinishStep, reduction: TensorView, reference: TensorView) -> ScheduleStep:
    """``finish``'s schedule of a final step, or the user's where ``finish`` keeps it."""
    def schedule(fusion: Fusion, memo: dict[int, object]) -> FinalSchedule:
        return finish(fusion) or FinalSchedule(_keep_schedule(fusion, memo, [reduction], reference), 0)
    return schedule


def _partials_of(tv: TensorView) -> list[TensorView]:
    """The tensors grid reduction ``tv`` reduces: its partial results per program (one for a reduction;
    a var_mean rfactored by hand combines three: mean, squared deviations, count)."""
    expr = tv.definition
    partials = expr.tensor_inputs if expr is not None else []
    if not partials:
        raise KernelError(f"{tv.short_name} is a grid reduction without a tensor operand ({expr})")
    return partials


def _copy_of(memo: dict[int, object], tv: TensorView) -> TensorView:
    """``tv``'s copy in a segment copied with ``memo``."""
    copy = memo.get(id(tv))
    if not isinstance(copy, TensorView):
        raise KernelError(f"{tv.short_name} has no copy in its launch's fusion (got {copy!r})")
    return copy


def _widest(fusion: Fusion, partial: TensorView) -> TensorView:
    """The first launch's loop nest: the partial results', unless a tensor it computes iterates more
    loops (a reduction of a step's tile axis inside the loop, rfactored out of the partial).

    Only iterating loop IDs count: a broadcast loop ID (a per-row value's size-1 axis, scheduled
    like the row) opens no loop, so a tensor wide only in broadcasts would give the nest no loop
    for the axes the partial results iterate."""
    depth = _iterated(partial)
    wider = [tv for tv in fusion.tensors() if tv.definition is not None and _iterated(tv) > depth]
    return max(wider, key=_iterated, default=partial)


def _iterated(tv: TensorView) -> int:
    return sum(not i.is_broadcast() for i in tv.get_loop_domain())


def _final_step(fusion: Fusion, outputs: list[Val], partials: list[TensorView],
                schedule: ScheduleStep) -> list[KernelPart]:
    """The launch(es) computing ``outputs`` from the partial results (and the fusion's inputs)."""
    memo: dict[int, object] = {}
    second = fusion.clone_segment(fusion.inputs_read_by(outputs, partials), outputs, memo)
    for p in partials:
        _copy_of(memo, p).memory_type = MemoryType.Global
    final = schedule(second, memo)
    return [replace(part, num_warps=final.num_warps)
            for part in split_at_grid_reductions(second, final.reference, None)]


def _keep_schedule(fusion: Fusion, memo: dict[int, object], reductions: list[TensorView],
                   reference: TensorView) -> TensorView:
    """The user's schedule of the final step, its reductions' grid axes turned into loops."""
    for tv in reductions:
        for sibling in tv.definition.tensor_outputs if tv.definition is not None else [tv]:
            if id(sibling) in memo:
                _grid_to_loops(_copy_of(memo, sibling))
    outputs = [o for o in fusion.outputs() if isinstance(o, TensorView)]
    mapped = memo.get(id(reference))
    kept = [t for t in fusion.tensors() if t is mapped]
    chosen = kept[0] if kept else outputs[0]
    # An output iterating grid axes the reference does not (a split normalization's output, written
    # in shares of the row by the programs of each row) is the loop nest.
    wider = [o for o in outputs if _grid_types(o) > _grid_types(chosen)]
    chosen = max(wider, key=lambda o: len(_grid_types(o))) if wider else chosen
    # A broadcast axis split like the row (a row's sum broadcast back to it) keeps the row's grid and
    # tile axes; where the launch's loop nest has none of them (its outputs are per row), it indexes
    # nothing.
    nest = {i.parallel_type for i in chosen.get_loop_domain()}
    for tv in fusion.tensors():
        for i in tv.get_loop_domain():
            if i.is_broadcast() and i.parallel_type not in nest:
                i.parallel_type = ParallelType.serial
    fusion.mark_changed()
    return chosen


def _grid_types(tv: TensorView) -> set[ParallelType]:
    """The grid axes ``tv`` iterates (a broadcast axis scheduled like the row it is read back into, a
    per-row result's, iterates none)."""
    return {i.parallel_type for i in tv.get_loop_domain()
            if not i.is_reduction() and not i.is_broadcast() and i.parallel_type in GRID_PARALLEL_TYPES}


def _grid_to_loops(tv: TensorView) -> None:
    for i in tv.get_loop_domain():
        if i.is_reduction() and i.parallel_type in GRID_PARALLEL_TYPES:
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
        if not (i.is_reduction() and i.parallel_type in GRID_PARALLEL_TYPES):
            continue
        p = inverse.get(id(i))
        if p is None or not any(p is j for j in partial_loop) or p.parallel_type is not i.parallel_type:
            raise KernelError(f"{tv.short_name} axis {tv.loop_position(i)} ({i}) is a grid reduction, but its "
                              f"producer {partial.short_name} does not iterate that axis on {i.parallel_type.name}: "
                              "the partial results per program have no legal final step; parallelize the "
                              f"producer's axis like the reduction's (or rfactor {tv.short_name})")


def _grid_axes_outermost(tv: TensorView, partial: TensorView) -> None:
    """Lay ``partial`` out with the axes grid reduction ``tv`` reduces across programs outermost, the others
    in logical order: the partial results of one grid position are then contiguous along the kept axes the
    programs tile, which the final step reads a row of partials at a time (a split normalization's final
    step, in a loop over them). H200, softmax over 262144 rows of 128 columns (outermost in memory), 256
    programs per column block: laid out ``[columns, programs]`` each program's loop read one partial per
    column 1 KiB apart, 320 us in all; ``[programs, columns]``, 129 us. A layout given to ``partial`` is
    kept."""
    if partial.has_allocation_domain() or tv.definition is None:
        return
    reduced = {id(p) for p, c in tv.definition.logical_map(partial).items() if c.is_reduction()}
    logical = partial.get_logical_domain()
    grid = [i for i in logical if id(i) in reduced and not i.is_reduction()]
    if grid:
        partial.set_allocation_domain([*grid, *(i for i in logical if id(i) not in reduced or i.is_reduction())],
                                      hint=True)


def _depends_on(val: Val, tv: TensorView) -> bool:
    """Whether ``val`` is computed from ``tv`` or from an output of ``tv``'s definition (a var_mean's
    mean is computed where its variance is)."""
    targets = {id(o) for o in tv.definition.outputs} if tv.definition is not None else {id(tv)}
    stack, seen = [val], set()
    while stack:
        v = stack.pop()
        if id(v) in targets:
            return True
        if id(v) in seen or v.definition is None:
            continue
        seen.add(id(v))
        stack.extend(v.definition.inputs)
    return False
