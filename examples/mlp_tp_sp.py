"""A transformer MLP block (linear -> gelu -> linear) with tensor + sequence parallelism.

    torchrun --nproc-per-node 2 examples/mlp_tp_sp.py

Every rank defines the same fusion with *global* shapes and annotates how tensors are sharded:

* the activations ``x [S, H]`` come in sequence-sharded (``S`` split over the ranks),
* the first weight is column-parallel (``W1 [4H, H]``: its output features split), the second
  row-parallel (``W2 [H, 4H]``: its input features split),
* the block's output is sequence-sharded again.

pyfuser propagates the shardings, inserts the communications (an Allgather of ``x`` before the first
linear, a ReduceScatter of the second linear's partial sums) and runs each rank's program on its shards:
gloo on CPUs, NCCL when each rank has a GPU. Rank 0 prints its Host IR; every rank checks its piece of
the output against single-process torch.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition, ParallelType
from pyfuser.multidevice import Communicator, DeviceMesh, MultiDeviceExecutor, shard_tensor


def define_mlp(num_ranks: int) -> tuple[FusionDefinition, list]:
    mesh = DeviceMesh(range(num_ranks))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        w1, b1 = fd.define_tensor([-1, -1]), fd.define_tensor([-1])
        w2, b2 = fd.define_tensor([-1, -1]), fd.define_tensor([-1])
        hidden = fd.ops.gelu(fd.ops.linear(x, w1, b1), approximate="tanh")
        out = fd.ops.linear(hidden, w2, b2)
        fd.add_output(out)
    for tv in (x, w1, b1, w2, b2, out):
        tv.set_device_mesh(mesh)
    for tv, axis in ((x, 0), (w1, 0), (b1, 0), (w2, 1), (out, 0)):
        tv.outer_split(axis, num_ranks)  # global extent -> [ranks, extent / ranks]
        tv.axis(axis).parallelize(ParallelType.mesh_x)
    return fd, [x, w1, b1, w2, b2]


def main() -> int:
    comm = Communicator.instance()
    rank, size, device = comm.rank(), comm.size(), comm.device()
    seq, hidden = 8 * size, 32

    torch.manual_seed(0)  # every rank builds the same full tensors and keeps its shards
    full = [torch.randn(seq, hidden), torch.randn(4 * hidden, hidden) / hidden**0.5, torch.randn(4 * hidden),
            torch.randn(hidden, 4 * hidden) / (2 * hidden), torch.randn(hidden)]
    full = [t.to(device) for t in full]

    fd, inputs = define_mlp(size)
    executor = MultiDeviceExecutor(fd.fusion)
    (local_out,) = executor.run([shard_tensor(t, tv) for t, tv in zip(full, inputs, strict=True)])

    x, w1, b1, w2, b2 = full
    expected = F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2).chunk(size, 0)[rank]
    ok = torch.allclose(local_out, expected, atol=1e-5, rtol=1e-5)
    if rank == 0:
        print(f"== Host IR of rank 0 ({size} ranks, {comm.backend}) ==")
        print(executor.host_ir(), end="", flush=True)
    error = (local_out - expected).abs().max().item()
    for speaker in range(size):  # one rank at a time, so lines do not interleave
        comm.barrier()
        if speaker == rank:
            print(f"rank {rank}: output shard {tuple(local_out.shape)} of [{seq}, {hidden}], max |error| vs torch "
                  f"{error:.2e} -> {'OK' if ok else 'MISMATCH'}", flush=True)
    comm.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
