"""The CI-sized fuzz run (fixed seeds) and the fuzzer's own checks: it must catch what it claims to."""

from __future__ import annotations

import re

import pytest
import torch

from .campaign import Campaign
from .case import Case, Output, Step, TensorInput
from .generator import GeneratorConfig, generate
from .runner import (
    MODES,
    Category,
    ExecutionMode,
    check_outputs,
    compare,
    on_device,
    outputs_where_torch_raised,
    reference_float64,
    run_case,
    shrink,
)

#: seeds per chunk and chunks: every mode on each seed (about 40 s on CI's cores); the long campaigns
#: run from the command line (``python -m tests.fuzz --minutes N``)
CHUNK, CHUNKS = 125, 4


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_fuzz_ci(chunk: int) -> None:
    campaign = Campaign([m for m in MODES.values() if m.available], GeneratorConfig(max_ops=14))
    campaign.run(range(chunk * CHUNK, (chunk + 1) * CHUNK))
    counts = campaign.counts()
    assert counts[Category.match] > counts[Category.rejected], campaign.table()  # mostly valid programs
    assert campaign.failed == 0, f"\n{campaign.table()}\n{campaign.failure_report()}"


def test_cases_are_deterministic() -> None:
    assert generate(7).repro() == generate(7).repro()
    values = [v for v in generate(7).input_values() if isinstance(v, torch.Tensor)]
    assert all(torch.equal(a, b) for a, b in zip(values, [v for v in generate(7).input_values()
                                                         if isinstance(v, torch.Tensor)], strict=True))


def _one_op_case(fd: str, ref: str, shape: tuple[int, ...] = (3, 4)) -> Case:
    x = TensorInput("t0", shape, torch.float32, 1, tuple(range(len(shape))),
                    declaration=f"fd.define_tensor({[-1] * len(shape)})")
    return Case(0, (x,), (Step(("t1",), fd, ref),), (Output("t1"),))


def test_a_wrong_result_is_caught_and_printed_as_a_runnable_repro() -> None:
    case = _one_op_case("fd.ops.exp(t0)", "torch.exp(t0) + 1e-3")  # a reference that disagrees
    (outcome,) = run_case(case, [MODES["default"]])
    assert outcome.category is Category.wrong and "values differ" in outcome.detail
    namespace: dict[str, object] = {}
    with pytest.raises(AssertionError, match="not close"):
        exec(case.repro(), namespace)  # the printed repro reproduces it


def test_a_rejection_must_name_a_tensor() -> None:
    (named,) = run_case(_one_op_case("fd.ops.squeeze(t0, [0])", "t0.squeeze(0)"), [MODES["default"]])
    assert named.category is Category.rejected and re.search(r"\bT0 axis 0\b", named.detail)
    (internal,) = run_case(_one_op_case("fd.ops.exp(t0, 1)", "torch.exp(t0)"), [MODES["default"]])
    assert internal.category is Category.internal  # a TypeError that names no tensor


def test_the_executor_promises_are_checked() -> None:
    assert compare(torch.ones(2), torch.ones(2, dtype=torch.float64)) == "dtype torch.float32, expected torch.float64"
    assert compare(torch.tensor([float("inf")]), torch.tensor([float("nan")])) is None  # kernel-dependent
    assert compare(torch.tensor([1.0]), torch.tensor([float("nan")])) is not None
    case = _one_op_case("fd.ops.exp(t0)", "torch.exp(t0)").with_(outputs=(Output("t1", (0, 1)),))
    (outcome,) = run_case(case, [MODES["default"]])
    assert outcome.category is Category.match  # strides of stride_order=[0, 1] are checked, and met


def test_modes_pass_their_options() -> None:
    bogus = ExecutionMode("bogus", enable=("no_such_option",))
    (outcome,) = run_case(_one_op_case("fd.ops.exp(t0)", "torch.exp(t0)"), [bogus])
    assert outcome.category is Category.internal and "no_such_option" in outcome.detail


def test_shrinking_keeps_the_failure_and_drops_the_rest() -> None:
    x = TensorInput("t0", (3, 4), torch.float32, 1, (1, 0), strided_axis=1, declaration="fd.define_tensor([-1, -1])")
    steps = (Step(("t1",), "fd.ops.exp(t0)", "torch.exp(t0)"), Step(("t2",), "fd.ops.neg(t1)", "torch.neg(t1)"),
             Step(("t3",), "fd.ops.sin(t0)", "torch.sin(t0) * 2"))
    case = Case(0, (x,), steps, (Output("t2"), Output("t3")), ("t2.split(0, 2)",))
    (outcome,) = run_case(case, [MODES["default"]])
    assert outcome.category is Category.wrong

    def still_fails(c: Case) -> bool:
        return run_case(c, [MODES["default"]])[0].signature() == outcome.signature()

    small = shrink(case, still_fails)
    assert [s.outs for s in small.steps] == [("t3",)] and small.schedule == ()
    assert small.inputs[0].strided_axis is None and small.inputs[0].memory_order == (0, 1)


def test_gpu_modes_take_the_inputs_in_their_layouts() -> None:
    """A GPU mode's inputs keep their strides, offsets and expanded axes (``.to`` would make them dense);
    without a GPU its modes are left out of the CI run."""
    base = torch.randn(5, 8)
    values = [base[1:, ::2].t(), torch.randn(3, 1).expand(3, 4), base[2:4], 2.5]
    for got, want in zip(on_device(values, "meta"), values, strict=True):
        if isinstance(want, torch.Tensor):
            assert got.device.type == "meta"
            assert (got.shape, got.stride(), got.storage_offset()) == (want.shape, want.stride(), want.storage_offset())
        else:
            assert got == want
    assert [m.name for m in MODES.values() if m.device == "cuda"] == ["cuda", "cuda_bound", "cuda_graph"]
    assert all(m.available == torch.cuda.is_available() for m in MODES.values() if m.device == "cuda")


def test_outputs_may_share_a_storage_but_not_memory() -> None:
    """Disjoint views of one buffer (the CUDA-graph path's small outputs) keep the executor's promise;
    overlapping outputs break it."""
    case = _one_op_case("fd.ops.exp(t0)", "torch.exp(t0)")
    case = Case(0, case.inputs, case.steps, (Output("t1"), Output("t1")))
    buffer = torch.arange(8.0)
    x = torch.zeros(3, 4)
    disjoint = [buffer[:4], buffer[4:]]
    assert check_outputs(case, disjoint, [t.clone() for t in disjoint], [x], [x.clone()]) is None
    overlapping = [buffer[:4], buffer[2:6]]
    assert check_outputs(case, overlapping, [t.clone() for t in overlapping], [x], [x.clone()]) == \
        "output 1 shares memory with output 0"


def _cast_case(fd_cast: str) -> Case:
    """t0 * 1e9 cast to int32 (about 3% of the values beyond int32's range),
    then + 1: ``fd_cast`` is the fusion's cast, the reference's is torch's ``.to(torch.int32)``."""
    x = TensorInput("t0", (64, 33), torch.float32, 5, (0, 1), declaration="fd.define_tensor([-1, -1])")
    steps = (Step(("t1",), "fd.ops.mul(t0, 1e9)", "t0 * 1e9"),
             Step(("t2",), fd_cast, "t1.to(torch.int32)"),
             Step(("t3",), "fd.ops.add(t2, 1)", "t2 + 1"))
    return Case(0, (x,), steps, (Output("t3"),))


#: the fusion's cast where torch's is defined, another value (0) where it is not: a GPU's behaviour
_IN_RANGE = "fd.ops.lt(fd.ops.abs(t1), 2.0 ** 31)"


def test_an_integer_division_by_zero_is_an_oracle_artifact_only_on_a_gpu() -> None:
    """torch raises for an integer division by zero on the CPU (its reference) and not on a GPU: outputs of a
    CUDA mode there are the artifact, outputs of a CPU mode a wrong result (pyfuser raises there as torch)."""
    zero = "RuntimeError: ZeroDivisionError"
    on_gpu = outputs_where_torch_raised(MODES["cuda"], zero)
    assert on_gpu.category is Category.undefined_division and not on_gpu.failed, on_gpu
    assert outputs_where_torch_raised(MODES["default"], zero).category is Category.wrong
    assert outputs_where_torch_raised(MODES["cuda"], "RuntimeError: shape mismatch").category is Category.wrong


def test_an_undefined_float_to_int_cast_is_an_oracle_artifact() -> None:
    case = _cast_case(f"fd.ops.cast(fd.ops.where({_IN_RANGE}, t1, 0.0), DataType.Int32)")
    out_of_range = (case.input_values()[0].double() * 1e9).abs() >= 2 ** 31
    assert out_of_range.any() and not out_of_range.all()
    (outcome,) = run_case(case, [MODES["default"]])
    assert outcome.category is Category.undefined_cast, outcome
    assert not outcome.failed and "output 0 (t3)" in outcome.detail


def test_a_wrong_integer_cast_stays_a_wrong_result() -> None:
    # wrong on defined elements too (+ 1 before the cast), though the undefined ones differ as well
    case = _cast_case(f"fd.ops.cast(fd.ops.where({_IN_RANGE}, fd.ops.add(t1, 1.0), 0.0), DataType.Int32)")
    (outcome,) = run_case(case, [MODES["default"]])
    assert outcome.category is Category.wrong and "values differ" in outcome.detail
    # and a cast of in-range values only is defined: any difference is wrong
    x = TensorInput("t0", (8, 5), torch.float32, 5, (0, 1), declaration="fd.define_tensor([-1, -1])")
    small = Case(0, (x,), (Step(("t1",), "fd.ops.cast(fd.ops.add(t0, 1.0), DataType.Int32)", "t0.to(torch.int32)"),),
                 (Output("t1"),))
    (outcome,) = run_case(small, [MODES["default"]])
    assert outcome.category is Category.wrong



def test_torchs_own_rounding_is_an_oracle_artifact() -> None:
    """A reference that rounds more than pyfuser (here its operand through float16: a stand-in for
    torch's order of an ill-conditioned result rounding more than pyfuser's, as cuBLAS's and the CPU's
    orders of a linear under an rsqrt near 0 in CUDA fuzz seed 7002405): the results differ beyond
    float32's tolerance, but against the program in float64 pyfuser's error is within twice torch's.
    Named as the artifact it is, not a wrong result."""
    case = _one_op_case("fd.ops.exp(t0)", "torch.exp(t0.half().float())", shape=(8, 33))
    values = case.input_values()
    (exact,) = reference_float64(case, values)
    assert exact.dtype is torch.float64 and torch.equal(exact, values[0].double().exp())  # no float16 in it
    (outcome,) = run_case(case, [MODES["default"]])
    assert outcome.category is Category.rounding and not outcome.failed, outcome
    assert re.search(r"output 0 \(t1\): \d+ element\(s\) differ from torch; against float64", outcome.detail)


def test_a_result_equal_to_the_float64_program_where_torch_rounds_to_another_is_an_oracle_artifact() -> None:
    """pyfuser's NaN where torch's rounding gave a number and the float64 program gives NaN too (torch's CPU
    ``erf`` of a half subnormal returns -0.0, and ``pow(-3, -0.0)`` is 1: CPU fuzz seed 9404423; here an
    exponent that torch's float16 flushes to 0 and float64 keeps): torch's error is not finite, pyfuser's
    is 0, so the difference is torch's."""
    case = _one_op_case("fd.ops.pow(-3.0, fd.ops.mul(t0, 1e-7))", "torch.pow(-3.0, (t0 * 1e-7).half().float())",
                        shape=(8, 33))
    values = case.input_values()
    assert (case.reference(values)[0] == 1.0).any() and reference_float64(case, values)[0].isnan().all()
    (outcome,) = run_case(case, [MODES["default"]])
    assert outcome.category is Category.rounding and not outcome.failed, outcome


def test_rounding_never_excuses_a_less_accurate_result() -> None:
    """The other way round (pyfuser's result the less accurate one), or where torch's value is not
    finite but the float64 program's is (an overflow torch has and pyfuser lacks): wrong results."""
    (outcome,) = run_case(_one_op_case("fd.ops.add(fd.ops.exp(t0), 1e-3)", "torch.exp(t0)"), [MODES["default"]])
    assert outcome.category is Category.wrong and "values differ" in outcome.detail, outcome
    clipped = _one_op_case("fd.ops.minimum(fd.ops.exp(fd.ops.mul(t0, 200.0)), 3e38)", "torch.exp(t0 * 200)",
                           shape=(8, 33))
    values = clipped.input_values()
    assert torch.isinf(clipped.reference(values)[0]).any() and reference_float64(clipped, values)[0].isfinite().all()
    (outcome,) = run_case(clipped, [MODES["default"]])
    assert outcome.category is Category.wrong, outcome
