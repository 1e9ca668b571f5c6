"""TensorDomain: the logical / root / allocation / loop views of one tensor's axes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pyfuser.ir.iter_domain import IdTransform, IterDomain

Contiguity = list[bool | None]


class DomainCoverageError(ValueError):
    pass


def check_covers(target: Sequence[IterDomain], logical: Sequence[IterDomain], what: str) -> None:
    """Check that ``target`` is a complete frontier of the ID DAG rooted at ``logical``.

    Walks ``target`` back to ``logical``: an ID is replaced by the inputs of its defining
    transform only when all outputs of that transform are present. Whatever remains must be
    exactly ``logical``, each ID once.
    """
    if len(set(map(id, target))) != len(target):
        dup = next(i for i in target if sum(j is i for j in target) > 1)
        raise DomainCoverageError(f"{what} lists {dup} twice")
    frontier: dict[int, IterDomain] = {id(i): i for i in target}
    logical_ids = {id(i) for i in logical}
    changed = True
    while changed:
        changed = False
        for key, node in list(frontier.items()):
            if key in logical_ids or key not in frontier:
                continue
            definition = node.definition
            if definition is None:
                raise DomainCoverageError(f"{what} contains {node}, which is not derived from the logical domain "
                                          f"({', '.join(map(str, logical))})")
            if all(id(o) in frontier for o in definition.outputs):
                for out in definition.outputs:
                    del frontier[id(out)]
                for inp in definition.inputs:
                    if id(inp) in frontier:
                        raise DomainCoverageError(f"{what} lists both {inp} and IDs derived from it")
                    frontier[id(inp)] = inp
                changed = True
    missing = [str(i) for i in logical if id(i) not in frontier]
    extra = [str(i) for k, i in frontier.items() if k not in logical_ids]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"does not cover logical IDs {', '.join(missing)}")
        if extra:
            parts.append(f"has IDs {', '.join(extra)} whose split/merge partners are missing")
        raise DomainCoverageError(f"{what} " + " and ".join(parts))


def transforms_between(start: Iterable[IterDomain], end: Iterable[IterDomain]) -> list[IdTransform]:
    """ID transforms on paths from ``start`` to ``end``, in topological (creation) order."""
    start_ids = {id(i) for i in start}
    seen: dict[int, IdTransform] = {}
    stack = list(end)
    visited: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in visited or id(node) in start_ids:
            continue
        visited.add(id(node))
        definition = node.definition
        if definition is not None and id(definition) not in seen:
            seen[id(definition)] = definition
            stack.extend(definition.inputs)
    # Creation order is a valid topological order: an output ID is always newer than its inputs.
    return sorted(seen.values(), key=lambda t: min(o.name for o in t.outputs))


class TensorDomain:
    """Domains of one tensor. ``allocation`` None means allocated as logical, row-major.

    ``contiguity`` has one entry per ID of the allocation domain (or of logical when there is no
    allocation domain), reductions excluded: True / False, or None for broadcast IDs.
    """

    __slots__ = ("logical", "root", "allocation", "contiguity", "loop", "allocation_is_hint",
                 "allocation_frozen")

    def __init__(self, logical: list[IterDomain], *, root: list[IterDomain] | None = None,
                 contiguity: Contiguity | None = None) -> None:
        self.logical = list(logical)
        self.root = list(root) if root is not None else None
        self.allocation: list[IterDomain] | None = None
        self.loop = list(logical)
        self.allocation_is_hint = False
        self.allocation_frozen = False
        if contiguity is None:
            contiguity = default_contiguity(self.logical)
        self.contiguity = list(contiguity)

    @property
    def maybe_allocation(self) -> list[IterDomain]:
        """The allocation domain, or logical when none was set."""
        return self.allocation if self.allocation is not None else self.logical

    @property
    def has_allocation(self) -> bool:
        return self.allocation is not None

    def __str__(self) -> str:
        """The loop domain, as nvFuser prints a TensorDomain (``[iS0{2}, iS1{4}]``)."""
        return "[" + ", ".join(map(str, self.loop)) + "]"

    __repr__ = __str__


def no_reductions(ids: Iterable[IterDomain]) -> list[IterDomain]:
    return [i for i in ids if not i.is_reduction()]


def default_contiguity(ids: Sequence[IterDomain], value: bool = True) -> Contiguity:
    return [None if i.is_broadcast() else value for i in no_reductions(ids)]


def format_contiguity(contiguity: Contiguity) -> str:
    return " ".join("n" if c is None else ("t" if c else "f") for c in contiguity)
