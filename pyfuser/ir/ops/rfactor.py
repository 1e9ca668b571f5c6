"""Reduction rfactor: split one reduction into a partial reduction and a final one (nvFuser's
``TensorView::rFactor``).

``tv = reduce(x)`` with loop domain ``[..., rA, rB]`` (both derived from its reduction IDs by
splits and merges) becomes, for ``tv.rfactor([pos of rA])``:

* ``partial = reduce(x)`` over ``rA`` only: its root domain is a copy of ``tv``'s logical domain,
  and its logical domain holds the split products of the reduced IDs, ``rA`` still a reduction and
  ``rB`` now an iteration ID (nvFuser's rfactor-product domain);
* ``tv = reduce(partial)`` over ``rB``, with a fresh reduction ID in its place.

The result is the same up to the order of additions; each step can then be parallelized on its
own (a serial per-lane step, then a tile reduction; or partial results per program, then a final
step over programs: a grid reduction).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from pyfuser.ir.base import Expr, PythonCall
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.iter_domain import IdTransform, IterDomain, IterType, Merge, Split
from pyfuser.ir.ops.common import header, int_list
from pyfuser.ir.ops.matmul import LinearOp, MatmulOp
from pyfuser.ir.ops.reduction import ReductionOp, ReductionOpType, VarMeanOp
from pyfuser.ir.ops.shape import LoadStoreOp
from pyfuser.ir.tensor_domain import TensorDomain, transforms_between

if TYPE_CHECKING:
    from pyfuser.ir.fusion import Fusion
    from pyfuser.ir.tensor_view import TensorView


def identity_value(kind: ReductionOpType, dtype: torch.dtype) -> float | int:
    """The value that leaves a reduction of ``kind`` unchanged (what pads a non-divisible split)."""
    if kind in (ReductionOpType.sum, ReductionOpType.mean):
        return 0
    if kind is ReductionOpType.prod:
        return 1
    if dtype.is_floating_point:
        return float("-inf") if kind is ReductionOpType.max else float("inf")
    if dtype is torch.bool:
        return kind is ReductionOpType.min
    info = torch.iinfo(dtype)
    return info.min if kind is ReductionOpType.max else info.max


class RFactorOp(ReductionOp):
    """The partial step of an rfactored reduction: ``out``'s root domain maps ``in``'s logical
    domain; its logical domain is the root after the reduced IDs' splits and merges, reduced at the
    rfactored IDs (``axes``: their positions in ``out``'s logical domain)."""

    def evaluate(self, ctx: EvalContext, x: torch.Tensor) -> list[Any]:
        out = self.output
        domain = out.domain()
        assert domain.root is not None
        dims: list[IterDomain] = list(domain.root)
        pad = identity_value(self.kind, x.dtype)
        for t in transforms_between(domain.root, domain.logical):
            x, dims = _apply(t, x, dims, pad, ctx)
        x = x.permute([dims.index(i) for i in domain.logical])
        dtype = out.dtype.torch_dtype
        kind = ReductionOpType.sum if self.kind is ReductionOpType.mean else self.kind
        return [kind.spec.fn(x, self.axes, dtype) if self.axes else x.to(dtype)]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return _map_to_root(producer, self.output)

    def python_call(self) -> PythonCall:
        raise ValueError(f"{self.output.short_name} is the partial result of an rfactored reduction, a scheduling "
                         "step with no fd.ops form; print the fusion definition before scheduling it")

    def to_string(self, indent: int = 0) -> str:
        spec = self.kind.spec
        return (f"{header(self.output, indent)}reduction( {self.inputs[0]}, op = {spec.printed}, "
                f"initial value = {self.output.dtype.value}({spec.init}), allreduce = false, rfactor )\n")


class WelfordPartialOp(VarMeanOp):
    """The partial step of an rfactored var_mean: ``avg, m2, n = welford(in)`` over the rfactored IDs
    (domains as ``RFactorOp``'s): each partial's mean, sum of squared deviations from it and count,
    which ``WelfordCombineOp`` combines (partials of unequal counts: a split that does not divide)."""

    def __init__(self, fusion: Fusion, avg: TensorView, m2: TensorView, n: TensorView, inp: TensorView,
                 axes: list[int]) -> None:
        Expr.__init__(self, fusion, [inp], [avg, m2, n])
        self.axes = tuple(sorted(axes))
        self.correction = 0

    def evaluate(self, ctx: EvalContext, x: torch.Tensor) -> list[Any]:
        domain = self.output.domain()
        assert domain.root is not None
        dims: list[IterDomain] = list(domain.root)
        x = x.double()
        valid = torch.ones_like(x)
        for t in transforms_between(domain.root, domain.logical):
            valid, _ = _apply(t, valid, dims, 0, ctx)
            x, dims = _apply(t, x, dims, 0, ctx)
        order = [dims.index(i) for i in domain.logical]
        x, valid = x.permute(order), valid.permute(order)
        n = valid.sum(self.axes, keepdim=True)
        mean = (x * valid).sum(self.axes, keepdim=True) / n.clamp_min(1)
        m2 = ((x - mean) * valid).square().sum(self.axes)
        avg, deviations, count = self.tensor_outputs
        return [mean.sum(self.axes).to(avg.dtype.torch_dtype), m2.to(deviations.dtype.torch_dtype),
                n.sum(self.axes).to(count.dtype.torch_dtype)]

    def logical_map(self, producer: TensorView) -> dict[IterDomain, IterDomain]:
        return _map_to_root(producer, self.output)

    def python_call(self) -> PythonCall:
        raise ValueError(f"{self.output.short_name} is a partial result of an rfactored var_mean, a scheduling "
                         "step with no fd.ops form; print the fusion definition before scheduling it")

    def to_string(self, indent: int = 0) -> str:
        avg, m2, n = self.outputs
        outs = f"{avg}(Avg),\n   {m2}(Var),\n   {n}(Count)"
        return f"{header(outs, indent)}Welford ( {self.inputs[0]}, dims = {int_list(self.axes)}, rfactor )\n"


class WelfordCombineOp(VarMeanOp):
    """The final step of an rfactored var_mean: ``var, mean`` from the partials' ``avg, m2, n`` over
    ``axes`` (Chan's combine: the counts weigh the means, the means' deviations add to ``m2``)."""

    def __init__(self, fusion: Fusion, var: TensorView, mean: TensorView, avg: TensorView, m2: TensorView,
                 n: TensorView, axes: list[int], correction: int) -> None:
        Expr.__init__(self, fusion, [avg, m2, n], [var, mean])
        self.axes = tuple(sorted(axes))
        self.correction = correction

    def evaluate(self, ctx: EvalContext, *partials: torch.Tensor) -> list[Any]:
        avg, m2, n = (p.double() for p in partials)  # three inputs where a var_mean has one
        total = n.sum(self.axes, keepdim=True)
        mean = (avg * n).sum(self.axes, keepdim=True) / total
        deviations = (m2 + n * (avg - torch.where(total > 0, mean, 0.0)).square()).sum(self.axes)
        var = deviations / (total.sum(self.axes) - self.correction).clamp_min(0)
        var_out, mean_out = self.tensor_outputs
        return [var.to(var_out.dtype.torch_dtype), mean.sum(self.axes).to(mean_out.dtype.torch_dtype)]

    def python_call(self) -> PythonCall:
        raise ValueError(f"{self.output.short_name} finishes an rfactored var_mean, a scheduling step with no "
                         "fd.ops form; print the fusion definition before scheduling it")

    def to_string(self, indent: int = 0) -> str:
        var, mean = self.outputs
        outs = f"{var},\n   {mean}"
        return (f"{header(outs, indent)}var_mean( {', '.join(str(v) for v in self.inputs)}, dims = "
                f"{int_list(self.axes)}, correction = {self.correction}, welford combine )\n")


def _map_to_root(producer: TensorView, partial: TensorView) -> dict[IterDomain, IterDomain]:
    """A partial step's logical map: the producer's logical IDs to the partial's root (the domain the
    rfactor split and merged into its logical one)."""
    root = partial.domain().root
    assert root is not None
    return dict(zip(producer.get_logical_domain(no_reductions=True), root, strict=False))


def _apply(t: IdTransform, x: torch.Tensor, dims: list[IterDomain], pad: float | int,
           ctx: EvalContext) -> tuple[torch.Tensor, list[IterDomain]]:
    """Apply one split / merge of reduced IDs to the tensor (a split that does not divide is padded
    with the reduction's identity, as the generated kernel masks it)."""
    if isinstance(t, Split):
        d = dims.index(t.in_id)
        size = x.shape[d]
        factor = int(t.factor.evaluate(ctx.env))
        parts = -(-size // factor)
        outer, inner = (parts, factor) if t.inner_split else (factor, parts)
        if outer * inner != size:
            spec = [0, 0] * (x.ndim - 1 - d) + [0, outer * inner - size]
            x = F.pad(x, spec, value=pad) if x.dtype is not torch.bool else \
                F.pad(x.to(torch.uint8), spec, value=int(pad)).to(torch.bool)
        return x.unflatten(d, (outer, inner)), [*dims[:d], t.outer, t.inner, *dims[d + 1:]]
    assert isinstance(t, Merge)
    a, b = dims.index(t.outer), dims.index(t.inner)
    rest = [k for k in range(len(dims)) if k not in (a, b)]
    order = [*rest[:min(a, len(rest))], a, b, *rest[min(a, len(rest)):]]
    x = x.permute(order)
    at = order.index(a)
    new_dims = [dims[k] for k in order]
    return x.flatten(at, at + 1), [*new_dims[:at], t.out, *new_dims[at + 2:]]


def rfactor(tv: TensorView, axes: Sequence[int]) -> TensorView:
    """Split ``tv``'s reduction: the loop axes ``axes`` are reduced into a new partial tensor,
    which ``tv`` then reduces over its remaining reduction axes. Returns the partial tensor."""
    expr = tv.definition
    name = tv.short_name
    if isinstance(expr, (MatmulOp, LinearOp)):
        _checked_positions(tv, axes)  # every split piece of K adds into one sum: which ones is a schedule
        return _rfactor_contraction(tv, expr)
    if not isinstance(expr, ReductionOp) or isinstance(expr, RFactorOp):
        what = type(expr).__name__ if expr is not None else "no definition (a fusion input)"
        raise ValueError(f"{name} cannot be rfactored: only a sum / prod / max / min / mean reduction, a matmul or "
                         f"a linear can, and {name} is produced by {what}")
    positions = _checked_positions(tv, axes)
    fusion = tv.fusion
    split = _Factored(tv, positions)
    partial = split.partial(_partial_dtype(tv.dtype))
    split.install()
    x = expr.tensor_input(0)
    x.uses[:] = [e for e in x.uses if e is not expr]
    kind = ReductionOpType.sum if expr.kind is ReductionOpType.mean else expr.kind
    partial_op = RFactorOp(fusion, kind, partial, x, split.partial_axes)
    count = expr.count_ids or split.reduced_copies
    final = ReductionOp(fusion, expr.kind, tv, partial, split.final_axes,
                        count_ids=count if expr.kind is ReductionOpType.mean else ())
    final.name = expr.name
    partial_op.compensated = final.compensated = expr.compensated  # a schedule's choice, kept by both steps
    fusion.mark_changed()
    return partial


def _rfactor_contraction(tv: TensorView, expr: MatmulOp | LinearOp) -> TensorView:
    """The rfactor of a matmul or linear (an ATen contraction over one reduction ID, ``K``) as pyfuser
    represents partial sums: the contraction writes a copy of ``tv`` (``partial``, the same logical domain
    and loop transforms), which ``tv = set(partial)`` combines. The loop axes left to ``tv``'s reduction
    (those not rfactored) are the ones whose blocks' sums ``partial`` keeps apart: parallelized on a device
    dim (nvFuser's row-parallel matmul: ``K`` split ``d`` ways, the outer part on ``mesh_x``), each rank's
    contraction of its shards gives its block's sums, and the set is their all-reduce. Elsewhere ``partial``
    already holds the sum over every block (one GEMM computes all of them), and the set copies it.
    Deliberate difference (``docs/multidevice.md``): nvFuser's partial has those axes as iteration IDs;
    here they stay reduction IDs of the same loop positions, so ``axis(k)`` names the same axis."""
    name = tv.short_name
    if isinstance(expr, LinearOp) and expr.has_bias:
        raise ValueError(f"{name} cannot be rfactored: it is a linear with a bias, which every block's partial sum "
                         f"would add once; rfactor linear(x, w) and add the bias to its result")
    logical, loop = tv.get_logical_domain(), tv.get_loop_domain()
    copy: dict[int, IterDomain] = {id(i): i.clone() for i in logical}
    for t in transforms_between(logical, loop):
        _replay(t, copy)
    domain = TensorDomain([copy[id(i)] for i in logical],
                          contiguity=[None if i.is_broadcast() else True for i in logical if not i.is_reduction()])
    domain.loop = [copy[id(i)] for i in loop]
    for i in loop:
        copy[id(i)].parallel_type = i.parallel_type
    partial = type(tv)(tv.fusion, domain, tv.dtype)
    for i in _all_ids(domain):
        i.tensor = partial
    partial.set_device_mesh(tv.device_mesh)
    expr.replace_output(tv, partial)
    LoadStoreOp(tv.fusion, tv, partial)
    tv.fusion.mark_changed()
    return partial


def rfactor_var_mean(var: TensorView, axes: Sequence[int]) -> tuple[TensorView, TensorView, TensorView]:
    """Split a ``var_mean`` (``var`` its first output, scheduled like its mean) as ``rfactor`` splits a
    reduction: Welford's partial results over the loop axes ``axes`` (the mean, the sum of squared
    deviations and the count of each partial: ``WelfordPartialOp``), then their combine over the other
    reduction axes into the var and mean (``WelfordCombineOp``). Returns the three partial tensors."""
    expr = var.definition
    if not isinstance(expr, VarMeanOp) or isinstance(expr, WelfordPartialOp) or expr.tensor_outputs[0] is not var:
        raise ValueError(f"{var.short_name} is not the variance of a var_mean: rfactor_var_mean splits var_means")
    positions = _checked_positions(var, axes)
    mean = expr.tensor_outputs[1]
    if len(mean.get_loop_domain()) != len(var.get_loop_domain()):
        raise ValueError(f"{mean.short_name} is not scheduled like {var.short_name}: a var_mean's outputs are "
                         "split together")
    fusion = var.fusion
    dtype = DataType.Double if var.dtype is DataType.Double else DataType.Float
    splits = [_Factored(var, positions), _Factored(mean, positions), _Factored(var, positions)]
    partials = (splits[0].partial(dtype), splits[1].partial(dtype), splits[2].partial(DataType.Double))
    splits[0].install()
    splits[1].install()
    x = expr.tensor_inputs[0]
    x.uses[:] = [e for e in x.uses if e is not expr]
    WelfordPartialOp(fusion, *partials, x, splits[0].partial_axes)
    final = WelfordCombineOp(fusion, var, mean, *partials, splits[0].final_axes, expr.correction)
    final.name = expr.name
    fusion.mark_changed()
    return partials


def _checked_positions(tv: TensorView, axes: Sequence[int]) -> list[int]:
    loop = tv.get_loop_domain()
    name = tv.short_name
    positions = []
    for axis in axes:
        pos = axis + len(loop) if axis < 0 else axis
        if not 0 <= pos < len(loop):
            raise ValueError(f"{name}: rfactor axis {axis} is out of range for its {len(loop)} loop axes")
        if not loop[pos].is_reduction():
            raise ValueError(f"{name}: rfactor axis {pos} ({loop[pos]}) is not a reduction axis; rfactor only "
                             "splits reduction axes")
        positions.append(pos)
    reduction_axes = [k for k, i in enumerate(loop) if i.is_reduction()]
    if not positions:
        raise ValueError(f"{name}: rfactor needs at least one reduction axis to factor out")
    if set(positions) == set(reduction_axes):
        raise ValueError(f"{name}: rfactor of every reduction axis ({reduction_axes}) leaves no final reduction; "
                         "leave at least one reduction axis to tv")
    return positions


class _Factored:
    """A reduction tensor's rfactor at loop ``positions``: the partial tensor's domain (root = a copy
    of the tensor's logical domain, the reduced IDs replayed into its logical domain, the factored
    ones still reductions) and the tensor's new domain (its iteration IDs, a fresh reduction ID for
    each reduction axis left), built from the tensor's current domain; ``install`` gives it the new one."""

    def __init__(self, tv: TensorView, positions: list[int]) -> None:
        self.tv = tv
        loop = tv.get_loop_domain()
        factored = {id(loop[p]) for p in positions}
        fusion = tv.fusion
        domain = tv.domain()
        logical = domain.logical
        reduced_roots = [i for i in logical if i.is_reduction()]
        reduction_transforms = transforms_between(reduced_roots, [i for i in loop if i.is_reduction()])
        copy: dict[int, IterDomain] = {id(i): i.clone() for i in logical}
        for t in reduction_transforms:
            _replay(t, copy)
        for i in loop:
            if i.is_reduction():
                mine = copy[id(i)]
                mine.iter_type = IterType.Reduction if id(i) in factored else IterType.Iteration
                mine.parallel_type = i.parallel_type
        partial_logical: list[IterDomain] = []
        loop_reductions = [i for i in loop if i.is_reduction()]
        for root in logical:
            if not root.is_reduction():
                partial_logical.append(copy[id(root)])
                continue
            for i in loop_reductions:
                if root in _logical_sources(i, reduced_roots) and copy[id(i)] not in partial_logical:
                    partial_logical.append(copy[id(i)])
        self.partial_domain = TensorDomain(partial_logical, root=[copy[id(i)] for i in logical],
                                           contiguity=[None if i.is_broadcast() else True for i in partial_logical
                                                       if not i.is_reduction()])
        # The partial's loop: tv's iteration transforms replayed onto its iteration IDs, same order.
        iteration_transforms = transforms_between([i for i in logical if not i.is_reduction()],
                                                  [i for i in loop if not i.is_reduction()])
        for t in iteration_transforms:
            _replay(t, copy)
        self.partial_domain.loop = [copy[id(i)] for i in loop]
        for i in loop:
            copy[id(i)].parallel_type = i.parallel_type
        self.reduced_copies = tuple(copy[id(i)] for i in reduced_roots)
        # tv: its iteration IDs stay; each reduction axis left becomes a fresh reduction ID.
        fresh = {id(i): IterDomain(fusion, i.extent, IterType.Reduction, i.parallel_type)
                 for i in loop if i.is_reduction() and id(i) not in factored}
        by_partial = {id(copy[k]): v for k, v in fresh.items()}
        new_logical = [by_partial[id(i)] if id(i) in by_partial else next(j for j in logical if copy[id(j)] is i)
                       for i in partial_logical if not i.is_reduction()]
        self.new_domain = TensorDomain(new_logical, contiguity=list(domain.contiguity))
        self.new_domain.loop = [fresh.get(id(i), i) for i in loop if id(i) not in factored]
        if domain.allocation is not None:
            self.new_domain.allocation = [i for i in domain.allocation if not i.is_reduction()] + list(fresh.values())
            self.new_domain.allocation_is_hint = domain.allocation_is_hint
        self.partial_axes = [k for k, i in enumerate(partial_logical) if i.is_reduction()]
        self.final_axes = [k for k, i in enumerate(new_logical) if i.is_reduction()]

    def partial(self, dtype: DataType) -> TensorView:
        partial = type(self.tv)(self.tv.fusion, self.partial_domain, dtype)
        for i in _all_ids(self.partial_domain):
            i.tensor = partial
        return partial

    def install(self) -> None:
        self.tv._domain = self.new_domain
        for i in _all_ids(self.new_domain):
            i.tensor = self.tv


def _partial_dtype(dtype: DataType) -> DataType:
    """Partial results of half-precision reductions are kept in float32 (as they accumulate)."""
    return DataType.Float if dtype in (DataType.Half, DataType.BFloat16) else dtype


def _replay(t: IdTransform, copy: dict[int, IterDomain]) -> None:
    if isinstance(t, Split):
        new = Split(copy[id(t.in_id)], t.factor, t.inner_split)
        copy[id(t.outer)], copy[id(t.inner)] = new.outer, new.inner
    else:
        assert isinstance(t, Merge)
        merged = Merge(copy[id(t.outer)], copy[id(t.inner)])
        copy[id(t.out)] = merged.out


def _logical_sources(i: IterDomain, logical: list[IterDomain]) -> list[IterDomain]:
    """The logical IDs ``i`` is derived from."""
    found: list[IterDomain] = []
    stack = [i]
    while stack:
        node = stack.pop()
        if any(node is j for j in logical):
            found.append(node)
        elif node.definition is not None:
            stack.extend(node.definition.inputs)
    return found


def _all_ids(domain: TensorDomain) -> list[IterDomain]:
    start = domain.root if domain.root is not None else domain.logical
    ids = {id(i): i for i in (*start, *domain.logical, *domain.loop, *(domain.allocation or ()))}
    for t in transforms_between(start, [*domain.loop, *domain.logical]):
        for i in (*t.inputs, *t.outputs):
            ids[id(i)] = i
    return list(ids.values())
