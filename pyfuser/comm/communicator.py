"""Communicator: this process' place in the world and lazily created torch.distributed groups.

The launcher (torchrun or mpirun) tells each process its rank through the environment. The default
process group is created on first use, once, with NCCL for CUDA and gloo for CPU, and every group gets
a timeout so a rank that dies makes the others fail with an error instead of hanging.

A group pyfuser created is torn down at interpreter exit too (``shutdown()`` is optional, as in nvFuser's
scripts): left alive, torch destroys it after the interpreter has finalized, where gloo's worker threads,
still holding tensors of Python objects, abort the process ("terminate called without an active
exception"). The teardown runs from an ``atexit`` hook registered when the group is created, so it runs
before the handlers of modules imported earlier (torch's), while the interpreter is whole.
"""

from __future__ import annotations

import atexit
import datetime
import os
import sys
import threading
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from pyfuser.host_ir.cuda_graph import release_collective_graphs
from pyfuser.options import LaunchInfo

#: Default collective timeout in seconds; override with ``PYFUSER_DIST_TIMEOUT``.
DEFAULT_TIMEOUT_S = 300.0


class Communicator:
    """The process-wide communicator (``Communicator.instance()``).

    Backend: NCCL when every local rank can have its own GPU, else gloo; ``PYFUSER_DIST_BACKEND=gloo|nccl``
    overrides.
    """

    _instance: Communicator | None = None

    def __init__(self, info: LaunchInfo | None = None, backend: str | None = None,
                 timeout_s: float | None = None) -> None:
        self.info = info or LaunchInfo.from_env()
        if backend is None:
            one_gpu_each = torch.cuda.is_available() and torch.cuda.device_count() >= self.info.local_size
            backend = os.environ.get("PYFUSER_DIST_BACKEND") or ("nccl" if one_gpu_each else "gloo")
        if backend not in ("nccl", "gloo"):
            raise ValueError(f"Communicator backend must be 'nccl' or 'gloo', got {backend!r}")
        self.backend = backend
        if timeout_s is None:
            timeout_s = float(os.environ.get("PYFUSER_DIST_TIMEOUT", DEFAULT_TIMEOUT_S))
        self.timeout = datetime.timedelta(seconds=timeout_s)
        #: the sub-groups handed out: the only references pyfuser keeps, so dropping them at teardown ends
        #: the groups' threads (compiled steps look groups up here at run time)
        self._groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
        self._created_world = False

    @classmethod
    def instance(cls) -> Communicator:
        """The communicator of this process; in a multi-process world the first call joins the default
        group, so every rank joins when it first compiles a multi-device fusion -- also ranks that will
        have nothing to communicate, which would otherwise leave their peers waiting in the rendezvous."""
        if cls._instance is None:
            comm = Communicator()
            if comm.size() > 1:
                comm._ensure_initialized()
            cls._instance = comm
        return cls._instance

    # --- who am I -------------------------------------------------------------------------------
    def rank(self) -> int:
        return self.info.rank

    def size(self) -> int:
        return self.info.size

    def local_rank(self) -> int:
        return self.info.local_rank

    def local_size(self) -> int:
        return self.info.local_size

    def device(self) -> torch.device:
        """This rank's device: ``cuda:local_rank`` under NCCL, else the CPU."""
        if self.backend == "nccl":
            return torch.device("cuda", self.info.local_rank % max(torch.cuda.device_count(), 1))
        return torch.device("cpu")

    # --- groups -------------------------------------------------------------------------------
    def _ensure_initialized(self) -> None:
        if dist.is_initialized():
            return
        os.environ.setdefault("MASTER_ADDR", self.info.master_addr)
        os.environ.setdefault("MASTER_PORT", str(self.info.master_port))
        if self.backend == "nccl":
            # No ``device_id``: binding one makes NCCL create every sub-group by splitting the world
            # communicator, a collective that ranks outside the team (which never call ``group``) would
            # have to join -- members of a mesh on a subset of the ranks would hang.
            torch.cuda.set_device(self.device())
        dist.init_process_group(self.backend, rank=self.info.rank, world_size=self.info.size,
                                timeout=self.timeout)
        self._created_world = True
        _register_exit_teardown(self)

    def group(self, team: Sequence[int]) -> dist.ProcessGroup:
        """The process group of ``team`` (whole world: the default group). Only members call this:
        sub-groups synchronize locally, so ranks outside a team never block on its creation."""
        key = tuple(sorted(team))
        found = self._groups.get(key)
        if found is not None:
            return found
        if any(not 0 <= r < self.info.size for r in key):
            raise ValueError(f"team {list(team)} names ranks outside the world of {self.info.size} processes")
        if self.info.rank not in key:
            raise ValueError(f"rank {self.info.rank} asked for the group of team {list(key)} it is not in")
        self._ensure_initialized()
        if key == tuple(range(self.info.size)):
            return dist.group.WORLD  # type: ignore[return-value]  # torch's reference, dropped when it is destroyed
        found = dist.new_group(list(key), timeout=self.timeout, use_local_synchronization=True)
        self._groups[key] = found
        return found

    def barrier(self) -> None:
        self._ensure_initialized()
        if self.backend == "nccl":
            dist.barrier(device_ids=[self.device().index])
        else:
            dist.barrier()

    def shutdown(self) -> None:
        """Destroy the groups after every rank got here (optional: a group pyfuser created is also torn down
        at exit). Calling it again, or after the exit teardown, does nothing."""
        if dist.is_initialized():
            self.barrier()  # no rank tears down its groups while a peer still talks to it
        self._teardown(destroy_world=True)
        Communicator._instance = None

    def _teardown(self, destroy_world: bool) -> None:
        """Drop the CUDA graphs that captured communications, stop what runs beside the groups (the P2P
        watchdog), destroy the world (with every sub-group) when ``destroy_world``, and drop pyfuser's
        references, which ends the groups' threads. No barrier: a rank that exits after an error must not
        wait for peers that may be inside a collective it never joins (destroying its groups makes theirs
        fail instead of running into the timeout)."""
        release_collective_graphs()
        for hook in list(_BEFORE_TEARDOWN):
            hook()
        _BEFORE_TEARDOWN.clear()
        if destroy_world:
            if dist.is_initialized():
                dist.destroy_process_group()
            self._created_world = False  # a world made later by someone else is theirs to destroy
        self._groups.clear()


#: Called before the groups are destroyed: what must stop before them (the P2P transport's watchdog).
_BEFORE_TEARDOWN: list[Callable[[], None]] = []


def before_teardown(hook: Callable[[], None]) -> None:
    """Run ``hook`` at the next teardown (``shutdown()`` or interpreter exit), before the groups go."""
    _BEFORE_TEARDOWN.append(hook)


class _ExitGuard:
    """Ends the process when the exit teardown outlasts the timeout. Its thread starts with the group: from
    Python 3.12 on, no thread can start once the interpreter is shutting down."""

    def __init__(self) -> None:
        self._armed = threading.Event()
        self._done = threading.Event()
        self._rank, self._limit = 0, 0.0
        threading.Thread(target=self._run, name="pyfuser-exit-guard", daemon=True).start()

    def arm(self, rank: int, limit: float) -> None:
        self._rank, self._limit = rank, limit
        self._done.clear()
        self._armed.set()

    def disarm(self) -> None:
        self._armed.clear()
        self._done.set()

    def _run(self) -> None:
        while True:
            self._armed.wait()
            if not self._done.wait(self._limit):
                sys.stderr.write(f"pyfuser: rank {self._rank}: tearing the process groups down at exit did not finish "
                                 f"within {self._limit:g}s (PYFUSER_DIST_TIMEOUT): a peer failed or stopped inside a "
                                 "collective; exiting\n")
                sys.stderr.flush()
                os._exit(1)


_EXIT_GUARD: _ExitGuard | None = None
_WORLD_CREATOR: Communicator | None = None  # the communicator whose init_process_group made the world


def _register_exit_teardown(creator: Communicator) -> None:
    global _EXIT_GUARD, _WORLD_CREATOR
    _WORLD_CREATOR = creator
    if _EXIT_GUARD is None:
        _EXIT_GUARD = _ExitGuard()
        atexit.register(teardown_at_exit)


def teardown_at_exit() -> None:
    """The interpreter is exiting: tear down what the communicator holds (the world only if pyfuser created
    it). Bounded by the timeout: a teardown blocked on a lost peer (a gloo worker inside a collective, an
    NCCL communicator with unfinished work) ends the process with a line saying so, never hangs."""
    global _WORLD_CREATOR
    comms = [c for c in (Communicator._instance, _WORLD_CREATOR) if c is not None]
    if not comms:
        return
    guard = _EXIT_GUARD
    if guard is not None:
        guard.arm(comms[0].rank(), comms[0].timeout.total_seconds())
    try:
        for comm in comms:
            comm._teardown(destroy_world=comm._created_world)
    finally:
        if guard is not None:
            guard.disarm()
    Communicator._instance = _WORLD_CREATOR = None
