"""Communicator: this process' place in the world and lazily created torch.distributed groups.

The launcher (torchrun or mpirun) tells each process its rank through the environment. The default
process group is created on first use, once, with NCCL for CUDA and gloo for CPU, and every group gets
a timeout so a rank that dies makes the others fail with an error instead of hanging.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence

import torch
import torch.distributed as dist

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
        self._groups: dict[tuple[int, ...], dist.ProcessGroup] = {}

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

    def group(self, team: Sequence[int]) -> dist.ProcessGroup:
        """The process group of ``team`` (whole world: the default group). Only members call this:
        sub-groups synchronize locally, so ranks outside a team never block on its creation."""
        key = tuple(sorted(team))
        if any(not 0 <= r < self.info.size for r in key):
            raise ValueError(f"team {list(team)} names ranks outside the world of {self.info.size} processes")
        if self.info.rank not in key:
            raise ValueError(f"rank {self.info.rank} asked for the group of team {list(key)} it is not in")
        self._ensure_initialized()
        if key == tuple(range(self.info.size)):
            return dist.group.WORLD  # type: ignore[return-value]
        if key not in self._groups:
            self._groups[key] = dist.new_group(list(key), timeout=self.timeout, use_local_synchronization=True)
        return self._groups[key]

    def barrier(self) -> None:
        self._ensure_initialized()
        if self.backend == "nccl":
            dist.barrier(device_ids=[self.device().index])
        else:
            dist.barrier()

    def shutdown(self) -> None:
        """Destroy the groups this communicator created (call once at the end of a program)."""
        if dist.is_initialized():
            self.barrier()  # no rank tears down its groups while a peer still talks to it
            dist.destroy_process_group()
        self._groups.clear()
        Communicator._instance = None
