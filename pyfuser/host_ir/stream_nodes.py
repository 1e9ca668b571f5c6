"""Host IR nodes that manage CUDA streams: switch the current stream, make one stream wait for
another, and guard ring-buffer slots with events. On CPU they compile to nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from pyfuser.host_ir.nodes import NUMBER_OF_STREAMS, CompileContext, Frame, HostNode, HostStream, LoopIndex, Step
from pyfuser.ir.base import indent_str
from pyfuser.ir.tensor_view import TensorView


class GetCurrentStream(HostNode):
    """Name the stream current when the node runs (the user's), to return to and sync with later."""

    def __init__(self, stream: HostStream) -> None:
        self.stream = stream
        self.inputs = []
        self.outputs = [stream]

    def to_string(self, indent: int = 0) -> str:
        return f"{indent_str(indent)}GetCurrentStream into {self.stream}\n"

    def compile(self, cc: CompileContext) -> Step | None:
        if cc.device.type != "cuda":
            return None
        slot = cc.slot(self.stream)

        def step(frame: Frame) -> None:
            frame.values[slot] = frame.streams.current

        return step


class SetCurrentStream(HostNode):
    """Make ``stream`` current: the ATen calls that follow are enqueued on it."""

    def __init__(self, stream: HostStream) -> None:
        self.stream = stream
        self.inputs = [stream]
        self.outputs = []

    def to_string(self, indent: int = 0) -> str:
        return f"{indent_str(indent)}SetCurrentStream to {self.stream}\n"

    def compile(self, cc: CompileContext) -> Step | None:
        if cc.device.type != "cuda":
            return None
        resolve = _stream_resolver(cc, self.stream)

        def step(frame: Frame) -> None:
            frame.streams.set(resolve(frame))

        return step


class Synchronize(HostNode):
    """The current stream waits for all work issued so far on ``stream``."""

    def __init__(self, stream: HostStream) -> None:
        self.stream = stream
        self.inputs = [stream]
        self.outputs = []

    def to_string(self, indent: int = 0) -> str:
        return f"{indent_str(indent)}Synchronize {self.stream}\n"

    def compile(self, cc: CompileContext) -> Step | None:
        if cc.device.type != "cuda":
            return None
        resolve = _stream_resolver(cc, self.stream)
        event = torch.cuda.Event()  # one per node: a wait is enqueued before the next record

        def step(frame: Frame) -> None:
            other = resolve(frame)
            current = frame.streams.current
            if other != current:
                event.record(other)
                current.wait_event(event)

        return step


def _stream_resolver(cc: CompileContext, stream: HostStream) -> Callable[[Frame], Any]:
    if stream.index is None:
        slot = cc.slot(stream)
        return lambda frame: frame.values[slot]
    idx = cc.slot(stream.index)
    return lambda frame: frame.streams.worker(frame.values[idx])


class SlotWait(HostNode):
    """Before writing ring-buffer slot ``StreamIdx % numberOfStreams`` of ``tv``: wait for the
    stream that last released it (nothing to do when that is the current stream)."""

    keyword: ClassVar[str] = "WaitSlot"

    def __init__(self, tv: TensorView, index: LoopIndex) -> None:
        self.tv = tv
        self.index = index
        self.inputs = [tv]
        self.outputs = []

    def to_string(self, indent: int = 0) -> str:
        return f"{indent_str(indent)}{self.keyword} ( {self.index} % {NUMBER_OF_STREAMS} ) of {self.tv}\n"

    def compile(self, cc: CompileContext) -> Step | None:
        if cc.device.type != "cuda":
            return None
        idx, key = cc.slot(self.index), self.tv

        def step(frame: Frame) -> None:
            frame.streams.wait_slot(key, frame.values[idx])

        return step


class SlotRelease(SlotWait):
    """After the last use of ring-buffer slot ``StreamIdx % numberOfStreams`` of ``tv`` in an
    iteration: record an event on the current stream for the slot's next writer."""

    keyword: ClassVar[str] = "ReleaseSlot"

    def compile(self, cc: CompileContext) -> Step | None:
        if cc.device.type != "cuda":
            return None
        idx, key = cc.slot(self.index), self.tv

        def step(frame: Frame) -> None:
            frame.streams.release_slot(key, frame.values[idx])

        return step
