"""One interface for every compiler pass, preseg (on a Fusion) and host (on a Host IR program).

A pass is a name and a function ``run(ir, options)``; the option that turns it off (on by
default) or on (off by default) sits beside it in its pipeline's list, so no pass reads option
names itself. ``run_passes`` runs a list in order and dumps the IR after each pass when asked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

from pyfuser.options import CompileOptions, DisableOption, DumpOption, EnableOption, dump

IR = TypeVar("IR")


@dataclass(frozen=True)
class Pass(Generic[IR]):
    name: str
    run: Callable[[IR, CompileOptions], None]
    #: the ``_disable_options`` name that turns this (default-on) pass off
    disabled_by: DisableOption | None = None
    #: the ``_enable_options`` name that turns this (default-off) pass on
    enabled_by: EnableOption | None = None

    def applies(self, options: CompileOptions) -> bool:
        if self.enabled_by is not None and not options.is_enabled(self.enabled_by):
            return False
        return self.disabled_by is None or not options.is_disabled(self.disabled_by)


def run_passes(passes: Sequence[Pass[IR]], ir: IR, options: CompileOptions, dump_option: DumpOption,
               describe: Callable[[IR, str], str]) -> None:
    """Run each applicable pass in order; ``describe(ir, pass name)`` is what ``dump_option`` prints after it."""
    for p in passes:
        if p.applies(options):
            p.run(ir, options)
            dump(dump_option, partial(describe, ir, p.name))
