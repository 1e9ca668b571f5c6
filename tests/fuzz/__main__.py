"""Long mode: ``python -m tests.fuzz --minutes 30`` (run from the repository root).

Prints progress every 30 s, then a table of outcomes by execution mode, the most frequent
rejections and a minimal repro of each distinct wrong result or internal error. Exits 1 when there
was any.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

from .campaign import Campaign
from .generator import GeneratorConfig
from .runner import DEFAULT_MODES, MODES, ExecutionMode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0, help="how long to run (default 30)")
    parser.add_argument("--cases", type=int, default=None, help="stop after this many cases")
    parser.add_argument("--seed", type=int, default=1_000_000, help="first seed (cases use consecutive seeds)")
    available = [name for name, mode in MODES.items() if mode.available]
    parser.add_argument("--modes", default=",".join(available),
                        help=f"comma-separated execution modes, of {', '.join(MODES)} (default: all this machine "
                             "runs: the cuda ones need a GPU)")
    parser.add_argument("--enable", default="", help="comma-separated _enable_options of one more mode, 'custom'")
    parser.add_argument("--disable", default="", help="comma-separated _disable_options of the 'custom' mode")
    parser.add_argument("--max-ops", type=int, default=20, help="most ops in a case (default 20)")
    parser.add_argument("--max-inputs", type=int, default=5, help="most tensor inputs in a case (default 5)")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between progress lines")
    parser.add_argument("--no-shrink", action="store_true", help="print failing cases as generated")
    args = parser.parse_args(argv)
    names = list(_names(args.modes)) or list(DEFAULT_MODES)
    unknown = [n for n in names if n not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; known: {', '.join(MODES)}")
    modes = [MODES[n] for n in names]
    missing = [m.name for m in modes if not m.available]
    if missing:
        parser.error(f"mode(s) {missing} need a GPU, and torch sees none")
    if args.enable or args.disable:
        modes.append(ExecutionMode("custom", _names(args.enable), _names(args.disable)))
        names.append(f"custom (enable {args.enable or '-'}, disable {args.disable or '-'})")
    campaign = Campaign(modes, GeneratorConfig(max_ops=args.max_ops, max_inputs=args.max_inputs))
    start = time.monotonic()
    seeds = itertools.count(args.seed) if args.cases is None else range(args.seed, args.seed + args.cases)
    print(f"fuzzing from seed {args.seed} for {args.minutes} min, modes {', '.join(names)}", flush=True)

    def progress(c: Campaign) -> None:
        print(c.progress_line(time.monotonic() - start), flush=True)

    campaign.run(seeds, deadline=start + 60 * args.minutes, progress=progress, every=args.every)
    progress(campaign)
    print()
    print(campaign.table())
    print()
    print(campaign.rejection_report())
    print()
    print(campaign.failure_report(shrink=not args.no_shrink), flush=True)
    return 1 if campaign.failures else 0


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


if __name__ == "__main__":
    sys.exit(main())
