"""Writing a kernel body: lines at an indentation, fresh names, and what is known in each scope.

A Triton loop body cannot hand its local variables to code after the loop, so everything the
builder remembers (an index expression already assigned, a value already computed, the loop
index of an ID class, a condition that masks accesses) belongs to the scope that computed it and is
forgotten when that scope closes. Identical expressions in visible scopes are assigned once
(common-subexpression elimination by text), which is also what lets a value computed at one loop
point be found again by a consumer that reaches the same indices another way.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Scope:
    exprs: dict[str, str] = field(default_factory=dict)
    values: dict[tuple[object, ...], str] = field(default_factory=dict)
    loop_index: dict[int, str] = field(default_factory=dict)
    class_indices: dict[int, list[str]] = field(default_factory=dict)
    conditions: list[tuple[str, frozenset[int]]] = field(default_factory=list)
    #: uniform conditions this scope's ``if`` already branches on
    branched: tuple[str, ...] = ()


class CodeWriter:
    def __init__(self, masked_uniform: bool = False) -> None:
        #: conditions the same for the whole tile go into the masks instead of an ``if`` around the
        #: accesses: Triton does not software-pipeline a loop whose body branches
        self.masked_uniform = masked_uniform
        self.lines: list[str] = []
        self.indent = 1
        self._counter = 0
        self._scopes = [_Scope()]
        #: tile axes each variable varies along (absent: a scalar)
        self.dims: dict[str, frozenset[int]] = {}
        #: names each assigned variable is computed from
        self._deps: dict[str, frozenset[str]] = {}

    # --- lines ----------------------------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def assign(self, prefix: str, expr: str, dims: frozenset[int] | None = None, cse: bool = True) -> str:
        """``name = expr`` (or the name an identical visible expression already has)."""
        if cse:
            for scope in reversed(self._scopes):
                if expr in scope.exprs:
                    return scope.exprs[expr]
        name = self.fresh(prefix)
        self.emit(f"{name} = {expr}")
        used = _names_in(expr)
        self.dims[name] = dims if dims is not None else self.dims_of(*used)
        self._deps[name] = frozenset(used)
        if cse:
            self._scopes[-1].exprs[expr] = name
        return name

    def reduced(self, name: str, axes: list[int | None]) -> None:
        """``name`` was reduced over tile ``axes`` (kept as size 1; None: all): it no longer varies
        along them."""
        dims = self.dims.get(name, frozenset())
        self.dims[name] = frozenset() if None in axes else dims - {a for a in axes if a is not None}

    def dims_of(self, *names: str) -> frozenset[int]:
        return frozenset().union(*(self.dims.get(n, frozenset()) for n in names))

    def dims_in(self, expr: str) -> frozenset[int]:
        """The tile axes an expression varies along (those of the names in it)."""
        return self.dims_of(*_names_in(expr))

    @staticmethod
    def is_constant(expr: str) -> bool:
        """Whether ``expr`` names nothing (``(0 + 2)``, ``3 >= 0``): a plain Python value in the kernel."""
        return not _names_in(expr)

    # --- scopes ---------------------------------------------------------------------------------------
    def open(self, header: str, branch_on: list[str] | tuple[str, ...] = ()) -> None:
        """Emit ``header`` (a ``for`` or an ``if``) and enter its body; ``branch_on``: the uniform
        conditions the ``if`` tests (they hold in the body)."""
        self.emit(header)
        self.indent += 1
        self._scopes.append(_Scope(branched=tuple(branch_on)))

    def branch(self, conditions: list[str]) -> bool:
        """Open an ``if`` on uniform ``conditions`` (none: nothing opened); whether one was opened."""
        if not conditions:
            return False
        self.open(f"if {' & '.join(conditions)}:", conditions)
        return True

    def close(self) -> None:
        self.indent -= 1
        self._scopes.pop()

    def remember(self, key: tuple[object, ...], name: str) -> None:
        self._scopes[-1].values[key] = name

    def recall(self, key: tuple[object, ...]) -> str | None:
        for scope in reversed(self._scopes):
            if key in scope.values:
                return scope.values[key]
        return None

    def bind_loop(self, loop_id: int, root: int, index: str) -> None:
        """Loop ID ``loop_id`` (of ID class ``root``) iterates with ``index`` in this scope."""
        scope = self._scopes[-1]
        scope.loop_index[loop_id] = index
        scope.class_indices.setdefault(root, []).append(index)

    def alias_loop(self, loop_id: int, index: str) -> None:
        """Loop ID ``loop_id`` iterates with the index of a loop already bound in this scope (a sibling
        reduction sharing another's loop); its class's list of loops is unchanged."""
        self._scopes[-1].loop_index[loop_id] = index

    def loop_index(self, loop_id: int) -> str | None:
        for scope in reversed(self._scopes):
            if loop_id in scope.loop_index:
                return scope.loop_index[loop_id]
        return None

    def class_indices(self, root: int) -> list[str]:
        """Indices of the loops of class ``root``, outermost scope first."""
        return [i for scope in self._scopes for i in scope.class_indices.get(root, [])]

    def add_condition(self, condition: str, dims: frozenset[int]) -> None:
        if (condition, dims) not in self.conditions():  # already holds in an enclosing scope
            self._scopes[-1].conditions.append((condition, dims))

    def conditions(self) -> list[tuple[str, frozenset[int]]]:
        return [c for scope in self._scopes for c in scope.conditions]

    def mask(self, dims: frozenset[int], uses: str | None = None) -> str:
        """The conditions an access varying along tile axes ``dims`` needs: those on its own axes (an
        access may not have a mask wider than its pointer), and with ``uses`` (the address or value
        it computes) only those on indices it is computed from: a reduction nested in a pass over a
        chunk of its axis iterates the axis itself and ignores the chunk's bound. Conditions on no
        tile axis are the same for the whole tile: the code around the access branches on them
        (``uniform``), or with ``masked_uniform`` they join the mask."""
        conds = [c for c, d in self.conditions() if d and d <= dims]
        if self.masked_uniform:
            conds += self._unbranched()
        if uses is not None:
            names = self._closure(uses)
            conds = [c for c in conds if any(n in names for n in _names_in(c) if n in self._deps)]
        return self.assign("mask", " & ".join(conds), dims) if conds else ""

    def _closure(self, expr: str) -> set[str]:
        seen: set[str] = set()
        stack = _names_in(expr)
        while stack:
            n = stack.pop()
            if n not in seen:
                seen.add(n)
                stack.extend(self._deps.get(n, ()))
        return seen

    def uniform(self) -> list[str]:
        """Conditions on no tile axis that no enclosing ``if`` already tests (none when they are
        masks)."""
        return [] if self.masked_uniform else self._unbranched()

    def _unbranched(self) -> list[str]:
        branched = {c for scope in self._scopes for c in scope.branched}
        return [c for c, d in self.conditions() if not d and c not in branched]


def _names_in(expr: str) -> list[str]:
    """Identifiers of ``expr`` (enough to look up which tile axes it varies along)."""
    word, names = "", []
    for ch in expr + " ":
        if ch.isalnum() or ch == "_":
            word += ch
        else:
            if word and not word[0].isdigit():
                names.append(word)
            word = ""
    return names
