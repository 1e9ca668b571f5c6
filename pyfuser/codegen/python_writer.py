"""The one writer of generated host Python: launchers, bound launches, straight-line programs, size
buckets, input binders.

Host code is generated (as Inductor writes its wrappers) so a cached call runs straight-line Python
instead of interpreting a description. Every such function is written here: lines at an
indentation, fresh names, constants bound into the function's globals by name (never printed into
the text as ``repr``), and compiled in one place under a readable file name registered with
``linecache``, so a traceback through generated code shows its lines and names what wrote it.
"""

from __future__ import annotations

import itertools
import linecache
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

#: Numbers the generated files of this process (two launchers of one kernel name get two files).
_SERIAL = itertools.count()


class PythonWriter:
    """Lines of generated Python and the globals they read, compiled by ``define``.

    ``what`` names the code in its file name (``<pyfuser launcher of pointwise_kernel #3>``);
    ``env`` is the functions' globals (shared with a caller that binds names itself)."""

    def __init__(self, what: str, env: dict[str, Any] | None = None) -> None:
        self.what = what
        self.env: dict[str, Any] = {} if env is None else env
        self.lines: list[str] = []
        self._indent = 0
        self._taken: dict[str, int] = {}

    def line(self, *texts: str) -> None:
        """Append lines (a text may hold several, separated by newlines) at the current indentation."""
        pad = "    " * self._indent
        for text in texts:
            self.lines.extend(pad + part for part in text.split("\n"))

    @contextmanager
    def indented(self) -> Iterator[None]:
        self._indent += 1
        try:
            yield
        finally:
            self._indent -= 1

    @contextmanager
    def block(self, header: str) -> Iterator[None]:
        """``header`` (``if ...:``, ``def ...:``) and the lines written inside, one level deeper."""
        self.line(header)
        with self.indented():
            yield

    def function(self, header: str, body: Iterable[str]) -> None:
        """A function: ``header`` (``def run(args):``) and its body's lines."""
        with self.block(header):
            self.line(*body)

    def fresh(self, prefix: str) -> str:
        """A name no other ``fresh`` or ``constant`` of this writer returned, nor in the globals yet:
        ``prefix`` itself the first time, then ``prefix1``, ``prefix2``..."""
        n = self._taken.get(prefix, 0)
        while (f"{prefix}{n}" if n else prefix) in self.env:
            n += 1
        self._taken[prefix] = n + 1
        return f"{prefix}{n}" if n else prefix

    def constant(self, value: Any, prefix: str = "_const") -> str:
        """The name of ``value`` in the functions' globals (bound under a fresh name)."""
        name = self.fresh(prefix)
        self.env[name] = value
        return name

    @property
    def source(self) -> str:
        return "\n".join(self.lines) + "\n"

    def define(self, *names: str) -> Any:
        """Compile the lines; the object ``names[0]`` defines (a tuple of them for several names)."""
        namespace = compile_source(self.source, self.what, self.env)
        if len(names) == 1:
            return namespace[names[0]]
        return tuple(namespace[n] for n in names)


def dropped_after_last_use(statements: Sequence[tuple[str, Collection[str], Collection[str]]],
                           kept: Collection[str], local: Callable[[str], bool]) -> list[str]:
    """The lines of ``statements`` (each its text, the names it reads, the names it defines), each
    ``local`` name dropped (``del``) after the last statement that reads it, or after its definition where
    none does, unless ``kept`` (returned): a generated function frees its intermediates as it goes, as
    torch.fx's code does."""
    last: dict[str, int] = {}
    for k, (_, uses, _) in enumerate(statements):
        for name in uses:
            last[name] = k
    lines: list[str] = []
    for k, (text, uses, defines) in enumerate(statements):
        lines.extend(text.split("\n"))
        dead = {n for n in uses if last[n] == k} | {n for n in defines if last.get(n, -1) <= k}
        dead = {n for n in dead if n not in kept and local(n)}
        if dead:
            lines.append(f"del {', '.join(sorted(dead))}")
    return lines


def compile_source(source: str, what: str, env: dict[str, Any]) -> dict[str, Any]:
    """Run generated ``source`` with globals ``env`` (returned, with what it defined): the one place
    generated host Python is compiled."""
    filename = f"<pyfuser {what} #{next(_SERIAL)}>"
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)  # tracebacks show the generated lines
    exec(compile(source, filename, "exec"), env)
    return env


def define_function(header: str, body: Iterable[str], what: str, env: dict[str, Any] | None = None,
                    ) -> Callable[..., Any]:
    """One generated function: ``header`` (``def name(params):``) over the lines ``body``."""
    writer = PythonWriter(what, env)
    writer.function(header, body)
    return writer.define(header.split()[1].split("(")[0])
