"""CUDA-graph capture and replay: the step of a ``CaptureGraph`` node (``GraphStep``, built by
``steps.py``: what ``_enable_options=["cuda_graph"]`` gives a compiled program through the
``capture_graph`` host pass), and the runner a whole torch.compile graph is replayed by
(``CudaGraphRunner``, ``integrations/torch_compile/graph_replay.py``; a region's own graphs too). Work
captured once per key of its inputs (a program's kernels, ATen calls and stream switches) is
replayed, so a cached execution costs one graph launch plus the copies of its inputs instead of one
host dispatch per node.

A graph reads fixed addresses, so each captured graph owns static copies of its inputs (one
batched copy per dtype before each replay), except the inputs read *in place*: those the caller
declares static, parameters (``nn.Parameter``) and any tensor on the storage of a parameter or
static input, wherever it comes from (a weight's transpose that an eager op took between regions,
a weight the backward saved): those are read where they live, and their addresses are part of the
graph's key (a moved parameter is a new capture, never a stale read). So are results of another
captured graph (the activations a forward region's graph hands the backward's): their buffers last
as long as that graph.

Large results, and those the caller says go to another graph (a training forward's activations
saved for its backward), are the graph's own output buffers, handed out without a copy (a layer's
activations are hundreds of megabytes); other small ones (a loss the caller keeps a history of) are
copies, so holding them pins nothing: the graph stages them into one buffer per dtype and a replay
copies that buffer once. A replay overwrites the buffers, so a graph replays only once the caller
has let go of every result of its last replay (the buffers' storages are referenced by the graph
alone again); while the caller holds them (a loop's previous result, activations saved for the
backward), the next call replays another *replica* of the graph, captured the first time it is
needed, and with every replica's results held the call runs without a graph. Scalar inputs are
baked into the captured kernels' arguments: their values are part of the key too. One set of
replicas per key, so a new input size (or bucket of sizes the caller rounds to) captures once and
replays from then on. The keys' captures are a ``Specializations`` (``host_ir/specialization.py``,
what every other per-signature specialization is kept in): one key more than
``SPECIALIZATION_LIMIT`` forgets them all, freeing their memory once the caller drops their results,
and the new key captures anew. Most calls repeat the last call's signature, checked first without
building a key.

A multi-device program's runner is ``collective``: its graphs hold NCCL collectives and P2P transfers, so
every rank must capture and replay at the same calls (as for any collective). A key's first call runs
without a graph (communicators and symmetric buffers are set up there, with host synchronizations), the
capture runs in the thread-local error mode (NCCL's watchdog thread queries events meanwhile), and the
communicator's teardown drops these graphs before it destroys the groups (``release_collective_graphs``).
"""

from __future__ import annotations

import os
import sys
import warnings
import weakref
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from pyfuser.host_ir.frame import CudaStreams, Frame, Step
from pyfuser.host_ir.specialization import Specializations

Run = Callable[[list[Any]], list[torch.Tensor]]

#: this package's directory, with its separator: a frame of a file under it is pyfuser's
_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep


def outside_pyfuser() -> int:
    """The ``stacklevel`` of a warning issued by its caller that names the first frame outside pyfuser
    (the user's ``execute``, a compiled graph's call)."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


class CaptureError(RuntimeError):
    """The program cannot be captured (it synchronizes with the host, say); it names the program."""


def _span(t: torch.Tensor) -> int:
    """Elements between a tensor's first and last addressed element, inclusive."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))


#: Addresses of the storages captured graphs hand out as results (while the graph is kept).
_graph_results: set[int] = set()


def _is_parameter(t: torch.Tensor) -> bool:
    # A plain tensor is decided without Parameter's metaclass instance check (5x a type test).
    return type(t) is torch.nn.Parameter or (type(t) is not torch.Tensor and isinstance(t, torch.nn.Parameter))


#: The storages of the parameters and static inputs graphs were called with, by address: a tensor on
#: one of them is read in place even when nothing says it is a parameter's view (a weight the
#: forward saved comes back to the backward as a plain tensor, its transpose without its ``_base``).
_parameter_storages: dict[int, StorageWeakRef] = {}
_MAX_PARAMETER_STORAGES = 1 << 14


def _lasting(t: torch.Tensor, declared: bool = False) -> bool:
    """Whether ``t``'s address lasts across calls: ``declared`` so (a static input), a parameter or a
    view of one (the optimizer updates it in place), a tensor on such a storage, or a result of a
    captured graph."""
    # The storage's address without building its Python object (a call's key reads every input).
    address = t.data_ptr() - int(t.storage_offset()) * t.element_size()  # int: an eager tensor's offset
    known = _parameter_storages.get(address)
    if known is not None and not known.expired():  # a storage freed since is expired, whatever took its address
        return True
    if address in _graph_results:
        return True
    if declared or _is_parameter(t) or ((base := t._base) is not None and _is_parameter(base)):
        if len(_parameter_storages) >= _MAX_PARAMETER_STORAGES:  # models come and go: drop the freed
            for freed in [a for a, ref in _parameter_storages.items() if ref.expired()]:
                del _parameter_storages[freed]
        _parameter_storages[address] = StorageWeakRef(t.untyped_storage())
        return True
    return False


class _StaticInput:
    """A graph-owned buffer with an input's sizes and strides, refreshed before each replay."""

    def __init__(self, example: torch.Tensor) -> None:
        self.overlapping = any(s == 0 and n > 1 for n, s in zip(example.shape, example.stride(), strict=True))
        if self.overlapping:  # expanded (stride 0): copy the addressed span, view it the same way
            self.flat = torch.empty(_span(example), dtype=example.dtype, device=example.device)
            self.view = self.flat.as_strided(example.shape, example.stride(), 0)
        else:
            self.view = torch.empty_strided(example.shape, example.stride(), dtype=example.dtype, device=example.device)
            self.flat = self.view

    def source(self, arg: torch.Tensor) -> torch.Tensor:
        if self.overlapping:
            return arg.as_strided((self.flat.numel(),), (1,), arg.storage_offset())
        return arg


#: A storage's reference count (what CUDA-graph trees read too); without it results are copied out.
_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _warm_up(run: Run, inputs: list[Any], name: str) -> None:
    """Run the program once before capturing it, with torch's synchronizing calls made errors: a
    program that waits for the host (``nonzero``, ``.item()``) is refused here. Failing inside the
    capture instead leaves torch's CUDA generator in capture mode, and every later random op of the
    process raises."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run(list(inputs))
    except RuntimeError as e:
        if "synchronizing" not in str(e):
            raise
        raise CaptureError(f"{name}: the program cannot be captured into a CUDA graph: it waits for the host "
                           f"({e})") from e
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def _end_failed_capture(device: torch.device, pool: Any, stream: torch.cuda.Stream) -> None:
    """After a failed capture: a capture that torch cannot end (an invalidated stream capture) never
    runs its epilogue. The caching allocator still counts it as allocating into ``pool`` (the process
    then aborts at exit, when the pool is destroyed: "captures_underway.empty()"), ``device``'s
    default generator stays marked as capturing, so every later random op of the process raises, and
    the capture's stream stays current (``torch.cuda.graph`` leaves it when ending the capture raises),
    so the caller's later work would go there. The pool's capture is ended here (a RuntimeError: torch
    had ended it), an empty capture begins and ends the generator's state once more, and ``stream``,
    current before the capture, is current again."""
    if torch.cuda.current_stream(device) != stream:
        torch.cuda.set_stream(stream)
    if pool is not None:
        try:
            torch._C._cuda_endAllocateToPool(device.index, pool)
        except RuntimeError:
            pass
    try:
        with torch.cuda.device(device):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                pass
    except RuntimeError:
        pass


class CapturedGraph:
    """One captured execution: static inputs, the graph, its output buffers."""

    def __init__(self, run: Run, args: Sequence[Any], in_place: frozenset[int], pool: Any, name: str,
                 hands_out: Callable[[int, torch.Tensor], bool] = lambda j, o: True,
                 capture_error_mode: str = "global") -> None:
        inputs: list[Any] = []  # what the capture reads: held only while capturing (see below)
        self.copies: list[tuple[int, _StaticInput]] = []  # inputs copied into the graph's buffers
        for k, a in enumerate(args):
            if isinstance(a, torch.Tensor) and k not in in_place and a.device.type == "cuda":
                buffer = _StaticInput(a)
                buffer.flat.copy_(buffer.source(a))
                self.copies.append((k, buffer))
                inputs.append(buffer.view)
            else:
                inputs.append(a)
        device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"), None)
        if device is None:
            raise CaptureError(f"{name}: no CUDA tensor among the inputs; only CUDA programs are captured")
        self.graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm up: lazy initialization, kernel compilation, workspaces
            _warm_up(run, inputs, name)
        user = torch.cuda.current_stream(device)
        user.wait_stream(side)
        try:
            with torch.cuda.graph(self.graph, pool=pool, capture_error_mode=capture_error_mode):
                self.outputs: list[torch.Tensor | None] = list(run(list(inputs)))
                self._sort_outputs(inputs, in_place, name, hands_out)
        except CaptureError:
            _end_failed_capture(device, pool, user)
            raise
        except RuntimeError as e:
            _end_failed_capture(device, pool, user)
            raise CaptureError(f"{name}: the program cannot be captured into a CUDA graph: {e}") from e
        # Inputs refreshed by one batched copy per dtype (torch's fast path takes one dtype at a time).
        groups: dict[torch.dtype, list[tuple[int, _StaticInput]]] = {}
        for k, buffer in self.copies:
            groups.setdefault(buffer.flat.dtype, []).append((k, buffer))
        self._copy_groups = [([b.flat for _, b in members], members) for members in groups.values()]

    def _sort_outputs(self, inputs: list[Any], in_place: frozenset[int], name: str,
                      hands_out: Callable[[int, torch.Tensor], bool]) -> None:
        """Decide, inside the capture, how each output reaches the caller: rebuilt on an input it lives
        on, a fixed non-tensor value, handed out (the graph's buffer), or staged for a copy."""
        # An output on an input read in place is rebuilt on the call's argument at each replay: the
        # graph keeps no reference to the caller's memory (another graph's results among it, which
        # would stay pinned).
        callers = {inputs[k].untyped_storage().data_ptr(): k for k in in_place}
        self._on_inputs: list[tuple[int, int, tuple[int, ...], tuple[int, ...], int]] = []
        #: outputs that are no tensor (a size the backward needs, None): fixed by the key's inputs
        self._fixed: list[tuple[int, Any]] = []
        handed: list[tuple[int, torch.Tensor]] = []
        copied: list[tuple[int, torch.Tensor]] = []
        for j, o in enumerate(self.outputs):
            if not isinstance(o, torch.Tensor):
                self._fixed.append((j, o))
                self.outputs[j] = None
                continue
            if o.device.type != "cuda":
                raise CaptureError(f"{name}: output {j} is a {o.device.type} tensor, computed once at capture")
            k = callers.get(o.untyped_storage().data_ptr())
            if k is not None:
                self._on_inputs.append((j, k, tuple(o.shape), o.stride(), int(o.storage_offset())))
                self.outputs[j] = None
            elif _use_count is None or not hands_out(j, o):
                # (and all without a way to tell when the caller lets go); ``self.outputs`` keeps the
                # buffer the staging copy reads, so the graph's pool never hands it to another graph
                copied.append((j, o))
            else:
                handed.append((j, o))
        self._handed = handed
        self._stage(copied)
        # The storages a replay writes that handed-out results alias (outputs, and inputs' buffers an
        # output views).
        storages = {o.untyped_storage().data_ptr(): o.untyped_storage() for _, o in handed}
        self._storages = list(storages.values())
        self._free_counts = [_use_count(st._cdata) for st in self._storages] if _use_count else []
        if _use_count is not None:  # results are the buffers themselves: a reader may key on them
            _graph_results.update(ptr for ptr in storages if ptr)  # an empty buffer has no address

    def _stage(self, copied: list[tuple[int, torch.Tensor]]) -> None:
        """Copy the outputs a caller gets copies of into one staging buffer per dtype, in the graph: a
        replay then copies each staging buffer once (one copy, not one per output and a host dispatch
        each) and the results are views of that copy with the outputs' strides."""
        by_dtype: dict[torch.dtype, list[tuple[int, torch.Tensor]]] = {}
        for j, o in copied:
            by_dtype.setdefault(o.dtype, []).append((j, o))
        self._staged: list[tuple[torch.Tensor, list[tuple[int, tuple[int, ...], tuple[int, ...], int]]]] = []
        for dtype, members in by_dtype.items():
            spans = [_span(o) for _, o in members]
            staging = torch.empty(sum(spans), dtype=dtype, device=members[0][1].device)
            layout, offset = [], 0
            for (j, o), span in zip(members, spans, strict=True):
                if span:  # the addressed span, so any strides (expanded, transposed) view it the same way
                    staging[offset:offset + span].copy_(o.as_strided((span,), (1,), o.storage_offset()))
                layout.append((j, tuple(o.shape), o.stride(), offset))
                offset += span
            self._staged.append((staging, layout))

    def release(self) -> None:
        """The graph is dropped: its buffers' addresses no longer last."""
        _graph_results.difference_update(st.data_ptr() for st in self._storages)

    def free(self) -> bool:
        """Whether no result of the last replay is held outside the graph (a replay may overwrite them)."""
        if _use_count is None:
            return True
        return all(_use_count(st._cdata) == n for st, n in zip(self._storages, self._free_counts, strict=True))

    def replay(self, args: Sequence[Any]) -> list[torch.Tensor]:
        for destinations, members in self._copy_groups:
            sources = [b.source(args[k]) if b.overlapping else args[k] for k, b in members]
            if len(sources) == 1:
                destinations[0].copy_(sources[0])
            else:
                torch._foreach_copy_(destinations, sources)
        self.graph.replay()
        results: list[Any] = [None] * len(self.outputs)
        # New tensors on the buffers: each holds its storage while the caller holds it.
        for j, o in self._handed:
            results[j] = o.detach()
        for j, k, size, stride, offset in self._on_inputs:
            results[j] = args[k].as_strided(size, stride, offset)
        for j, value in self._fixed:
            results[j] = value
        for staging, layout in self._staged:
            copy = staging.clone()
            for j, size, stride, offset in layout:  # detached: results, not views of one another
                results[j] = copy.as_strided(size, stride, offset).detach()
        return results


class Captures(Specializations[Hashable, list[CapturedGraph]]):
    """A runner's captured replicas per key. Forgetting them (the limit reached) releases each graph:
    the addresses of its buffers no longer last, so no later key reads a dropped graph's results in
    place."""

    __slots__ = ()

    def clear(self) -> None:
        for replicas in self.values():
            for graph in replicas:
                graph.release()
        super().clear()


#: The runners whose graphs captured communications (``collective``), dropped before the process groups go.
_collective_runners: weakref.WeakSet[CudaGraphRunner] = weakref.WeakSet()


def release_collective_graphs() -> None:
    """Drop every graph that captured communications, once the device finished them: the communicator's
    teardown calls it before it destroys the process groups, since a communicator whose collectives live on
    in a graph is not torn down (the process would not exit). A later call of such a program captures anew."""
    runners = [r for r in _collective_runners if r._graphs]
    if runners and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    for runner in runners:
        runner.forget()


class CudaGraphRunner:
    """Runs ``run(args)`` by replaying a CUDA graph captured for the arguments' signature."""

    def __init__(self, run: Run, static_inputs: Sequence[int] = (), name: str = "program",
                 replicas: int = 2, hand_out_bytes: int = 1 << 20, handed_from: int | None = None,
                 on_refusal: Callable[[CaptureError], None] | None = None, collective: bool = False) -> None:
        self.run = run
        #: ``run`` communicates with other processes (``CaptureGraph.collective``): a key's first call runs
        #: without a graph, and captures use the thread-local error mode (NCCL's watchdog thread queries
        #: its events while this thread captures)
        self.collective = collective
        self._ran_plain: Specializations[Hashable, bool] = Specializations()
        #: told of a key whose capture is refused (a ``CaptureError``), which then runs ``run`` without a
        #: graph; without it the refusal is raised to the caller (which gives the runner up)
        self.on_refusal = on_refusal
        #: the keys whose capture was refused (with ``on_refusal``)
        self._refused: Specializations[Hashable, bool] = Specializations()
        #: results at least this large are handed out as the graph's buffers, smaller ones copied
        self.hand_out_bytes = hand_out_bytes
        #: outputs from this position on are handed out whatever their size: a training forward's
        #: activations saved for its backward (whose graph reads them in place, not a copy of a copy)
        self.handed_from = handed_from
        self.static_inputs = frozenset(static_inputs)
        self.replicas = replicas
        self.name = name
        self._graphs = Captures()
        self._pool: Any = None
        #: how many signatures were captured (a test counts re-captures with it; a refused one is not)
        self.captures = 0
        #: graphs captured in all, replicas included
        self.graphs_captured = 0
        #: calls that ran without a graph, every replica's results being held
        self.plain_runs = 0
        #: the last call's key and replicas: most calls repeat it
        self._recent: tuple[tuple[Any, ...], list[CapturedGraph]] | None = None
        if collective:
            _collective_runners.add(self)

    def forget(self) -> None:
        """Drop every captured graph (and the last call's key); the next call of a key captures anew."""
        self._graphs.clear()
        self._recent = None

    def key(self, args: Sequence[Any]) -> tuple[Any, ...]:
        """What a captured graph depends on: every tensor's signature, the address of an input read in
        place, and the values the kernels take as arguments (scalars, 0-dim CPU tensors)."""
        # On every call, for every input (~50 per training step): one loop, no helper calls.
        static = self.static_inputs
        entries: list[Hashable] = []
        for k, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                entries.append((type(a), a))
                continue
            device = a.get_device()  # an int (-1: the CPU): cheaper than building a torch.device
            if device < 0 and a.dim() == 0:
                entries.append((a.dtype, device, a.item()))
                continue
            entries.append((a.dtype, a.shape, a.stride(), device, a.data_ptr() if _lasting(a, k in static) else None))
        return tuple(entries)

    def hands_out(self, position: int, output: torch.Tensor) -> bool:
        """Whether a result is the graph's buffer itself (else a copy the caller may keep for good)."""
        if self.handed_from is not None and position >= self.handed_from:
            return True
        return output.numel() * output.element_size() >= self.hand_out_bytes

    def in_place(self, args: Sequence[Any]) -> frozenset[int]:
        """The positions of the inputs a graph captured for ``args`` reads where they live."""
        return frozenset(k for k, a in enumerate(args) if isinstance(a, torch.Tensor) and _lasting(a, k in self.static_inputs))

    @staticmethod
    def fits(key: tuple[Any, ...], args: Sequence[Any]) -> bool:
        """Whether ``args`` have the signature ``key`` (the last call's), checked with fewer reads than
        building their key: an input the graph copies is not asked whether its address lasts now
        (copying it is right either way); one it reads in place must be at the same address."""
        if len(args) != len(key):
            return False
        for a, entry in zip(args, key, strict=True):
            if not isinstance(a, torch.Tensor):
                if len(entry) != 2 or entry[0] is not type(a) or entry[1] != a:
                    return False
            elif len(entry) == 5:
                dtype, shape, stride, device, address = entry
                if (a.dtype != dtype or a.shape != shape or a.stride() != stride or a.get_device() != device
                        or (address is not None and a.data_ptr() != address)):
                    return False
            elif len(entry) != 3 or a.get_device() >= 0 or a.dim() or a.dtype != entry[0] or a.item() != entry[2]:
                return False
        return True

    def replay_recent(self, args: Sequence[Any]) -> list[torch.Tensor] | None:
        """The replay of a free graph of the last call's key when ``args`` fit it (most calls); else None,
        and nothing ran: ``__call__`` keys, captures or runs without a graph."""
        recent = self._recent
        if recent is None or not self.fits(recent[0], args):
            return None
        for graph in recent[1]:
            if graph.free():
                return graph.replay(args)
        return None

    def __call__(self, args: Sequence[Any]) -> list[torch.Tensor]:
        recent = self._recent
        replicas: list[CapturedGraph] | None
        if recent is not None and self.fits(recent[0], args):
            key, replicas = recent
        else:
            key = self.key(args)
            replicas = self._graphs.get(key)
            if replicas is None:
                replicas = self._graphs.record(key, [])
            self._recent = (key, replicas)
        graph = next((g for g in replicas if g.free()), None)
        if graph is None:
            if len(replicas) >= self.replicas or (self._refused and key in self._refused):
                self.plain_runs += 1
                return self.run(list(args))
            if self.collective and not replicas and key not in self._ran_plain:
                self._ran_plain.record(key, True)
                self.plain_runs += 1
                return self.run(list(args))
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            try:
                graph = CapturedGraph(self.run, args, self.in_place(args), self._pool, self.name, self.hands_out,
                                      "thread_local" if self.collective else "global")
            except CaptureError as e:
                if self.on_refusal is None:
                    raise
                self._refused.record(key, True)
                self.on_refusal(e)
                self.plain_runs += 1
                return self.run(list(args))
            self.captures += not replicas
            self.graphs_captured += 1
            replicas.append(graph)
        return graph.replay(args)


class GraphStep:
    """The step of a ``CaptureGraph`` on a CUDA device (``steps.py``): the body's steps captured and
    replayed per key of the values it reads from the frame (``reads``: their slots), a replay writing
    the node's outputs (``writes``) into the frame. A key whose capture is refused (the body waits for
    the host, say) runs the body's steps from then on, with a warning; inside a caller's capture the
    body's steps run, to be captured by it."""

    def __init__(self, body: Sequence[Step], reads: Sequence[int], writes: Sequence[int], name: str,
                 collective: bool = False) -> None:
        self.body = list(body)
        self.reads = list(reads)
        self.writes = list(writes)
        self.runner = CudaGraphRunner(self._run, name=name, on_refusal=self._refused, collective=collective)
        #: the frame of the run in progress, which the body's runs (warm-up, capture, plain) start from
        self._frame: Frame | None = None

    @staticmethod
    def _refused(error: CaptureError) -> None:
        warnings.warn(f"{error}; this input signature runs without CUDA graphs from now on", stacklevel=outside_pyfuser())

    def _run(self, args: list[Any]) -> list[Any]:
        """The body's steps on ``args`` (a capture's: its static buffers), in a frame of their own: the
        frame's values with ``args`` read, stream state starting on the current stream (the warm-up's
        or the capture's, not the one the program's run started on)."""
        frame = self._frame
        assert frame is not None  # set by __call__
        values = frame.values.copy()
        for slot, a in zip(self.reads, args, strict=True):
            values[slot] = a
        outer = frame.streams
        if outer is None:
            inner = Frame(values, frame.ctx, None)
            for step in self.body:
                step(inner)
            return [values[s] for s in self.writes]
        streams = CudaStreams(outer.pool, torch.cuda.current_stream(), outer.slot_events)
        inner = Frame(values, frame.ctx, streams)

        def body() -> None:
            for step in self.body:
                step(inner)

        streams.run(body)
        return [values[s] for s in self.writes]

    def replay(self, args: Sequence[Any]) -> list[Any] | None:
        """The outputs (``writes``' values) of a replay for the values ``args`` of ``reads``, when the last
        call's graph fits and is free and no caller is capturing; else None, and nothing ran (the step
        keys, captures or runs the body from a frame). A program that is this step alone runs it without
        building a frame (``HostIrEvaluator``)."""
        if torch.cuda.is_current_stream_capturing():
            return None
        return self.runner.replay_recent(args)

    def __call__(self, frame: Frame) -> None:
        values = frame.values
        if torch.cuda.is_current_stream_capturing():  # inside a caller's capture: be captured
            for step in self.body:
                step(frame)
            return
        self._frame = frame  # sizes are the key's; scalar values are in the key
        try:
            outputs = self.runner([values[s] for s in self.reads])
        finally:
            self._frame = None
        for slot, value in zip(self.writes, outputs, strict=True):
            values[slot] = value

    @property
    def captures(self) -> int:
        """Keys captured so far."""
        return self.runner.captures
