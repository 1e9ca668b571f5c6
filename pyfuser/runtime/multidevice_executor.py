"""MultiDeviceExecutor: run a multi-device fusion on this rank's shards (every rank calls ``run``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pyfuser.comm.communicator import Communicator
from pyfuser.ir.analysis.sharding import check_meshes_fit
from pyfuser.ir.fusion import Fusion
from pyfuser.options import CommunicatorBackend, check_options, comm_backend
from pyfuser.runtime.executor import FusionExecutorCache
from pyfuser.runtime.inputs import input_list


@dataclass(slots=True)
class MultiDeviceExecutorParams:
    """``device``: where this rank computes; default: ``cuda:LOCAL_RANK`` under NCCL, else the CPU.

    ``backend_type`` (nvFuser's name): what moves the data. ``CommunicatorBackend.cuda`` runs the
    all-gather + GEMM and GEMM + reduce-scatter pipelines over copy-engine P2P transfers in symmetric
    memory; ``nccl`` / ``gloo`` (or None, the default: ``PYFUSER_COMM_BACKEND``, else the process
    group's) use torch.distributed collectives.

    ``cuda_graph`` (pyfuser's): capture the program (its kernels, GEMMs and communications) into a CUDA
    graph per input signature and replay it, so a call costs one graph launch instead of one host dispatch
    per node and the first GPU operation follows the call within microseconds. Every rank must call with
    the same signatures, as for any collective; a signature's first call runs without a graph. Inputs that
    are not parameters are copied into the graph's buffers before each replay (``host_ir/cuda_graph.py``).

    ``enable_options`` / ``disable_options`` (pyfuser's): the names ``fd.execute`` takes as ``_enable_options``
    / ``_disable_options``, for every run of this executor; ``disable_options=["p2p_pipelines"]`` forces the
    plain collective then GEMM, ``enable_options=["p2p_pipelines_always"]`` the pipeline
    (``comm/overlap_model.py`` decides otherwise).

    ``use_allocation_cache``, ``number_of_streams``, ``offset_stream_indexing_by_rank`` and
    ``inter_stream_synchronization`` tune nvFuser's own Host IR executor. They are accepted so its
    scripts run unchanged; pyfuser's programs do not read them (results do not depend on them).
    """

    device: torch.device | str | None = None
    backend_type: CommunicatorBackend | None = None
    cuda_graph: bool = False
    enable_options: Sequence[str] = ()
    disable_options: Sequence[str] = ()
    use_allocation_cache: bool = False
    number_of_streams: int = 3
    offset_stream_indexing_by_rank: bool = False
    inter_stream_synchronization: bool = False


class MultiDeviceExecutor:
    """Compiles ``fusion`` (global shapes) into this rank's Host IR program and runs it on local inputs.

    Every rank calls ``run`` with one tensor per fusion input: its shard of a sharded input, the whole
    tensor of a replicated one. A rank outside an input's mesh still passes a tensor of that input's
    per-rank shape (it binds the sizes; its values are not read). Outputs are this rank's pieces; an
    output on a mesh without this rank comes back empty (every dim 0). Equivalent to
    ``fd.execute(local_inputs)``; the executor also checks up front that every mesh fits in the world.
    """

    def __init__(self, fusion: Fusion, params: MultiDeviceExecutorParams | None = None) -> None:
        self.fusion = fusion
        self.params = params or MultiDeviceExecutorParams()
        self._backend = comm_backend(self.params.backend_type)  # checked here: a bad name fails before any run
        check_options(self.params.enable_options, self.params.disable_options)
        self.communicator = Communicator.instance()
        check_meshes_fit(fusion, self.communicator.size())
        self._cache = FusionExecutorCache(fusion)

    @property
    def device(self) -> torch.device:
        if self.params.device is not None:
            return torch.device(self.params.device)
        return self.communicator.device()

    def run(self, inputs: Sequence[Any]) -> list[torch.Tensor]:
        enabled = (*self.params.enable_options, *(("cuda_graph",) if self.params.cuda_graph else ()))
        return self._cache.run(input_list(inputs), device=self.device, backend=self._backend, enable_options=enabled,
                               disable_options=self.params.disable_options)

    def host_ir(self) -> str:
        """This rank's Host IR of the latest run (as ``PYFUSER_DUMP=host_ir`` prints it)."""
        program = self._cache.last_program
        if program is None:
            raise ValueError("MultiDeviceExecutor.host_ir: run the executor once first")
        return str(program)

