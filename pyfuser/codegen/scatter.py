"""The kernels of a scheduled scatter segment (``scheduler/scatter.py``): ``out = acc`` with
``out[index[i], ...] += value[i, ...]`` (``= value[i, ...]`` for an ``index_put`` without accumulation).

Two launches write one buffer: the first computes ``acc`` into it (an ordinary kernel of the code
generator: a fill of zeros, or whatever pointwise ops compute ``acc``), the second iterates
``value``'s elements (computing them from the segment's inputs, a cast of a bfloat16 gradient),
reads each element's row index and adds the element into the buffer at that row with
``tl.atomic_add`` (or stores it there: ``tl.store``). The buffer is an input of the second launch (it
reads its sizes and strides from it) and the output it is given (``out=``), so nothing else is allocated.

An index out of ``[0, rows)`` is never written (the add is masked by the range). It is reported as
torch reports it: on a GPU by a device-side assert in the kernel (``KernelSource.device_asserts``:
compiled with Triton's ``debug``, as Inductor compiles its kernels), without waiting for the device;
through Triton's interpreter, which has no device asserts, by ``check_indices`` on the host before the launch (a ValueError naming
the index, the tensor and the axis).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pyfuser.codegen.kernel_builder import KernelBuilder, Layouts
from pyfuser.codegen.kernel_source import KernelError, KernelSource
from pyfuser.codegen.triton_support import int_expr
from pyfuser.codegen.values import Indices
from pyfuser.ir.base import Expr
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.layout import Layout
from pyfuser.ir.ops.indexing import IndexPutOp
from pyfuser.ir.tensor_view import MemoryType, TensorView


@dataclasses.dataclass
class ScatterParts:
    """The fusions of a scatter segment's launches: ``init`` computes ``acc`` (None where ``acc`` is a
    segment input, copied on the host); ``scatter`` reads ``acc`` as its first input (the buffer it
    adds into) and has the segment's output as its own; ``values`` computes ``value`` alone."""

    op: IndexPutOp
    init: Fusion | None
    init_reference: TensorView | None
    scatter: Fusion
    scatter_reference: TensorView
    #: ``value`` computed and stored (None where it is a segment input), for ATen's deterministic
    #: index_put under ``torch.use_deterministic_algorithms(True)``
    values: Fusion | None
    values_reference: TensorView | None


def scatter_op(exprs: Sequence[Expr]) -> IndexPutOp | None:
    """The segment's one ``index_put_accumulate`` / ``index_put`` (None: none, or several)."""
    found = [e for e in exprs if isinstance(e, IndexPutOp)]
    return found[0] if len(found) == 1 else None


def split_scatter(fusion: Fusion, op: IndexPutOp, reference: TensorView) -> ScatterParts:
    """The launches' fusions, cut out of scheduled ``fusion`` (``reference``: the ``value`` tensor whose
    loop nest the scatter launch runs)."""
    acc = op.inputs[0]
    assert isinstance(acc, TensorView)
    init, init_reference = _launch_writing(fusion, acc)
    memo: dict[int, Any] = {}
    second = fusion.clone(memo)
    buffer, out = memo[id(acc)], memo[id(op.output)]
    assert isinstance(buffer, TensorView) and isinstance(out, TensorView)
    buffer.memory_type = MemoryType.Global
    second.restrict(second.inputs_read_by([out], [buffer]), [out])
    scatter_reference = memo.get(id(reference), reference)
    assert isinstance(scatter_reference, TensorView)
    values, values_reference = _launch_writing(fusion, reference)
    return ScatterParts(op, init, init_reference, second, scatter_reference, values, values_reference)


def _launch_writing(fusion: Fusion, tv: TensorView) -> tuple[Fusion | None, TensorView | None]:
    """A launch of its own computing ``tv`` into global memory (a copy of ``fusion`` restricted to it),
    and ``tv`` in it; (None, None) where ``tv`` is a fusion input, which nothing computes."""
    if any(tv is v for v in fusion.inputs()):
        return None, None
    memo: dict[int, Any] = {}
    launch = fusion.clone(memo)
    written = memo[id(tv)]
    assert isinstance(written, TensorView)
    written.memory_type = MemoryType.Global
    launch.restrict(launch.inputs_read_by([written]), [written])
    return launch, written


def init_layouts(layouts: Layouts, parts: ScatterParts, out_name: int) -> Layouts:
    """The fill's output is dense in the segment output's allocation order: it is that output."""
    result = dict(layouts)
    if parts.init_reference is not None:
        dims = parts.init_reference.get_logical_domain(no_reductions=True)
        perm = layouts[out_name].perm if out_name in layouts else tuple(range(len(dims)))
        result[parts.init_reference.name] = Layout.dense(perm, [i.is_broadcast() for i in dims])
    return result


class ScatterKernelBuilder(KernelBuilder):
    """The scatter launch: the reference (``value``) is computed as a pointwise kernel computes an
    output, then added into (or stored in) the segment output at its rows' indices."""

    def build(self) -> KernelSource:
        if len(self.outputs) != 1 or not isinstance(self.outputs[0].definition, IndexPutOp):
            raise KernelError("a scatter kernel writes one output, an index_put_accumulate or index_put")
        self._check_inlined_producers()
        loops = self._loop_nest()
        self._open_parallel(loops)
        self._open_serial(loops)
        out = self.outputs[0]
        position = len(self.inputs)
        op = out.definition
        assert isinstance(op, IndexPutOp)
        acc, index, value = op.inputs
        assert isinstance(acc, TensorView) and isinstance(index, TensorView) and isinstance(value, TensorView)
        code = self.code
        at = self.walk_back(value)
        element = self.value(value, at)
        value_ids = value.get_logical_domain(no_reductions=True)
        out_ids = out.get_logical_domain(no_reductions=True)
        row = at.of[id(value_ids[0])]
        target_row = self.value(index, Indices(of={id(index.get_logical_domain()[0]): row}, valid=at.valid))
        rows = int_expr(self.size_symbol(out_ids[0]))
        if op.wrap_negative:
            target_row = code.assign("row", f"tl.where({target_row} < 0, {target_row} + {rows}, {target_row})")
        in_range = code.assign("inside", f"({target_row} >= 0) & ({target_row} < {rows})")
        where = Indices(of={id(out_ids[0]): target_row,
                            **{id(o): at.of[id(v)] for o, v in zip(out_ids[1:], value_ids[1:], strict=True)}})
        branched = code.branch(code.uniform())
        offset, dims = self.offset(out, position, where)
        # the lanes past the value's extent read index 0 (a row in range): their conditions join the mask
        # through the index the address is computed from, not only through the address itself, and through
        # the value (one index of one element broadcast to a value of symbolic length: the row's lanes)
        mask = code.mask(dims | code.dims_of(in_range) | code.dims_of(element),
                         uses=f"{offset} {in_range} {element}")
        if self.target == "cuda":
            message = (f"{op.op_name}: index {index.short_name} holds a value out of range for "
                       f"{acc.short_name} axis 0 (valid: 0 to its size - 1)")
            code.emit(f"tl.device_assert({in_range}, {message!r}{', mask=' + mask if mask else ''})")
            self.device_asserts = True
        # ``!= 0``: the interpreter's ``&`` of a tile mask with a 0-dim condition (the index of a single
        # row) is no boolean mask; a compiled kernel folds it away. Without a mask, the condition is
        # widened to the address's shape.
        both = code.assign("mask", f"({mask} & {in_range}) != 0" if mask else f"((({offset}) * 0 == 0) & {in_range}) != 0")
        # A block mask or value takes a block address (a single row's element has a scalar one): the address
        # is widened to the mask's shape, which spans the value's axes (its row axis through the index, the
        # others through the address); the zeros fold away in a compiled kernel.
        stored = code.assign("stored", self.store_value(element, out))
        address = f"T{position} + {offset} + ({both}).to(tl.int32) * 0"
        if op.accumulate:
            code.emit(f"tl.atomic_add({address}, {stored}, mask={both}, sem='relaxed')")
        else:
            code.emit(f"tl.store({address}, {stored}, mask={both})")
        if branched:
            code.close()
        self._stored.add(id(out))
        return self._source(loops)
