"""All-gather -> matmul and matmul -> reduce-scatter in an ATen graph, run as pyfuser's pipelines.

DTensor's tensor / sequence parallelism reaches AOTAutograd's graphs as functional collectives
(``_c10d_functional.all_gather_into_tensor`` / ``reduce_scatter_tensor`` / ``all_reduce`` and their
``wait_tensor``). Each collective stays a call torch runs between pyfuser's regions (a region boundary,
as any op outside the op table), except two patterns, which this pass replaces, before the graph is
partitioned, by one call of a multi-device pyfuser program (``CollectiveMatmul``):

* ``all_gather_into_tensor(x) -> wait_tensor -> [split + cat along the gathered dim] -> [views] -> mm``
  (column-parallel linears on a sequence-sharded input; several matmuls may read the gathered rows, and
  other ops too: then the call returns them as well, as the weight gradients need them): a fusion whose
  input ``[d, rows, K]`` is sharded over the group on its outer axis and whose outputs are the replicated
  ``linear`` / ``matmul`` results (and the gathered rows). pyfuser inserts the all-gather, and
  ``CommunicatorBackend.cuda`` lowers it with the GEMMs into the P2P pipeline (each rank's block multiplied
  as soon as it lands; ``comm/p2p_pipelines.py``).
* ``mm -> [views] -> [split + cat moving the scattered dim outermost] -> reduce_scatter_tensor('sum') ->
  wait_tensor`` (a row-parallel linear with a sequence-sharded output): the contraction dim sharded, the
  output sharded on its outer axis: the GEMM + reduce-scatter pipeline.

Both communications are Host IR nodes of the program that runs the GEMMs. Where the machine model says the
pipeline does not pay at the graph's sizes (``comm/overlap_model.py``; options force either), the program
runs the collective then the GEMMs instead. Where the copy engines cannot
carry them (CPU tensors, gloo) the same program sends its blocks over the process group, as every P2P
program does. DTensor gathers and scatters along dim 0 only; a sequence dim ``g`` > 0 reaches the graph
as a split along dim 0 and a cat along ``g`` (or the reverse): the program computes the rows in block
order and the call puts them back in the graph's order (a view when nothing precedes ``g``).

Anything else keeps torch's collective, with why in the ``fx_graph`` dump: a reduce-scatter not fed by one
matmul (the sum of several projections' input gradients), a gathered value that no matmul reads as its
rows, a gather along the last dim, a reduction other than a sum, symbolic sizes, a group pyfuser's
communicator does not span.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx import GraphModule, Node
from torch.fx.passes.tools_common import legalize_graph

from pyfuser.comm.communicator import Communicator
from pyfuser.comm.nodes import Communication
from pyfuser.comm.overlap_model import Decision, Pattern, decide
from pyfuser.comm.p2p import P2PCommunication
from pyfuser.frontend.fusion_definition import FusionDefinition
from pyfuser.integrations.torch_compile.lowering import RESHAPES
from pyfuser.ir.device_mesh import DeviceMesh
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.iter_domain import ParallelType
from pyfuser.options import CommunicatorBackend, CompileOptions, check_options
from pyfuser.runtime.multidevice_executor import MultiDeviceExecutor, MultiDeviceExecutorParams

aten = torch.ops.aten
_C10D = torch.ops._c10d_functional
ALL_GATHER = _C10D.all_gather_into_tensor.default
REDUCE_SCATTER = _C10D.reduce_scatter_tensor.default
WAIT = _C10D.wait_tensor.default
#: namespaces of the ops through which DTensor and functional collectives communicate
COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "_c10d_functional_autograd", "c10d_functional", "_dtensor"})
#: where a kept collective's reason is recorded for the ``fx_graph`` dump (``support.refusal``)
WHY_KEPT = "pyfuser_collective"


def is_collective(node: Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target.namespace in COLLECTIVE_NAMESPACES


_LABELS = {"allgather_matmul": "all-gather + matmul", "matmul_reduce_scatter": "matmul + reduce-scatter"}


class CollectiveMatmul:
    """``call(x, *weights)``: one rank's part of an all-gather + matmuls or a matmul + reduce-scatter, as one
    pyfuser program (``executor``), returning the values of the graph nodes it replaced (a list: each matmul's,
    then the gathered rows where other ops read them; the reduce-scatter's).

    ``kind``: ``"allgather_matmul"`` or ``"matmul_reduce_scatter"``; ``outer``: the product of the dims
    before the sequence dim (the rows that interleave with the ranks' blocks; 1: blocks are contiguous)."""

    def __init__(self, name: str, kind: str, fd: FusionDefinition, parts: int, outer: int,
                 out_shapes: Sequence[Sequence[int]], nodes: Sequence[str], decision: Decision) -> None:
        self.__name__ = self.__qualname__ = name  # how torch.fx prints the call
        self.name = name
        self.kind = kind
        self.fd = fd
        self.parts = parts
        self.outer = outer
        #: the shape of each value the call returns (the graph's: its matmuls', then the gathered value)
        self.out_shapes = [tuple(shape) for shape in out_shapes]
        self.nodes = list(nodes)
        #: pipeline or the plain collective then GEMM (``comm/overlap_model.py``), from the graph's static sizes
        self.decision = decision
        backend = CommunicatorBackend.cuda if decision.pipelined else None
        self.executor = MultiDeviceExecutor(fd.fusion, MultiDeviceExecutorParams(backend_type=backend))
        #: never a region's: the partitioner leaves the call in eager with this reason
        self.eager_reason = f"pyfuser's {_LABELS[kind]} pipeline (one multi-device program)"

    def __call__(self, x: torch.Tensor, *weights: torch.Tensor) -> list[torch.Tensor]:
        try:
            return self._run(x, weights)
        except (ValueError, TypeError, RuntimeError) as e:  # peers waiting on this rank fail within the timeout
            if type(e) not in (ValueError, TypeError, RuntimeError):
                raise
            raise type(e)(f"pyfuser {_LABELS[self.kind]} pipeline {self.name} (FX nodes {', '.join(self.nodes)}) "
                          f"failed: {e}") from e

    def _run(self, x: torch.Tensor, weights: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        d, a = self.parts, self.outer
        if self.kind == "allgather_matmul":
            rows = x.numel() // x.shape[-1]
            outs = self.executor.run([x.reshape(1, rows, x.shape[-1]), *weights])
            if a > 1:  # block p's rows (a, b) go to rows (a, p, b)
                outs = [out.view(d, a, rows // a, out.shape[-1]).transpose(0, 1) for out in outs]
            return [out.reshape(shape) for out, shape in zip(outs, self.out_shapes, strict=True)]
        rows = x.shape[0] // d
        blocks = x.reshape(a, d, rows // a, x.shape[-1]).transpose(0, 1).reshape(d, rows, x.shape[-1])
        (out,) = self.executor.run([blocks, *weights])
        return [out.reshape(self.out_shapes[0])]

    def host_ir(self) -> str:
        """This rank's program of the latest call."""
        return self.executor.host_ir()

    def communications(self) -> dict[str, int]:
        """The program's communication nodes by kind (``P2PCommunication``: the pipeline's transfers;
        ``Communication``: a collective), as the latest call ran them."""
        program = self.executor._cache.last_program
        container = program.container if program is not None else None
        counts = {"P2PCommunication": 0, "Communication": 0}
        for node in container.walk() if container is not None else ():
            if isinstance(node, P2PCommunication):
                counts["P2PCommunication"] += 1
            elif isinstance(node, Communication):
                counts["Communication"] += 1
        return counts

    def summary(self) -> str:
        comms = self.communications()
        return (f"{self.name}: {_LABELS[self.kind]} over {self.parts} ranks, FX nodes {', '.join(self.nodes)}; "
                f"{comms['P2PCommunication']} P2P transfers, {comms['Communication']} collectives; {self.decision}")

    def __repr__(self) -> str:
        return f"<pyfuser {self.kind} {self.name}>"


@dataclass
class _Match:
    kind: str
    x: Node  # the local operand: the all-gather's input, or the matmul's rows
    #: per matmul, the weight as the fusion reads it (the untransposed one of a linear) and whether it is one
    weights: list[tuple[Node, bool]]
    nodes: list[Node]  # what the call replaces (erased)
    results: list[Node]  # the nodes whose values the call returns, in order
    outer: int
    team: tuple[int, ...]
    #: all-gather: the gathered value (``results[-1]``) is read by other ops too, and returned
    keeps_gathered: bool = False


class _Refused(Exception):
    pass


def _only_user(node: Node) -> Node:
    users = list(node.users)
    if len(users) != 1:
        raise _Refused(f"{node.name} is read by {len(users)} ops ({', '.join(u.name for u in users)}), not only "
                       "by the next op of the pattern")
    return users[0]


def _int(node: Node, position: int, default: int | None = None) -> int:
    """An integer argument of ``node`` (a dim, a size, a group size)."""
    value = node.args[position] if position < len(node.args) else default
    if type(value) is not int:
        raise _Refused(f"{node.name}'s argument {position} is {value!r}, not an integer")
    return value


def _node(value: Any, what: str) -> Node:
    if not isinstance(value, Node):
        raise _Refused(f"{what} is {value!r}, not a value of the graph")
    return value


def _static(node: Node) -> list[int]:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or any(type(s) is not int for s in value.shape):
        raise _Refused(f"{node.name} has symbolic or unknown sizes")
    return list(value.shape)


def _team(group_size: int, group_name: Any) -> tuple[int, ...]:
    """The global ranks of the collective's group, in group order, where pyfuser's communicator runs it."""
    if not isinstance(group_name, str):
        raise _Refused(f"its group is given as {type(group_name).__name__}, not by name")
    group = dist.distributed_c10d._resolve_process_group(dist.distributed_c10d.GroupName(group_name))
    team = tuple(dist.get_process_group_ranks(group))
    if len(team) != group_size or len(team) < 2:
        raise _Refused(f"its group {group_name} has {len(team)} ranks, the op names {group_size}")
    communicator = Communicator.instance()
    if communicator.size() != dist.get_world_size():
        raise _Refused(f"pyfuser's communicator spans {communicator.size()} processes, torch's world "
                       f"{dist.get_world_size()}")
    return team


def _weight(mm: Node, at: int) -> tuple[Node, bool]:
    """The matmul's second operand as the fusion reads it: ``w`` of ``t(w)`` (a linear), else itself."""
    operand = _node(mm.args[at], f"{mm.name}'s operand {at}")
    if operand.target is aten.t.default and isinstance(operand.args[0], Node):
        return operand.args[0], True
    return operand, False


def _match_allgather(ag: Node) -> _Match:
    x = _node(ag.args[0], "its input")
    chunk = _static(x)
    parts = _int(ag, 1)
    nodes = [ag]
    wait = _only_user(ag)
    if wait.target is not WAIT:
        raise _Refused(f"its result is read by {wait.name} before any wait_tensor")
    nodes.append(wait)
    value, gathered_dim = wait, 0
    user = _only_user(wait)
    if user.target is aten.split.Tensor:  # DTensor's gather along dim g > 0: split along 0, cat along g
        pieces = [u for u in user.users if u.target is operator.getitem]
        pieces.sort(key=lambda u: _int(u, 1))
        if (_int(user, 1) != chunk[0] or _int(user, 2, 0) != 0 or len(pieces) != parts or len(user.users) != parts
                or any(_int(p, 1) != k for k, p in enumerate(pieces))):
            raise _Refused(f"{user.name} does not split the gathered value into the ranks' blocks")
        cat = _only_user(pieces[0])
        if (cat.target is not aten.cat.default or not isinstance(cat.args[0], list | tuple)
                or list(cat.args[0]) != pieces or any(_only_user(p) is not cat for p in pieces)):
            raise _Refused(f"the ranks' blocks of {wait.name} are not concatenated by one cat")
        gathered_dim = _int(cat, 1, 0) % len(chunk)
        nodes += [user, *pieces, cat]
        value = cat
    if gathered_dim == len(chunk) - 1:
        raise _Refused("it gathers along the last dim, which a matmul of the gathered rows contracts")
    while len(value.users) == 1 and (user := next(iter(value.users))).target in RESHAPES:
        nodes.append(user)
        value = user
    shape = _static(value)
    mms = [u for u in value.users if u.target is aten.mm.default and u.args[0] is value and u.args[1] is not value]
    if not mms:
        raise _Refused(f"the gathered value {value.name} is not the rows of an aten.mm")
    if len(shape) != 2 or shape[1] != chunk[-1]:
        raise _Refused(f"the matmul reads the gathered value as {shape}, not its rows flattened")
    nodes += mms
    keeps = len(mms) < len(value.users)  # read by other ops too (saved for the weight gradient): returned
    return _Match("allgather_matmul", x, [_weight(mm, 1) for mm in mms], nodes, [*mms, *([value] if keeps else [])],
                  math.prod(chunk[:gathered_dim]), _team(parts, ag.args[2]), keeps)


def _match_reduce_scatter(rs: Node) -> _Match:
    source = _node(rs.args[0], "its input")
    if rs.args[1] != "sum":
        raise _Refused(f"it reduces with {rs.args[1]!r}; the pipeline sums")
    parts = _int(rs, 2)
    wait = _only_user(rs)
    if wait.target is not WAIT:
        raise _Refused(f"its result is read by {wait.name} before any wait_tensor")
    nodes = [rs, wait]
    value, scattered_dim = source, 0
    if source.target is aten.cat.default and _int(source, 1, 0) == 0 and isinstance(source.args[0], list | tuple):
        pieces = [_node(p, f"a block of {source.name}") for p in source.args[0]]
        split = _node(pieces[0].args[0], f"what {pieces[0].name} picks") if pieces else None
        if (split is None or split.target is not aten.split.Tensor or len(pieces) != parts
                or any(p.target is not operator.getitem or p.args != (split, k) or _only_user(p) is not source
                       for k, p in enumerate(pieces)) or len(split.users) != parts):
            raise _Refused(f"its input {source.name} is a cat, not the blocks of one split")
        _only_user(source)
        value = _node(split.args[0], f"what {split.name} splits")
        full = _static(value)
        scattered_dim = _int(split, 2, 0) % len(full)
        if _int(split, 1) * parts != full[scattered_dim]:
            raise _Refused(f"{split.name} does not split into one block per rank")
        nodes[:0] = [split, *pieces, source]
    full = _static(value)
    if scattered_dim == len(full) - 1:
        raise _Refused("it scatters the matmul's columns")
    while value.target in RESHAPES:
        _only_user(value)
        nodes.insert(0, value)
        value = _node(value.args[0], f"what {value.name} reshapes")
    if value.target is not aten.mm.default:
        raise _Refused(f"its input is not a matmul's output but {value.name} ({value.target})")
    _only_user(value)
    rows = _node(value.args[0], f"{value.name}'s rows")
    nodes.insert(0, value)
    return _Match("matmul_reduce_scatter", rows, [_weight(value, 1)], nodes, [wait], math.prod(full[:scattered_dim]),
                  _team(parts, rs.args[3]))


def _fusion(match: _Match) -> FusionDefinition:
    """The multi-device fusion of a match, in global shapes (``[d, rows, K]``; each weight ``[N, K]`` of a
    linear or ``[K, N]`` of a matmul), sharded as the pipelines of ``comm/p2p_pipelines.py`` expect: the
    all-gather's input on its outer axis (several matmuls, or the gathered value returned too: gathered
    once, by a ``set``), the reduce-scatter's contraction axis, and its output on its outer axis."""
    d = len(match.team)
    mesh = DeviceMesh(sorted(match.team))
    mesh_x = ParallelType.mesh_x
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1], dtype=DataType.from_torch(match.x.meta["val"].dtype))
        ws = [fd.define_tensor([-1, -1], dtype=DataType.from_torch(w.meta["val"].dtype)) for w, _ in match.weights]
        gathered = fd.ops.set(x) if match.keeps_gathered or len(ws) > 1 else x
        outs = [fd.ops.linear(gathered, w) if linear else fd.ops.matmul(gathered, w)
                for w, (_, linear) in zip(ws, match.weights, strict=True)]
        for out in outs:
            fd.add_output(out)
        if match.keeps_gathered:
            fd.add_output(gathered)
    for tv in (x, gathered, *ws, *outs):
        tv.set_device_mesh(mesh)
    if match.kind == "allgather_matmul":
        x.axis(0).parallelize(mesh_x)  # each rank holds block [1, rows, K]; the outputs are whole
    else:
        (w,), ((_, linear),), (out,) = ws, match.weights, outs
        x.outer_split(2, d)  # the contraction dim is sharded: partial sums, scattered by rows
        x.axis(2).parallelize(mesh_x)
        contracted = 1 if linear else 0
        w.outer_split(contracted, d)
        w.axis(contracted).parallelize(mesh_x)
        out.axis(0).parallelize(mesh_x)
    return fd


def _decision(match: _Match) -> Decision:
    """``overlap_model.decide`` on the match's static sizes: each rank's GEMM ``[m, k] x [k, n]`` (the gathered
    rows of an all-gather, every matmul's columns together; the rows of the partial sums of a reduce-scatter)."""
    x = match.x.meta["val"]
    d = len(match.team)
    n = sum(w.meta["val"].shape[0 if linear else 1] for w, linear in match.weights)
    m = x.numel() // x.shape[-1] * (d if match.kind == "allgather_matmul" else 1)
    pattern = Pattern.allgather_gemm if match.kind == "allgather_matmul" else Pattern.gemm_reduce_scatter
    enabled, disabled = check_options((), ())  # PYFUSER_ENABLE / PYFUSER_DISABLE force either
    return decide(pattern, m, x.shape[-1], n, x.dtype, d, 1, CompileOptions(enabled, disabled, x.device))


def lower_collective_matmuls(gm: GraphModule, prefix: str = "pyfuser") -> list[CollectiveMatmul]:
    """Replace each all-gather -> matmul and matmul -> reduce-scatter of ``gm`` by a ``CollectiveMatmul``
    call; every other collective is left to torch with why (``node.meta[WHY_KEPT]``)."""
    calls: list[CollectiveMatmul] = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (ALL_GATHER, REDUCE_SCATTER):
            continue
        try:
            match = _match_allgather(node) if node.target is ALL_GATHER else _match_reduce_scatter(node)
        except _Refused as e:
            node.meta[WHY_KEPT] = f"not pipelined: {e}"
            continue
        name = f"{prefix}_{match.kind}_{len(calls)}"
        try:
            with unset_fake_temporarily():  # the backend compiles under the tracer's fake mode; meshes are real
                call = CollectiveMatmul(name, match.kind, _fusion(match), len(match.team), match.outer,
                                        [_static(r) for r in match.results], [n.name for n in match.nodes],
                                        _decision(match))
        except Exception as e:  # a case the fusion cannot express: torch's collective runs, with why
            node.meta[WHY_KEPT] = f"not pipelined: its program could not be built: {type(e).__name__}: {e}"
            continue
        first = min(match.results, key=list(gm.graph.nodes).index)
        with gm.graph.inserting_before(first):
            new = gm.graph.call_function(call, (match.x, *(w for w, _ in match.weights)))
        new.meta["val"] = [r.meta.get("val") for r in match.results]
        with gm.graph.inserting_after(new):
            for k, result in reversed(list(enumerate(match.results))):
                item = gm.graph.call_function(operator.getitem, (new, k))
                item.meta.update(result.meta)
                result.replace_all_uses_with(item)
        for old in reversed(match.nodes):
            gm.graph.erase_node(old)
        for w, linear in match.weights:  # the transposes the matmuls read (the fusion reads the weights)
            for view in [u for u in w.users if linear and u.target is aten.t.default and not u.users]:
                gm.graph.erase_node(view)
        calls.append(call)
    if calls:
        legalize_graph(gm)  # a weight's view may come after the first matmul it fed: order the call after it
        gm.graph.lint()
        gm.recompile()
    return calls
