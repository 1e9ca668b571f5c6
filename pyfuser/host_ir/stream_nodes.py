"""Host IR nodes that manage CUDA streams: switch the current stream, make one stream wait for
another, and guard ring-buffer slots with events. On CPU the evaluator runs none of them."""

from __future__ import annotations

from typing import ClassVar

from pyfuser.host_ir.nodes import NUMBER_OF_STREAMS, HostNode, HostStream, LoopIndex
from pyfuser.ir.base import indent_str
from pyfuser.ir.tensor_view import TensorView


class StreamNode(HostNode):
    """A node that only orders work between streams (no data of its own)."""

    chunk_local = True


class GetCurrentStream(StreamNode):
    """Name the stream current when the node runs (the user's), to return to and sync with later."""

    def __init__(self, stream: HostStream) -> None:
        self.stream = stream
        self.inputs = []
        self.outputs = [stream]

    def to_string(self, indent: int = 0) -> str:
        return f"{indent_str(indent)}GetCurrentStream into {self.stream}\n"


class SetCurrentStream(StreamNode):
    """Make ``stream`` current: the ATen calls that follow are enqueued on it."""

    def __init__(self, stream: HostStream) -> None:
        self.stream = stream
        self.inputs = [stream]
        self.outputs = []

    def to_string(self, indent: int = 0) -> str:
        return f"{indent_str(indent)}SetCurrentStream to {self.stream}\n"


class Synchronize(StreamNode):
    """The current stream waits for all work issued so far on ``stream``."""

    def __init__(self, stream: HostStream) -> None:
        self.stream = stream
        self.inputs = [stream]
        self.outputs = []

    def to_string(self, indent: int = 0) -> str:
        return f"{indent_str(indent)}Synchronize {self.stream}\n"


class SlotWait(StreamNode):
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


class SlotRelease(SlotWait):
    """After the last use of ring-buffer slot ``StreamIdx % numberOfStreams`` of ``tv`` in an
    iteration: record an event on the current stream for the slot's next writer."""

    keyword: ClassVar[str] = "ReleaseSlot"
