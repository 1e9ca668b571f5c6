"""A torchrun script written as nvFuser's users write them: sharded fusions, their results checked, and no
``Communicator.instance().shutdown()`` at the end. pyfuser created the process group, so it tears it down
at exit: every rank exits 0, without "terminate called without an active exception".

An ``atexit`` probe registered before pyfuser creates the group runs after pyfuser's teardown and prints
whether the group and its threads are gone by then (before the interpreter finalizes).
``PYFUSER_EXIT_MODE=shutdown`` calls ``shutdown()`` twice before exiting; ``raise`` makes the last rank raise
before its collective (its peers are in a collective it never joins).
"""

from __future__ import annotations

import atexit
import os
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pyfuser import FusionDefinition, ParallelType
from pyfuser.multidevice import (
    Communicator,
    CommunicatorBackend,
    DeviceMesh,
    MultiDeviceExecutor,
    MultiDeviceExecutorParams,
    shard_tensor,
)

#: threads of gloo's process groups (its workers and event loop): outliving finalization, they abort the process
GROUP_THREADS = ("pt_gloo", "gloo_")


def group_threads() -> list[str]:
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    return sorted(n for n in names if n.startswith(GROUP_THREADS))


def probe() -> None:
    # A destroyed group's event-loop thread ends on its own shortly after: wait for it (a group left alive
    # keeps its threads for good, so this still tells the two apart).
    deadline = time.monotonic() + 5.0
    alive = group_threads()
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = group_threads()
    print(f"AT EXIT rank {os.environ['RANK']}: initialized={dist.is_initialized()} group threads={alive}", flush=True)


def main() -> None:
    comm = Communicator.instance()
    d, rank = comm.size(), comm.rank()
    device, mode = comm.device(), os.environ.get("PYFUSER_EXIT_MODE", "")
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:  # an all-reduce
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(x, [0]))
        x.set_device_mesh(mesh)
        x.outer_split(0, d)
        x.axis(0).parallelize(ParallelType.mesh_x)
    full = torch.arange(4 * d * 3, dtype=torch.float32, device=device).reshape(4 * d, 3)
    if mode == "raise" and rank == d - 1:
        raise ValueError(f"rank {rank} fails before its collective")
    (out,) = fd.execute([shard_tensor(full, x)])
    torch.testing.assert_close(out, full.sum(0))
    with FusionDefinition() as pipe:  # an all-gather in each iteration of a stream loop
        x, w = pipe.define_tensor([-1, -1, -1, -1]), pipe.define_tensor([-1, -1])
        y = pipe.ops.linear(x, w)
        pipe.add_output(y)
        for tv in (x, w, y):
            tv.set_device_mesh(mesh)
        x.axis(1).parallelize(ParallelType.mesh_x)
        y.axis(0).parallelize(ParallelType.stream)
    xf = torch.randn(2, d, 3, 8, generator=torch.Generator().manual_seed(0)).to(device)
    wf = torch.randn(5, 8, generator=torch.Generator().manual_seed(1)).to(device)
    (got,) = pipe.execute([shard_tensor(xf, x), wf])
    torch.testing.assert_close(got, F.linear(xf, wf))
    # The same pipeline over P2P channels (the CUDA transport; on CPUs the process group's send / recv).
    params = MultiDeviceExecutorParams(backend_type=CommunicatorBackend.cuda)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the CPU fallback's warning
        (got,) = MultiDeviceExecutor(pipe.fusion, params).run([shard_tensor(xf, x), wf])
    torch.testing.assert_close(got, F.linear(xf, wf))
    print(f"RANK {rank} DONE", flush=True)
    if mode == "shutdown":
        comm.shutdown()
        comm.shutdown()


if __name__ == "__main__":
    torch.set_num_threads(1)
    atexit.register(probe)
    main()
