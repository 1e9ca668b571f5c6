"""One rank fails before a collective (or, with ``PYFUSER_FAULT_P2P=1``, before its copy in a P2P pipeline);
the others must exit with an error within the group timeout.

Run by test_multidevice.py under torchrun with ``PYFUSER_DIST_TIMEOUT`` set low. The failing rank stays
alive (as a rank stuck in a bug would), so only the timeout can release its peers: gloo raises in the
waiting rank; NCCL's watchdog aborts its process; with the CUDA P2P transport the waiting GPU stream never
sees its peer's signal, and pyfuser's watchdog exits the process with a line naming the transfers.
"""

from __future__ import annotations

import os
import sys
import time

import torch
from harness import comm, randn

from pyfuser import FusionDefinition, ParallelType
from pyfuser.multidevice import (
    CommunicatorBackend,
    DeviceMesh,
    MultiDeviceExecutor,
    MultiDeviceExecutorParams,
    shard_tensor,
)


def p2p_main() -> None:
    """Seed 004 over P2P: one good execution (buffers set up), then the last rank raises before its copy."""
    c = comm()
    d, rank = c.size(), c.rank()
    with FusionDefinition() as fd:
        x, w = fd.define_tensor([-1, -1, -1, -1]), fd.define_tensor([-1, -1])
        out = fd.ops.linear(x, w)
        fd.add_output(out)
        for tv in (x, w, out):
            tv.set_device_mesh(DeviceMesh(range(d)))
        x.axis(1).parallelize(ParallelType.mesh_x)
        out.axis(0).parallelize(ParallelType.stream)
    executor = MultiDeviceExecutor(fd.fusion, MultiDeviceExecutorParams(backend_type=CommunicatorBackend.cuda))
    local, weight = shard_tensor(randn(2, d, 4, 8), x), randn(3, 8)
    executor.run([local, weight])
    if local.is_cuda:
        torch.cuda.synchronize()
    c.barrier()
    start = time.monotonic()
    if rank == d - 1:
        local = local.double()  # this rank's input is wrong: it raises before its copy
    try:
        executor.run([local, weight])
        if local.is_cuda:
            torch.cuda.synchronize()  # the GPU waits for the peer's signal (or the watchdog ends the process)
    except Exception as e:
        elapsed = time.monotonic() - start
        print(f"RANK {rank} FAILED after {elapsed:.1f}s: {type(e).__name__}: {str(e)[:200]}", flush=True)
        if rank == d - 1:
            time.sleep(float(os.environ["PYFUSER_DIST_TIMEOUT"]) * 4)  # linger: peers must not wait for us
        os._exit(1)
    print(f"RANK {rank} finished without error", flush=True)
    sys.exit(0)


def main() -> None:
    c = comm()
    d, rank = c.size(), c.rank()
    with FusionDefinition() as fd:
        x, w = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.linear(x, w))
        for tv in (x, w):
            tv.set_device_mesh(DeviceMesh(range(d)))
        for tv in (x, w):  # sequence-parallel x, column-parallel w: x is all-gathered
            tv.outer_split(0, d)
            tv.axis(0).parallelize(ParallelType.mesh_x)
    full, weight = randn(2 * d, 4), shard_tensor(randn(3 * d, 4), w)
    c.barrier()  # everyone is up and connected
    start = time.monotonic()
    local = shard_tensor(full, x)
    if rank == d - 1:
        local = local.double()  # this rank's input is wrong: it raises before communicating
    try:
        fd.execute([local, weight])
        if local.is_cuda:
            torch.cuda.synchronize()  # NCCL work is asynchronous: wait for it (or for the watchdog)
    except Exception as e:  # report how long it took, then fail the process
        elapsed = time.monotonic() - start
        print(f"RANK {rank} FAILED after {elapsed:.1f}s: {type(e).__name__}: {str(e)[:200]}", flush=True)
        if rank == d - 1:
            time.sleep(float(os.environ["PYFUSER_DIST_TIMEOUT"]) * 4)  # linger: peers must not wait for us
        os._exit(1)
    print(f"RANK {rank} finished without error", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    torch.set_num_threads(1)
    p2p_main() if os.environ.get("PYFUSER_FAULT_P2P") == "1" else main()
