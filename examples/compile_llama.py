"""``torch.compile(model, backend="pyfuser")`` on a small Llama-style decoder from Hugging Face
``transformers`` (config built here, random weights, nothing downloaded): forward and backward,
checked against eager, then which regions became which kernels and what stayed in eager, and why.

    python examples/compile_llama.py                  # CUDA when present, else CPU (ATen calls)
    python examples/compile_llama.py --interpreter    # CPU with generated kernels (Triton's interpreter)
    python examples/compile_llama.py --cuda-graph     # regions replayed from CUDA graphs (CUDA)
    PYFUSER_DUMP=fx_graph python examples/compile_llama.py   # each ATen graph with its regions marked
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyfuser.integrations.torch_compile import PyfuserBackend

try:
    import transformers
except ImportError:  # pragma: no cover - the README's set-up installs it
    sys.exit("examples/compile_llama.py needs transformers: pip install -e '.[test]' (or pip install transformers)")


def build_model(device: str, dtype: torch.dtype) -> torch.nn.Module:
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype)


def step(run: object, model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    out = run(ids, labels=ids, use_cache=False)  # type: ignore[operator]
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    parser.add_argument("--interpreter", action="store_true", help="generated kernels on CPU (Triton's interpreter)")
    parser.add_argument("--cuda-graph", action="store_true", help="replay regions from CUDA graphs")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    model = build_model(args.device, dtype)
    ids = torch.randint(0, 256, (2, 32), device=args.device)

    backend = PyfuserBackend(triton_interpreter=args.interpreter, cuda_graph=args.cuda_graph)
    compiled = torch.compile(model, backend=backend)  # with pyfuser pip-installed: backend="pyfuser"
    logits, grads = step(compiled, model, ids)
    logits, grads = step(compiled, model, ids)  # the cached path (and CUDA-graph replay)
    want_logits, want_grads = step(model, model, ids)
    tolerance = {torch.float32: 2e-4, torch.float64: 1e-7, torch.bfloat16: 5e-2}[dtype]
    torch.testing.assert_close(logits, want_logits, rtol=tolerance, atol=tolerance)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, want_grads[name], rtol=tolerance, atol=tolerance,
                                   msg=lambda m, name=name: f"gradient of {name}: {m}")
    print(f"forward and backward match eager ({args.device}, {args.dtype}, logits {tuple(logits.shape)}, "
          f"{len(grads)} parameter gradients)\n")

    for graph in backend.graphs:
        print(f"== {graph.kind} graph: {len(graph.regions)} pyfuser regions, {len(graph.eager)} ATen ops left in eager")
        for region in graph.regions:
            print(region.summary())
        why = collections.Counter(graph.eager.values())
        print("left in eager:")
        for reason, count in why.most_common():
            print(f"  {count:3d} x {reason}")
        print()


if __name__ == "__main__":
    main()
