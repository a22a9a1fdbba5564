"""The conformance kit's profiles and the options of ``blockspace conformance``.

Why here, outside the kit: three readers need them where the kit's extra
(Hypothesis, ...) may be missing, and importing any module of the kit
checks that extra first. ``blockspace conformance --help`` shows the options
before anything is installed; the pytest plugin turns an unknown
``--blockspace-profile`` into a usage error of the whole run; the kit itself
(``conformance/runner.py``, ``conformance/cli.py``) takes both from here, so
there is one list of profiles. This module imports nothing of the kit.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from blockspace.validation import Range, command_parser


@dataclass(frozen=True)
class Profile:
    name: str
    max_examples: int  # state-machine examples per configuration family
    step_count: int  # rules per example
    trace_requests: int  # Mooncake requests replayed in lockstep
    derandomize: bool  # same examples every run (CI) or fresh ones
    symbolic: bool = False
    shrink_seconds: float = 20.0  # time allowed to shrink a family's failure, from when it is found
    reduce_repro: bool = True  # after Hypothesis' share of that time, delete lines from the repro (reduce.py)
    scopes: tuple[str, ...] = ()  # scopes the explorer exhausts (explore.py), by name (scope.SCOPES)


# The exhaustive profile's scopes (conformance/scope.py defines each): every family, and every mechanism
# the spec names (lookahead, fork and copy-on-write, adapters and salts, hit-rate buckets, the window,
# swaps, cross tables), each exhausted; together they reach every situation of conformance/situations.py
# (tests/test_situations.py), in minutes on two cores (docs/conformance.md, *The standard set*).
STANDARD_SCOPES = (
    "default", "plain_single", "wide", "big_steps", "evictions", "stale_pair", "shared_writes", "adapter_rows",
    "salts", "key_room", "long_tables", "step_tails", "two_buckets", "tracker_hole", "untracked",
    "sliding_window_single", "window_mid_block", "swap_single", "encoder_decoder_single",
)  # fmt: skip

PROFILES = {
    # Not derandomized: Hypothesis' derandomized examples were far less varied
    # here (a tenth of the appends); a failure prints its repro anyway.
    "quick": Profile("quick", max_examples=100, step_count=40, trace_requests=12, derandomize=False),
    "full": Profile("full", max_examples=2000, step_count=80, trace_requests=200, derandomize=False),
    "symbolic": Profile("symbolic", max_examples=25, step_count=12, trace_requests=0, derandomize=True, symbolic=True),
    # Breadth-first and exhaustive: no sampling, so nothing to derandomize or shrink. With it, what quick
    # runs that is no sample: its trace replays (12 requests), long runs and sweeps, each deterministic, so
    # that it kills every broken manager of the kit's catalogue that quick kills (tests/test_conformance_broken.py).
    "exhaustive": Profile("exhaustive", max_examples=0, step_count=0, trace_requests=12, derandomize=True,
                          scopes=STANDARD_SCOPES),
}  # fmt: skip

RANGES = {
    "budget": Range(above=0),
    "examples": Range(least=1),
    "shrink_budget": Range(above=0),
    "workers": Range(least=1),
}  # validation.check_ranges

CAPABILITIES = ("supports_caching", "supports_sliding_window", "supports_encoder_decoder")
FEATURES = {name.removeprefix("supports_"): name for name in CAPABILITIES}  # --without NAME -> the flag it clears

DESCRIPTION = """\
Check one implementation of the block manager against another. Every check
of the profile runs in lockstep; a failure is announced the moment it is
found, shortened for at most --shrink-budget seconds and printed as a repro,
a script that fails on its own; checks that meet the same failure are
reported together, with one repro. Then a table of the checks and, with
--json, a report for CI. An option that no check of the run reads is
refused, and so is a run whose every check would be skipped. Exit status:
0 when everything passed or was skipped, 1 when a check failed or every
check was skipped (nothing was checked), 2 on bad arguments. Examples: blockspace
conformance --impl fast --against reference; blockspace conformance --impl
mypkg.manager:MyManager --json report.json.
"""


def build_parser() -> argparse.ArgumentParser:
    """The options of ``blockspace conformance``; each one's help says its
    default. A bad option raises ``InvalidArgumentError`` (the project's
    command parser, ``validation.command_parser``)."""
    parser = command_parser("blockspace conformance", DESCRIPTION)
    profiles = ", ".join(f"{p.name} ({p.max_examples} examples x {p.step_count} steps)" if p.max_examples else
                         f"{p.name} (the explorer)" for p in PROFILES.values())  # fmt: skip
    add = parser.add_argument
    add(
        "--impl",
        required=True,
        metavar="NAME",
        help='the implementation under test: "fast", "reference" or package.module:Class (required, no default)',
    )
    add("--against", default="reference", metavar="NAME", help="the yardstick, named as --impl (default: reference)")
    add("--profile", choices=list(PROFILES), default="quick", help=f"what to run: {profiles} (default: quick)")
    add("--json", metavar="PATH", help="write a JSON report here (default: none)")
    add(
        "--only",
        metavar="TEXT",
        action="append",
        help="run only the checks whose name contains TEXT, e.g. machine[caching], sweep; repeatable "
        "(default: every check)",
    )
    add(
        "--examples",
        type=int,
        metavar="N",
        help="state-machine examples per family; only where a state machine (machine[...]) runs "
        "(default: the profile's)",
    )
    add(
        "--shrink-budget",
        type=float,
        metavar="SECONDS",
        help="time to shorten a family's failure once found; only where a state machine runs, as nothing else "
        "shrinks (default: the profile's, 20)",
    )
    add(
        "--fail-fast",
        action="store_true",
        help="stop at the first failing check; only where two checks or more run (default: run them all)",
    )
    add(
        "--without",
        choices=list(FEATURES),
        action="append",
        default=[],
        help="a feature the implementation lacks: its checks are skipped; only where a check needs it, and not "
        "where it skips every check; repeatable (default: none)",
    )
    add(
        "--scope",
        metavar="NAME",
        action="append",
        help="a scope the explorer exhausts, under any profile, e.g. default; its check explore[NAME] must be "
        "among those --only keeps; a wrong name lists them all (default: none; the exhaustive profile's: the "
        "standard set)",
    )
    add(
        "--scope-set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="change a value of every --scope (with no --scope: of the profile's scopes, or default), e.g. "
        "num_gpu_blocks=5, alphabet=1,2, max_depth=8; only where the explorer runs (default: none)",
    )
    add(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="the explorer's wall time over all its scopes: a scope still running when it is spent is cut at the "
        "depth it reached, and one not begun is skipped, each said in the report; only where the explorer runs "
        "(default: no bound)",
    )
    add(
        "--workers",
        type=int,
        metavar="N",
        help="the explorer's processes; only where the explorer runs (default: one per core, or with --executor "
        "ray one per CPU of the cluster)",
    )
    add(
        "--executor",
        choices=("process", "ray"),
        default="process",
        help="where the explorer's workers run: forked processes of this machine, or a Ray cluster (the [ray] "
        "extra; a local one unless --address names one); only where the explorer runs (default: process)",
    )
    add(
        "--address",
        metavar="HOST:PORT",
        help="with --executor ray: the running Ray cluster to join (what `ray start --head` printed, or auto) "
        "(default: RAY_ADDRESS, else a local cluster Ray starts)",
    )
    return parser
