"""The options of ``blockspace soak``, apart from its run (``cli.py``), which
needs the conformance kit's extra: so ``blockspace soak --help`` works
before it is installed (``blockspace/cli.py``'s ``help_from``)."""

from __future__ import annotations

import argparse

from blockspace.validation import Range, command_parser

DESCRIPTION = (
    "A long run that looks for leaks and drift: random operations and, with --trace, a replay by two managers."
)
RANGES = {"ops": Range(least=0), "check_every": Range(least=1)}
# The soak's two parts are its modes: the random operations (--ops, unless 0) and the replay (--trace).
# An option of one part, written where that part does not run, is refused by name (check_mode_options).
NEEDS = {
    "impl": (("ops",), "it is the manager of the random operations, and --ops 0 runs none"),
    "check_every": (("ops",), "it paces the invariant checks of the random operations, and --ops 0 runs none"),
    "compare": (("trace",), "it names the two managers of the trace replay, and without --trace there is none"),
    "out": (("trace",), "it is where the trace replay writes simulation.json, and without --trace there is none"),
}
MODES = ("ops", "trace")


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("blockspace soak", DESCRIPTION)
    parser.add_argument(
        "--impl", default="fast", help="manager of the random operations: reference, fast or package.module:Class"
    )
    parser.add_argument("--ops", type=int, default=10_000_000, help="random legal operations (0: none)")
    parser.add_argument("--check-every", type=int, default=10_000, help="check_invariants() every N calls")
    parser.add_argument("--trace", default=None, help="also replay this trace with --compare (default: no replay)")
    parser.add_argument("--compare", default="reference,fast", help="the two managers of the trace replay")
    parser.add_argument("--out", default="out/soak", help="folder for the trace replay's simulation.json")
    parser.add_argument("--json", default=None, help="write the results here (default: not written)")
    return parser
