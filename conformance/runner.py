"""Checks: what the profiles (``quick``, ``full``, ``symbolic``; defined in
``blockspace/kit_options.py``, readable without the kit's extra) run.

A *check* is one named, independent piece of evidence (the state machine
over one configuration family, a trace replay, a CrossHair run); running it
gives a ``CheckResult`` (passed / failed with its repro / skipped and why).
The CLI and the pytest base class both run checks from here, so they agree
on what each profile means. ``Check`` and ``CheckResult`` live in
``check.py``, which every check module imports: this module imports those
modules, so it can hold nothing they need. The names that moved there are
still importable from here, as they were before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from blockspace.conformance import explore, long_runs, sweeps, symbolic, trace
from blockspace.conformance.check import (  # noqa: F401 - REPRO, failure_signature, scripted_check: still read from here
    REPRO,
    Check,
    CheckResult,
    FirstFailure,
    failure_signature,
    run_machine,
    scripted_check,
)
from blockspace.conformance.configs import FAMILIES, FAMILY_CAPABILITY
from blockspace.kit_options import CAPABILITIES, Profile
from blockspace.kit_options import PROFILES as PROFILES  # read from here by the kit (explicitly re-exported)


def capabilities_of(impl_cls: type, overrides: Mapping[str, bool] | None = None) -> dict[str, bool]:
    """Capability flags: the class's own ``supports_*`` attributes (default
    True), overridden by ``overrides``."""
    flags = {name: bool(getattr(impl_cls, name, True)) for name in CAPABILITIES}
    flags.update(overrides or {})
    return flags


def machine_checks(
    impls: Mapping[str, Any], profile: Profile, capabilities: Mapping[str, bool], on_failure: FirstFailure | None = None
) -> list[Check]:
    checks = []
    for family in FAMILIES:
        needed = FAMILY_CAPABILITY[family]
        if needed is not None and not capabilities.get(needed, True):
            checks.append(
                Check(
                    f"machine[{family}]",
                    partial(CheckResult, f"machine[{family}]", "skipped", detail=f"{needed} is False"),
                    needed,
                )
            )
        else:
            checks.append(Check(f"machine[{family}]", partial(run_machine, impls, family, profile, on_failure), needed))
    return checks


def checks_for(
    impls: Mapping[str, Any],
    profile: Profile,
    capabilities: Mapping[str, bool],
    on_failure: FirstFailure | None = None,
    scopes: Sequence[Any] = (),
    workers: int | None = None,
    budget: float | None = None,
    executor: str = "process",
    on_layer: explore.LayerDone | None = None,
) -> list[Check]:
    """Every check of a profile, in the order they run (``scopes``: the
    explorer's, instead of the profile's, as names or ``Scope``s, explored
    by ``workers`` processes, default one per core, here or on a Ray
    cluster (``executor``), all of them within ``budget`` seconds when one
    is given; ``on_layer`` hears of each layer the explorer ends)."""
    checks = machine_checks(impls, profile, capabilities, on_failure) if profile.max_examples else []
    if profile.trace_requests:
        checks += trace.trace_checks(impls, profile.trace_requests, capabilities)
        checks += long_runs.long_run_checks(impls, capabilities)
        checks += sweeps.sweep_checks(impls, capabilities)
    if profile.symbolic:
        checks += symbolic.symbolic_checks(impls, profile)
    shared = explore.Budget(budget) if budget is not None else None
    layers = None
    if executor == "ray":  # the explorer's workers on a Ray cluster
        from blockspace.conformance.ray_layers import RayLayers

        layers = RayLayers
    for scope in scopes or profile.scopes:
        checks.append(explore.explore_check(impls, scope, capabilities, workers, shared, layers, on_layer))
    return checks


def with_changes(profile: Profile, **changes: Any) -> Profile:
    """The profile with some fields changed (``--examples``, ``--shrink-budget``)."""
    return replace(profile, **changes)
