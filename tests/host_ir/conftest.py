"""Fixtures for Host IR tests: run a fusion and capture the Host IR it compiled to."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from pyfuser import FusionDefinition
from pyfuser.ir.base import Expr
from pyfuser.ir.eval_context import EvalContext
from pyfuser.ir.ops.common import positional_map

RunDumped = Callable[..., tuple[list[torch.Tensor], str]]

_NUMBERS = [
    (re.compile(r"\bT\d+_"), "T?_"),
    (re.compile(r"\b([irb])(S|StreamIdx|deviceIdx\.[xyz])\d+\{"), r"\1\2?{"),
    (re.compile(r"\bi\d+\b"), "i?"),
    (re.compile(r"\bStream \d+"), "Stream ?"),
]


def normalize_dump(text: str) -> list[str]:
    """Dump lines without indentation and with T / ID / extent / stream numbers replaced by ``?``."""
    lines = []
    for line in text.strip().splitlines():
        line = line.strip()
        for pattern, repl in _NUMBERS:
            line = pattern.sub(repl, line)
        if line:
            lines.append(line)
    return lines


@pytest.fixture
def run_dumped(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> RunDumped:
    """``run(fd, inputs, **execute_kwargs) -> (outputs, host IR dump)``; the fusion must compile anew.

    Every expr runs as its own ATen call (generated kernels off, also on CUDA), so the dumps have the
    seeds' shape: these tests are about Host IR, stream loops and buffers, not about fusion.
    """

    def run(fd: FusionDefinition, inputs: Sequence[Any], **kwargs: Any) -> tuple[list[torch.Tensor], str]:
        kwargs["_disable_options"] = [*kwargs.get("_disable_options", ()), "kernel_codegen"]
        capsys.readouterr()
        monkeypatch.setenv("PYFUSER_DUMP", "host_ir")
        try:
            outputs = fd.execute(inputs, **kwargs)
        finally:
            monkeypatch.delenv("PYFUSER_DUMP")
        text = capsys.readouterr().out
        assert "%HostIrContainer" in text, "the fusion was not compiled by this call"
        return outputs, text

    return run


@pytest.fixture
def run_seed_dumped(run_dumped: RunDumped) -> RunDumped:
    """``run_dumped`` with stream overlap off: the program as seed 002 prints it, each iteration joining the
    user's stream (what the stream-lowering and ring-buffer tests check line by line)."""

    def run(fd: FusionDefinition, inputs: Sequence[Any], **kwargs: Any) -> tuple[list[torch.Tensor], str]:
        disabled = [*kwargs.pop("_disable_options", ()), "stream_overlap"]
        return run_dumped(fd, inputs, _disable_options=disabled, **kwargs)

    return run


@pytest.fixture
def normalize() -> Callable[[str], list[str]]:
    return normalize_dump


class DoublingOp(Expr):
    """A test-only op computing ``2 * x`` whose lowering a test chooses: subclass it (a lowering is
    registered per class) and set ``printed_as``, how it prints."""

    printed_as = "double"

    def __init__(self, fusion: Any, out: Any, inp: Any) -> None:
        super().__init__(fusion, [inp], [out])

    def evaluate(self, ctx: EvalContext, x: torch.Tensor) -> list[Any]:
        return [x * 2]

    def logical_map(self, producer: Any) -> dict:
        return positional_map(producer, self.output)

    def to_string(self, indent: int = 0) -> str:
        return f"{'  ' * indent}{self.output} = {self.printed_as}({self.inputs[0]})\n"
