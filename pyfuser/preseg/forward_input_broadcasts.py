"""Forward the cheap chains that start at a fusion input (or at nothing) into each of their readers
(nvFuser's segmenter forwards the unary ops of fusion inputs the same way).

A value computed from a fusion input by broadcasts, expands and unary math (``cos[None, None]``,
``sin(freqs) * 1.0`` read by the rotary embedding of both q and k), or from nothing (an ``iota`` of
position ids, a ``full``), that several exprs read would otherwise be one tensor for two segments:
either a kernel of its own that writes it out to global memory, or a boundary that stops the
segments around it from merging (one pointwise kernel writes outputs of one shape). Recomputing it
reads nothing more than the input its readers' kernels would read anyway, so each reader gets its
own chain from the input, and the segmenter then puts every copy inside the kernel of its reader.

A value computed from nothing at all (DeBERTa's relative-position buckets: ``arange``s, their
difference, its sign, log and clamps) reads no memory in any copy, so there the chain may combine
several forwarded values (binary and ternary ops of two or three of them) and squeeze them. Each
reader's private chain also keeps its kernel's axes its own: one ``[S, S]`` table read as it is by
one gather and transposed by another would tie the query axis to the key axis in a kernel that reads
both (the scores' softmax could not be one kernel); each copy maps onto its reader's axes alone.

A value a GEMM or an attention call reads is written anyway, so it is not forwarded.

Forwarded: broadcasts and expands (views on the ATen path too) and, where segments run as generated
kernels (each copy computed inside its reader's kernel, not as an ATen call of its own), unary ops,
binary ops of one tensor and a scalar, ``iota`` and ``full``, each of a fusion input or of another
forwarded value. Only tensors as defined (loop domain
= logical domain, no parallel type, no layout of its own, not inlined) that are not fusion outputs
are forwarded: a scheduled one is the user's, an output is written anyway.
"""

from __future__ import annotations

from pyfuser.ir.base import Expr
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.ops import (
    BinaryOp,
    BroadcastOp,
    ExpandOp,
    FullOp,
    IotaOp,
    LinearOp,
    MatmulOp,
    SqueezeOp,
    TernaryOp,
    UnaryOp,
)
from pyfuser.ir.ops.attention import SdpaBwdOp, SdpaFwdOp
from pyfuser.ir.ops.matmul import GroupedMmOp
from pyfuser.ir.tensor_view import TensorView, as_defined, new_like
from pyfuser.options import CompileOptions

#: exprs whose result costs nothing to recompute beside their tensor operand (or from no tensor at all)
_CHEAP = (BroadcastOp, ExpandOp, UnaryOp, BinaryOp, IotaOp, FullOp)
#: exprs that cost nothing to recompute from values that are themselves computed from nothing
_INPUT_FREE = (*_CHEAP, TernaryOp, SqueezeOp)
#: The most exprs the copies of one forwarded value may add (a long chain many exprs read stays shared)
COPY_BUDGET = 2048
#: readers that run as ATen calls on tensors in memory, never inside a kernel
_READ_FROM_MEMORY = (MatmulOp, LinearOp, GroupedMmOp, SdpaFwdOp, SdpaBwdOp)


def _as_defined(tv: TensorView) -> bool:
    return not tv.is_fusion_output and as_defined(tv)


def _input_free(expr: Expr, free: set[int], kernels: bool) -> bool:
    """Whether ``expr`` computes its output cheaply from values computed from nothing (or from no
    tensor at all), inside the kernels that read it."""
    return (kernels and isinstance(expr, _INPUT_FREE) and len(expr.outputs) == 1
            and isinstance(expr.outputs[0], TensorView) and all(id(t) in free for t in expr.tensor_inputs)
            and _as_defined(expr.output))


def _forwardable(expr: Expr, forwarded: set[int], kernels: bool) -> bool:
    """Whether ``expr`` computes its output from fusion inputs and forwarded values only, cheaply: at
    most one tensor operand (a binary op of two tensors would read two inputs in each copy); math only
    where ``kernels`` compute it inline."""
    cheap = _CHEAP if kernels else (BroadcastOp, ExpandOp)
    if not isinstance(expr, cheap) or len(expr.outputs) != 1 or not isinstance(expr.outputs[0], TensorView):
        return False
    tensors = expr.tensor_inputs
    if isinstance(expr, BroadcastOp | ExpandOp | UnaryOp | BinaryOp) and len(tensors) != 1:
        return False
    return all(t.is_fusion_input or id(t) in forwarded for t in tensors) and _as_defined(expr.output)


def _copy_chain(tv: TensorView, fusion: Fusion, copies: dict[int, TensorView]) -> TensorView:
    """A private copy of the forwarded exprs that compute ``tv``; ``copies``: the values of this copy
    made so far (a value two exprs of the chain read is copied once)."""
    made = copies.get(id(tv))
    if made is not None:
        return made
    expr = tv.definition
    assert expr is not None
    inputs = [v if not isinstance(v, TensorView) or v.is_fusion_input else _copy_chain(v, fusion, copies)
              for v in expr.inputs]
    copy = new_like(tv)
    copies[id(tv)] = copy
    copy.device_mesh = tv.device_mesh
    if isinstance(expr, BroadcastOp | ExpandOp):
        source = inputs[0]
        assert isinstance(source, TensorView)
        if isinstance(expr, BroadcastOp):
            BroadcastOp(fusion, copy, source, expr.flags, expr.implicit)
        else:
            ExpandOp(fusion, copy, source, expr.size_checks, expr.shape)
    elif isinstance(expr, UnaryOp):
        UnaryOp(fusion, expr.kind, copy, inputs[0])
    elif isinstance(expr, BinaryOp):
        BinaryOp(fusion, expr.kind, copy, inputs[0], inputs[1]).number_like = expr.number_like
    elif isinstance(expr, TernaryOp):
        TernaryOp(fusion, expr.kind, copy, inputs[0], inputs[1], inputs[2])
    elif isinstance(expr, SqueezeOp):
        source = inputs[0]
        assert isinstance(source, TensorView)
        SqueezeOp(fusion, copy, source, expr.flags)
    elif isinstance(expr, IotaOp):
        IotaOp(fusion, copy, inputs[0], inputs[1], inputs[2])
    else:
        assert isinstance(expr, FullOp)
        FullOp(fusion, copy, inputs[0])
    return copy


def _chain_size(tv: TensorView, forwarded: set[int]) -> int:
    """How many exprs a copy of ``tv``'s forwarded chain holds."""
    seen: set[int] = set()
    stack = [tv]
    while stack:
        value = stack.pop()
        if id(value) in seen or id(value) not in forwarded:
            continue
        seen.add(id(value))
        definition = value.definition
        if definition is not None:
            stack.extend(definition.tensor_inputs)
    return len(seen)


def forward_input_broadcasts(fusion: Fusion, options: CompileOptions) -> None:
    exprs = fusion.exprs()
    live = {id(e) for e in exprs}
    forwarded: list[TensorView] = []
    seen: set[int] = set()
    free: set[int] = set()
    for expr in exprs:
        if _input_free(expr, free, options.kernels):
            free.add(id(expr.output))
        elif not _forwardable(expr, seen, options.kernels):
            continue
        forwarded.append(expr.output)
        seen.add(id(expr.output))
    for tv in forwarded:
        readers: list[Expr] = list(dict.fromkeys(u for u in tv.uses if id(u) in live))
        # A GEMM or attention call reads the value from memory, so it is written anyway: the other
        # readers read it too (a copy of their own was written beside it: Whisper's scaled queries, read
        # by a matmul and, reshaped, by a bias gradient's kernel and two more matmuls, written twice).
        if any(isinstance(r, _READ_FROM_MEMORY) for r in readers):
            continue
        if len(readers) > 1 and (len(readers) - 1) * _chain_size(tv, seen) > COPY_BUDGET:
            continue  # (the segmenter's time grows with the copies)
        for reader in readers[1:]:
            reader.replace_input(tv, _copy_chain(tv, fusion, {}))
