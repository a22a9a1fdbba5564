"""How fast the conformance kit reports a bug: the quick profile on each
deliberately broken manager (``blockspace.conformance.broken``), stopping
at the first failing check as ``--fail-fast`` does, and on a correct one.

    python -m blockspace.bench.kit
    python -m blockspace.bench.kit --before   # also as the kit ran before: Hypothesis' own
                                              # 5-minute shrink, no line deletion

For each broken manager: seconds until the failure was found, until its
repro was ready (what a CI log waits for), the repro's calls, and whether
it raises as printed (run on its own). Then the whole quick profile on the
fast manager against the reference. A benchmark, not a test: nothing here
asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from blockspace.conformance import Divergence
from blockspace.conformance.broken import BROKEN_MANAGERS
from blockspace.conformance.check import REPRO
from blockspace.conformance.runner import capabilities_of, checks_for, with_changes
from blockspace.errors import BlockSpaceError
from blockspace.kit_options import PROFILES, Profile
from blockspace.validation import check_output_file, command_parser, load_manager, refuse, write_output

BEFORE = {"shrink_seconds": 300.0, "reduce_repro": False}  # Hypothesis' own limit, as the kit had it


def runs_as_printed(repro: str) -> bool:
    try:
        exec(compile(repro, "<repro>", "exec"), {})
    except Divergence:
        return True
    return False


def time_to_report(broken: type, profile: Profile) -> dict[str, Any]:
    """The quick profile on ``broken`` until its first failing check."""
    impls = {"reference": "reference", broken.__name__: broken}
    found: list[float] = []
    started = time.perf_counter()
    for check in checks_for(impls, profile, capabilities_of(broken), lambda *_: found.append(time.perf_counter())):
        result = check.run()
        if result.status == "failed":
            repro = result.detail.split(REPRO, 1)[1] if REPRO in result.detail else ""
            return {
                "manager": broken.__name__, "check": result.name,
                "found_s": round((found[0] if found else time.perf_counter()) - started, 1),
                "report_s": round(time.perf_counter() - started, 1),
                "calls": sum(line.startswith("lock.call(") for line in repro.splitlines()),
                "runs_as_printed": bool(repro) and runs_as_printed(repro),
            }  # fmt: skip
    return {"manager": broken.__name__, "check": None, "report_s": round(time.perf_counter() - started, 1)}


def whole_profile(impl: str, profile: Profile) -> dict[str, Any]:
    impls = {"reference": "reference", impl: impl}
    started = time.perf_counter()
    results = [check.run() for check in checks_for(impls, profile, {})]
    return {"manager": impl, "seconds": round(time.perf_counter() - started, 1),
            "failed": sum(r.status == "failed" for r in results)}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("python -m blockspace.bench.kit", __doc__)
    parser.add_argument("--before", action="store_true", help="also run each broken manager as the kit ran before")
    parser.add_argument("--correct", default="fast", help="the correct manager timed over the whole quick profile")
    parser.add_argument("--json", type=Path, help="write the figures here (default: not written)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Exit status 0; 2 for a bad option, said before anything is timed."""
    try:
        args = build_parser().parse_args(argv)
        load_manager(args.correct, "--correct")  # timed last, after minutes: checked first
        if args.json:
            check_output_file(args.json, "--json")
    except BlockSpaceError as error:
        return refuse(error)
    ways = {"now": PROFILES["quick"]}
    if args.before:
        ways["before"] = with_changes(PROFILES["quick"], **BEFORE)
    rows = []
    print("| manager | kit | failing check | found s | reported s | repro calls | runs as printed |")
    print("| --- | --- | --- | ---: | ---: | ---: | --- |")
    for broken in BROKEN_MANAGERS:
        for way, profile in ways.items():
            row = {"kit": way, **time_to_report(broken, profile)}
            rows.append(row)
            print(f"| {row['manager']} | {way} | {row['check']} | {row.get('found_s', '-')} | {row['report_s']} | "
                  f"{row.get('calls', '-')} | {row.get('runs_as_printed', '-')} |", flush=True)  # fmt: skip
    correct = whole_profile(args.correct, PROFILES["quick"])
    print(
        f"\nquick profile, {correct['manager']} against the reference: {correct['seconds']} s, "
        f"{correct['failed']} failed"
    )
    if args.json:
        write_output(args.json, json.dumps({"broken": rows, "correct": correct}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
