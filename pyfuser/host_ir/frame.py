"""What the evaluator and the step builders share: the runtime frame of one execution, the
compile-time context a builder sees, and the CUDA stream state."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from pyfuser.host_ir.nodes import HostNode, HostVal, LaunchKernel
from pyfuser.ir.eval_context import EvalContext

if TYPE_CHECKING:
    from pyfuser.host_ir.steps import BoundLaunches


class Frame:
    """Runtime state of one execution: value slots, the eval context and the stream runtime."""

    __slots__ = ("ctx", "streams", "values")

    def __init__(self, values: list[Any], ctx: EvalContext, streams: CudaStreams | None) -> None:
        self.values = values
        self.ctx = ctx
        self.streams = streams

    @property
    def cuda_streams(self) -> CudaStreams:
        """The stream runtime, for the steps built only on CUDA (stream switches, waits, slot events)."""
        if self.streams is None:
            raise RuntimeError("a CUDA stream step ran in a frame without CUDA streams; stream steps are built "
                               "only for a program on a CUDA device")
        return self.streams


Step = Callable[[Frame], None]


class CompileContext(Protocol):
    """What a step builder sees while turning a node into a step (implemented by the evaluator)."""

    device: torch.device

    @property
    def top_level(self) -> bool:
        """Whether the nodes being compiled run once per program run (not in a loop's body)."""
        ...

    def slot(self, val: HostVal | Hashable) -> int:
        """The value slot of ``val`` (a Val, a host value, or a private key like a loop's chunk bounds)."""
        ...

    def compile_body(self, nodes: Sequence[HostNode], *, once_per_run: bool = False) -> list[Step]:
        """The steps of a block's ``nodes``: a loop's body (its nodes run per iteration), or one whose
        nodes run at most once per program run where they sit (``once_per_run``: a ``CaptureGraph``'s
        body at the top level, whose launches keep their bound launches)."""
        ...

    def bound_launches(self, node: LaunchKernel) -> BoundLaunches:
        """The bound launches of a launch that runs once per program run (one per node): its step
        records and replays them, and the program's straight-line function and direct path read them."""
        ...


#: Builds the step of one node (None: nothing to do at run time on ``cc.device``).
StepBuilder = Callable[[Any, CompileContext], Step | None]


@dataclass(frozen=True)
class RuntimeSlot:
    """Key of a value the evaluator binds per execution rather than a node computing it."""

    name: str


#: Slot holding the bound ``numberOfStreams`` (the worker-pool size).
NUMBER_OF_STREAMS_SLOT = RuntimeSlot("numberOfStreams")

class CudaStreams:
    """Current stream tracking and ring-buffer slot events for one execution."""

    __slots__ = ("current", "pool", "slot_events", "slot_streams", "switched_to")

    def __init__(self, pool: list[torch.cuda.Stream], current: torch.cuda.Stream,
                 slot_events: dict[tuple[int, int], torch.cuda.Event]) -> None:
        self.pool = pool
        self.current = current
        self.slot_events = slot_events
        self.slot_streams: dict[tuple[int, int], torch.cuda.Stream] = {}
        #: the streams this execution issued work on besides the one it started on
        self.switched_to: set[torch.cuda.Stream] = set()

    def set(self, stream: torch.cuda.Stream) -> None:
        if stream != self.current:
            torch.cuda.set_stream(stream)
            self.current = stream
            self.switched_to.add(stream)

    def wait_for(self, other: torch.cuda.Stream, event: torch.cuda.Event) -> None:
        """The current stream waits for the work issued on ``other`` (through ``event``). A worker this
        execution never switched to (a stream loop of one iteration runs on the current stream) holds none
        of its work: no wait, which inside a CUDA graph capture would be a dependency on uncaptured work."""
        if other == self.current or (other not in self.switched_to and any(other == w for w in self.pool)):
            return
        event.record(other)
        self.current.wait_event(event)

    def worker(self, index: int) -> torch.cuda.Stream:
        return self.pool[index % len(self.pool)]

    def run(self, body: Callable[[], None]) -> None:
        """``body`` (steps that switch streams) from the current stream, which is current again after
        it. If it fails, that stream first waits for every worker (the frees of a failed iteration's
        buffers are ordered after what the workers still run), except inside a capture, which cannot
        wait for work it did not capture."""
        user = self.current
        try:
            body()
        except BaseException:
            if not torch.cuda.is_current_stream_capturing():
                for worker in self.pool:
                    user.wait_stream(worker)
            raise
        finally:
            if self.current != user:
                torch.cuda.set_stream(user)

    def wait_slot(self, key: object, index: int) -> None:
        slot = (id(key), index % len(self.pool))
        last = self.slot_streams.get(slot)
        if last is not None and last != self.current:
            self.current.wait_event(self.slot_events[slot])

    def release_slot(self, key: object, index: int) -> None:
        slot = (id(key), index % len(self.pool))
        event = self.slot_events.get(slot)
        if event is None:
            event = self.slot_events[slot] = torch.cuda.Event()
        event.record(self.current)
        self.slot_streams[slot] = self.current
