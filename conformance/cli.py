"""blockspace conformance: check one implementation against another.

    blockspace conformance --impl fast --against reference --profile quick
    blockspace conformance --impl mypkg.manager:MyManager --json report.json

Every argument is checked before any check runs (the implementations must
be block managers, ``validation.load_manager``; the ``--json`` path must be
writable), so a mistake is one ``error:`` line and exit status 2, never a
traceback after minutes. So is an option that no check of the run reads
(``--examples`` where no state machine runs, ``--workers`` where no
explorer does, a ``--without`` that skips nothing, ...: ``check_choice``),
and a run whose every check would be skipped: each would pass having
checked less than was asked, or nothing. Then every check of the profile
(``runner.py``) runs with a progress bar naming the check that runs; a
failure is announced the moment it is found (it is then shortened for at
most ``--shrink-budget`` seconds) and its repro printed as soon as its
check ends; ``--fail-fast`` stops there. Checks that meet the same failure
(``check.failure_signature``) are reported together: one repro and the
list of checks that met it, not one repro each. Then a summary table and
the repros, and optionally a JSON report for CI. Exit status: 0 when
everything passed or was skipped, 1 when a check failed or when every
check was skipped after all (nothing was checked), 2 on bad arguments.
The options are in ``blockspace/kit_options.py``, where ``blockspace
conformance --help`` reads them without the kit's extra.
"""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from blockspace.conformance.check import REPRO, Check, CheckResult, failure_signature
from blockspace.conformance.explore import Report
from blockspace.conformance.runner import (
    PROFILES,
    capabilities_of,
    checks_for,
    with_changes,
)
from blockspace.conformance.scope import Scope, ScopeError, scope_from
from blockspace.errors import BlockSpaceError, InvalidArgumentError
from blockspace.kit_options import FEATURES, RANGES, Profile, build_parser
from blockspace.outputs import write_text
from blockspace.validation import check_output_file, check_ranges, given_options, load_manager, option_name, refuse


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        plan = prepare(args, given_options(parser, argv))
    except SystemExit as stop:  # --help
        return int(stop.code or 0)
    except BlockSpaceError as error:
        return refuse(error)
    results = run_with_progress(plan.checks, plan.reporter, args.fail_fast)
    checked = sum(r.status != "skipped" for r in results)
    entries = check_entries(results)
    report = {
        "impl": args.impl,
        "against": args.against,
        "profile": args.profile,
        "settings": plan.settings,
        "capabilities": plan.capabilities,
        "passed": checked > 0 and all(r.status != "failed" for r in results),
        "checks": entries,
        "situations": situation_coverage(entries, [check.name for check in plan.checks]),
        "totals": {
            "checks": len(results),
            "failed": sum(r.status == "failed" for r in results),
            "skipped": sum(r.status == "skipped" for r in results),
            "examples": sum(r.examples for r in results),
            "seconds": round(sum(r.seconds for r in results), 1),
        },
    }
    print_summary(report)
    if args.json:  # whole or not at all, its folder made: check_output_file allowed one still to be made
        write_text(args.json, json.dumps(report, indent=2, default=str))
    return 0 if report["passed"] else 1


@dataclass
class Plan:
    """What a run will do: its checks, who reports on them, the capability
    flags they were given, and the profile's settings as the options made
    them (in the report: what was run, not only what was named)."""

    checks: list[Check]
    reporter: Reporter
    capabilities: dict[str, bool]
    settings: dict[str, Any]


def prepare(args: Any, given: frozenset[str] = frozenset()) -> Plan:
    """The checks to run, from arguments checked first (``InvalidArgumentError``
    naming the option that is wrong); ``given``: the options written on the
    command line (``validation.given_options``), each of which some check
    of the run must read (``check_choice``)."""
    check_ranges(args, RANGES)
    if args.json:
        check_output_file(args.json, "--json")
    profile = PROFILES[args.profile]
    scopes = explorer_scopes(args, profile)
    # Last of the checks: a manager is built to see it construct, and a cold
    # cache compiles fast's kernels for it (a minute), so nothing cheaper waits on it.
    impl_cls = load_manager(args.impl, "--impl")
    against_cls = load_manager(args.against, "--against")
    if args.address is not None and args.executor != "ray":
        raise InvalidArgumentError("--address goes with --executor ray: it names the Ray cluster to join")
    if args.examples and profile.max_examples:  # the explorer samples nothing: check_choice refuses it there
        profile = with_changes(profile, max_examples=args.examples)
    if args.shrink_budget is not None:
        profile = with_changes(profile, shrink_seconds=args.shrink_budget)
    capabilities = capabilities_of(impl_cls, {FEATURES[f]: False for f in args.without})
    names = [name.rpartition(":")[2] for name in (args.against, args.impl)]
    if names[0] == names[1]:
        names[1] += " (2)"
    impls = {names[0]: against_cls, names[1]: impl_cls}
    reporter = Reporter(profile.shrink_seconds)
    every_check = checks_for(
        impls, profile, capabilities, reporter.found, scopes, args.workers, args.budget, args.executor, reporter.layer
    )
    unmatched = [text for text in args.only or () if not any(text in check.name for check in every_check)]
    if unmatched:
        known = ", ".join(check.name for check in every_check)
        raise InvalidArgumentError(f"--only {unmatched[0]!r} names no check of the {args.profile} profile ({known})")
    checks = [c for c in every_check if not args.only or any(t in c.name for t in args.only)]
    check_choice(args, given, checks, scopes, capabilities_of(impl_cls), capabilities)
    if args.executor == "ray":  # joined now: a cluster that is not there, or too small, is one error line
        from blockspace.conformance.ray_layers import ray_workers, shipped_modules
        from blockspace.ray_cluster import join, use_address

        use_address(args.address)
        join(shipped_modules(impls))
        ray_workers(args.workers)
    settings = {**asdict(profile), "scopes": [scope.name for scope in scopes], "budget_s": args.budget}
    return Plan(checks, reporter, capabilities, settings)


def explorer_scopes(args: Any, profile: Profile) -> list[Scope]:
    """The scopes the explorer exhausts: each ``--scope``, else the
    profile's (or, for ``--scope-set`` alone, ``default``), with every
    ``--scope-set`` change. A scope named twice is refused: it would be
    explored twice, for the same theorem."""
    named = args.scope or []
    repeated = next((name for i, name in enumerate(named) if name in named[:i]), None)
    if repeated is not None:
        raise InvalidArgumentError(f"--scope {repeated} is named twice: it would be explored twice")
    names = named or list(profile.scopes or (["default"] if args.scope_set else []))
    try:
        return [scope_from(name, args.scope_set) for name in names]
    except ScopeError as error:
        raise InvalidArgumentError(f"--scope/--scope-set: {error}") from None


# Options that only some checks read, by argparse destination: (the name every such check starts with,
# what the option does there). Written where none of the checks that run is one, an option would change
# nothing, and the run would pass without the answer it asked for: ``check_choice`` refuses it by name.
READ_BY = {
    "examples": ("machine[", "sets the examples of each state machine (machine[...])"),
    "shrink_budget": ("machine[", "bounds the shrinking of a state machine's failure (machine[...]; no other check "
                                  "shrinks)"),
    "scope_set": ("explore[", "changes the scopes the explorer exhausts (explore[...])"),
    "workers": ("explore[", "sets the explorer's processes (explore[...])"),
    "address": ("explore[", "names the Ray cluster the explorer's workers run on (explore[...])"),
    "executor": ("explore[", "sets where the explorer's workers run (explore[...])"),
    "budget": ("explore[", "bounds the explorer's wall time (explore[...])"),
}  # fmt: skip


def check_choice(
    args: Any,
    given: frozenset[str],
    checks: Sequence[Check],
    scopes: Sequence[Scope],
    own: Mapping[str, bool],
    capabilities: Mapping[str, bool],
) -> None:
    """Each option written (``given``) is read by a check that runs, and
    some check runs: else ``InvalidArgumentError`` naming the option, the
    run (its ``--profile``, ``--only`` and ``--scope``) and its checks.

    A check runs unless the capability it needs is False (``capabilities``:
    the implementation's ``own`` flags with ``--without``'s cleared). Why
    before anything runs: the skips cost nothing, so the run would end at
    once with exit status 0, having checked less than was asked, or
    nothing; a mistake costs one ``error:`` line instead."""
    names = [check.name for check in checks]
    needs = {check.name: check.needs for check in checks}
    lacking = {name: flag for name, flag in needs.items() if flag and not capabilities.get(flag, True)}
    running = [name for name in names if name not in lacking]
    run = " ".join(["--profile", args.profile, *(f"--only {shlex.quote(t)}" for t in args.only or ()),
                    *(f"--scope {name}" for name in args.scope or ())])  # fmt: skip
    for feature in dict.fromkeys(args.without):
        if not any(FEATURES[feature] in check.capabilities_read() for check in checks):
            raise InvalidArgumentError(
                f"--without {feature} changes nothing here: no check of {run} needs {FEATURES[feature]} "
                f"({listed(names)})"
            )
    if not running:
        why = ", ".join(f"{name}: {flag} is False" for name, flag in lacking.items())
        if all(not own.get(flag, True) for flag in lacking.values()):  # skipped by the class's own flags
            raise InvalidArgumentError(f"--impl {args.impl} lacks what every check of {run} needs ({why}): "
                                       "nothing would be checked")  # fmt: skip
        without = " ".join(f"--without {feature}" for feature in dict.fromkeys(args.without))
        raise InvalidArgumentError(f"{without} skips every check of {run} ({why}): nothing would be checked")
    for scope in scopes if args.scope else ():
        name = f"explore[{scope.name}]"
        if name not in names:
            raise InvalidArgumentError(f"--scope {scope.name} changes nothing here: --only leaves out {name}")
        if name in lacking:
            raise InvalidArgumentError(
                f"--scope {scope.name} changes nothing here: {name} is skipped ({lacking[name]} is False)"
            )
    for dest, (prefix, does) in READ_BY.items():
        if dest in given and not any(name.startswith(prefix) for name in running):
            raise InvalidArgumentError(
                f"{option_name(dest)} changes nothing here: it {does}, and {run} runs none ({listed(running)})"
            )
    if "fail_fast" in given and len(running) < 2:
        raise InvalidArgumentError(
            f"--fail-fast changes nothing here: it stops the run after the first failing check, and {run} runs "
            f"one ({listed(running)})"
        )


def listed(names: Sequence[str]) -> str:
    """``names`` for a message: all of them when they are few, else the first ones and how many."""
    if len(names) <= 4:
        return "it runs " + ", ".join(names) if names else "it runs no check"
    return f"it runs {len(names)} checks: {', '.join(names[:3])}, ..."


def situation_coverage(entries: list[dict[str, Any]], planned: Sequence[str]) -> dict[str, Any] | None:
    """Which situations of the spec (``situations.py``) the explorer's
    scopes of this run reached, each with the scopes and the shallowest
    depth; None when the run explores no scope (``planned``: the names of
    its checks). Not measured (``measured`` False, and why) where a search
    stopped at a failure or the run stopped before a search (``--fail-fast``):
    the situations its scopes would have reached would read as not reached,
    a coverage gap that is not one."""
    from blockspace.conformance.situations import SITUATIONS
    from blockspace.conformance.wrong import killers  # each situation's wrong implementations (issue #51)

    searches = [name for name in planned if name.startswith("explore[")]
    if not searches:
        return None
    ran = {entry["name"]: entry for entry in entries}
    failed = [name for name in searches if name in ran and ran[name]["status"] == "failed"]
    stopped = any(name not in ran for name in searches)
    if failed or stopped:
        where = "the run stopped at the first failure" if stopped else f"{failed[0]} stopped at its first failure"
        return {"registered": len(SITUATIONS), "measured": False, "not_measured": where}
    explored = [entry for entry in entries if "situations" in entry]
    reached: dict[str, dict[str, Any]] = {}
    for entry in explored:
        for name, depth in entry["situations"].items():
            seen = reached.setdefault(name, {"depth": depth, "scopes": []})
            seen["depth"] = min(seen["depth"], depth)
            seen["scopes"].append(entry["scope"])
    return {
        "registered": len(SITUATIONS),
        "measured": True,
        "reached": {s.name: {**reached[s.name], "kills": killers(s.name)} for s in SITUATIONS if s.name in reached},
        "not_reached": [s.name for s in SITUATIONS if s.name not in reached],
        "scopes_exhausted": [entry["scope"] for entry in explored if entry.get("exhausted")],
    }


def repro_lines(result: CheckResult) -> int:
    """How long a failure's repro is, in lines (a failure with none: 0)."""
    return len(result.detail.partition(REPRO)[2].splitlines())


def check_entries(results: list[CheckResult]) -> list[dict[str, Any]]:
    """The report's entry of each check. Failures of one signature
    (``check.failure_signature``: the call the repro ends in and how the
    answers differ) are one bug: each check but the one with the shortest
    repro names that one as ``same_failure_as``, and the report shows its
    repro alone. Why the shortest: one bug met by a state machine (a few
    calls, shrunk), a trace (hundreds) and a sweep reads best in the few."""
    groups: dict[str, list[CheckResult]] = {}
    for result in results:
        if result.status == "failed":
            groups.setdefault(result.signature, []).append(result)
    shown = {signature: min(group, key=repro_lines).name for signature, group in groups.items()}
    entries = []
    for result in results:
        entry = result.as_dict()
        if result.status == "failed" and shown[result.signature] != result.name:
            entry["same_failure_as"] = shown[result.signature]
        entries.append(entry)
    return entries


PROGRESS_SECONDS = 60.0  # a search says where it is at most this often (as TLC does, once a minute)


class Reporter:
    """Says what happens while the checks run, above the progress bar: each
    failure once (a check that meets a failure already shown says nothing:
    the summary lists it with the first), and where a long search is. Why
    the search's lines: its figures come only at its end, so without them
    a search stopped after an hour leaves nothing of what it counted."""

    def __init__(self, shrink_seconds: float) -> None:
        self.shrink_seconds = shrink_seconds
        self.console: Any = None  # the progress bar's, once it runs
        self.shown: set[str] = set()  # signatures of the failures printed
        self.next_line: dict[str, float] = {}  # check -> its search's seconds at which it next says where it is

    def say(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def found(self, check: str, seconds: float, message: str) -> None:
        """A check's first failure, the moment it is found (before shrinking)."""
        if failure_signature(message) not in self.shown:
            self.say(f"{check}: a failure after {seconds:.1f} s, shrinking it for at most {self.shrink_seconds:g} s: "
                     f"{message.splitlines()[0]}")  # fmt: skip

    def layer(self, check: str, report: Report) -> None:
        """A layer of a search ended: its figures so far, once a ``PROGRESS_SECONDS``."""
        going_on = not (report.exhausted or report.cut)  # else its summary follows at once
        if going_on and report.seconds >= self.next_line.get(check, PROGRESS_SECONDS):
            self.next_line[check] = report.seconds + PROGRESS_SECONDS
            self.say(f"{check}: depth {report.depth} reached ({report.layers[-1]:,} states at it), "
                     f"{report.states:,} states and {report.transitions:,} transitions so far, "
                     f"{report.seconds:.0f} s")  # fmt: skip

    def failed(self, result: CheckResult) -> None:
        if result.signature not in self.shown:
            self.shown.add(result.signature)
            self.say(f"--- {result.name} failed ({result.seconds:.1f} s) ---\n{result.detail}")


def run_with_progress(checks: list[Check], reporter: Reporter, fail_fast: bool = False) -> list[CheckResult]:
    """The checks, one after another, under a progress bar. The bar has a
    console of its own, made now: rich's shared one keeps what it found
    about the output when it was first used (a terminal's colours and
    redraws), maybe by other code of the process on another stdout."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    results = []
    columns = (
        TextColumn("{task.description:<28}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(), transient=False) as progress:
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
                    reporter.say(
                        f"--fail-fast: stopping after {result.name}; {len(checks) - len(results)} check(s) not run"
                    )
                    break
        progress.update(task, description="done")
    return results


HEADERS = ("check", "status", "examples", "seconds", "note")
PIPED_WIDTH = 100  # the summary's columns where the output is not a terminal: a file, a pipe, a CI log


def _table(title: str, rows: list[tuple[str, ...]]) -> Any:
    """The summary table of ``rows`` (plain text): a check's name and
    figures on one line, its note wrapped onto more lines of its column."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False)
    for header in HEADERS:
        table.add_column(header, justify="right" if header in ("examples", "seconds") else "left",
                         no_wrap=header != "note", overflow="fold")  # fmt: skip
    colours = {"passed": "green", "failed": "bold red", "skipped": "yellow"}
    for name, status, *numbers, note in rows:
        status = f"[{colours[status]}]{status}[/]" if status in colours else status
        table.add_row(escape(name), status, *numbers, escape(note))
    return table


def _note(check: dict[str, Any]) -> str:
    """A check's note in the table: the first line of its detail, except
    where the text is printed below the table (a failure met before, an
    explorer's theorem: hundreds of columns, the scope's settings in it)."""
    if "same_failure_as" in check:
        return f"the same failure as {check['same_failure_as']}"
    if "theorem" in check and check["status"] == "passed":
        return f"{'exhausted' if check.get('exhausted') else 'not exhausted'}; its theorem below"
    return str(check["detail"]).partition("\n")[0]


def print_summary(report: dict[str, Any]) -> None:
    """The table of checks, then each explorer's theorem, then each failure
    once: the first check that met it, the others that did, its repro.

    Why the width: as wide as a terminal, else ``PIPED_WIDTH`` columns (or
    what the names and figures need, if more), so that a file or a CI log
    reads without scrolling sideways; a long note or theorem wraps onto more
    lines, and nothing is cut. A repro keeps its lines as they are: it is a
    script to copy and run."""
    from rich.console import Console
    from rich.markup import escape
    from rich.measure import Measurement

    console = Console()
    checks = report["checks"]
    totals = report["totals"]
    rows: list[tuple[str, ...]] = [
        (check["name"], check["status"], str(check["examples"]), f"{check['seconds']:.1f}", _note(check))
        for check in checks
    ]
    rows.append(("total", f"{totals['failed']} failed", str(totals["examples"]), f"{totals['seconds']:.1f}", ""))
    table = _table(f"{report['impl']} against {report['against']} ({report['profile']})", rows)
    if not console.is_terminal:
        needed = Measurement.get(console, console.options.update_width(10_000), table).minimum
        console.width = max(PIPED_WIDTH, needed)

    def say(text: str) -> None:
        """``text`` wrapped to the width, each line after the first indented."""
        wrapped = textwrap.fill(text, console.width, subsequent_indent="  ", break_long_words=False,
                                break_on_hyphens=False)  # fmt: skip
        console.print(wrapped, markup=False, highlight=False, soft_wrap=True)

    console.print(table)
    if totals["skipped"] == totals["checks"]:
        say("nothing was checked: every check was skipped (its note says why), so the run does not pass")
    for check in checks:
        if "theorem" in check and check["status"] == "passed":
            say(f"{check['name']}: {check['theorem']}")
    for check in checks:
        if refused := check.get("not_compared"):
            say(
                f"{check['name']}: not compared on {sum(refused.values()):,} call(s) a manager refused, by reason: "
                + "; ".join(f"{reason}: {count:,}" for reason, count in refused.items())
            )
    if (coverage := report.get("situations")) is not None and not coverage["measured"]:
        say(f"situations of the spec: not measured: {coverage['not_measured']}")
    elif coverage is not None:
        missed = coverage["not_reached"]
        say(f"situations of the spec reached: {len(coverage['reached'])} of {coverage['registered']} "
            f"(conformance/situations.py); " + (f"not reached by these scopes: {', '.join(missed)}" if missed
                                                 else "every one"))  # fmt: skip
    for check in checks:
        if check["status"] == "failed" and "same_failure_as" not in check:
            console.rule(f"[bold red]{escape(check['name'])}")
            others = [c["name"] for c in checks if c.get("same_failure_as") == check["name"]]
            if others:
                say(f"the same failure in {len(others)} more check(s): {', '.join(others)}")
            console.print(check["detail"], markup=False, highlight=False, soft_wrap=True)
