"""pyfuser's differential fuzzer: random fusions, inputs and schedules, compared with eager torch.

``generator.generate(seed)`` grows a random program over the ops ``fd.ops`` offers;
``runner.run_case(case, modes)`` runs it under each ``ExecutionMode`` and classifies the outcome
(match, valid rejection, wrong result, internal error, or an oracle artifact: a float-to-integer
cast torch leaves undefined, an integer division by zero on a GPU (torch raises only on the CPU), or
a difference from torch where pyfuser is as close to the program evaluated in float64 as torch is);
``runner.minimal_repro`` shrinks a failing case to a copy-pasteable program (``Case.repro()``).

- CI: ``tests/fuzz/test_fuzz.py`` (fixed seeds, part of the default pytest run).
- Long mode: ``python -m tests.fuzz --minutes 30`` (progress, a table of outcomes, minimal repros).
"""

from .case import Case
from .generator import GeneratorConfig, generate
from .runner import DEFAULT_MODES, MODES, Category, ExecutionMode, Outcome, minimal_repro, run_case

__all__ = ["DEFAULT_MODES", "MODES", "Case", "Category", "ExecutionMode", "GeneratorConfig", "Outcome", "generate",
           "minimal_repro", "run_case"]
