"""Running a fuzz case under execution modes, classifying what happened, and shrinking failures.

Each case runs once per ``ExecutionMode`` (the ``_enable_options`` / ``_disable_options`` of every
execute call), so a new execution path is covered by adding a mode to ``MODES``: generated kernels
through Triton's interpreter will be ``ExecutionMode("triton_interpreter", enable=("triton_interpreter",))``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from pyfuser.ir.base import FusionRuleError

from .case import Case, Output, TensorInput, moved, prelude_namespace


@dataclass(frozen=True)
class ExecutionMode:
    """Options of every ``fd.execute`` of a run; ``bound``: each execution's inputs also run three times
    through the bound program (a torch.compile region's path: the second run records, the third runs
    the straight-line function)."""

    name: str
    enable: tuple[str, ...] = ()
    disable: tuple[str, ...] = ()
    bound: bool = False
    #: where the inputs live and the program runs (``cuda``: kernels compiled for the GPU, real streams);
    #: torch's reference runs on the CPU values either way
    device: str = "cpu"

    @property
    def available(self) -> bool:
        return self.device == "cpu" or torch.cuda.is_available()


#: Every mode the fuzzer knows; ``--modes`` (and the CI test) pick from these by name.
MODES: dict[str, ExecutionMode] = {m.name: m for m in [
    ExecutionMode("default"),
    ExecutionMode("no_ring_buffers", disable=("stream_ring_buffers",)),
    ExecutionMode("stream_overlap", enable=("stream_overlap",)),
    ExecutionMode("no_infer_contiguity", disable=("infer_contiguity",)),
    ExecutionMode("triton_interpreter", enable=("triton_interpreter",)),
    ExecutionMode("bound_interpreter", enable=("triton_interpreter",), bound=True),
    ExecutionMode("cuda", device="cuda"),
    ExecutionMode("cuda_bound", device="cuda", bound=True),
    ExecutionMode("cuda_graph", enable=("cuda_graph",), device="cuda"),
]}
DEFAULT_MODES = ("default",)


class Category(Enum):
    match = "match"
    #: a ValueError / TypeError naming a tensor (or input): pyfuser refuses the program or its inputs
    rejected = "valid rejection"
    wrong = "wrong result"
    #: any other exception, or an error that names nothing
    internal = "internal error"
    #: an oracle artifact, not a defect: the only differing elements are those computed from a float
    #: converted to an integer type outside that type's range (inf, nan, too large), which C++ and torch
    #: leave undefined (x86 CPUs give the integer's minimum, GPUs saturate or give other values)
    undefined_cast = "undefined in torch: float-to-integer cast out of range"
    #: an oracle artifact, not a defect: pyfuser differs from torch beyond the dtype's tolerance, but
    #: against the program evaluated in float64 each differing element is within twice torch's own
    #: error plus that tolerance (an ill-conditioned result: both round, in other orders), or within the
    #: tolerance of the float64 program itself where torch is not (torch's CPU ``erf`` of a half subnormal
    #: is -0.0, so ``pow(-3, erf(x))`` is 1 where pyfuser and the float64 program give NaN: seed 9404423)
    rounding = "rounding: as close to float64 as torch (2x torch's error + tolerance)"
    #: an oracle artifact, not a defect: torch's reference (on the CPU) raised for an integer division by
    #: zero, and the program ran on a GPU, where torch's own integer division by zero raises nothing and
    #: returns unspecified values (pyfuser on the CPU raises as torch does)
    undefined_division = "undefined in torch: integer division by zero on a GPU"


#: the categories that are oracle artifacts: counted apart, never a failure
ARTIFACTS = (Category.undefined_cast, Category.rounding, Category.undefined_division)


@dataclass(frozen=True)
class Outcome:
    category: Category
    mode: str
    detail: str = ""
    #: for a rejection: eager torch ran the program (pyfuser is stricter, or wrong to refuse)
    torch_runs_it: bool = False
    #: for a match: how many stream loops the compiled program ran
    stream_loops: int = 0

    @property
    def failed(self) -> bool:
        return self.category in (Category.wrong, Category.internal)

    def signature(self) -> str:
        """What identifies the defect: the category and the message without names and numbers."""
        return f"{self.category.value}: {normalize(self.detail)[:90]}"


_NAMES = re.compile(r"\bT\d+\b|\b[isdb]\d+\b|\binput \d+\b")
_NUMBERS = re.compile(r"-?\d+(\.\d+)?(e-?\d+)?")


def normalize(message: str) -> str:
    """A message with tensor names and numbers replaced, to group messages of one kind."""
    return _NUMBERS.sub("N", _NAMES.sub("T", message.splitlines()[0] if message else ""))


def names_a_tensor(message: str) -> bool:
    """``T3`` (also as in ``T3_g_float[...]``) or ``input 2``."""
    return re.search(r"\bT\d+(?![0-9a-zA-Z])|\binput \d+\b", message) is not None


def tolerance(dtype: torch.dtype, low_precision: bool = False) -> dict[str, float]:
    """How close floats must be: the last bits of inexact ops (``INEXACT_OPS``) may differ, at the
    precision of the lowest-precision dtype the values went through (float32 at best, as Python
    numbers compute in float32 with integer tensors)."""
    if not (dtype.is_floating_point or dtype.is_complex):
        return {"rtol": 0.0, "atol": 0.0}
    if low_precision or dtype in (torch.float16, torch.bfloat16):
        return {"rtol": 2e-2, "atol": 2e-2}
    return {"rtol": 1e-4, "atol": 1e-5}


def low_precision(case: Case) -> bool:
    """Whether values of ``case`` pass through a 16-bit float."""
    text = case.repro()
    return any(name in text for name in ("float16", "bfloat16", "DataType.Half", "DataType.BFloat16"))


def compare(out: Any, want: torch.Tensor, low_precision: bool = False) -> str | None:
    """None when ``out`` is ``want`` (shape, dtype and values within the dtype's tolerance)."""
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, expected a tensor"
    if out.shape != want.shape:
        return f"shape {tuple(out.shape)}, expected {tuple(want.shape)}"
    out = out.to(want.device)  # a GPU mode's output beside the reference on the CPU
    if out.dtype != want.dtype:
        return f"dtype {out.dtype}, expected {want.dtype}"
    if out.dtype.is_floating_point or out.dtype.is_complex:
        # Where both are inf or nan, which one depends on torch's kernel (vectorized or not: a chunk
        # of a stream loop may take the other): not a difference of pyfuser's.
        both = ~torch.isfinite(out) & ~torch.isfinite(want)
        out, want = out.masked_fill(both, 0), want.masked_fill(both, 0)
    try:
        torch.testing.assert_close(out, want, equal_nan=True, **tolerance(want.dtype, low_precision))
    except AssertionError as e:
        return "values differ: " + " ".join(str(e).split())[:300]
    return None


def mismatches(out: torch.Tensor, want: torch.Tensor, low_precision: bool = False) -> torch.Tensor:
    """Where ``out`` differs from ``want`` (same shape and dtype) beyond ``compare``'s tolerance."""
    out = out.to(want.device)
    if not (want.dtype.is_floating_point or want.dtype.is_complex):
        return out != want
    both = ~torch.isfinite(out) & ~torch.isfinite(want)
    tol = tolerance(want.dtype, low_precision)
    close = torch.isclose(out, want, rtol=tol["rtol"], atol=tol["atol"], equal_nan=True)
    return ~(close | both)


#: the reference's form of a cast (the generator's ``cast`` step): ``t3.to(torch.int32)``
_CAST = re.compile(r"^(t\d+)\.to\(torch\.(u?int\d+)\)$")


def _undefined_cast_mask(source: Any, dtype: torch.dtype) -> torch.Tensor | None:
    """Where converting the float tensor ``source`` to the integer ``dtype`` is undefined: a value that
    is not finite or whose truncation does not fit ``dtype``; None when ``source`` is not a float tensor."""
    if not isinstance(source, torch.Tensor) or not source.dtype.is_floating_point:
        return None
    info, x = torch.iinfo(dtype), source.double()
    return ~torch.isfinite(x) | (x <= info.min - 1) | (x >= info.max + 1.0)


def reference_with_undefined_casts(case: Case, values: Sequence[Any], fill: int | None) -> tuple[list[Any], bool]:
    """The reference's outputs with each float-to-integer cast's undefined elements set to ``fill``
    (None: torch's own values); and whether any cast had such an element. The values of the
    reference's intermediates decide, not the program text: a cast of in-range values is defined."""
    namespace = dict(case_namespace(case, values))
    undefined = False
    for step in case.steps:
        exec(f"{', '.join(step.outs)} = {step.ref}", namespace)
        cast = _CAST.match(step.ref)
        if cast is None or len(step.outs) != 1:
            continue
        result = namespace[step.outs[0]]
        mask = _undefined_cast_mask(namespace[cast.group(1)], result.dtype)
        if mask is None or not bool(mask.any()):
            continue
        undefined = True
        if fill is not None:
            info = torch.iinfo(result.dtype)
            namespace[step.outs[0]] = result.masked_fill(mask, max(info.min, min(info.max, fill)))
    return [namespace[o.name] for o in case.outputs], undefined


def case_namespace(case: Case, values: Sequence[Any]) -> dict[str, Any]:
    """The reference program's names bound to ``values`` (what ``Case.reference`` starts from)."""
    namespace = prelude_namespace()
    for inp, value in zip(case.inputs, values, strict=True):
        namespace[inp.name] = value
    return namespace


def undefined_cast_artifact(case: Case, values: Sequence[Any], outs: Sequence[Any],
                            wants: Sequence[torch.Tensor]) -> tuple[str, list[torch.Tensor]] | None:
    """When every element where ``outs`` differ from ``wants`` depends on an undefined float-to-integer
    cast of the reference: a description, and ``wants`` with those elements taken from ``outs`` (to check
    the executor's other promises); None when any differing element does not (a wrong result), or when
    no cast was undefined.

    Dependence is found by running the reference again with those casts' undefined elements set to
    the integer type's minimum, maximum and zero: an output element that changes depends on them."""
    try:
        _, undefined = reference_with_undefined_casts(case, values, None)
        if not undefined:
            return None
        variants = [reference_with_undefined_casts(case, values, fill)[0] for fill in (-2 ** 63, 2 ** 63 - 1, 0)]
    except Exception:
        return None  # the reference does not run again this way: no verdict but "wrong"
    low, described, patched = low_precision(case), [], []
    for k, (out, want) in enumerate(zip(outs, wants, strict=True)):
        if not isinstance(out, torch.Tensor) or out.shape != want.shape or out.dtype != want.dtype:
            return None
        differ = mismatches(out, want, low)
        depends = torch.zeros_like(differ)
        for variant in variants:
            depends |= mismatches(variant[k], want, low)
        if bool((differ & ~depends).any()):
            return None
        patched.append(torch.where(differ, out.to(want.device), want))
        if bool(differ.any()):
            described.append(f"output {k} ({case.outputs[k].name}): {int(differ.sum())} element(s) differ, each "
                             f"computed from a float cast to an integer type out of its range")
    return ("; ".join(described), patched) if described else None


def _wide(value: Any) -> Any:
    """``value`` with every floating tensor and dtype in it as float64 (complex: complex128)."""
    if isinstance(value, torch.Tensor):
        wide = _wide(value.dtype)
        return value.to(wide) if wide is not value.dtype else value
    if isinstance(value, torch.dtype):
        return torch.float64 if value.is_floating_point else torch.complex128 if value.is_complex else value
    if isinstance(value, (list, tuple)):
        return type(value)(_wide(v) for v in value)
    if isinstance(value, dict):
        return {k: _wide(v) for k, v in value.items()}
    return value


#: conversions to a float dtype by name: float64 in the float64 program
_TO_FLOAT = (torch.Tensor.half, torch.Tensor.float, torch.Tensor.bfloat16)


class _Float64(TorchFunctionMode):
    """Every torch call of the reference in float64: its floating operands, the dtypes it is asked for
    (``.to(torch.float16)``, ``dtype=``, ``.half()``) and its results."""

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        if func in _TO_FLOAT:
            func = torch.Tensor.double
        return _wide(func(*_wide(tuple(args)), **_wide(kwargs or {})))


def reference_float64(case: Case, values: Sequence[Any]) -> list[Any]:
    """The reference program evaluated in float64: the same steps, each float op (and cast) computed and
    kept in float64, from the same inputs; integer and bool values stay what they are."""
    namespace = dict(case_namespace(case, [_wide(v) for v in values]))
    with _Float64():
        for step in case.steps:
            exec(f"{', '.join(step.outs)} = {step.ref}", namespace)
    return [namespace[o.name] for o in case.outputs]


def _error(value: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """``|value - exact|`` in float64, 0 where both are the same inf or both NaN, inf where only one is
    not finite."""
    a, b = value.to(exact.device), exact
    if a.dtype.is_complex or b.dtype.is_complex:
        a, b = a.to(torch.complex128), b.to(torch.complex128)
    else:
        a, b = a.double(), b.double()
    same = (a == b) | (a.isnan() & b.isnan())
    return torch.where(same, 0.0, (a - b).abs().double().nan_to_num(nan=float("inf"), posinf=float("inf")))


def rounding_artifact(case: Case, values: Sequence[Any], outs: Sequence[Any],
                      wants: Sequence[torch.Tensor]) -> tuple[str, list[torch.Tensor]] | None:
    """When every element where ``outs`` differ from torch's ``wants`` is as close to the program in
    float64 as torch is (pyfuser's error at most twice torch's plus the dtype's tolerance, torch's error
    finite; or pyfuser within the dtype's tolerance of the float64 program): a description, and ``wants``
    with those elements taken from ``outs`` (to check the executor's other promises); None when any is not
    (a wrong result), or when the float64 program does not run. As ``tests/codegen/test_accuracy.py`` judges
    reductions: torch's own error is the measure of how ill-conditioned the result is."""
    try:
        exacts = reference_float64(case, values)
    except Exception:
        return None  # no float64 evaluation: no verdict but "wrong"
    low, described, patched = low_precision(case), [], []
    for k, (out, want, exact) in enumerate(zip(outs, wants, exacts, strict=True)):
        if not isinstance(out, torch.Tensor) or not isinstance(exact, torch.Tensor) or out.shape != want.shape \
                or out.dtype != want.dtype or exact.shape != want.shape:
            return None
        differ = mismatches(out, want, low)
        if not bool(differ.any()):
            patched.append(want)
            continue
        if not want.dtype.is_floating_point and not want.dtype.is_complex:
            return None  # an integer or boolean result has no rounding to be as close as torch's in
        ours, torchs = _error(out, exact), _error(want, exact)
        tol = tolerance(want.dtype, low)
        scale = exact.abs().double().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        within = tol["atol"] + tol["rtol"] * scale
        # within twice torch's (finite) error, or within the dtype's tolerance of the float64 program where
        # torch is further off (a NaN the float64 program has too, where torch's rounding made a number)
        explained = (torchs.isfinite() & (ours <= 2 * torchs + within)) | (ours <= within)
        if bool((differ & ~explained).any()):
            return None
        patched.append(torch.where(differ, out.to(want.device), want))
        described.append(f"output {k} ({case.outputs[k].name}): {int(differ.sum())} element(s) differ from torch; "
                         f"against float64 pyfuser's largest error there is {float(ours[differ].max()):.3e}, "
                         f"torch's {float(torchs[differ].max()):.3e}")
    return ("; ".join(described), patched) if described else None


def _dense_strides(shape: Sequence[int], stride_order: Sequence[int]) -> list[int]:
    strides, stride = [0] * len(shape), 1
    for d in sorted(range(len(shape)), key=lambda d: stride_order[d]):
        strides[d] = stride
        stride *= max(shape[d], 1)
    return strides


def on_device(values: Sequence[Any], device: str) -> list[Any]:
    """``values`` with each tensor copied to ``device`` in the same layout (``moved`` of the prelude)."""
    if device == "cpu":
        return list(values)
    return [moved(v, device) if isinstance(v, torch.Tensor) else v for v in values]


def check_outputs(case: Case, outs: Sequence[Any], wants: Sequence[torch.Tensor], args: Sequence[Any],
                  originals: Sequence[Any]) -> str | None:
    """Values, required layouts, no shared memory, inputs untouched: the executor's promises."""
    if len(outs) != len(wants):
        return f"{len(outs)} outputs, expected {len(wants)}"
    low = low_precision(case)
    for k, (out, want, spec) in enumerate(zip(outs, wants, case.outputs, strict=True)):
        problem = compare(out, want, low)
        if problem is not None:
            return f"output {k} ({spec.name}): {problem}"
        if spec.stride_order is not None and out.numel() > 1:
            want_strides = _dense_strides(out.shape, spec.stride_order)
            if any(s != w for s, w, n in zip(out.stride(), want_strides, out.shape, strict=True) if n > 1):
                return f"output {k} ({spec.name}): strides {out.stride()}, but stride_order {list(spec.stride_order)} " \
                       f"requires {want_strides}"
    # The promise is about memory, not storages: the CUDA-graph path returns small outputs as disjoint
    # views of one copy, which a caller may write to independently.
    spans: list[tuple[str, int, int]] = []
    for what, t in [*((f"input {k}", a) for k, a in enumerate(args)), *((f"output {k}", o) for k, o in enumerate(outs))]:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        start = t.data_ptr()
        end = start + (sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) + 1) * t.element_size()
        if what.startswith("output"):
            other = next((name for name, lo, hi in spans if start < hi and lo < end), None)
            if other is not None:
                return f"{what} shares memory with {other}"
        spans.append((what, start, end))
    for k, (arg, original) in enumerate(zip(args, originals, strict=True)):
        if isinstance(arg, torch.Tensor) and not torch.equal(arg, original) and not (
                arg.dtype.is_floating_point and torch.equal(arg.isnan(), original.isnan())
                and torch.equal(arg.nan_to_num(), original.nan_to_num())):
            return f"input {k} was modified"
    return None


def _rejection_or_internal(error: BaseException, mode: str, torch_ok: bool, where: str) -> Outcome:
    message = f"{type(error).__name__} {where}: {error}"
    if isinstance(error, (ValueError, TypeError, FusionRuleError)) and names_a_tensor(str(error)):
        return Outcome(Category.rejected, mode, message, torch_runs_it=torch_ok)
    return Outcome(Category.internal, mode, message)


def _runs(case: Case) -> list[tuple[str, Callable[[], list[Any]]]]:
    """The executions of a case: the first (compiles), one with other values (a cached program),
    and, when no input promises a layout (declared or set as its allocation domain), one with dense
    inputs (another layout: compiles again).
    Inputs are rebuilt, never cloned: a clone of a strided or expanded input is dense."""
    runs: list[tuple[str, Callable[[], list[Any]]]] = [("first run", case.input_values),
                                                       ("cached run, other values", lambda: case.input_values(1))]
    tensors = [i for i in case.inputs if isinstance(i, TensorInput)]
    required = any(line.startswith(f"{i.name}.set_allocation_domain(") for i in tensors for line in case.schedule)
    if tensors and not required and not any(i.promises_layout for i in tensors) and any(
            i.strided_axis is not None or i.expanded or list(i.memory_order) != sorted(i.memory_order) for i in tensors):
        runs.append(("dense inputs", lambda: [v.contiguous() if isinstance(v, torch.Tensor) else v
                                              for v in case.input_values(2)]))
    return runs


def _bound_runs(case: Case, fd: Any, mode: ExecutionMode, make_inputs: Callable[[], list[Any]],
                wants: Sequence[torch.Tensor], values: Sequence[Any]) -> Outcome | None:
    """The inputs of an execution that matched, three times through its bound program (none for a
    fusion with scalar inputs or outputs written into inputs): None if each run matches too."""
    options = {"enable_options": list(mode.enable), "disable_options": list(mode.disable)}
    bound = fd.fec.bound_program(make_inputs(), **options)
    for k in range(3 if bound is not None else 0):
        args, originals = make_inputs(), make_inputs()
        try:
            outs = bound.run(args)
        except Exception as e:  # the same inputs ran through fd.execute
            return Outcome(Category.internal, mode.name, f"bound run {k + 1} raised {type(e).__name__}: {e}")
        problem = check_outputs(case, outs, wants, args, originals)
        if problem is not None:
            return _wrong_or_artifact(case, mode, values, outs, wants, args, originals, problem, f"bound run {k + 1}: ")
    return None


def _wrong_or_artifact(case: Case, mode: ExecutionMode, values: Sequence[Any], outs: Sequence[Any],
                       wants: Sequence[torch.Tensor], args: Sequence[Any], originals: Sequence[Any],
                       problem: str, where: str) -> Outcome:
    """A wrong result, unless the only differences are values torch leaves undefined (see
    ``undefined_cast_artifact``) or torch's own rounding (``rounding_artifact``), and the executor's
    other promises hold."""
    if "values differ" not in problem:
        return Outcome(Category.wrong, mode.name, f"{where}{problem}")
    for category, explain in ((Category.undefined_cast, undefined_cast_artifact),
                              (Category.rounding, rounding_artifact)):
        artifact = explain(case, values, outs, wants)
        if artifact is None:
            continue
        description, patched = artifact
        other = check_outputs(case, outs, patched, args, originals)
        if other is None:
            return Outcome(category, mode.name, f"{where}{description}")
        problem = other
        break
    return Outcome(Category.wrong, mode.name, f"{where}{problem}")


def outputs_where_torch_raised(mode: ExecutionMode, torch_error: str | None) -> Outcome:
    """pyfuser returned outputs where torch's reference raised: a wrong result, unless torch raised for an
    integer division by zero and the program ran on a GPU (``Category.undefined_division``)."""
    if mode.device == "cuda" and torch_error is not None and "ZeroDivisionError" in torch_error:
        return Outcome(Category.undefined_division, mode.name,
                       f"torch raised {torch_error} on the CPU; on a GPU it returns unspecified values, as pyfuser did")
    return Outcome(Category.wrong, mode.name, f"torch raised {torch_error}, but pyfuser returned outputs")


def run_mode(case: Case, mode: ExecutionMode, wants: Sequence[torch.Tensor] | None, torch_error: str | None) -> Outcome:
    """One case under one mode; ``wants`` are torch's outputs (None when torch raised ``torch_error``)."""
    try:
        fd, _ = case.build(mode.device)
    except Exception as e:
        return _rejection_or_internal(e, mode.name, wants is not None, "at definition")
    stream_loops, artifact = 0, None
    for k, (attempt, make_values) in enumerate(_runs(case)):
        if k > 0:  # the reference of other inputs
            try:
                wants = case.reference(make_values())
            except Exception:
                continue  # torch rejects these values (a division by zero): nothing to compare

        def make_inputs(make_values: Callable[[], list[Any]] = make_values) -> list[Any]:
            return on_device(make_values(), mode.device)

        args, originals = make_inputs(), make_inputs()
        try:
            outs = fd.execute(args, _enable_options=list(mode.enable), _disable_options=list(mode.disable))
        except Exception as e:
            where = "compiling" if fd.fec.last_program is None else f"executing ({attempt})"
            outcome = _rejection_or_internal(e, mode.name, wants is not None, where)
            if k > 0 and outcome.category is Category.rejected:  # torch runs these inputs, of the accepted shapes
                return replace(outcome, category=Category.internal,
                               detail=f"rejected after accepting the first inputs: {outcome.detail}")
            return outcome
        if wants is None:
            return outputs_where_torch_raised(mode, torch_error)
        problem = check_outputs(case, outs, wants, args, originals)
        if problem is not None:
            verdict = _wrong_or_artifact(case, mode, make_values(), outs, wants, args, originals, problem,
                                         f"{attempt}: ")
            if verdict.category not in ARTIFACTS:
                return verdict
            artifact = artifact or verdict  # the other runs still check everything else
        elif mode.bound:
            failed = _bound_runs(case, fd, mode, make_inputs, wants, make_values())
            if failed is not None and failed.category not in ARTIFACTS:
                return replace(failed, detail=f"{attempt}: {failed.detail}")
            artifact = artifact or (failed and replace(failed, detail=f"{attempt}: {failed.detail}"))
        stream_loops = stream_loops or str(fd.fec.last_program).count("FOR StreamIdx")
    return artifact or Outcome(Category.match, mode.name, stream_loops=stream_loops)


def reference(case: Case) -> tuple[list[torch.Tensor] | None, str | None]:
    try:
        return case.reference(case.input_values()), None
    except Exception as e:
        return None, f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"


def run_case(case: Case, modes: Sequence[ExecutionMode]) -> list[Outcome]:
    """The outcome of ``case`` under each mode.

    A rejection while executing a scheduled program, of inputs torch runs, is checked once more
    without the schedule: a schedule decides how a program runs, never which inputs are valid, so
    if the unscheduled program matches torch the rejection is a defect.
    """
    wants, torch_error = reference(case)
    outcomes = []
    for mode in modes:
        outcome = run_mode(case, mode, wants, torch_error)
        if (outcome.category is Category.rejected and outcome.torch_runs_it and case.schedule
                and " executing " in outcome.detail):
            plain = run_mode(case.with_(schedule=()), mode, wants, torch_error)
            if plain.category is Category.match:
                outcome = Outcome(Category.internal, mode.name, f"rejected only when scheduled: {outcome.detail}")
        outcomes.append(outcome)
    return outcomes


# --- shrinking -------------------------------------------------------------------------------------------------
def _names(code: str) -> set[str]:
    return set(re.findall(r"\b[ts]\d+\b", code))


def prune(case: Case) -> Case:
    """Only the steps, inputs and schedule lines the outputs depend on."""
    needed = {o.name for o in case.outputs}
    steps = []
    for step in reversed(case.steps):
        if needed & set(step.outs):
            steps.append(step)
            needed |= _names(step.fd) | _names(step.ref)
    steps.reverse()
    defined = needed | {o for s in steps for o in s.outs}
    inputs = tuple(i for i in case.inputs if i.name in needed)
    schedule = tuple(line for line in case.schedule if _names(line) <= defined)
    return case.with_(inputs=inputs, steps=tuple(steps), schedule=schedule)


def shrink(case: Case, still_fails: Callable[[Case], bool], budget: int = 150) -> Case:
    """A smaller case for which ``still_fails`` holds: fewer outputs, steps, schedule lines, plainer inputs."""
    calls = 0

    def attempt(candidate: Case) -> bool:
        nonlocal calls
        if calls >= budget:
            return False
        calls += 1
        try:
            return still_fails(candidate)
        except Exception:
            return False

    best = case
    if attempt(prune(case)):
        best = prune(case)
    for out in case.outputs:
        candidate = prune(best.with_(outputs=(out,)))
        if len(best.outputs) > 1 and attempt(candidate):
            best = candidate
            break
    changed = True
    while changed and calls < budget:
        changed = False
        for k in range(len(best.schedule)):
            candidate = best.with_(schedule=best.schedule[:k] + best.schedule[k + 1:])
            if attempt(candidate):
                best, changed = candidate, True
                break
        else:
            for candidate in _plainer_inputs(best):
                if attempt(candidate):
                    best, changed = candidate, True
                    break
            else:
                for candidate in _earlier_outputs(best):
                    if attempt(candidate):
                        best, changed = candidate, True
                        break
    return best


def _plainer_inputs(case: Case) -> list[Case]:
    """The case with one input's layout made plainer (one change per candidate)."""
    candidates = []
    for k, inp in enumerate(case.inputs):
        if not isinstance(inp, TensorInput):
            continue
        simpler = []
        if inp.strided_axis is not None:
            simpler.append(replace(inp, strided_axis=None))
        if inp.expanded:
            simpler.append(replace(inp, expanded=()))
        if list(inp.memory_order) != sorted(inp.memory_order):
            simpler.append(replace(inp, memory_order=tuple(sorted(inp.memory_order))))
        for s in simpler:
            if "from_pytorch" in s.declaration:
                s = replace(s, declaration=f"fd.from_pytorch({s.make_code()})")
            candidates.append(case.with_(inputs=(*case.inputs[:k], s, *case.inputs[k + 1:])))
    return candidates


def _earlier_outputs(case: Case) -> list[Case]:
    """The case ending at an earlier step (its first output moved to that step's result)."""
    if len(case.outputs) != 1:
        return []
    return [prune(case.with_(outputs=(Output(step.outs[0]),), schedule=()))
            for step in case.steps[:-1][::-1] if step.outs[0] != case.outputs[0].name][:4]


def minimal_repro(case: Case, outcome: Outcome, modes: Sequence[ExecutionMode]) -> tuple[Case, Outcome]:
    """``case`` shrunk while it fails the same way; with the outcome of the shrunk case."""
    mode = [m for m in modes if m.name == outcome.mode]
    target = outcome.signature()

    def still_fails(candidate: Case) -> bool:
        return run_case(candidate, mode)[0].signature() == target

    small = shrink(case, still_fails)
    return small, run_case(small, mode)[0]
