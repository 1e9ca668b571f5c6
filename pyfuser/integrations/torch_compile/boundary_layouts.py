"""Layouts of the values one region passes only to other regions, chosen for the regions that read them.

A region writes each value it returns in the strides torch's meta functions traced, so that an eager
op or the graph's caller sees what eager would give it. Where nothing outside pyfuser ever sees a
value (every reader is a node of a region, it is not a graph output, saved for the backward or viewed
in eager), those strides are not observable, and eager's are often the wrong ones for the regions that
read it: torch's TensorIterator gives ``a + b`` the layout of its first operand, so a transposed view
(Whisper's encoder: ``conv1d -> gelu -> permute(0, 2, 1) + positions``) makes the whole residual
stream transposed, and every layer norm over it reduces along the outermost axis in memory (an outer
normalization, each row scattered across the tensor) where torch's own layer norm, and Inductor,
write contiguous rows.

Such a value is written row-major when a region reading it normalizes it over its trailing axes (a
reduction of the value, or of what pointwise ops, casts and clones compute from it in that region,
over its last axes): the value's node gets the row-major example value, so its producer requires
that order of the output and its readers declare their input in it. A value no region reduces that
way keeps eager's layout, the cheap one for its producer. A training forward saves such values for its
backward: there ``conv_layout.normalized_rows`` makes the choice before partitioning, the backward
compiled for the saved values' new strides.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.fx import Node

from pyfuser.integrations.torch_compile.lowering import is_tensor_meta, meta_of
from pyfuser.integrations.torch_compile.pointwise_lowerings import POINTWISE_LOWERINGS
from pyfuser.integrations.torch_compile.translator import ROW_MAJOR_OUTPUT, TranslatedRegion, size_hints
from pyfuser.ir.layout import is_dense, memory_order

aten = torch.ops.aten

#: reductions whose reduced axes are their ``dim`` argument (position 1)
REDUCTIONS = frozenset({aten.var_mean.correction, aten.var.correction, aten.sum.dim_IntList, aten.mean.dim,
                        aten.amax.default, aten.amin.default})
#: ops a value flows through unchanged in shape and axes on its way to a reduction
SAME_AXES = frozenset({*POINTWISE_LOWERINGS, aten.clone.default, aten._to_copy.default,
                       aten.alias.default, aten.detach.default})


def row_major_boundaries(regions: list[tuple[list[Node], TranslatedRegion]]) -> list[Node]:
    """The values returned by ``regions`` to be written row-major (see the module's docstring), in
    graph order; each one's ``meta['val']`` is replaced by its row-major example and marked
    ``ROW_MAJOR_OUTPUT``. The regions that return or read one must be translated again."""
    region_of = {n: k for k, (nodes, _) in enumerate(regions) for n in nodes}
    chosen: list[Node] = []
    for k, (_, translated) in enumerate(regions):
        viewed = {v.args[0] for v in translated.rederived}
        for value in translated.outputs:
            if value not in viewed and _only_regions_read(value, region_of) and _normalized_rows(value, k, region_of):
                chosen.append(value)
    for value in chosen:
        _set_row_major(value)
    return chosen


def _only_regions_read(value: Node, region_of: Mapping[Node, int]) -> bool:
    """Whether ``value`` is a tensor not laid out row-major whose every reader is a node of a region
    (so neither an eager op nor the graph's output, which covers a forward's saved values)."""
    meta = meta_of(value)
    if not is_tensor_meta(meta) or meta.dim() < 2 or not value.users:
        return False
    sizes, strides = size_hints(meta.shape), size_hints(meta.stride())
    if sizes is None or strides is None or not is_dense(sizes, strides):
        return False
    if memory_order(sizes, strides) == list(range(meta.dim())):
        return False
    return all(user.op == "call_function" and user in region_of for user in value.users)


def _normalized_rows(value: Node, producer: int, region_of: Mapping[Node, int]) -> bool:
    """Whether a region other than ``producer`` reduces ``value`` over its trailing axes (directly, or
    what its pointwise ops, casts and clones of the same shape compute from it)."""
    shape = tuple(meta_of(value).shape)
    seen: set[Node] = set()
    frontier = [u for u in value.users if region_of[u] != producer]
    while frontier:
        node = frontier.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.target in REDUCTIONS:
            if reduces_trailing_axes(node, len(shape)):
                return True
            continue
        meta = meta_of(node)
        if node.target in SAME_AXES and is_tensor_meta(meta) and tuple(meta.shape) == shape:
            frontier.extend(u for u in node.users if region_of.get(u) == region_of[node])
    return False


def reduces_trailing_axes(node: Node, rank: int) -> bool:
    """Whether a reduction's ``dim`` is the last axes of its rank-``rank`` operand, not all of them."""
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if isinstance(dims, int):
        dims = [dims]
    if not isinstance(dims, (list, tuple)) or not dims or not all(isinstance(d, int) for d in dims):
        return False
    reduced = sorted({d % rank for d in dims})
    return len(reduced) < rank and reduced == list(range(rank - len(reduced), rank))


def _set_row_major(value: Node) -> None:
    """Give ``value`` the row-major example value of its sizes and dtype (on its device)."""
    row_major = torch.empty_like(meta_of(value), memory_format=torch.contiguous_format)
    value.meta["val"] = row_major
    tensor_meta = value.meta.get("tensor_meta")
    if tensor_meta is not None:
        value.meta["tensor_meta"] = tensor_meta._replace(stride=row_major.stride(),
                                                         memory_format=torch.contiguous_format)
    value.meta[ROW_MAJOR_OUTPUT] = True

