"""``torch.compile(model, backend="pyfuser")``: a dynamo backend that partitions each ATen graph
into pyfuser regions (FusionDefinitions) and eager ops. Not imported by ``import pyfuser``: dynamo
loads it through the ``torch_dynamo_backends`` entry point."""

from pyfuser.integrations.torch_compile.backend import CompiledGraph, PyfuserBackend, pyfuser_backend
from pyfuser.integrations.torch_compile.decompositions import DECOMPOSED_OPS, decomposition_table
from pyfuser.integrations.torch_compile.support import LOWERINGS

__all__ = ["DECOMPOSED_OPS", "LOWERINGS", "CompiledGraph", "PyfuserBackend", "decomposition_table", "pyfuser_backend"]
