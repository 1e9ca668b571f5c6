"""A fuzz case: inputs, op steps, outputs and a schedule, each a line of Python.

Every step is kept twice, as ``fd.ops`` code and as the eager torch code of the same op, so building
the fusion, computing the reference and printing a repro all run the very same text: a printed
repro is exactly the program that failed. Tensors are named ``t<k>`` and scalar inputs ``s<k>`` in
both programs; the printed reference renames tensors to ``r<k>``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F

import pyfuser
from pyfuser import DataType, FusionDefinition, ParallelType

#: Names the reference program may use besides the values (its helpers are part of the repro).
PRELUDE = '''\
import torch
import torch.nn.functional as F
from pyfuser import DataType, FusionDefinition, ParallelType


def gen(seed):
    return torch.Generator().manual_seed(seed)


def moved(t, device):
    """``t`` copied to ``device`` in the same layout (strides, storage offset, expanded axes: what
    ``.to`` would make dense)."""
    storage = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage()).to(device)
    return storage.as_strided(t.shape, t.stride(), t.storage_offset())


def prod_dims(x, dims, keepdim=False, dtype=None):
    """torch.prod over several dims (one at a time, innermost first)."""
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, keepdim=keepdim, dtype=dtype)
    return x


def div_like_nvfuser(a, b):
    """nvFuser's div: truncation when both operands are integral, true division otherwise."""
    integral = all(not (x.is_floating_point() or x.is_complex()) if isinstance(x, torch.Tensor)
                   else isinstance(x, int) for x in (a, b))
    return torch.div(a, b, rounding_mode="trunc") if integral else torch.true_divide(a, b)


def iota_values(n, start, step, dtype):
    return torch.tensor([start + step * i for i in range(n)], dtype=dtype)
'''


def prelude_namespace() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(PRELUDE, "<fuzz prelude>", "exec"), namespace)
    return namespace


_PRELUDE_NS = prelude_namespace()
#: a tensor copied to a device in its layout: the prelude's, which repros print
moved: Callable[[torch.Tensor, str], torch.Tensor] = _PRELUDE_NS["moved"]

DTYPE_NAMES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.int64: "Int", torch.int32: "Int32", torch.bool: "Bool", torch.complex64: "ComplexFloat",
}


def fd_dtype(dtype: torch.dtype) -> str:
    return f"DataType.{DTYPE_NAMES[dtype]}"


@dataclass(frozen=True)
class TensorInput:
    """An input tensor: its values (a seeded generator), memory layout and declaration."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    seed: int
    #: logical dims, outermost in memory first
    memory_order: tuple[int, ...]
    #: a logical axis taken every other element (non-contiguous), or None
    strided_axis: int | None = None
    #: logical axes expanded from size 1 (stride 0)
    expanded: tuple[int, ...] = ()
    #: how the fusion declares it: ``define_tensor(...)`` arguments, or ``from_pytorch``
    declaration: str = "fd.define_tensor([])"

    @property
    def promises_layout(self) -> bool:
        """Whether the declaration constrains strides (a dense copy of the input would be refused)."""
        return "from_pytorch" in self.declaration or "contiguity" in self.declaration

    def make_code(self, variant: int = 0) -> str:
        """Torch code building the tensor (deterministic; ``variant`` draws other values)."""
        phys = [1 if d in self.expanded else self.shape[d] * (2 if d == self.strided_axis else 1)
                for d in self.memory_order]
        g = f"generator=gen({self.seed + 7919 * variant})"
        if self.dtype.is_floating_point or self.dtype.is_complex:
            code = f"torch.randn({phys}, {g}, dtype={self.dtype})"
        elif self.dtype is torch.bool:
            code = f"torch.randint(0, 2, {phys}, {g}).bool()"
        else:
            code = f"torch.randint(-4, 5, {phys}, {g}, dtype={self.dtype})"
        if self.strided_axis is not None:
            place = self.memory_order.index(self.strided_axis)
            code += "[" + ", ".join(["::2" if p == place else ":" for p in range(len(phys))]) + "]"
        if list(self.memory_order) != sorted(self.memory_order):
            code += f".permute({_inverse(self.memory_order)})"
        if self.expanded:
            code += f".expand({list(self.shape)})"
        return code

    def make(self, variant: int = 0) -> torch.Tensor:
        return eval(self.make_code(variant), _PRELUDE_NS)


@dataclass(frozen=True)
class ScalarInput:
    name: str
    dtype: torch.dtype
    value: bool | int | float

    def make_code(self, variant: int = 0) -> str:
        return repr(self.value)

    def make(self, variant: int = 0) -> Any:
        return self.value


Input = TensorInput | ScalarInput


@dataclass(frozen=True)
class Step:
    """One op: ``outs = <fd>`` in the fusion and ``outs = <ref>`` in the reference."""

    outs: tuple[str, ...]
    fd: str
    ref: str


@dataclass(frozen=True)
class Output:
    name: str
    stride_order: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Case:
    seed: int
    inputs: tuple[Input, ...]
    steps: tuple[Step, ...]
    outputs: tuple[Output, ...]
    #: statements scheduling tensors, run after the definition (``t3.outer_split(0, 2)``)
    schedule: tuple[str, ...] = ()
    #: the generator kept a step torch rejects: the case must be rejected
    expect_rejection: bool = False
    notes: tuple[str, ...] = field(default=(), compare=False)

    def with_(self, **changes: Any) -> Case:
        return replace(self, **changes)

    # --- programs --------------------------------------------------------------------------------
    def input_values(self, variant: int = 0) -> list[Any]:
        return [i.make(variant) for i in self.inputs]

    def build(self, device: str = "cpu") -> tuple[FusionDefinition, dict[str, Any]]:
        """The fusion, defined and scheduled (raises what pyfuser raises); ``from_pytorch`` declares
        from an example on ``device``, where the inputs will live."""
        namespace = fusion_namespace()
        fd = namespace["fd"]
        for inp in self.inputs:
            namespace[inp.name] = eval(_declare(inp, device), namespace)
        for step in self.steps:
            exec(_statement(step.outs, step.fd), namespace)
        for out in self.outputs:
            order = "" if out.stride_order is None else f", stride_order={list(out.stride_order)}"
            exec(f"fd.add_output({out.name}{order})", namespace)
        for line in self.schedule:
            exec(line, namespace)
        return fd, namespace

    def reference(self, values: Sequence[Any]) -> list[Any]:
        """The outputs computed by eager torch (raises what torch raises)."""
        namespace = dict(_PRELUDE_NS)
        for inp, value in zip(self.inputs, values, strict=True):
            namespace[inp.name] = value
        for step in self.steps:
            exec(_statement(step.outs, step.ref), namespace)
        return [namespace[o.name] for o in self.outputs]

    # --- printing --------------------------------------------------------------------------------
    def repro(self, device: str = "cpu") -> str:
        """Self-contained Python that defines, schedules and runs the case on ``device`` and compares
        with torch."""
        lines = [PRELUDE, "", "with FusionDefinition() as fd:"]
        lines += [f"    {inp.name} = {_declare(inp, device)}" for inp in self.inputs]
        lines += [f"    {_statement(s.outs, s.fd)}" for s in self.steps]
        for out in self.outputs:
            order = "" if out.stride_order is None else f", stride_order={list(out.stride_order)}"
            lines.append(f"    fd.add_output({out.name}{order})")
        lines += list(self.schedule)
        lines.append("")
        lines += [f"{_as_reference_name(inp.name)} = "
                  + (f"moved({inp.make_code()}, {device!r})" if isinstance(inp, TensorInput) and device != "cpu"
                     else inp.make_code()) for inp in self.inputs]
        names = ", ".join(_as_reference_name(i.name) for i in self.inputs)
        lines.append(f"outs = fd.execute([{names}])")
        lines += [_as_reference_name(_statement(s.outs, s.ref)) for s in self.steps]
        for k, out in enumerate(self.outputs):
            lines.append(f"torch.testing.assert_close(outs[{k}], {_as_reference_name(out.name)}, equal_nan=True)")
        return "\n".join(lines) + "\n"


def fusion_namespace() -> dict[str, Any]:
    return {"fd": FusionDefinition(), "DataType": DataType, "ParallelType": ParallelType, "torch": torch,
            "F": F, "pyfuser": pyfuser, "gen": _PRELUDE_NS["gen"], "moved": moved}


def _declare(inp: Input, device: str) -> str:
    if isinstance(inp, ScalarInput):
        return f"fd.define_scalar(dtype={fd_dtype(inp.dtype)})"
    if device != "cpu" and inp.declaration.startswith("fd.from_pytorch("):
        return f"fd.from_pytorch(moved({inp.declaration.removeprefix('fd.from_pytorch(')[:-1]}, {device!r}))"
    return inp.declaration


def _statement(outs: Sequence[str], expr: str) -> str:
    return f"{', '.join(outs)} = {expr}"


def _as_reference_name(code: str) -> str:
    return re.sub(r"\bt(\d+)\b", r"r\1", code)


def _inverse(order: Sequence[int]) -> list[int]:
    """``permute`` argument taking a tensor stored in ``order`` back to logical order."""
    return [list(order).index(d) for d in range(len(order))]
