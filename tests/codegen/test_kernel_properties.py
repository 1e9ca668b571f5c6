"""Property: random pointwise / broadcast / permute programs, scheduled automatically or by a random
manual schedule, compute what the ATen evaluator (the oracle) computes."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyfuser import FusionDefinition, ParallelType

UNARY = ["neg", "exp", "sin", "tanh", "sigmoid", "relu", "abs"]
BINARY = ["add", "sub", "mul", "maximum", "minimum"]


@dataclass
class Program:
    shape: tuple[int, ...]
    inputs: list[tuple[tuple[int, ...], tuple[int, ...]]]  # (shape, memory order)
    steps: list[tuple[str, tuple[int, ...]]]  # (op, operand indices or a permutation)


@st.composite
def programs(draw: st.DrawFn) -> Program:
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=rank, max_size=rank)))
    inputs = []
    for _ in range(draw(st.integers(1, 3))):
        dims = tuple(s if draw(st.booleans()) or k == rank - 1 else 1 for k, s in enumerate(shape))
        order = tuple(draw(st.permutations(range(rank))))
        inputs.append((dims, order))
    steps: list[tuple[str, tuple[int, ...]]] = []
    values = [d for d, _ in inputs]
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["unary", "binary", "permute"]))
        k = draw(st.integers(0, len(values) - 1))
        if kind == "unary":
            steps.append((draw(st.sampled_from(UNARY)), (k,)))
            values.append(values[k])
        elif kind == "binary":
            partners = [j for j, v in enumerate(values) if all(a == b or a == 1 or b == 1
                                                               for a, b in zip(v, values[k], strict=True))]
            j = draw(st.sampled_from(partners))
            steps.append((draw(st.sampled_from(BINARY)), (k, j)))
            # broadcasting: a size-1 axis takes the other's size, 0 included (max would say 1)
            values.append(tuple(b if a == 1 else a for a, b in zip(values[k], values[j], strict=True)))
        else:
            perm = tuple(draw(st.permutations(range(rank))))
            steps.append(("permute", (k, *perm)))
            values.append(tuple(values[k][p] for p in perm))
    return Program(shape, inputs, steps)


def _build(program: Program, merge: tuple[tuple[int, ...], int, int] | None = None,
           ) -> tuple[FusionDefinition, list[torch.Tensor], torch.Tensor]:
    """The program's fusion, its inputs (drawn from a generator seeded by the program: a failure
    reproduces) and torch's result; ``merge`` (a permutation and a range of its axes) permutes the last
    value and reshapes it with those axes merged."""
    tensors = _inputs(program, merge)
    expected = _torch_result(program, merge, tensors)
    with FusionDefinition() as fd:
        vals = [fd.define_tensor([-1 if s != 1 else 1 for s in t.shape]) for t in tensors]
        for op, args in program.steps:
            if op == "permute":
                vals.append(fd.ops.permute(vals[args[0]], list(args[1:])))
            else:
                vals.append(getattr(fd.ops, op)(*(vals[a] for a in args)))
        if merge is not None:
            vals.append(fd.ops.reshape(fd.ops.permute(vals[-1], list(merge[0])), list(expected.shape)))
        fd.add_output(vals[-1])
    return fd, tensors, expected


def _inputs(program: Program, merge: tuple[tuple[int, ...], int, int] | None) -> list[torch.Tensor]:
    """The program's inputs in their layouts, drawn from a generator seeded by the program and merge."""
    gen = torch.Generator().manual_seed(zlib.crc32(repr((program, merge)).encode()))
    tensors = []
    for dims, order in program.inputs:
        base = torch.randn([dims[d] for d in order], generator=gen)
        tensors.append(base.permute([order.index(d) for d in range(len(dims))]))
    return tensors


def _torch_result(program: Program, merge: tuple[tuple[int, ...], int, int] | None,
                  tensors: list[torch.Tensor]) -> torch.Tensor:
    """The program (and ``merge``) computed by torch from ``tensors``, in their dtype."""
    refs = list(tensors)
    for op, args in program.steps:
        if op == "permute":
            refs.append(refs[args[0]].permute(list(args[1:])))
        else:
            refs.append(getattr(torch, op)(*(refs[a] for a in args)))
    if merge is None:
        return refs[-1]
    perm, start, stop = merge
    permuted = refs[-1].permute(list(perm))
    return permuted.reshape([*permuted.shape[:start], permuted.shape[start:stop].numel(), *permuted.shape[stop:]])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_automatic_schedules_match_the_oracle(program: Program) -> None:
    fd, inputs, expected = _build(program)
    if not fd.fusion.exprs():
        return
    (got,) = fd.execute(inputs, _enable_options=["triton_interpreter"])
    (oracle,) = fd.execute(inputs, _disable_options=["kernel_codegen"])
    torch.testing.assert_close(oracle, expected)
    _assert_as_close_as_the_oracle(got, oracle, program)


def _assert_as_close_as_the_oracle(got: torch.Tensor, oracle: torch.Tensor, program: Program,
                                   merge: tuple[tuple[int, ...], int, int] | None = None) -> None:
    """``got`` within 1e-5 of the oracle, or, element by element, no further from the program's float64
    result than a float32 evaluation may be (``_rounding_bound``) or twice the oracle's own distance
    (plus the same 1e-5): a chain of exponentials magnifies one float32 ulp of an inner value (each
    ``exp`` by its argument), so two correct float32 evaluations may differ by more than 1e-5 there, and
    the oracle's own error may happen to be far below what its roundings allow (exp(exp(exp(1.38))):
    1e-5 relative allowed, the oracle's 8e-8)."""
    if torch.allclose(got, oracle, rtol=1e-5, atol=1e-5, equal_nan=True):
        return
    exact = _in_float64(program, merge)
    mine, theirs = (got.double() - exact).abs(), (oracle.double() - exact).abs()
    bound = torch.maximum(2 * theirs, _rounding_bound(program, merge)) + 1e-5 * exact.abs() + 1e-5
    assert bool((mine <= bound).all()), (
        f"generated kernel errs by {float(mine.max()):.3g} from float64, the oracle by {float(theirs.max()):.3g}")


#: Relative error of one float32 op as a kernel or torch computes it (two ulps: a transcendental's
#: implementations differ by about one each side of the exact value).
_ULPS = 2 * 2.0 ** -24
#: Each unary op's derivative, of its float64 argument (how much an error in the argument moves it).
_DERIVATIVES = {"neg": lambda x: -torch.ones_like(x), "exp": torch.exp, "sin": torch.cos,
                "tanh": lambda x: 1 - torch.tanh(x) ** 2,
                "sigmoid": lambda x: torch.sigmoid(x) * (1 - torch.sigmoid(x)),
                "relu": lambda x: (x > 0).double(), "abs": torch.sign}


def _rounding_bound(program: Program, merge: tuple[tuple[int, ...], int, int] | None) -> torch.Tensor:
    """Per element, how far a float32 evaluation of the program may be from its float64 result: each
    value's error bound carried through the program to first order (a unary op scales its argument's by
    its derivative, sums add theirs, products weigh each by the other factor), plus each op's own
    rounding (``_ULPS`` of its result); inputs are exact."""
    values = [t.double() for t in _inputs(program, merge)]
    errors = [torch.zeros_like(v) for v in values]
    for op, args in program.steps:
        if op == "permute":
            values.append(values[args[0]].permute(list(args[1:])))
            errors.append(errors[args[0]].permute(list(args[1:])))
            continue
        operands = [values[a] for a in args]
        out = getattr(torch, op)(*operands)
        if len(args) == 1:
            carried = _DERIVATIVES[op](operands[0]).abs() * errors[args[0]]
        else:
            (a, b), (ea, eb) = operands, (errors[args[0]], errors[args[1]])
            carried = {"add": ea + eb, "sub": ea + eb, "mul": b.abs() * ea + a.abs() * eb + ea * eb,
                       "maximum": torch.maximum(ea, eb), "minimum": torch.maximum(ea, eb)}[op]
        values.append(out)
        errors.append(carried + _ULPS * out.abs())
    bound = errors[-1]
    if merge is None:
        return bound
    perm, start, stop = merge
    permuted = bound.permute(list(perm))
    return permuted.reshape([*permuted.shape[:start], permuted.shape[start:stop].numel(), *permuted.shape[stop:]])


def _in_float64(program: Program, merge: tuple[tuple[int, ...], int, int] | None) -> torch.Tensor:
    """``_build``'s result computed by torch in float64 from the same inputs."""
    return _torch_result(program, merge, [t.double() for t in _inputs(program, merge)])


@st.composite
def head_merges(draw: st.DrawFn) -> tuple[Program, tuple[tuple[int, ...], int, int]]:
    program = draw(programs())
    rank = len(program.shape)
    start = draw(st.integers(0, rank - 1))
    return program, (tuple(draw(st.permutations(range(rank)))), start, draw(st.integers(start + 1, rank)))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(head_merges())
def test_a_computed_value_permuted_and_merged_matches_the_oracle(
        case: tuple[Program, tuple[tuple[int, ...], int, int]]) -> None:
    """A program's last value permuted and reshaped with some of its axes merged (a backward's head
    merge; preseg lays the value out in the permuted order when only the reshape reads it): kernels
    and the oracle agree for every permutation, merge, size and input layout."""
    program, merge = case
    fd, inputs, expected = _build(program, merge)
    (got,) = fd.execute(inputs, _enable_options=["triton_interpreter"])
    (oracle,) = fd.execute(inputs, _disable_options=["kernel_codegen"])
    torch.testing.assert_close(oracle, expected)
    _assert_as_close_as_the_oracle(got, oracle, program, merge)


@st.composite
def manual_schedules(draw: st.DrawFn) -> tuple[Program, list[tuple[str, int, int]], list[str]]:
    program = draw(programs())
    transforms = []
    n = len(program.shape)
    for _ in range(draw(st.integers(0, 4))):
        if n > 1 and draw(st.booleans()):
            k = draw(st.integers(0, n - 2))
            transforms.append(("merge", k, 0))
            n -= 1
        else:
            transforms.append(("split", draw(st.integers(0, n - 1)), draw(st.integers(1, 8))))
            n += 1
    kinds = [draw(st.sampled_from(["serial", "grid", "block"])) for _ in range(n)]
    return program, transforms, kinds


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manual_schedules())
def test_random_manual_schedules_match_the_oracle(case: tuple[Program, list[tuple[str, int, int]], list[str]]) -> None:
    program, transforms, kinds = case
    fd, inputs, expected = _build(program)
    if not fd.fusion.exprs():
        return
    out = fd.fusion.outputs()[0]
    for kind, axis, factor in transforms:
        if kind == "merge":
            out.merge(axis)
        else:
            out.split(axis, factor)
    grids = iter([ParallelType.grid_x, ParallelType.grid_y])
    blocks = iter([ParallelType.block_x, ParallelType.block_y])
    for pos, kind in enumerate(kinds):
        i = out.axis(pos)
        if kind == "grid":
            ptype = next(grids, None)
        elif kind == "block" and i.extent.value is not None:
            ptype = next(blocks, None)
        else:
            ptype = None
        if ptype is not None:
            i.parallelize(ptype)
    (got,) = fd.manual_execute(inputs)
    _assert_as_close_as_the_oracle(got, expected, program)
