"""nvFuser's ``idm`` module: an ``IdModel`` view of which IterDomains of a fusion iterate together.

``idm.IdModel(fd.fusion).maybe_build_graph(IdMappingMode.exact)`` is a graph over every ID of the
fusion's tensors (root, logical, allocation, loop and the splits and merges between them), built by
the ID graph the schedulers and the code generator use (``pyfuser.ir.analysis.id_graph``). The exact
graph joins a producer ID with the consumer ID it maps to, never a broadcast with a concrete ID; the
permissive (broadcast, loop) graph also joins a broadcast with the ID it is broadcast to. Both grow
through transforms: splits by equal factors of mapped IDs have mapped outputs, as do merges of
mapped pairs. ``map_vals`` joins two classes by hand and propagates the same way.

A view, not nvFuser's IdModel: ``almost_exact`` (exact, plus forwarding through size-1 splits and
merges) is not built (the schedulers do not need it), and a tensor's loop IDs are grouped only as
far as these maps group them (no promotion analysis).
"""

from __future__ import annotations

from enum import Enum

from pyfuser.ir.analysis.id_graph import IdGraph
from pyfuser.ir.base import UnsupportedFeatureError
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.iter_domain import IterDomain

__all__ = ["DisjointValSets", "IdMappingMode", "IdModel", "ValGraph"]


class IdMappingMode(Enum):
    """nvFuser's graph kinds (its ``IdMappingMode``)."""

    exact = "exact"
    almost_exact = "almost_exact"
    broadcast = "broadcast"
    permissive = "permissive"
    loop = "loop"


def _check_id(value: object, where: str) -> IterDomain:
    if not isinstance(value, IterDomain):
        raise TypeError(f"{where} takes IterDomains (tv.axis(i), tv.get_logical_domain()[i]), got "
                        f"{type(value).__name__}")
    return value


class DisjointValSets:
    """The classes of one graph (nvFuser's ``DisjointValSets``)."""

    def __init__(self, graph: IdGraph) -> None:
        self._graph = graph

    def strict_are_mapped(self, entry0: IterDomain, entry1: IterDomain) -> bool:
        """Whether two IDs are in one class; an ID that is not in the graph is an error (``strict``)."""
        a, b = _check_id(entry0, "strict_are_mapped"), _check_id(entry1, "strict_are_mapped")
        for i in (a, b):
            if not self._graph.contains(i):
                owner = i.tensor.short_name if i.tensor is not None else "no tensor"
                raise ValueError(f"strict_are_mapped: {i} (of {owner}) is not an ID of this graph's fusion")
        return self._graph.mapped(a, b)

    def __str__(self) -> str:
        sets = ";\n".join("  { " + ", ".join(map(str, members)) + " }" for members in self._graph.classes())
        return "disjoint sets{\n" + sets + "\n}"


class ValGraph:
    """One graph of an ``IdModel`` (nvFuser's ``ValGraph``)."""

    def __init__(self, mode: IdMappingMode, graph: IdGraph) -> None:
        self.mode = mode
        self._graph = graph

    def disjoint_val_sets(self) -> DisjointValSets:
        return DisjointValSets(self._graph)

    def map_vals(self, val0: IterDomain, val1: IterDomain) -> None:
        """Join the classes of ``val0`` and ``val1``, and of the transform outputs that then map."""
        self._graph.map_ids(_check_id(val0, "map_vals"), _check_id(val1, "map_vals"))

    def __str__(self) -> str:
        return f"IdGraph {self.mode.name} {{\n{self.disjoint_val_sets()}\n}}"


class IdModel:
    """The ID graphs of ``fusion``, each built on first request and kept (nvFuser's ``IdModel``)."""

    def __init__(self, fusion: Fusion, build_graphs: bool = False, allow_self_mapping: bool = True,
                 validate: bool = False) -> None:
        if not isinstance(fusion, Fusion):
            raise TypeError(f"IdModel takes a Fusion (fd.fusion), got {type(fusion).__name__}")
        self.fusion = fusion
        self._graphs: dict[IdMappingMode, ValGraph] = {}
        if build_graphs:
            for mode in (IdMappingMode.exact, IdMappingMode.permissive):
                self.maybe_build_graph(mode)

    def maybe_build_graph(self, mode: IdMappingMode) -> ValGraph:
        if not isinstance(mode, IdMappingMode):
            raise TypeError(f"maybe_build_graph takes an IdMappingMode, got {type(mode).__name__}")
        if mode is IdMappingMode.almost_exact:
            raise UnsupportedFeatureError("the almost_exact ID graph",
                                          "use IdMappingMode.exact (or permissive, which also maps broadcasts)")
        graph = self._graphs.get(mode)
        if graph is None:
            ids = IdGraph(self.fusion.tensors(), self.fusion.exprs(), map_broadcast=mode is not IdMappingMode.exact)
            graph = self._graphs[mode] = ValGraph(mode, ids)
        return graph

    def __str__(self) -> str:
        return "IdModel {\n" + "\n".join(str(g) for g in self._graphs.values()) + "\n}"
