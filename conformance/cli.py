"""``blockspace conformance``: check one implementation against another.

    blockspace conformance --impl fast --against reference --profile quick
    blockspace conformance --impl mypkg.manager:MyManager --json report.json

Runs every check of the profile (``runner.py``) with a progress bar naming
the check that runs, says so the moment a failure is found (it is then
shrunk for at most ``--shrink-budget`` seconds) and prints its repro as soon
as its check ends; ``--fail-fast`` stops there. Then a summary table
(checks, examples run, failures) and each failure's repro, and optionally a
JSON report for CI. Exit status: 0 when everything passed or was skipped, 1
when a check failed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from blockspace.conformance.runner import CAPABILITIES, PROFILES, capabilities_of, checks_for, with_changes
from blockspace.conformance.scope import SCOPES, ScopeError, scope_from
from blockspace.interfaces import load_manager_class

FEATURES = {name.removeprefix("supports_"): name for name in CAPABILITIES}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="blockspace conformance", description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", required=True, help='implementation under test: "fast", "reference" or package.module:Class')
    parser.add_argument("--against", default="reference", help="the yardstick (default: reference)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    parser.add_argument("--json", metavar="PATH", help="write a JSON report here")
    parser.add_argument("--only", metavar="TEXT", action="append", help="run only checks whose name contains TEXT")
    parser.add_argument("--examples", type=int, help="state-machine examples per family (overrides the profile)")
    parser.add_argument("--shrink-budget", type=float, metavar="SECONDS",
                        help="time to shrink a family's failure once found (default: the profile's, 20 s)")  # fmt: skip
    parser.add_argument("--fail-fast", action="store_true", help="stop at the first failing check")
    parser.add_argument(
        "--without", choices=sorted(FEATURES), action="append", default=[], help="a feature the implementation lacks"
    )
    parser.add_argument("--scope", metavar="NAME", action="append",
                        help=f"a scope the explorer exhausts (any profile; exhaustive's default: default): {', '.join(SCOPES)}")
    parser.add_argument("--scope-set", metavar="KEY=VALUE", action="append", default=[],
                        help="change a value of every --scope, e.g. num_gpu_blocks=5, alphabet=1,2, max_depth=8")
    parser.add_argument("--workers", type=int, metavar="N", help="explorer processes (default: one per core)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as stop:
        return int(stop.code or 0)
    try:
        impl_cls = load_manager_class(args.impl)
        against_cls = load_manager_class(args.against)
    except (ImportError, AttributeError, ValueError) as error:
        print(f"error: cannot load an implementation: {error}", file=sys.stderr)
        return 2
    if args.examples is not None and args.examples < 1:
        print(f"error: --examples must be >= 1, got {args.examples}", file=sys.stderr)
        return 2
    if args.shrink_budget is not None and not args.shrink_budget > 0:
        print(f"error: --shrink-budget must be > 0 seconds, got {args.shrink_budget}", file=sys.stderr)
        return 2
    if args.workers is not None and args.workers < 1:
        print(f"error: --workers must be >= 1, got {args.workers}", file=sys.stderr)
        return 2
    try:
        names = args.scope or (list(PROFILES[args.profile].scopes or ["default"]) if args.scope_set else [])
        scopes = [scope_from(name, args.scope_set) for name in names]
    except ScopeError as error:
        print(f"error: --scope/--scope-set: {error}", file=sys.stderr)
        return 2
    profile = PROFILES[args.profile]
    if args.examples:
        profile = with_changes(profile, max_examples=args.examples)
    if args.shrink_budget is not None:
        profile = with_changes(profile, shrink_seconds=args.shrink_budget)
    capabilities = capabilities_of(impl_cls, {FEATURES[f]: False for f in args.without})
    names = [name.rpartition(":")[2] for name in (args.against, args.impl)]
    if names[0] == names[1]:
        names[1] += " (2)"
    impls = {names[0]: against_cls, names[1]: impl_cls}
    reporter = Reporter(profile.shrink_seconds)
    every_check = checks_for(impls, profile, capabilities, reporter.found, scopes, args.workers)
    unmatched = [text for text in args.only or () if not any(text in check.name for check in every_check)]
    if unmatched:
        names = ", ".join(check.name for check in every_check)
        print(f"error: --only {unmatched[0]!r} names no check of the {args.profile} profile ({names})", file=sys.stderr)
        return 2
    checks = [c for c in every_check if not args.only or any(t in c.name for t in args.only)]
    results = run_with_progress(checks, reporter, args.fail_fast)
    report = {
        "impl": args.impl,
        "against": args.against,
        "profile": args.profile,
        "capabilities": capabilities,
        "passed": all(r.status != "failed" for r in results),
        "checks": [r.as_dict() for r in results],
        "totals": {
            "checks": len(results),
            "failed": sum(r.status == "failed" for r in results),
            "skipped": sum(r.status == "skipped" for r in results),
            "examples": sum(r.examples for r in results),
            "seconds": round(sum(r.seconds for r in results), 1),
        },
    }
    print_summary(report)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2, default=str)
    return 0 if report["passed"] else 1


class Reporter:
    """Says what happens while the checks run, above the progress bar."""

    def __init__(self, shrink_seconds: float) -> None:
        self.shrink_seconds = shrink_seconds
        self.console: Any = None  # the progress bar's, once it runs

    def say(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def found(self, check: str, seconds: float, message: str) -> None:
        """A check's first failure, the moment it is found (before shrinking)."""
        self.say(f"{check}: a failure after {seconds:.1f} s, shrinking it for at most {self.shrink_seconds:g} s: "
                 f"{message.splitlines()[0]}")  # fmt: skip

    def failed(self, result: Any) -> None:
        self.say(f"--- {result.name} failed ({result.seconds:.1f} s) ---\n{result.detail}")


def run_with_progress(checks: list[Any], reporter: Reporter, fail_fast: bool = False) -> list[Any]:
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    results = []
    columns = (TextColumn("{task.description:<28}"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn())
    with Progress(*columns, transient=False) as progress:
        reporter.console = progress.console
        task = progress.add_task("conformance", total=len(checks))
        for check in checks:
            progress.update(task, description=escape(check.name))
            result = check.run()
            results.append(result)
            progress.advance(task)
            if result.status == "failed":
                reporter.failed(result)
                if fail_fast:
                    reporter.say(f"--fail-fast: stopping after {result.name}; {len(checks) - len(results)} check(s) not run")
                    break
        progress.update(task, description="done")
    return results


def print_summary(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    table = Table(title=f"{report['impl']} against {report['against']} ({report['profile']})")
    for column in ("check", "status", "examples", "seconds", "note"):
        table.add_column(column, justify="right" if column in ("examples", "seconds") else "left")
    colours = {"passed": "green", "failed": "bold red", "skipped": "yellow"}
    for check in report["checks"]:
        note = check["detail"].splitlines()[0] if check["detail"] else ""
        status = f"[{colours[check['status']]}]{check['status']}[/]"
        note = escape(note[:70])
        table.add_row(escape(check["name"]), status, str(check["examples"]), f"{check['seconds']:.1f}", note)
    totals = report["totals"]
    table.add_row("total", f"{totals['failed']} failed", str(totals["examples"]), f"{totals['seconds']:.1f}", "")
    console.print(table)
    for check in report["checks"]:
        if "theorem" in check and check["status"] == "passed":
            console.print(f"{check['name']}: {check['theorem']}", markup=False, highlight=False, soft_wrap=True)
    for check in report["checks"]:
        if check["status"] == "failed":
            console.rule(f"[bold red]{escape(check['name'])}")
            console.print(check["detail"], markup=False, highlight=False, soft_wrap=True)
