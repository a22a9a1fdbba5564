"""Whether a profile tells a manager apart from the yardstick, and by which
check: the question the mutation campaign asks of each mutant
(``mutation.py``) and ``tests/test_conformance_broken.py`` asks of each
broken manager of the kit's catalogue, answered one way for both.

``kill(impls, "quick")`` makes the quick profile's checks: the sweeps
(deterministic, and the cheapest), each state-machine family, then the
trace replays and the long runs. ``kill(impls, "exhaustive")`` makes the
exhaustive profile's: the same sweeps, replays and long runs, then the
explorer over the standard set (``kit_options.STANDARD_SCOPES``), its
scopes searched side by side, the one whose next layer is smallest first,
so the small scopes are exhausted in seconds and a failure in any scope
comes without waiting for the large scopes' deep layers (each scope's
failure is still one of its shortest). Both stop at the first check that
fails and shrink nothing: the question is *whether* a profile kills, not
how short its repro is, and a kill costs seconds where a whole run costs
minutes.

``derandomize``: the state machines draw the same examples each run (a
fixed seed), so that whether quick kills a manager is a fact a test can
hold the exhaustive profile to; the profile itself stays random.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from blockspace.conformance.check import Check, run_machine
from blockspace.conformance.configs import FAMILIES
from blockspace.conformance.long_runs import long_run_checks
from blockspace.conformance.runner import PROFILES, with_changes
from blockspace.conformance.sweeps import sweep_checks
from blockspace.conformance.trace import trace_checks


@dataclass(frozen=True)
class Kill:
    """The first check of a profile that told the manager apart."""

    check: str
    seconds: float  # from the start of the profile
    moves: int | None = None  # the explorer's: the moves of the shortest failing path in its scope

    def __str__(self) -> str:
        return f"killed by {self.check}" + (f" in {self.moves} moves" if self.moves is not None else "")


def kill(
    impls: Mapping[str, Any],
    profile: str,
    derandomize: bool = False,
    before_layer: Callable[[], None] | None = None,
) -> Kill | None:
    """The first check of ``profile`` ("quick" or "exhaustive") that fails
    on ``impls`` (the yardstick first), or None when every check passes.
    ``before_layer`` is called before each layer the explorer expands (the
    mutation campaign's watchdog for a hang)."""
    if profile not in ("quick", "exhaustive"):
        raise ValueError(f"kill() answers for the quick and exhaustive profiles, not {profile!r}")
    started = time.perf_counter()
    chosen = with_changes(PROFILES[profile], reduce_repro=False)
    if found := _first_failed(sweep_checks(impls, {}), started):
        return found
    if profile == "quick":
        from hypothesis import Phase

        settings = with_changes(chosen, derandomize=derandomize or chosen.derandomize)
        for family in FAMILIES:
            if run_machine(impls, family, settings, phases=(Phase.explicit, Phase.generate)).status == "failed":
                return Kill(f"machine[{family}]", time.perf_counter() - started)
    if found := _first_failed([*trace_checks(impls, chosen.trace_requests, {}), *long_run_checks(impls, {})], started):
        return found
    return _explored(impls, chosen.scopes, started, before_layer) if profile == "exhaustive" else None


def _first_failed(checks: list[Check], started: float) -> Kill | None:
    for check in checks:
        if check.run().status == "failed":
            return Kill(check.name, time.perf_counter() - started)
    return None


def _explored(
    impls: Mapping[str, Any], scopes: tuple[str, ...], started: float, before_layer: Callable[[], None] | None
) -> Kill | None:
    """The scopes searched side by side, on one worker (the mutation campaign
    runs mutants side by side), the smallest next layer first."""
    from blockspace.conformance.explore import Search
    from blockspace.conformance.scope import SCOPES

    searches = [Search(impls, SCOPES[name], workers=1) for name in scopes]
    while live := [search for search in searches if not search.done]:
        search = min(live, key=lambda search: len(search.frontier))
        if before_layer is not None:
            before_layer()
        if (report := search.advance()).failure:
            return Kill(f"explore[{report.scope.name}]", time.perf_counter() - started, len(report.path))
    return None
