"""Profiles and checks: what ``quick``, ``full`` and ``symbolic`` run.

A *check* is one named, independent piece of evidence (the state machine
over one configuration family, a trace replay, a CrossHair run); running it
gives a ``CheckResult`` (passed / failed with its repro / skipped and why).
The CLI and the pytest base class both run checks from here, so they agree
on what each profile means.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from blockspace.conformance.configs import FAMILIES, FAMILY_CAPABILITY
from blockspace.conformance.lockstep import Divergence
from blockspace.conformance.machine import machine_for


@dataclass(frozen=True)
class Profile:
    name: str
    max_examples: int  # state-machine examples per configuration family
    step_count: int  # rules per example
    trace_requests: int  # Mooncake requests replayed in lockstep
    derandomize: bool  # same examples every run (CI) or fresh ones
    symbolic: bool = False


PROFILES = {
    # Not derandomized: Hypothesis' derandomized examples were far less varied
    # here (a tenth of the appends); a failure prints its repro anyway.
    "quick": Profile("quick", max_examples=100, step_count=40, trace_requests=12, derandomize=False),
    "full": Profile("full", max_examples=2000, step_count=80, trace_requests=200, derandomize=False),
    "symbolic": Profile("symbolic", max_examples=25, step_count=12, trace_requests=0, derandomize=True, symbolic=True),
}

CAPABILITIES = ("supports_caching", "supports_sliding_window", "supports_encoder_decoder")


@dataclass
class CheckResult:
    name: str
    status: str  # "passed", "failed" or "skipped"
    examples: int = 0
    seconds: float = 0.0
    detail: str = ""  # the failure with its repro, or why it was skipped
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "examples": self.examples,
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
            **self.extra,
        }


@dataclass
class Check:
    name: str
    run: Callable[[], CheckResult]


def capabilities_of(impl_cls: type, overrides: Mapping[str, bool] | None = None) -> dict[str, bool]:
    """Capability flags: the class's own ``supports_*`` attributes (default
    True), overridden by ``overrides``."""
    flags = {name: bool(getattr(impl_cls, name, True)) for name in CAPABILITIES}
    flags.update(overrides or {})
    return flags


def hypothesis_settings(profile: Profile, **changes: Any) -> settings:
    options = dict(
        max_examples=profile.max_examples,
        stateful_step_count=profile.step_count,
        deadline=None,
        derandomize=profile.derandomize,
        database=None,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )
    options.update(changes)
    return settings(**options)


def run_machine(impls: Mapping[str, Any], family: str, profile: Profile, **changes: Any) -> CheckResult:
    """The state machine over one configuration family."""
    machine = machine_for(impls, family)
    started = time.perf_counter()
    try:
        run_state_machine_as_test(machine, settings=hypothesis_settings(profile, **changes))
    except Divergence as failure:
        return CheckResult(f"machine[{family}]", "failed", len(machine.runs), time.perf_counter() - started, str(failure))
    return CheckResult(f"machine[{family}]", "passed", len(machine.runs), time.perf_counter() - started)


def machine_checks(impls: Mapping[str, Any], profile: Profile, capabilities: Mapping[str, bool]) -> list[Check]:
    checks = []
    for family in FAMILIES:
        needed = FAMILY_CAPABILITY[family]
        if needed is not None and not capabilities.get(needed, True):
            checks.append(Check(f"machine[{family}]", lambda f=family, n=needed: CheckResult(f"machine[{f}]", "skipped", detail=f"{n} is False")))
        else:
            checks.append(Check(f"machine[{family}]", lambda f=family: run_machine(impls, f, profile)))
    return checks


def checks_for(impls: Mapping[str, Any], profile: Profile, capabilities: Mapping[str, bool]) -> list[Check]:
    """Every check of a profile, in the order they run."""
    from blockspace.conformance import symbolic, trace

    checks = machine_checks(impls, profile, capabilities)
    if profile.trace_requests:
        checks.append(trace.trace_check(impls, profile.trace_requests, capabilities))
    if profile.symbolic:
        checks += symbolic.symbolic_checks(impls, profile)
    return checks
