"""Chains of views left in eager between regions, each as one reinterpretation of its root.

Around attention a Llama layer's graphs keep chains such as ``_unsafe_view -> view -> transpose`` (the
head reshape of a projection) in eager: a call into torch per view, each 1-3 us of host time on the
GPU machines. A chain whose intermediate values nothing else reads becomes one ``ViewChain`` call.
Its first call runs the views and records the result's sizes, strides and storage offset relative to
the root; a later call on a root of the same sizes and strides makes the result with one
reinterpretation of the root (Inductor's ``reinterpret_tensor``); any other root, or a chain whose
result did not share the root's memory (a ``reshape`` that copied), runs the views again.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch
from torch.fx import GraphModule, Node

from pyfuser.codegen.launcher import reinterpret_tensor

aten = torch.ops.aten

#: Views a chain may hold: ops whose result is a function of the operand's sizes and strides and the
#: (constant) arguments, with the operand's dtype.
CHAIN_OPS = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.t.default, aten.transpose.int,
    aten.permute.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
    aten.expand.default, aten.select.int, aten.slice.Tensor, aten.alias.default, aten.detach.default,
})


class ViewChain:
    """``chain(root)``: the views of the chain applied to ``root``, after the first call as one
    reinterpretation (see the module's docstring)."""

    def __init__(self, name: str, ops: list[tuple[Any, tuple[Any, ...]]]) -> None:
        self.__name__ = self.__qualname__ = name  # how torch.fx prints the call
        self.ops = ops
        self._root: tuple[torch.Size, tuple[int, ...]] | None = None
        self._result: tuple[tuple[int, ...], tuple[int, ...], int] = ((), (), 0)

    def __call__(self, root: torch.Tensor) -> torch.Tensor:
        if self._root is not None and root.shape == self._root[0] and root.stride() == self._root[1]:
            return reinterpret_tensor(root, *self._result)
        out = root
        for op, args in self.ops:
            out = op(out, *args)
        if self._root is None and out.numel() and out.dtype == root.dtype \
                and out.untyped_storage().data_ptr() == root.untyped_storage().data_ptr():
            self._root = (root.shape, root.stride())
            self._result = (tuple(out.shape), out.stride(), int(out.storage_offset() - root.storage_offset()))
        return out

    def __repr__(self) -> str:
        return f"<view chain {self.__name__}: {' -> '.join(str(op) for op, _ in self.ops)}>"


def _link(node: Node) -> bool:
    """A view of a chain: one of ``CHAIN_OPS`` on a tensor node, every other argument a constant."""
    return node.op == "call_function" and node.target in CHAIN_OPS and viewed_operand(node) is not None


def viewed_operand(node: Node) -> Node | None:
    """A call's first argument, when it is a node and every other argument a constant (what a view
    needs to be a function of its operand's geometry alone); else None."""
    if node.kwargs or not node.args or not isinstance(node.args[0], Node):
        return None
    if any(isinstance(a, Node) or (isinstance(a, list | tuple) and any(isinstance(x, Node) for x in a))
           for a in node.args[1:]):
        return None
    return node.args[0]


def collapse_view_chains(gm: GraphModule, protected: Collection[Node] = ()) -> int:
    """Replace each chain of two or more views (``_link``s, each read only by the next) by one
    ``ViewChain`` call, in place (the caller regenerates the code); a chain ending in a node of
    ``protected`` (outputs whose aliasing AOTAutograd tracks) is left alone. Returns how many
    chains were collapsed."""
    collapsed = 0
    for node in list(gm.graph.nodes):
        if not _link(node) or node in protected:
            continue
        # ``node`` ends a chain unless its one reader continues it
        users = list(node.users)
        if len(users) == 1 and _link(users[0]) and users[0] not in protected:
            continue
        chain = [node]
        while True:
            operand = chain[0].args[0]
            if not (isinstance(operand, Node) and _link(operand) and len(operand.users) == 1):
                break
            chain.insert(0, operand)
        if len(chain) < 2:
            continue
        root = chain[0].args[0]
        collapse = ViewChain(f"view_chain_{collapsed}", [(n.target, tuple(n.args[1:])) for n in chain])
        with gm.graph.inserting_after(node):
            call = gm.graph.call_function(collapse, (root,))
        call.meta.update(node.meta)
        node.replace_all_uses_with(call)
        for dead in reversed(chain):
            gm.graph.erase_node(dead)
        collapsed += 1
    return collapsed
