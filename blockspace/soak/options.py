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
