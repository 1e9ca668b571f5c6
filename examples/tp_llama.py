"""Tensor + sequence parallel training of a small Hugging Face Llama through ``torch.compile(backend="pyfuser")``.

    torchrun --nproc-per-node 2 examples/tp_llama.py            # CPU: gloo, float32
    torchrun --nproc-per-node 4 examples/tp_llama.py            # GPUs: NCCL, bfloat16 (one GPU per rank)

The model (config built here, random weights, nothing downloaded) is parallelized with torch's plans as
torchtitan does: the attention and MLP projections column- then row-parallel, the norms and the residual
stream sequence-parallel (``Shard(1)``), the embedding row-parallel over the vocabulary and the output
head column-parallel. DTensor turns the plan into functional collectives, which AOTAutograd leaves in
the ATen graphs pyfuser compiles: an all-gather feeding a matmul and a matmul feeding a reduce-scatter
run as pyfuser pipelines (the communication as Host IR nodes of the matmul's program), the other
collectives in torch, between pyfuser's regions. A few SGD steps; rank 0 checks every step's loss
against the same model trained on one process without parallelism, and prints what the backend made of
each graph.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from pyfuser.integrations.torch_compile import PyfuserBackend

try:
    import transformers
except ImportError:  # pragma: no cover - the README's set-up installs it
    sys.exit("examples/tp_llama.py needs transformers: pip install -e '.[test]' (or pip install transformers)")

# Multi-GPU settings every pyfuser multi-GPU run keeps (NVLink multicast off).
for _name in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
    os.environ.setdefault(_name, "0" if _name == "NCCL_NVLS_ENABLE" else "1")


def build_model(heads: int, layers: int, hidden: int, vocab: int, dtype: torch.dtype, device: torch.device,
                kv_heads: int | None = None, intermediate: int | None = None,
                max_positions: int = 256) -> transformers.LlamaForCausalLM:
    """The same random model on every rank (one seed); the heads, key / value heads, MLP width and vocabulary
    divide by the ranks."""
    config = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=intermediate or 2 * hidden,
                                      num_hidden_layers=layers, num_attention_heads=heads,
                                      num_key_value_heads=kv_heads or heads, vocab_size=vocab,
                                      max_position_embeddings=max_positions, attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype)


def parallelize(model: transformers.LlamaForCausalLM, mesh: DeviceMesh) -> None:
    """torchtitan's TP + SP plan, on Hugging Face's module names."""
    parallelize_module(model, mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    for layer in model.model.layers:
        parallelize_module(layer, mesh, {
            "input_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                            desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "post_attention_layernorm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        })


def train_step(run: object, optimizer: torch.optim.Optimizer, ids: torch.Tensor) -> torch.Tensor:
    """One SGD step on ``ids`` (next-token loss); its loss."""
    optimizer.zero_grad(set_to_none=True)
    # The positions and the causal mask of the whole sequence: the embedding's output is sequence-sharded,
    # and Hugging Face would otherwise derive the rotary table and the mask from the local shard's length.
    seq = ids.shape[1]
    positions = torch.arange(seq, device=ids.device)
    causal = torch.ones(seq, seq, dtype=torch.bool, device=ids.device).tril().expand(ids.shape[0], 1, seq, seq)
    loss = run(ids, labels=ids, use_cache=False, position_ids=positions[None],  # type: ignore[operator]
               cache_position=positions, attention_mask=causal).loss
    loss.backward()
    optimizer.step()
    return loss.detach()


def train(model: torch.nn.Module, run: object, batches: list[torch.Tensor], lr: float) -> list[float]:
    """Plain SGD steps (the same arithmetic on DTensor shards as on whole tensors); the loss of each."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    return [float(train_step(run, optimizer, ids).float()) for ids in batches]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=16, help="tokens per sequence (divisible by the ranks)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                        help="default: bfloat16 on GPUs, float32 on CPUs")
    parser.add_argument("--interpreter", action="store_true", help="CPU regions as generated kernels (slow)")
    args = parser.parse_args()

    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if cuda else "float32"))
    heads = 2 * size
    if args.seq % size:
        sys.exit(f"--seq {args.seq} must be divisible by the {size} ranks (the sequence is sharded)")
    vocab = 64 * size
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, vocab, (args.batch, args.seq), generator=gen).to(device) for _ in range(args.steps)]

    model = build_model(heads, args.layers, args.hidden, vocab, dtype, device)
    parallelize(model, init_device_mesh(device.type, (size,)))
    backend = PyfuserBackend(triton_interpreter=args.interpreter)
    compiled = torch.compile(model, backend=backend)  # with pyfuser pip-installed: backend="pyfuser"
    losses = train(model, compiled, batches, lr=0.1)

    ok = True
    if rank == 0:
        reference = build_model(heads, args.layers, args.hidden, vocab, dtype, device)
        want = train(reference, reference, batches, lr=0.1)
        tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
        print(f"{size} ranks, {dtype}: step losses, TP + SP through pyfuser: {[f'{v:.6f}' for v in losses]}")
        print(f"{size} ranks, {dtype}: step losses, one process in eager:   {[f'{v:.6f}' for v in want]}")
        ok = all(abs(a - b) <= tolerance * max(1.0, abs(b)) for a, b in zip(losses, want, strict=True))
        for graph in backend.graphs:
            pipelines = graph.collective_matmuls
            kept = collections.Counter(why.split(" (not pipelined: ")[-1].removesuffix(")") for why in graph.eager.values()
                                       if why.startswith("_c10d_functional.") and "wait_tensor" not in why)
            print(f"{graph.kind} graph: {len(graph.regions)} regions, {len(pipelines)} pipelines (all-gather + matmuls, "
                  f"matmul + reduce-scatter), {sum(kept.values())} collectives left to torch"
                  + "".join(f"\n  pipeline {p.summary()}" for p in pipelines)
                  + "".join(f"\n  torch's x{n}: {why}" for why, n in kept.items()))
        print("losses match" if ok else f"LOSSES DIFFER (tolerance {tolerance})")
    flag = torch.tensor([int(ok)], device=device)
    dist.broadcast(flag, 0)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if int(flag.item()) else 1


if __name__ == "__main__":
    sys.exit(main())
