"""Define, schedule, print and run a fusion on one device (CPU, or CUDA when present).

    python examples/fusion_basics.py
"""

from __future__ import annotations

import torch

from pyfuser import DataType, FusionDefinition, ParallelType


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=True, dtype=DataType.Float)
        bias = fd.define_tensor([-1], contiguity=True, dtype=DataType.Float)
        y = fd.ops.add(x, bias)  # bias broadcasts over rows
        y = fd.ops.gelu(y, approximate="tanh")
        total = fd.ops.sum(y, [1], keepdim=True)
        out = fd.ops.div(y, total)
        fd.add_output(out)

    # Schedule: compute `y` in 3 row chunks, each on its own CUDA stream (a host loop on CPU).
    y.outer_split(0, 3)
    y.axis(0).parallelize(ParallelType.stream)

    print("== definition ==")
    print(fd)
    print("== schedule of", y.short_name, "==")
    y.print_transforms()

    inputs = [torch.randn(10, 16, device=device), torch.randn(16, device=device)]
    (result,) = fd.execute(inputs)
    ref = torch.nn.functional.gelu(inputs[0] + inputs[1], approximate="tanh")
    ref = ref / ref.sum(1, keepdim=True)
    torch.testing.assert_close(result, ref)
    # Symbolic sizes: the same definition runs on other shapes.
    (result,) = fd.execute([torch.randn(7, 5, device=device), torch.randn(5, device=device)])
    print(f"== ran on {device}: matches torch; re-executed with new sizes -> {tuple(result.shape)} ==")


if __name__ == "__main__":
    main()
