"""Everything pyfuser reads from the caller or the environment: compile options, the option and
dump names, and the launcher's description of this process.

A leaf of the package (it imports nothing of pyfuser), so every layer can take options without
reaching up: passes name the option that toggles them (``DisableOption.infer_contiguity``), the
compile driver validates the names a caller passes, and ``PYFUSER_ENABLE`` / ``PYFUSER_DISABLE``
set options for a whole process the way nvFuser's ``NVFUSER_ENABLE`` / ``NVFUSER_DISABLE`` do.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

import torch


class DumpOption(StrEnum):
    """``PYFUSER_DUMP=a,b``: what to print (to stdout) while a program is compiled."""

    fusion_ir = "fusion_ir"
    fusion_ir_math = "fusion_ir_math"
    fusion_ir_preseg = "fusion_ir_preseg"
    segmented_fusion = "segmented_fusion"
    scheduler_params = "scheduler_params"
    scheduled_fusion = "scheduled_fusion"
    kernel = "kernel"
    host_ir = "host_ir"
    host_ir_passes = "host_ir_passes"
    fx_graph = "fx_graph"


class EnableOption(StrEnum):
    """``execute(_enable_options=[...])`` / ``PYFUSER_ENABLE``: features that are off by default."""

    #: accepted for compatibility: stream overlap is on by default (``DisableOption.stream_overlap``)
    stream_overlap = "stream_overlap"
    triton_interpreter = "triton_interpreter"
    host_ir_lowering = "host_ir_lowering"
    cuda_graph = "cuda_graph"
    #: nvFuser's: let its matmul scheduler take matmul / linear. pyfuser has no matmul kernel scheduler,
    #: so this changes nothing: matmuls run as ATen calls unless ``matmul_expr_eval`` is disabled too
    fuse_matmul = "fuse_matmul"
    #: ``CommunicatorBackend.cuda``: pipeline every all-gather + GEMM / GEMM + reduce-scatter, whatever the
    #: machine model (``comm/overlap_model.py``) says
    p2p_pipelines_always = "p2p_pipelines_always"


class DisableOption(StrEnum):
    """``execute(_disable_options=[...])`` / ``PYFUSER_DISABLE``: features that are on by default."""

    infer_contiguity = "infer_contiguity"
    stream_ring_buffers = "stream_ring_buffers"
    stream_overlap = "stream_overlap"
    kernel_codegen = "kernel_codegen"
    cooperative_launch = "cooperative_launch"
    #: nvFuser's: matmul / linear segments may not run as ATen calls, and pyfuser has no other way to
    #: run them, so a fusion with one fails to compile (as nvFuser's does when no scheduler takes it)
    matmul_expr_eval = "matmul_expr_eval"
    #: ``CommunicatorBackend.cuda``: never pipeline; the plain collective then GEMM runs
    p2p_pipelines = "p2p_pipelines"
    compile_ahead = "compile_ahead"
    #: nvFuser's: its resize scheduler off, so segments with slice / pad / cat go to its other schedulers.
    #: pyfuser has no resize scheduler: those ops are always scheduled by the pointwise and normalization
    #: schedulers, what nvFuser does with this option; accepted, and it changes nothing
    resize_scheduler = "resize_scheduler"


class CommunicatorBackend(StrEnum):
    """What moves a multi-device program's data (nvFuser's ``CommunicatorBackend``).

    ``nccl`` / ``gloo``: torch.distributed collectives of the process group (NCCL on GPUs, gloo on CPUs);
    ``cuda``: the P2P transport -- symmetric-memory buffers written by the copy engines and ordered by
    stream-side signals -- for the all-gather + GEMM and GEMM + reduce-scatter pipelines (collectives
    elsewhere). Where it cannot run (CPU tensors, no peer access, no symmetric memory) its transfers
    fall back to the process group's send / recv, with one warning naming why.
    """

    nccl = "nccl"
    gloo = "gloo"
    cuda = "cuda"


DESCRIPTIONS: dict[StrEnum, str] = {
    DumpOption.fusion_ir: "the fusion as defined: inputs, outputs, math and each tensor's domains",
    DumpOption.fusion_ir_math: "the fusion's %kernel_math block",
    DumpOption.fusion_ir_preseg: "the fusion after each pre-segmentation pass, under the pass's name",
    DumpOption.segmented_fusion: "each segment of the segmented fusion: its executor and boundary tensors",
    DumpOption.scheduler_params: "the heuristics each kernel segment was scheduled with",
    DumpOption.scheduled_fusion: "each kernel segment as scheduled: every tensor's domains and the math",
    DumpOption.kernel: "the source of each generated kernel",
    DumpOption.host_ir: "the Host IR program each compiled fusion runs",
    DumpOption.host_ir_passes: "the Host IR program after each host pass, under the pass's name",
    DumpOption.fx_graph: "torch.compile backend: each ATen graph with its pyfuser regions marked and, for every op "
                         "left in eager, why",
    EnableOption.stream_overlap: "accepted for compatibility: stream overlap is on by default",
    EnableOption.triton_interpreter: "run generated kernels through Triton's interpreter (kernels on CPU tensors)",
    EnableOption.host_ir_lowering: "accepted for nvFuser compatibility: pyfuser always lowers through Host IR",
    EnableOption.cuda_graph: "replay each compiled program from a CUDA graph captured per input signature (CUDA only)",
    EnableOption.p2p_pipelines_always: "P2P pipelines for every all-gather + GEMM and GEMM + reduce-scatter, even where "
                                       "the machine model says the plain collective then GEMM is faster",
    DisableOption.p2p_pipelines: "P2P pipelines (the plain collective then GEMM always runs)",
    DisableOption.infer_contiguity: "allocation-order inference (outputs without a requirement stay row-major)",
    DisableOption.stream_ring_buffers: "ring buffers for stream-loop intermediates (allocate them whole instead)",
    DisableOption.stream_overlap: "concurrent stream-loop iterations (docs/stream_lowering.md: each iteration joins the user's "
                                  "stream)",
    DisableOption.kernel_codegen: "generated kernels (every segment runs as ATen calls)",
    DisableOption.compile_ahead: "compiling a CUDA program's kernel variants in threads before its first run, from a "
                                 "run on meta tensors (each compiles at its first launch instead; "
                                 "PYFUSER_COMPILE_THREADS sets the threads, 0 none)",
    DisableOption.cooperative_launch: "a grid reduction's steps in one cooperative launch with a grid synchronization "
                                      "(each step a launch of its own instead)",
    DisableOption.resize_scheduler: "nvFuser's resize scheduler (pyfuser has none: slice, pad and cat are always scheduled "
                                    "by the pointwise and normalization schedulers, as nvFuser's are with it off; "
                                    "accepted for nvFuser code, changes nothing)",
}


@dataclass(frozen=True, slots=True)
class CompileOptions:
    """What one compiled program depends on besides the fusion: part of the program cache key."""

    enabled: frozenset[EnableOption] = frozenset()
    disabled: frozenset[DisableOption] = frozenset()
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    #: Memory order (logical dims, outermost first; ``ir.layout.memory_order``) of each input this
    #: program is compiled for, None for scalars. Part of the layout key, so a program never runs
    #: on inputs of another order; ``preseg/input_layouts.py`` writes it into the fusion copy.
    input_orders: tuple[tuple[int, ...] | None, ...] = ()
    #: Per input: whether it fills its memory densely in that order (``ir.layout.is_dense``), also
    #: part of the layout key: a dense input's contiguity is known, so kernels index it linearly.
    input_dense: tuple[bool, ...] = ()
    #: The var_means (by their variance output's number) whose reduced elements per result, at the sizes
    #: this program is compiled for, fit one program's tile (``preseg/staged_var_mean.py``): a size class
    #: of the program key, so sizes on either side of it get programs of their own, and no other size
    #: recompiles.
    one_stage_var_means: frozenset[int] = frozenset()
    #: This process' rank: each rank lowers a multi-device fusion to its own program.
    rank: int = 0
    #: The transport asked for (``MultiDeviceExecutorParams.backend_type``, ``PYFUSER_COMM_BACKEND``);
    #: None: the process group's collectives.
    backend: CommunicatorBackend | None = None

    def is_enabled(self, option: EnableOption) -> bool:
        return option in self.enabled

    def is_disabled(self, option: DisableOption) -> bool:
        return option in self.disabled

    @property
    def kernels(self) -> bool:
        """Whether segments run as generated kernels: on CUDA unless disabled, on a CPU through Triton's
        interpreter when asked."""
        wanted = self.is_enabled(EnableOption.triton_interpreter) or self.device.type == "cuda"
        return wanted and not self.is_disabled(DisableOption.kernel_codegen)


def _names(raw: str | None) -> frozenset[str]:
    return frozenset(n.strip() for n in (raw or "").split(",") if n.strip())


def _validated(names: Iterable[str], known: type[StrEnum], what: str) -> frozenset:
    names = frozenset(names)
    unknown = sorted(n for n in names if n not in known.__members__)
    if unknown:
        raise ValueError(f"{what}: unknown option(s) {unknown}; known: {sorted(known.__members__)}")
    return frozenset(known(n) for n in names)


def check_options(enable: Iterable[str], disable: Iterable[str]) -> tuple[frozenset[EnableOption],
                                                                          frozenset[DisableOption]]:
    """The options of one call merged with ``PYFUSER_ENABLE`` / ``PYFUSER_DISABLE``, validated."""
    for given, kind in ((enable, "_enable_options"), (disable, "_disable_options")):
        if isinstance(given, str):  # iterating it would check its letters
            raise TypeError(f"{kind} must be a list of option names, got the string {given!r}; write [{given!r}]")
    enabled = _validated(enable, EnableOption, "_enable_options") | _validated(
        _names(os.environ.get("PYFUSER_ENABLE")), EnableOption, "PYFUSER_ENABLE")
    disabled = _validated(disable, DisableOption, "_disable_options") | _validated(
        _names(os.environ.get("PYFUSER_DISABLE")), DisableOption, "PYFUSER_DISABLE")
    return enabled, disabled


# --- dumps -----------------------------------------------------------------------------------------
def dump_enabled(option: DumpOption) -> bool:
    """Read the environment each time so tests and users can toggle dumps at run time."""
    return option in _validated(_names(os.environ.get("PYFUSER_DUMP")), DumpOption, "PYFUSER_DUMP")


def dump(option: DumpOption, text: str | Callable[[], str]) -> None:
    """Print ``text`` (a string, or a function building it only when needed) if ``option`` is dumped."""
    if dump_enabled(option):
        sys.stdout.write(text() if callable(text) else text)


# --- process settings --------------------------------------------------------------------------------
DEFAULT_NUM_STREAMS = 4


def comm_backend(requested: CommunicatorBackend | str | None = None) -> CommunicatorBackend | None:
    """``requested`` (a ``CommunicatorBackend`` or its name), else ``PYFUSER_COMM_BACKEND``, else None (the
    process group's collectives)."""
    raw = requested if requested is not None else (os.environ.get("PYFUSER_COMM_BACKEND") or None)
    if raw is None:
        return None
    try:
        return CommunicatorBackend(raw)
    except ValueError:
        where = "backend_type" if requested is not None else "PYFUSER_COMM_BACKEND"
        raise ValueError(f"{where}: unknown communicator backend {raw!r}; known: "
                         f"{[b.value for b in CommunicatorBackend]}") from None


def num_streams() -> int:
    """``PYFUSER_NUM_STREAMS`` (default 4): ``numberOfStreams``, the size of the worker-stream pool
    that stream loops run on (and the slot count of their ring buffers)."""
    raw = os.environ.get("PYFUSER_NUM_STREAMS")
    if not raw:
        return DEFAULT_NUM_STREAMS
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"PYFUSER_NUM_STREAMS must be a positive integer, got {raw!r}") from None
    return value


@dataclass(frozen=True, slots=True)
class LaunchInfo:
    """This process' place in the world, as the launcher (torchrun or mpirun) tells it."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    master_addr: str
    master_port: int

    @staticmethod
    def from_env(env: dict[str, str] | os._Environ[str] = os.environ) -> LaunchInfo:
        """Read torchrun's ``RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE`` or mpirun's ``OMPI_COMM_WORLD_*``;
        a process started by neither is rank 0 of a world of 1."""
        def get(*names: str, default: str) -> str:
            return next((env[n] for n in names if n in env), default)

        values = {
            "rank": get("RANK", "OMPI_COMM_WORLD_RANK", default="0"),
            "size": get("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", default="1"),
            "local_rank": get("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", default="0"),
            "local_size": get("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", default="1"),
            "master_port": get("MASTER_PORT", default="29500"),
        }
        parsed: dict[str, int] = {}
        for key, raw in values.items():
            try:
                parsed[key] = int(raw)
            except ValueError:
                raise ValueError(f"launcher environment: {key} must be an integer, got {raw!r}") from None
        if not 0 <= parsed["rank"] < parsed["size"]:
            raise ValueError(f"launcher environment: rank {parsed['rank']} is outside a world of size {parsed['size']}")
        return LaunchInfo(master_addr=get("MASTER_ADDR", default="127.0.0.1"), **parsed)
