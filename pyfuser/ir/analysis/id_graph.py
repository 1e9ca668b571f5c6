"""Which IterDomains of a segment denote the same iteration: the ID graph of nvFuser's IdModel.

Two IDs are *exactly* mapped when they index the same logical positions with the same extent: an
expr's producer logical ID and the consumer logical ID it maps to (``Expr.logical_map``), when
neither is a broadcast. The *loop* map also joins a broadcast ID with the ID it is broadcast to, so
a broadcast input is indexed inside its consumer's loop. Both maps then grow through the ID
transforms: two splits with mapped inputs and the same factor have mapped outputs, and likewise two
merges whose inputs are mapped pairwise (nvFuser's forward propagation of ``IdModel``).

Across a reshape, the IDs of a group of axes with equal products are mapped (``reshape.py``
``regroupings``): one axis to one axis directly, and the row-major merge of a group's axes where a tensor
has it (a scheduler's ``merge(B, S)`` of a ``[B, S, V]`` is the ``B * S`` of the ``[B * S, V]`` it was
reshaped from). Merges are associative in the flat index they give, so a merge is known by its axes'
classes in order, however nested.

Schedulers ask it which axes of a segment correspond; the code generator uses the loop map to bind
every tensor's loop IDs to the kernel's loop nest and the exact map to give every ID a runtime
extent (``concrete`` ID: a non-broadcast member).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pyfuser.ir.analysis.reshape import Key, group_ids, reshape_regroupings
from pyfuser.ir.base import Expr
from pyfuser.ir.iter_domain import IdTransform, IterDomain, Merge, Split
from pyfuser.ir.ops import ReshapeOp
from pyfuser.ir.symbolic import SymConst
from pyfuser.ir.tensor_domain import transforms_between
from pyfuser.ir.tensor_view import TensorView


class _UnionFind:
    def __init__(self) -> None:
        self._parent: dict[int, int] = {}

    def find(self, key: int) -> int:
        parent = self._parent.setdefault(key, key)
        while parent != key:
            grand = self._parent[parent]
            self._parent[key] = grand
            key, parent = parent, grand
        return key

    def union(self, a: int, b: int) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return False
        self._parent[ra] = rb
        return True


def _transform_key(t: IdTransform, classes: _UnionFind) -> tuple[object, ...]:
    if isinstance(t, Split):
        return ("split", classes.find(id(t.in_id)), t.factor, t.inner_split)
    if isinstance(t, Merge):
        return ("merge", classes.find(id(t.outer)), classes.find(id(t.inner)))
    raise TypeError(f"unknown ID transform {type(t).__name__}")


def _size_one(i: IterDomain) -> bool:
    """A broadcast, or an ID of extent 1 (a reduction of a broadcast): merging it changes no extent."""
    return i.is_broadcast() or (isinstance(i.extent, SymConst) and i.extent.val == 1)


class IdGraph:
    """Union-find classes of the IDs of ``tensors`` (every domain, every transform between them)."""

    def __init__(self, tensors: Sequence[TensorView], exprs: Iterable[Expr], *, map_broadcast: bool,
                 through_transforms: bool = True, through_reshapes: bool = True) -> None:
        """``through_transforms=False`` maps logical IDs only (what propagating a schedule starts from), and
        across a reshape the IDs of groups of one axis and the merges a tensor already has;
        ``through_reshapes=False`` maps nothing across a reshape (the pointwise analysis, which reads a
        reshape's operand at computed indices without mapping it)."""
        self.map_broadcast = map_broadcast
        self._classes = _UnionFind()
        self._ids: dict[int, IterDomain] = {}
        transforms: dict[int, IdTransform] = {}
        for tv in tensors:
            d = tv.domain()
            start = d.root or d.logical  # an rfactor partial: its root maps its producer
            targets = [*d.loop, *(d.allocation or ()), *d.logical]
            for t in transforms_between(start, targets):
                transforms[id(t)] = t
            for i in (*start, *targets):
                self._ids[id(i)] = i
        for t in transforms.values():
            for i in (*t.inputs, *t.outputs):
                self._ids[id(i)] = i
        self._members: dict[int, list[IterDomain]] | None = None
        self._exprs = list(exprs)
        for expr in self._exprs:
            self._map_expr(expr)
        concrete = {self._classes.find(k) for k, i in self._ids.items() if not _size_one(i)}
        #: IDs of one position (broadcasts, reductions of a broadcast) whose class has no other kind of
        #: member: never resolved against an axis of another extent, so merging one changes no extent
        self._unresolved = {k for k, i in self._ids.items() if _size_one(i) and self._classes.find(k) not in concrete}
        self._transforms = list(transforms.values())
        self._resolve_transform_outputs()
        self._through_transforms = through_transforms
        if through_transforms:
            self._forward(self._transforms)
            self._propagate(self._transforms)
        self._reshapes = [e for e in self._exprs if isinstance(e, ReshapeOp)] if through_reshapes else []
        self._map_reshapes()

    def key(self, i: IterDomain) -> Key:
        """``i`` as the classes of the IDs a nest of merges combines into it, outer first (IDs of one
        position that no other ID resolves left out): the flat index it iterates."""
        definition = i.definition
        if isinstance(definition, Merge) and i is definition.out:
            return self.key(definition.outer) + self.key(definition.inner)
        return () if id(i) in self._unresolved else (self._classes.find(id(i)),)

    def _map_reshapes(self) -> None:
        """Join the IDs whose keys reshapes make one iteration, until nothing changes (a join changes
        classes, so keys; through transforms it maps their splits too)."""
        if not self._reshapes:
            return
        for expr in self._reshapes:
            for a, b in group_ids(expr, lambda i: id(i) in self._unresolved) or []:
                if len(a) == 1 and len(b) == 1 and not self._joins_two_axes(id(a[0]), id(b[0])):
                    self._classes.union(id(a[0]), id(b[0]))
        if self._through_transforms:
            self._propagate(self._transforms)
        changed = True
        while changed:
            changed = False
            regrouped = reshape_regroupings(self._reshapes, self.class_of, lambda i: id(i) in self._unresolved)
            holders: dict[Key, int] = {}
            for k, i in self._ids.items():
                key = self.key(i)
                if key and key in regrouped:
                    first = holders.setdefault(regrouped.find(key), k)
                    if not self._joins_two_axes(first, k):
                        changed |= self._classes.union(first, k)
            if changed and self._through_transforms:
                self._propagate(self._transforms)
        self._members = None

    def _joins_two_axes(self, a: int, b: int) -> bool:
        """Whether joining the classes of IDs ``a`` and ``b`` would make two logical axes of one tensor one
        class. A reshape never does that: where its operand's axes are one class already (``s[:, None] -
        s[None, :]``, a relative-position matrix), mapping each of them to its own axis of the result would
        join the result's axes; the second is left unmapped (the operand is read at computed indices)."""
        ra, rb = self._classes.find(a), self._classes.find(b)
        if ra == rb:
            return False
        axes: dict[int, set[int]] = {}
        for k, i in self._ids.items():
            root = self._classes.find(k)
            if (root == ra or root == rb) and i.tensor is not None and not i.is_broadcast():
                logical = {id(j) for j in i.tensor.get_logical_domain()}
                if k in logical:
                    axes.setdefault(id(i.tensor), set()).add(root)
        return any(len(roots) == 2 for roots in axes.values())

    def _map_expr(self, expr: Expr) -> None:
        outs = expr.tensor_outputs
        for producer in expr.tensor_inputs:
            for p, c in expr.logical_map(producer).items():
                # A reduction of a broadcast axis also covers its single position: exactly mapped.
                if self.map_broadcast or p.is_broadcast() == c.is_broadcast() or (p.is_broadcast() and c.is_reduction()):
                    self._classes.union(id(p), id(c))
        for other in outs[1:]:  # multi-output exprs (var_mean) iterate one space
            for a, b in zip(outs[0].get_logical_domain(), other.get_logical_domain(), strict=True):
                self._classes.union(id(a), id(b))

    def _resolve_transform_outputs(self) -> None:
        """A size-1 output of a transform with a resolved input is resolved too: a merge of broadcasts
        that map to H and W (a ``[1, C, 1, 1]`` tensor under an NCHW loop nest ``(N, (H, W))``) iterates
        ``merge(H, W)`` once transforms propagate. Left unresolved, a merge of it with the broadcast
        mapped to N would be forwarded to N, and N mapped to ``merge(N, merge(H, W))``: a tensor
        iterating N alone (a slice to one pixel) would take the whole row tile's parallel type."""
        changed = True
        while changed:
            changed = False
            for t in self._transforms:
                if any(id(i) not in self._unresolved for i in t.inputs):
                    for o in t.outputs:
                        if id(o) in self._unresolved:
                            self._unresolved.discard(id(o))
                            changed = True

    def _forward(self, transforms: list[IdTransform]) -> None:
        """A merge of an unresolved broadcast ID with another ID is that other ID (nvFuser's
        forwarding): a tensor that lacks the broadcast (a squeeze's output) and splits the other ID
        the same way iterates the same loops."""
        for t in transforms:
            if isinstance(t, Merge) and (id(t.outer) in self._unresolved) != (id(t.inner) in self._unresolved):
                other = t.inner if id(t.outer) in self._unresolved else t.outer
                self._classes.union(id(t.out), id(other))

    def _propagate(self, transforms: list[IdTransform]) -> None:
        changed = True
        while changed:
            changed = False
            seen: dict[tuple[object, ...], IdTransform] = {}
            for t in transforms:
                key = _transform_key(t, self._classes)
                first = seen.setdefault(key, t)
                if first is t:
                    continue
                for a, b in zip(first.outputs, t.outputs, strict=True):
                    changed |= self._classes.union(id(a), id(b))

    def map_ids(self, a: IterDomain, b: IterDomain) -> None:
        """Declare ``a`` and ``b`` the same iteration (nvFuser's ``ValGraph.mapVals``): their classes
        join, and so do the outputs of transforms that now have mapped inputs."""
        for i in (a, b):
            if not self.contains(i):
                raise ValueError(f"map_ids: {i} is not an ID of this graph's tensors")
        if self._classes.union(id(a), id(b)):
            self._members = None
            if self._through_transforms:
                self._propagate(self._transforms)

    def contains(self, i: IterDomain) -> bool:
        return id(i) in self._ids

    def classes(self) -> list[list[IterDomain]]:
        """Every class, members in the order the graph met them (first tensor first)."""
        groups: dict[int, list[IterDomain]] = {}
        for k, i in self._ids.items():
            groups.setdefault(self._classes.find(k), []).append(i)
        return list(groups.values())

    # --- queries -------------------------------------------------------------------------------
    def forwards(self, i: IterDomain) -> bool:
        """Whether a merge of ``i`` is forwarded to the ID it is merged with (see ``_forward``)."""
        return id(i) in self._unresolved

    def mapped(self, a: IterDomain, b: IterDomain) -> bool:
        return self._classes.find(id(a)) == self._classes.find(id(b))

    def class_of(self, i: IterDomain) -> int:
        return self._classes.find(id(i))

    def members(self, i: IterDomain) -> list[IterDomain]:
        if self._members is None:
            self._members = {}
            for k, j in self._ids.items():
                self._members.setdefault(self._classes.find(k), []).append(j)
        return self._members.get(self.class_of(i), [i])

    def concrete(self, i: IterDomain) -> IterDomain:
        """A member of ``i``'s class that is not a broadcast (``i`` itself when it is none)."""
        if not i.is_broadcast():
            return i
        return next((j for j in self.members(i) if not j.is_broadcast()), i)
