"""The restructured extension points: op tables, fd.ops as a class, passes, options, step builders."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest
import torch

from pyfuser import FusionDefinition, schedule
from pyfuser.codegen.launcher import BoundLaunch, Variant
from pyfuser.frontend.ops import Ops
from pyfuser.host_ir.evaluator import HostIrEvaluator
from pyfuser.host_ir.nodes import HostIrContainer, HostNode, KernelSegment, LaunchKernel, PlainSegment
from pyfuser.host_ir.outputs import OutputLayout
from pyfuser.host_ir.passes.pipeline import HOST_PASSES
from pyfuser.host_ir.straight_line import StraightLineFunction
from pyfuser.ir.layout import Layout
from pyfuser.ir.ops import BinaryOpType, ReductionOpType, TernaryOpType, UnaryOpType
from pyfuser.options import CommunicatorBackend, CompileOptions, DisableOption, EnableOption, check_options, comm_backend
from pyfuser.preseg.pipeline import PRESEG_PASSES
from pyfuser.runtime.backends import HOST_PASSES as RUNTIME_HOST_PASSES
from pyfuser.scheduler.registry import KernelParams, SchedulerType
from pyfuser.scheduler.schedulers import ALL_SCHEDULERS, KERNEL_SCHEDULERS, SCHEDULERS, is_kernel, size_dependent


@pytest.mark.parametrize("kind", [*UnaryOpType, *BinaryOpType, *TernaryOpType, *ReductionOpType],
                         ids=lambda k: f"{type(k).__name__}.{k.name}")
def test_every_op_kind_is_a_real_method_of_fd_ops(kind) -> None:
    name = {"gelu_tanh": "gelu"}.get(kind.name, kind.name)
    method = Ops.__dict__.get(name) or next(c.__dict__[name] for c in Ops.__mro__ if name in c.__dict__)
    assert inspect.isfunction(method), f"fd.ops.{name} must be defined in the class body"
    params = list(inspect.signature(method).parameters)
    assert params[0] == "self" and len(params) >= 2


def test_fd_ops_methods_are_visible_to_help() -> None:
    fd = FusionDefinition()
    assert "def exp" not in repr(fd.ops)  # a real object, not a module
    assert callable(fd.ops.exp) and inspect.signature(fd.ops.add).parameters.keys() == {"a", "b"}


def test_pass_toggles_sit_in_the_pipeline_lists() -> None:
    by_name = {p.name: p for p in [*PRESEG_PASSES, *HOST_PASSES]}
    assert by_name["infer_allocation_order"].disabled_by is DisableOption.infer_contiguity
    assert by_name["ring_buffers"].disabled_by is DisableOption.stream_ring_buffers
    assert by_name["stream_overlap"].disabled_by is DisableOption.stream_overlap
    assert by_name["stream_overlap"].applies(CompileOptions())
    assert not by_name["stream_overlap"].applies(CompileOptions(disabled=frozenset({DisableOption.stream_overlap})))
    assert not by_name["ring_buffers"].applies(CompileOptions(disabled=frozenset({"stream_ring_buffers"})))  # type: ignore[arg-type]


def test_communication_passes_run_between_stream_lowering_and_ring_buffers() -> None:
    names = [p.name for p in RUNTIME_HOST_PASSES]
    assert names == ["stream_lowering", "p2p_pipelines", "ring_buffers", "stream_overlap", "capture_graph"]
    assert [p.name for p in HOST_PASSES] == ["stream_lowering", "ring_buffers", "stream_overlap", "capture_graph"]


def test_process_wide_options_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYFUSER_DISABLE", "infer_contiguity, stream_ring_buffers")
    monkeypatch.setenv("PYFUSER_ENABLE", "stream_overlap")
    enabled, disabled = check_options(["host_ir_lowering"], [])
    assert enabled == {EnableOption.stream_overlap, EnableOption.host_ir_lowering}
    assert disabled == {DisableOption.infer_contiguity, DisableOption.stream_ring_buffers}
    monkeypatch.setenv("PYFUSER_DISABLE", "no_such_option")
    with pytest.raises(ValueError, match=r"PYFUSER_DISABLE: unknown option\(s\) \['no_such_option'\]"):
        check_options([], [])


def test_disable_by_environment_reaches_the_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(fd.define_tensor([-1, -1])))
    x = torch.randn(4, 3).t()
    assert fd.execute([x])[0].stride() == (1, 3)  # the input's column-major order, inferred
    monkeypatch.setenv("PYFUSER_DISABLE", "infer_contiguity")
    fd.fusion.mark_changed()
    assert fd.execute([x])[0].stride() == (4, 1)  # row-major


class _Opaque(HostNode):
    def __init__(self, out) -> None:
        self.inputs, self.outputs = [], [out]

    def to_string(self, indent: int = 0) -> str:
        return "Opaque\n"


def test_evaluator_names_a_node_it_has_no_step_builder_for() -> None:
    fd = FusionDefinition()
    t0 = fd.define_tensor([-1])
    container = HostIrContainer([t0], [t0], [_Opaque(t0)])
    with pytest.raises(TypeError, match=r"no step builder for _Opaque nodes \(Opaque\); register one in "
                                        r"pyfuser.runtime.backends"):
        HostIrEvaluator(container, [OutputLayout((0,), False)], torch.device("cpu"))


def test_communicator_backend_from_the_caller_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYFUSER_COMM_BACKEND", raising=False)
    assert comm_backend(None) is None  # the process group's collectives
    assert comm_backend("cuda") is CommunicatorBackend.cuda
    monkeypatch.setenv("PYFUSER_COMM_BACKEND", "nccl")
    assert comm_backend(None) is CommunicatorBackend.nccl
    assert comm_backend(CommunicatorBackend.cuda) is CommunicatorBackend.cuda  # the caller wins
    monkeypatch.setenv("PYFUSER_COMM_BACKEND", "ucc")
    with pytest.raises(ValueError, match=r"PYFUSER_COMM_BACKEND: unknown communicator backend 'ucc'; known: "
                                         r"\['nccl', 'gloo', 'cuda'\]"):
        comm_backend(None)


def test_each_scheduler_type_is_registered_once_with_its_facts() -> None:
    """A scheduler's facts are its ``Scheduler``'s; the enum is names only, every member registered
    once in ``ALL_SCHEDULERS`` but ``communication`` (a comm-layer segment) and ``none`` (no scheduler)."""
    registered = [s.type for s in ALL_SCHEDULERS]
    assert sorted(registered, key=lambda t: t.name) == sorted(
        set(SchedulerType) - {SchedulerType.communication, SchedulerType.none}, key=lambda t: t.name)
    assert len(registered) == len(set(registered))
    assert not is_kernel(SchedulerType.communication) and not is_kernel(SchedulerType.expr_eval)
    bucketed = {t for t in SchedulerType if size_dependent(t)}
    assert bucketed == {SchedulerType.reduction, SchedulerType.inner_persistent, SchedulerType.outer_persistent,
                        SchedulerType.inner_outer_persistent}
    assert [s.type for s in KERNEL_SCHEDULERS] == [t for t in registered if is_kernel(t)]


def test_the_runtime_reaches_the_schedulers_through_their_registry_level_modules() -> None:
    """Scheduling decisions (heuristics, size buckets, a grid reduction's final step) are the schedulers':
    the runtime imports the registry, the kernel-scheduling entry point and the public schedule tools,
    never a scheduler's internals."""
    allowed = {"pyfuser.scheduler.registry", "pyfuser.scheduler.schedulers", "pyfuser.scheduler.kernel_scheduling",
               "pyfuser.scheduler.tools"}
    runtime = Path(__file__).parents[1] / "pyfuser" / "runtime"
    imported = {(path.name, node.module) for path in runtime.glob("*.py")
                for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ImportFrom)
                and node.module is not None and node.module.startswith("pyfuser.scheduler")}
    assert imported and {(f, m) for f, m in imported if m not in allowed} == set()


@pytest.mark.parametrize(("scheduler_type", "shape"), [(SchedulerType.pointwise, (4, 6)),
                                                        (SchedulerType.reduction, (8, 33))])
def test_scheduler_params_are_frozen_cache_keys(scheduler_type: SchedulerType, shape: tuple[int, ...]) -> None:
    x = torch.randn(*shape)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.exp(t) if scheduler_type is SchedulerType.pointwise else fd.ops.sum(t, [1]))
    first = schedule.compute_heuristics(fd.fusion, scheduler_type, [x])
    again = schedule.compute_heuristics(fd.fusion, scheduler_type, [x])
    assert first == again and hash(first) == hash(again)
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.num_warps = 8  # type: ignore[misc]
    edited = dataclasses.replace(first, num_warps=8)
    assert edited != first and hash(edited) != hash(first)


def test_kernel_heuristics_are_a_kernels_params() -> None:
    """What the runtime compiles a kernel from: a kernel scheduler's params, read through ``KernelParams``;
    the expression evaluator's make no kernel and say so."""
    x = torch.randn(4, 6)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(fd.from_pytorch(x)))
    for scheduler in KERNEL_SCHEDULERS:
        if scheduler.can_schedule(fd.fusion)[0]:
            params = scheduler.kernel_heuristics(fd.fusion, [x])
            assert isinstance(params, KernelParams) and params.reference == fd.fusion.outputs()[0].name
    with pytest.raises(TypeError, match="the expr_eval scheduler makes no kernel: its ExprEvalParams lacks"):
        SCHEDULERS[SchedulerType.expr_eval].kernel_heuristics(fd.fusion, [x])


class _NameAndRun:
    name = "double_kernel"

    def run(self, ctx: object, x: torch.Tensor) -> list[torch.Tensor]:
        return [x * 2]


def test_launch_kernel_holds_the_whole_kernel_segment_protocol() -> None:
    """A launched segment is read through ``KernelSegment`` only: codegen's kernels have every
    member, a registered lowering's name-and-run segment is wrapped once where it is launched."""
    x = torch.randn(3, 5)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(fd.from_pytorch(x)))
    fd.execute([x], _enable_options=["triton_interpreter"])
    (generated,) = [n.segment for n in fd.fec.last_program.container.walk() if isinstance(n, LaunchKernel)]
    assert isinstance(generated, KernelSegment) and generated.output_perms == ((0, 1),)
    assert "tl.exp(" in generated.code and "loop domain" in generated.scheduled_ir
    node = LaunchKernel(_NameAndRun(), [], [])
    assert isinstance(node.segment, PlainSegment) and isinstance(node.segment, KernelSegment)
    assert node.segment.output_perms is None and node.segment.code == "" and node.segment.scheduler_params is None
    (doubled,) = node.segment.run(None, x)
    torch.testing.assert_close(doubled, x * 2)
    assert node.substitute({}).segment is node.segment


def test_bound_launches_and_straight_line_functions_are_typed_objects(device: str, kernel_options: list[str]) -> None:
    """What a bound program's first run records is read through typed members, never function
    attributes: a launch's ``BoundLaunch`` (its source, the variant it replays, whether torch's static
    launcher calls it) and the program's ``StraightLineFunction`` (its run and source)."""
    x = torch.randn(4, 8, device=device)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(fd.from_pytorch(x)))
    fd.execute([x], _enable_options=kernel_options)
    bound = fd.fec.bound_program([x], enable_options=kernel_options)
    assert bound is not None
    for _ in range(3):
        (out,) = bound.run([x])
        torch.testing.assert_close(out, x.exp())
    program = fd.fec.last_program
    (node,) = [n for n in program.container.walk() if isinstance(n, LaunchKernel)]
    (launch,) = program.bound_launches(node).by_binding.values()
    assert isinstance(launch, BoundLaunch) and isinstance(launch.variant, Variant)
    assert launch.source.startswith("def run(args):") and "data_ptr() % 16" in launch.source
    assert isinstance(bound.function, StraightLineFunction) and bound.function.source.startswith("def run(args):")
    package = Path(__file__).parents[1] / "pyfuser"
    read_by_name = [f"{path.relative_to(package)}:{node.lineno}" for path in package.rglob("*.py")
                    for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) > 1
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in ("plan", "source", "static")]
    assert read_by_name == []


def test_kernel_layouts_are_one_layout_type() -> None:
    """What a kernel may assume of a tensor's memory is an ``ir.layout.Layout`` everywhere (the
    compile driver, manual kernels, codegen's partial results)."""
    assert Layout.dense([1, 0, 2], [False, True, False]) == Layout((1, 0, 2), (None, True, True))
    assert Layout.strided(2) == Layout((0, 1), (False, False))
    assert Layout.of([1, 0], [True, None]) == Layout((1, 0), (True, None))
    x = torch.randn(6, 4).t()
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.neg(fd.from_pytorch(x)))
    fd.execute([x], _enable_options=["triton_interpreter"])
    (segment,) = [n.segment for n in fd.fec.last_program.container.walk() if isinstance(n, LaunchKernel)]
    assert segment.output_perms == ((1, 0),)  # the input's column-major order, from its Layout


@pytest.mark.parametrize("kind", [*BinaryOpType, *TernaryOpType], ids=lambda k: k.name)
def test_every_binary_and_ternary_op_has_its_torch_reference(kind: BinaryOpType | TernaryOpType) -> None:
    """Their evaluation calls it (only casts, unary, have none)."""
    assert callable(kind.spec.reference(kind.name))
