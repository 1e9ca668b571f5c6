"""A grid reduction's launches as one kernel, its steps separated by grid synchronizations
(nvFuser's grid sync; Inductor's cooperative reductions do the same).

``scheduler/grid_reduction.py`` cuts a fusion into kernels where one step reads what every program of
the step before wrote. On a GPU the cut costs a dependent launch, and the host the launch's time.
Here the steps become device functions of one kernel: every program runs the first step on its own
program ids, waits at a barrier until all programs have written their partial results, then takes
its share of the next step's programs, one after another. The barrier is safe only when all
programs of the launch are resident at once: a cooperative launch (the driver guarantees it, or
refuses the launch), with no more programs than the device runs at a time (the launcher checks).

The barrier is a counter in global memory that every launch leaves as it found it (up to one bit),
so one counter per stream serves every kernel launched on it, and a CUDA graph replays it as is.
"""

from __future__ import annotations

import ast

from pyfuser.codegen.kernel_source import KernelSource
from pyfuser.codegen.triton_support import loop_range

#: The counter's bit that flips once all programs have arrived at the barrier.
_FLIP = 1 << 30

_GRID_SYNC = f'''

@_jit
def _grid_sync(counter, programs):
    """Returns once every program of the launch has called it. Each program adds 1, except the
    first, which adds 2**30 - (programs - 1): the counter's bit 30 flips when the last one arrives
    and its low bits come back to where they were."""
    tl.debug_barrier()  # this program's stores are issued before its arrival is released
    first = (tl.program_id(0) == 0) & (tl.program_id(1) == 0) & (tl.program_id(2) == 0)
    arrived = tl.atomic_add(counter, tl.where(first, {_FLIP} - (programs - 1), 1), sem="release")
    flipped = False
    while not flipped:
        flipped = ((arrived ^ tl.atomic_add(counter, 0, sem="acquire")) & {_FLIP}) != 0
    tl.debug_barrier()
'''


class _ProgramIds(ast.NodeTransformer):
    """``tl.program_id(a)`` -> parameter ``_pid{a}``: a step's programs are the launch's, or (after a
    barrier) ones a program takes on in turn."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        f = node.func
        if (isinstance(f, ast.Attribute) and f.attr == "program_id" and isinstance(f.value, ast.Name)
                and f.value.id == "tl" and len(node.args) == 1 and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, int)):
            return ast.Name(f"_pid{node.args[0].value}", ast.Load())
        return node


def _kernel_def(source: KernelSource) -> tuple[ast.Module, ast.FunctionDef]:
    module = ast.parse(source.source)
    kernel = next(s for s in module.body if isinstance(s, ast.FunctionDef) and s.name == source.name)
    return module, kernel


def cooperative_source(name: str, steps: list[KernelSource], target: str, barriers: list[bool]) -> str:
    """One kernel running ``steps`` (kernels of one prelude, in launch order). ``barriers[k - 1]``:
    step ``k`` reads what a step since the last synchronization wrote, so all programs synchronize
    before it; steps between two synchronizations share out the launch's programs one after another
    (LayerNorm backward's two final steps run side by side). Its parameters: every step's own,
    prefixed ``s{k}_``; then the grid (x, y, z) of each step after the first; then the barrier's
    counter. The launch grid is the first step's."""
    prelude, _ = _kernel_def(steps[0])
    statements = [s for s in prelude.body if not (isinstance(s, ast.FunctionDef) and s.name == steps[0].name)]
    params: list[str] = []
    calls: list[tuple[str, list[str]]] = []
    for k, step in enumerate(steps):
        _, kernel = _kernel_def(step)
        kernel = _ProgramIds().visit(kernel)
        kernel.name = f"{name}_step{k}"
        names = [a.arg for a in kernel.args.args]
        kernel.args.args.extend(ast.arg(f"_pid{a}") for a in range(3))
        statements.append(ast.fix_missing_locations(kernel))
        for a in kernel.args.args[:len(names)]:
            constexpr = a.annotation is not None
            params.append(f"s{k}_{a.arg}" + (": tl.constexpr" if constexpr else ""))
        calls.append((kernel.name, [f"s{k}_{n}" for n in names]))
    grids = [f"g{k}_{a}" for k in range(1, len(steps)) for a in "xyz"]
    body = ["programs = tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2)",
            "me = tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))",
            f"{calls[0][0]}({', '.join(calls[0][1])}, tl.program_id(0), tl.program_id(1), tl.program_id(2))"]
    taken = ""  # programs the steps since the last synchronization took, from the first
    for k, (fn, args) in enumerate(calls[1:], start=1):
        x, y, z = (f"g{k}_{a}" for a in "xyz")
        if barriers[k - 1] or k == 1:
            body.append("_grid_sync(counter, programs)")
            taken = ""
        body.append(f"n{k} = {x} * {y} * {z}")
        start = f"(me + programs - ({taken}) % programs) % programs" if taken else "me"
        body += [f"for q in {loop_range(target)}({start}, n{k}, programs):",
                 f"    {fn}({', '.join(args)}, q % {x}, q // {x} % {y}, q // ({x} * {y}))"]
        taken = f"{taken} + n{k}" if taken else f"n{k}"
    wrapper = (f"@_jit\ndef {name}({', '.join([*params, *grids, 'counter'])}):\n"
               + "\n".join("    " + line for line in body) + "\n")
    return ast.unparse(ast.Module(statements, type_ignores=[])) + "\n" + _GRID_SYNC + "\n\n" + wrapper
