"""Turning a scheduled fusion into what runs it: one generated kernel, or the launches of a
grid reduction in order (``KernelSequence``), each compiled, which run as one cooperative launch
where the device holds all programs of the first at once."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from pyfuser.codegen.compiled_kernel import CompiledKernel, load_kernel
from pyfuser.codegen.cooperative import cooperative_source
from pyfuser.codegen.kernel_builder import KernelBuilder, Layouts
from pyfuser.codegen.kernel_source import KernelSource
from pyfuser.codegen.launcher import (
    Bound,
    BoundFunction,
    BoundParam,
    DirectLaunches,
    Variant,
    ahead_device,
    bound_launch,
    raw_stream,
)
from pyfuser.codegen.scatter import ScatterKernelBuilder, init_layouts, scatter_op, split_scatter
from pyfuser.codegen.values import L2Hint
from pyfuser.ir.analysis.allocation_order import allocation_perm
from pyfuser.ir.eval_context import EvalContext, NoPrograms
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.layout import Layout, dense_strides
from pyfuser.ir.ops.indexing import IndexPutOp, check_indices
from pyfuser.ir.tensor_view import TensorView


class Launch(Protocol):
    """What a ``KernelSequence`` launches: a compiled kernel, or kernels of their own in order (the
    parts of a segment split for some sizes, each compiled per size bucket)."""

    @property
    def code(self) -> str: ...

    def run(self, ctx: EvalContext, *args: Any, out: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]: ...

    def bind(self, ctx: EvalContext, args: Sequence[Any]) -> tuple[list[torch.Tensor], Bound | None]: ...


class KernelSequence:
    """Kernels launched one after another on a segment's inputs; a later one reads what an earlier
    one wrote (a grid reduction's partial results, a split segment's per-row statistics). Runs like
    one ``CompiledKernel``."""

    def __init__(self, name: str, kernels: Sequence[Launch], reads: list[list[int]], outputs: list[int],
                 output_perms: tuple[tuple[int, ...], ...]) -> None:
        """``reads[k]``: the slots kernel ``k`` takes (the segment's inputs, then every kernel's
        outputs in launch order); ``outputs``: the slots of the segment's outputs."""
        self.name = name
        self.kernels = kernels
        self._reads = reads
        self._outputs = outputs
        self.output_perms = output_perms
        self.scheduled_ir = ""
        #: the heuristics it was scheduled with (set by the runtime; None for a manual schedule)
        self.scheduler_params: object = None

    @property
    def code(self) -> str:
        return "\n".join(k.code for k in self.kernels)

    def run(self, ctx: EvalContext, *args: Any, out: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        slots: list[Any] = list(args)
        for kernel, reads in zip(self.kernels, self._reads, strict=True):
            slots.extend(kernel.run(ctx, *[slots[s] for s in reads]))
        return _deliver([slots[s] for s in self._outputs], out)

    def bind(self, ctx: EvalContext, args: Sequence[Any]) -> tuple[list[torch.Tensor], Bound | None]:
        """Run on ``args``, and return with the outputs the launches bound for a bound program's later
        calls, one after another (None unless every kernel's binds: see ``CompiledKernel.bind``)."""
        slots: list[Any] = list(args)
        runs = []
        for kernel, reads in zip(self.kernels, self._reads, strict=True):
            outputs, run = kernel.bind(ctx, [slots[s] for s in reads])
            slots.extend(outputs)
            runs.append(run)
        results = [slots[s] for s in self._outputs]
        bound = [run for run in runs if run is not None]
        if len(bound) < len(runs):
            return results, None
        steps, kept = [(b.run, reads) for b, reads in zip(bound, self._reads, strict=True)], self._outputs

        def run_bound(args: Sequence[Any]) -> list[torch.Tensor] | None:
            slots = list(args)
            for run, reads in steps:
                outputs = run([slots[s] for s in reads])
                if outputs is None:  # an argument's alignment changed: the caller runs the launchers
                    return None
                slots.extend(outputs)
            return [slots[s] for s in kept]

        return results, BoundFunction(run_bound)


def _deliver(results: list[torch.Tensor], out: Sequence[torch.Tensor] | None) -> list[torch.Tensor]:
    """The results, or ``out`` with them copied in."""
    if out is None:
        return results
    for buffer, result in zip(out, results, strict=True):
        buffer.copy_(result)
    return list(out)


#: Per (device, stream): the counter of the grid synchronizations of the kernels launched there.
_COUNTERS: dict[tuple[str, int | None, Any], torch.Tensor] = {}
_SM_COUNT: dict[int, int] = {}
#: Cooperative launches by this process (tests count them).
cooperative_launches = 0
#: At most this many programs of the steps after a synchronization per program of the launch. The
#: launch's programs take on the later steps' programs one after another, each a dependent load, a
#: reduction and a store; past two such rounds a launch per step (whose final steps' programs all run
#: at once) is faster. H200, bf16 16384x8192, 132 programs: rmsnorm backward (256 final programs)
#: 3835 / 3819 / 3821 GB/s as one launch, 3817 / 3785 / 3807 as two; layernorm backward (2 x 256)
#: 3541 / 3593 / 3543 as one, 3628 / 3613 / 3625 as three.
COOPERATIVE_ROUNDS = 2


def resident_programs(device: torch.device) -> int:
    """Programs that surely run at once: one per SM on a GPU (any kernel that compiles fits one);
    one in Triton's interpreter, which runs programs one after another."""
    if device.type == "meta" and (ahead := ahead_device()) is not None:  # a rehearsal's (``compiling_ahead``)
        device = torch.device("cuda", ahead)
    if device.type != "cuda":
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def _counter(device: torch.device) -> torch.Tensor:
    """The grid synchronizations' counter of the current stream: launches on one stream run one
    after another, and each leaves the counter usable by the next."""
    stream = raw_stream(device.index) if device.type == "cuda" else 0
    key = (device.type, device.index, stream)
    counter = _COUNTERS.get(key)
    if counter is None:
        counter = _COUNTERS[key] = torch.zeros(1, dtype=torch.int32, device=device)
    return counter


class CooperativeSequence(KernelSequence):
    """A grid reduction's kernels as one launch: the steps of ``cooperative_source``, separated by
    grid synchronizations. Launched so when the first step's programs fit on the device at once and
    the later steps need at most ``COOPERATIVE_ROUNDS`` of them, else (or when a step has nothing to
    run) as the sequence of launches."""

    kernels: Sequence[CompiledKernel]  # its steps are compiled kernels, joined into one launch's source

    def __init__(self, name: str, kernels: list[CompiledKernel], reads: list[list[int]], outputs: list[int],
                 output_perms: tuple[tuple[int, ...], ...], target: str, inputs: int) -> None:
        """``inputs``: how many inputs the segment has (the slots before the kernels' outputs)."""
        super().__init__(name, kernels, reads, outputs, output_perms)
        # A step synchronizes with every program first when it reads what a step since the last
        # synchronization wrote.
        made_by, slot = {}, inputs
        for k, kernel in enumerate(kernels):
            for _ in kernel.source.output_shapes:
                made_by[slot], slot = k, slot + 1
        barriers, phase = [], {0}
        #: the steps after each synchronization, which share out the launch's programs
        self._phases: list[list[int]] = []
        for k in range(1, len(kernels)):
            needs = any(made_by.get(s) in phase for s in reads[k])
            barriers.append(needs)
            phase = {k} if needs else phase | {k}
            if needs or k == 1:
                self._phases.append([])
            self._phases[-1].append(k)
        self.cooperative_code = cooperative_source(name, [k.source for k in kernels], target, barriers)
        self._launches = DirectLaunches(load_kernel(name, self.cooperative_code), kernels[0].num_warps, name,
                                        self.cooperative_code, cooperative=True, interpreted=target != "cuda",
                                        device_asserts=any(k.source.device_asserts for k in kernels),
                                        narrow_warps=kernels[0].narrow_warps)

    @property
    def code(self) -> str:
        """The steps, then what joins them into one launch (the grid synchronization and the kernel
        that calls the steps as device functions)."""
        joined = self.cooperative_code[self.cooperative_code.index("@_jit\ndef _grid_sync"):]
        return super().code + "\n# As one cooperative launch where the first step's programs fit on the device:\n" + joined

    def _prepared(self, ctx: EvalContext, args: Sequence[Any]) -> tuple[list[Any], list[Any]] | None:
        """(slots: the arguments then every step's outputs, (kernel, grid, params) per step) for one
        cooperative launch, or None where the steps run as a sequence of launches: a step with
        nothing to run, more programs in the first than the device holds at once, or later steps
        with more than ``COOPERATIVE_ROUNDS`` programs per program of the first."""
        slots: list[Any] = list(args)
        steps = []
        for kernel, reads in zip(self.kernels, self._reads, strict=True):
            outputs, grid, params = kernel.prepare(ctx, *[slots[s] for s in reads])
            if grid is None:  # empty outputs: the plain sequence knows what to skip
                return None
            slots.extend(outputs)
            steps.append((kernel, (*grid, *(1,) * (3 - len(grid))), params))
        programs = math.prod(steps[0][1])
        if programs > resident_programs(slots[len(args)].device):
            return None
        if any(sum(math.prod(steps[k][1]) for k in phase) > COOPERATIVE_ROUNDS * programs for phase in self._phases):
            return None
        return slots, steps

    def _launch(self, steps: list[Any], device: torch.device) -> Variant | None:
        """Launch the steps as one cooperative launch; returns the variant launched, counting its
        launches, for a bound launch (None: no variant to call directly)."""
        params = [p for _, _, step_params in steps for p in step_params]
        params += [g for _, grid, _ in steps[1:] for g in grid]
        params.append(_counter(device))
        key = (tuple(k.key(p) for k, _, p in steps), tuple((g == 1, g % 16 == 0) for _, grid, _ in steps[1:]
                                                       for g in grid))
        index = device.index if device.index is not None else -1  # (-1: not a CUDA device, as ``get_device``)
        self._launches.launch(key, steps[0][1], params, index)
        if device.type == "meta":  # a rehearsal's (``compiling_ahead``): nothing launched
            return None
        variant = self._launches.variant(key, index)

        global cooperative_launches
        cooperative_launches += 1
        if variant is None:
            return None

        run = variant.launch

        def launch(grid: tuple[int, ...], params: list[Any], stream: Any) -> None:
            global cooperative_launches
            run(grid, params, stream)
            cooperative_launches += 1

        return Variant(launch)

    def run(self, ctx: EvalContext, *args: Any, out: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        prepared = self._prepared(ctx, args)
        if prepared is None:  # a launch per step, each by its own launcher
            return super().run(ctx, *args, out=out)
        slots, steps = prepared
        self._launch(steps, slots[len(args)].device)
        return _deliver([slots[s] for s in self._outputs], out)

    def bind(self, ctx: EvalContext, args: Sequence[Any]) -> tuple[list[torch.Tensor], Bound | None]:
        """``KernelSequence.bind`` for one cooperative launch: the steps' parameters, grids and counter
        recorded as one bound launch."""
        prepared = self._prepared(ctx, args)
        if prepared is None:
            return super().bind(ctx, args)
        slots, steps = prepared
        device = slots[len(args)].device
        launch = self._launch(steps, device)
        if launch is None:  # no variant to call directly
            return [slots[s] for s in self._outputs], None
        entries: list[BoundParam] = []
        first_output = len(args)
        for (kernel, _, params), reads in zip(steps, self._reads, strict=True):
            step_entries = kernel.bound_params(reads, first_output, params)
            if step_entries is None:
                return [slots[s] for s in self._outputs], None
            entries += step_entries
            first_output += len(kernel.source.output_shapes)
        entries += [("value", g) for _, grid, _ in steps[1:] for g in grid]
        entries.append(("counter", None))
        return [slots[s] for s in self._outputs], bound_launch(
            args, slots[len(args):], entries, self._outputs, steps[0][1], launch, lambda stream: _counter(device))


@dataclass
class ScatterKernels:
    """The kernels of a scatter segment and the segment input each of their inputs is. ``init``
    computes ``acc`` (None: ``acc`` is input ``acc_slot``, copied); ``scatter`` adds into the buffer
    (its first input, not in ``scatter_reads``); ``values`` computes the rows added (None: they are
    input ``value_slot``), for ATen's deterministic ``index_put`` when torch asks for one."""

    init: CompiledKernel | None
    init_reads: list[int]
    scatter: CompiledKernel
    scatter_reads: list[int]
    values: CompiledKernel | None
    value_reads: list[int]
    acc_slot: int
    value_slot: int
    index_slot: int
    #: the segment's op: added or stored rows, negative indices wrapped, the tensors an index error names
    op: IndexPutOp


class ScatterSequence(KernelSequence):
    """A scatter segment's launches (``codegen/scatter.py``): ``acc`` computed into a fresh buffer
    (the first kernel; a copy of ``acc`` where it is a segment input), then the atomic adds of the
    second kernel into that buffer, which is the segment's output. Under
    ``torch.use_deterministic_algorithms(True)`` (turned on after the segment was compiled: a
    segment compiled under it is ATen's) the rows are computed and added by ATen's sorted
    ``index_put`` instead."""

    def __init__(self, name: str, kernels: ScatterKernels, output_perm: tuple[int, ...], target: str) -> None:
        launched = [k for k in (kernels.init, kernels.scatter) if k is not None]
        reads = [kernels.init_reads, [-1, *kernels.scatter_reads]][-len(launched):]
        super().__init__(name, launched, reads, [], (output_perm,))
        self.parts = kernels
        self._target = target

    def _buffer(self, ctx: EvalContext, args: Sequence[Any]) -> torch.Tensor:
        k = self.parts
        if k.init is not None:
            return k.init.run(ctx, *[args[s] for s in k.init_reads])[0]
        return self._copied_acc(args)

    def _copied_acc(self, args: Sequence[Any]) -> torch.Tensor:
        acc = args[self.parts.acc_slot]
        buffer = torch.empty_strided(acc.shape, dense_strides(acc.shape, self.output_perms[0]), dtype=acc.dtype,
                                     device=acc.device)
        return buffer.copy_(acc)

    def _check_on_host(self, index: torch.Tensor, buffer: torch.Tensor, deterministic: bool) -> None:
        """The index check where no device assert makes it: Triton's interpreter, ATen's deterministic
        ``index_put`` (which checks only what it does not add)."""
        op = self.parts.op
        check_indices(op.op_name, index, op.tensor_input(1), buffer.shape[0], op.tensor_input(0), 0,
                      allow_negative=op.wrap_negative, asserted_by_aten=deterministic and not op.accumulate)

    def run(self, ctx: EvalContext, *args: Any, out: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        k = self.parts
        buffer = self._buffer(ctx, args)
        index, op = args[k.index_slot], k.op
        deterministic = torch.are_deterministic_algorithms_enabled()
        if deterministic or self._target != "cuda":
            self._check_on_host(index, buffer, deterministic)
        if deterministic:
            values = k.values.run(ctx, *[args[s] for s in k.value_reads])[0] if k.values is not None \
                else args[k.value_slot]
            return _deliver([buffer.index_put_((index,), values.to(buffer.dtype), accumulate=op.accumulate)], out)
        try:
            k.scatter.run(ctx, buffer, *[args[s] for s in k.scatter_reads], out=[buffer])
        except NoPrograms:  # no rows to add: the buffer is the result
            pass
        return _deliver([buffer], out)

    def bind(self, ctx: EvalContext, args: Sequence[Any]) -> tuple[list[torch.Tensor], Bound | None]:
        """Run on ``args``, and return with the outputs the launches bound for a bound program's later
        calls: the buffer (the init kernel's bound launch, or a fresh copy of ``acc``), then the scatter's
        bound launch writing into it. Nothing bound under deterministic algorithms (ATen's
        ``index_put``), where no rows are added, or where a launch cannot be bound."""
        k = self.parts
        if torch.are_deterministic_algorithms_enabled():
            return self.run(ctx, *args), None
        init_bound: Bound | None = None
        if k.init is not None:
            (buffer,), init_bound = k.init.bind(ctx, [args[s] for s in k.init_reads])
        else:
            buffer = self._copied_acc(args)
        on_host = self._target != "cuda"
        if on_host:
            self._check_on_host(args[k.index_slot], buffer, False)
        scatter_args = [buffer, *[args[s] for s in k.scatter_reads]]
        try:
            _, grid, params = k.scatter.prepare(ctx, *scatter_args, out=[buffer])
        except NoPrograms:
            return [buffer], None
        if grid is None:
            return [buffer], None
        launch = k.scatter.launch(grid, params)
        entries = k.scatter.bound_params(range(len(scatter_args)), 0, params)  # its output: the buffer
        scatter = None if launch is None or entries is None else bound_launch(
            scatter_args, [], entries, [0], (*grid, *(1,) * (3 - len(grid))), launch)
        if scatter is None or (k.init is not None and init_bound is None):
            return [buffer], None
        init_run = init_bound.run if init_bound is not None else None
        init_reads, scatter_reads, index_slot, scatter_run = k.init_reads, k.scatter_reads, k.index_slot, scatter.run
        deterministic = torch.are_deterministic_algorithms_enabled

        def run_bound(args: Sequence[Any]) -> list[torch.Tensor] | None:
            if deterministic():  # turned on since: the caller runs ``run``, which calls ATen's index_put
                return None
            if init_run is None:
                buffer = self._copied_acc(args)
            else:
                made = init_run([args[s] for s in init_reads])
                if made is None:  # an argument's alignment changed: the caller runs the launchers
                    return None
                buffer = made[0]
            if on_host:
                self._check_on_host(args[index_slot], buffer, False)
            if scatter_run([buffer, *[args[s] for s in scatter_reads]]) is None:
                return None
            return [buffer]

        return [buffer], BoundFunction(run_bound)


def compile_scatter(fusion: Fusion, name: str, target: str, layouts: Layouts, reference: TensorView,
                    num_warps: int) -> ScatterSequence:
    """The launches of a scheduled scatter segment (see ``ScatterSequence``)."""
    op = scatter_op(fusion.exprs())
    assert op is not None
    parts = split_scatter(fusion, op, reference)
    out = fusion.outputs()[0]
    assert isinstance(out, TensorView)
    slot_of = {_key(v): k for k, v in enumerate(fusion.inputs())}

    def compiled(part: Fusion | None, ref: TensorView | None, kind: str, part_layouts: Layouts) -> CompiledKernel | None:
        if part is None or ref is None:
            return None
        return CompiledKernel(KernelBuilder(part, f"{name}_{kind}", target, part_layouts, ref,
                                            l2=L2Hint.none).build(), num_warps)

    def reads(part: Fusion | None) -> list[int]:
        return [] if part is None else [slot_of[_key(v)] for v in part.inputs()]

    # Each value is read once: nothing to keep in L2 (the rows of the index are, by every element).
    launch = f"{name}_{'add' if op.accumulate else 'store'}"
    scatter = CompiledKernel(ScatterKernelBuilder(parts.scatter, launch, target, layouts, parts.scatter_reference,
                                                  l2=L2Hint.none).build(), num_warps)
    acc, index, value = op.inputs
    kernels = ScatterKernels(
        compiled(parts.init, parts.init_reference, "init", init_layouts(layouts, parts, out.name)), reads(parts.init),
        scatter, [slot_of[_key(v)] for v in parts.scatter.inputs()[1:]],
        compiled(parts.values, parts.values_reference, "values", layouts), reads(parts.values),
        slot_of.get(_key(acc), -1), slot_of.get(_key(value), -1), slot_of[_key(index)], op)
    perm = layouts[out.name].perm if out.name in layouts else tuple(range(out.ndim))
    return ScatterSequence(name, kernels, tuple(perm), target)


@dataclass
class KernelPart:
    """One launch of a scheduled segment: its fusion, the tensor whose loop nest it runs and its warps per
    program (0: the segment's, which its first launch was scheduled for). A segment with grid reductions
    is several (``scheduler/grid_reduction.py`` decides them); any other, one."""

    fusion: Fusion
    reference: TensorView
    num_warps: int = 0


def build_sources(parts: Sequence[KernelPart], name: str, target: str, layouts: Layouts, loop_stages: int = 0,
                  chunked: bool = False, l2: L2Hint = L2Hint.keep) -> list[tuple[KernelPart, KernelSource]]:
    """The kernels of a scheduled segment's launches (``parts``, in launch order), each with its part."""
    if len(parts) == 1:
        part = parts[0]
        return [(part, KernelBuilder(part.fusion, name, target, layouts, part.reference, loop_stages,
                                     chunked, l2).build())]
    result = []
    for k, part in enumerate(parts):
        part_layouts = dict(layouts)
        for tv in (*part.fusion.inputs(), *part.fusion.outputs()):
            if isinstance(tv, TensorView) and tv.name not in part_layouts:  # a partial: dense, in its allocation order
                dims = tv.get_logical_domain(no_reductions=True)
                part_layouts[tv.name] = Layout.dense(allocation_perm(part.fusion, tv), [i.is_broadcast() for i in dims])
        partials = frozenset(tv.name for tv in part.fusion.inputs() if isinstance(tv, TensorView)
                             and tv.name not in layouts)
        kind = "final" if k == len(parts) - 1 else f"partial{k}"
        stages = loop_stages if k == 0 else 0  # the final step is small
        result.append((part, KernelBuilder(part.fusion, f"{name}_{kind}", target, part_layouts,
                                                  part.reference, stages, chunked, l2,
                                                  partials).build()))
    return result


def compile_fusion(fusion: Fusion, parts: Sequence[KernelPart], name: str, target: str, layouts: Layouts,
                   num_warps: int = 4, loop_stages: int = 0, chunked: bool = False, cooperative: bool = True,
                   l2: L2Hint = L2Hint.keep, narrow_warps: int = 0) -> CompiledKernel | KernelSequence:
    """Build and compile the kernel(s) of scheduled ``fusion``, launched as ``parts`` (``chunked``: it runs in
    a stream loop; ``cooperative``: a grid reduction's launches become one where its programs fit on the
    device; ``l2``: what the loads ask of L2; ``narrow_warps``: the warps of variants whose
    rows load narrower than 16 bytes, ``DirectLaunches.warps_of``)."""
    op = scatter_op(fusion.exprs())
    if op is not None and len(parts) == 1 and op.inputs[2] is parts[0].reference:
        # the scatter scheduler's: the added rows' loop nest
        return compile_scatter(fusion, name, target, layouts, parts[0].reference, num_warps)
    built = build_sources(parts, name, target, layouts, loop_stages, chunked, l2)
    if len(built) == 1:
        return CompiledKernel(built[0][1], num_warps, narrow_warps)
    slot_of = {_key(v): k for k, v in enumerate(fusion.inputs())}
    kernels, reads = [], []
    perm_of: dict[int, tuple[int, ...]] = {}
    next_slot = len(fusion.inputs())
    for part, source in built:
        reads.append([slot_of[_key(v)] for v in part.fusion.inputs()])
        # a final step launched on its own runs on its tile's warps (joined into one cooperative launch, every
        # step runs on the first's)
        kernels.append(CompiledKernel(source, part.num_warps, 0) if part.num_warps else
                       CompiledKernel(source, num_warps, narrow_warps))
        for v, perm in zip(part.fusion.outputs(), source.output_perms, strict=True):
            slot_of[_key(v)] = next_slot
            perm_of[next_slot] = tuple(perm)
            next_slot += 1
    outputs = [slot_of[_key(v)] for v in fusion.outputs()]
    perms = tuple(perm_of[s] for s in outputs)
    if cooperative:
        return CooperativeSequence(name, kernels, reads, outputs, perms, target, len(fusion.inputs()))
    return KernelSequence(name, kernels, reads, outputs, perms)


def _key(v: Any) -> Any:
    return v.name if isinstance(v, TensorView) else ("s", v.symbol)
