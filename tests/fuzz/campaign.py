"""A fuzzing campaign: many seeds, counts by outcome, and a minimal repro of each distinct failure."""

from __future__ import annotations

import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from .case import Case
from .generator import GeneratorConfig, generate
from .runner import Category, ExecutionMode, Outcome, minimal_repro, run_case


@dataclass
class Failure:
    seed: int
    case: Case
    outcome: Outcome
    count: int = 1


@dataclass
class Campaign:
    modes: Sequence[ExecutionMode]
    config: GeneratorConfig = field(default_factory=GeneratorConfig)
    cases: int = 0
    runs: Counter[tuple[str, Category]] = field(default_factory=Counter)
    #: rejections by message kind, and whether torch ran those programs
    rejections: Counter[tuple[str, bool]] = field(default_factory=Counter)
    stream_runs: int = 0
    failures: dict[str, Failure] = field(default_factory=dict)

    def run(self, seeds: Iterable[int], deadline: float | None = None,
            progress: Callable[[Campaign], None] | None = None, every: float = 30.0) -> None:
        """Run ``seeds`` until they or the ``deadline`` (``time.monotonic()``) run out."""
        last = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's warnings about degenerate inputs (var of one element)
            for seed in seeds:
                if deadline is not None and time.monotonic() >= deadline:
                    break
                self.add(seed)
                if progress is not None and time.monotonic() - last >= every:
                    last = time.monotonic()
                    progress(self)

    def add(self, seed: int) -> None:
        try:
            case = generate(seed, self.config)
        except Exception as e:  # the generator drives fd.ops: a crash there is pyfuser's too
            case = Case(seed, (), (), ())
            outcomes = [Outcome(Category.internal, "generator", f"{type(e).__name__} while generating: {e}")]
        else:
            outcomes = run_case(case, self.modes)
        self.cases += 1
        for outcome in outcomes:
            self.runs[(outcome.mode, outcome.category)] += 1
            self.stream_runs += outcome.stream_loops > 0
            if outcome.category is Category.rejected:
                self.rejections[(outcome.signature(), outcome.torch_runs_it)] += 1
            if outcome.failed:
                known = self.failures.get(outcome.signature())
                if known is None:
                    self.failures[outcome.signature()] = Failure(seed, case, outcome)
                else:
                    known.count += 1

    @property
    def failed(self) -> int:
        return sum(f.count for f in self.failures.values())

    def counts(self) -> Counter[Category]:
        total: Counter[Category] = Counter()
        for (_, category), n in self.runs.items():
            total[category] += n
        return total

    # --- reports ------------------------------------------------------------------------------------
    def progress_line(self, elapsed: float) -> str:
        counts = self.counts()
        parts = ", ".join(f"{c.value} {counts[c]}" for c in Category)
        return f"[{elapsed / 60:5.1f} min] {self.cases} cases ({self.cases / max(elapsed, 1e-9):.1f}/s): {parts}"

    def table(self) -> str:
        modes = [m.name for m in self.modes]
        width = max(len(c.value) for c in Category) + 2
        lines = [f"{'':{width}}" + "".join(f"{m:>22}" for m in modes) + f"{'total':>10}"]
        for category in Category:
            row = [self.runs[(m, category)] for m in modes]
            lines.append(f"{category.value:{width}}" + "".join(f"{n:>22}" for n in row) + f"{sum(row):>10}")
        lines.append(f"{self.cases} cases x {len(modes)} mode(s); {self.stream_runs} runs executed stream loops")
        return "\n".join(lines)

    def rejection_report(self, top: int = 15) -> str:
        lines = ["Most frequent rejections (* = eager torch runs the program):"]
        for (signature, torch_runs), n in self.rejections.most_common(top):
            lines.append(f"  {n:6}  {'*' if torch_runs else ' '} {signature.split(': ', 1)[1]}")
        return "\n".join(lines)

    def failure_report(self, shrink: bool = True, limit: int = 10) -> str:
        if not self.failures:
            return "No wrong results and no internal errors."
        parts = []
        for k, failure in enumerate(sorted(self.failures.values(), key=lambda f: -f.count)[:limit]):
            case, outcome = failure.case, failure.outcome
            head = (f"=== failure {k + 1}: {outcome.category.value} in mode {outcome.mode!r} ({failure.count} "
                    f"case(s), first seed {failure.seed}; again: python -m tests.fuzz --seed {failure.seed} "
                    f"--cases 1 --modes {outcome.mode})\n{outcome.detail}")
            if outcome.mode == "generator":  # no case was built: the generator's own call reproduces it
                parts.append(f"{head}\n--- repro ---\nfrom tests.fuzz import GeneratorConfig, generate\n"
                             f"generate({failure.seed}, {self.config!r})\n")
                continue
            if shrink:
                case, outcome = minimal_repro(case, outcome, self.modes)
            device = next((m.device for m in self.modes if m.name == outcome.mode), "cpu")
            parts.append(f"{head}\n--- minimal repro ---\n{case.repro(device)}")
        if len(self.failures) > limit:
            parts.append(f"... and {len(self.failures) - limit} more kinds of failure")
        return "\n".join(parts)
