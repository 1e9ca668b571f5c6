"""The main example (README's first command).

1. One process: define, schedule (stream-parallel row chunks), print and run a fusion.
2. Two processes: a transformer MLP block (linear, gelu, linear) with tensor + sequence
   parallelism, launched with torchrun (gloo on CPU, NCCL when there are >= 2 GPUs); each rank
   prints its Host IR and checks its result against single-process torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def run_multiprocess_mlp() -> None:
    env = dict(os.environ)
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    env.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    backend = "NCCL on 2 GPUs" if torch.cuda.device_count() >= 2 else "gloo on CPU"
    print(f"\n== transformer MLP block, tensor + sequence parallel, 2 processes ({backend}) ==", flush=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(HERE / "mlp_tp_sp.py")]
    subprocess.run(cmd, env=env, check=True, timeout=600)


def main() -> None:
    sys.path.insert(0, str(HERE))
    import fusion_basics

    fusion_basics.main()
    run_multiprocess_mlp()


if __name__ == "__main__":
    main()
