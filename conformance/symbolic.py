"""Symbolic checks with CrossHair (the ``symbolic`` profile).

* ``contracts``: ``crosshair check`` on every PEP 316 contract of
  ``blockspace.reference.rules``, one rule at a time (time per rule recorded).
* ``diffbehavior``: each fast kernel against the reference rule of the same
  name, with ``NUMBA_DISABLE_JIT=1`` so the kernels run as plain Python
  (through ``kernels.py``, which gives them the reference's signatures).

Both take their rules from ``rule_names``, which reads them off the
reference module: no list to keep in step with it.
* ``machine[symbolic]``: the state machine with Hypothesis' CrossHair
  backend, on small pools and few steps: inputs are solved for, not sampled.

CrossHair runs in subprocesses (it must see ``NUMBA_DISABLE_JIT`` before
Numba is imported, and a hung solver must not hang the run).
"""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from blockspace.conformance.check import Check, CheckResult, run_machine
from blockspace.kit_options import Profile

RULES_MODULE = "blockspace.reference.rules"
PER_CONDITION_TIMEOUT = 15.0
RULE_TIMEOUT = 300.0


def _crosshair(args: list[str], timeout: float) -> tuple[int, str, float]:
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "crosshair", *args], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f} s", time.perf_counter() - started
    return done.returncode, (done.stdout + done.stderr).strip(), time.perf_counter() - started


def rule_names(module: ModuleType | None = None) -> list[str]:
    """The rules of ``module`` (default: ``RULES_MODULE``, the reference's),
    in the order it defines them: its own functions, not those it imports.
    Why read off the module: a rule added to the reference is then checked
    by both CrossHair checks, and one without a fast twin fails
    ``tests/test_kit_rules.py`` by name, instead of going unchecked."""
    rules = importlib.import_module(RULES_MODULE) if module is None else module
    return [
        name for name, value in vars(rules).items() if inspect.isfunction(value) and value.__module__ == rules.__name__
    ]


def check_contracts(timeout: float = PER_CONDITION_TIMEOUT) -> CheckResult:
    """``crosshair check`` of each reference rule; detail lists every
    counterexample, extra holds the seconds per rule."""
    per_rule: dict[str, dict[str, Any]] = {}
    problems = []
    started = time.perf_counter()
    for name in sorted(rule_names()):  # in name order, as the contracts have always been checked
        code, output, seconds = _crosshair(
            ["check", "--report_all", "--per_condition_timeout", str(timeout), f"{RULES_MODULE}.{name}"], RULE_TIMEOUT
        )
        confirmed = output.count("Confirmed over all paths")
        per_rule[name] = {
            "seconds": round(seconds, 1),
            "clean": code == 0,
            "postconditions_confirmed_over_all_paths": confirmed,
        }
        if code != 0:
            problems.append(f"{name}: {output}")
    status = "failed" if problems else "passed"
    return CheckResult(
        "crosshair[contracts]",
        status,
        len(per_rule),
        time.perf_counter() - started,
        "\n".join(problems),
        {"rules": per_rule},
    )


def check_diffbehavior(timeout: float = PER_CONDITION_TIMEOUT) -> CheckResult:
    """Each fast kernel against its reference rule; skipped without the
    fast rules."""
    try:
        import blockspace.conformance.kernels  # noqa: F401
    except ImportError as missing:
        return CheckResult("crosshair[diffbehavior]", "skipped", detail=f"no fast rules: {missing}")
    per_rule: dict[str, dict[str, Any]] = {}
    problems = []
    started = time.perf_counter()
    for name in rule_names():
        args = [
            "diffbehavior",
            "--per_condition_timeout",
            str(timeout),
            f"{RULES_MODULE}.{name}",
            f"blockspace.conformance.kernels.{name}",
        ]
        code, output, seconds = _crosshair(args, RULE_TIMEOUT)
        per_rule[name] = {"seconds": round(seconds, 1), "result": " ".join(output.splitlines()[:2])}
        if code != 0:
            problems.append(f"{name}: {output}")
    return CheckResult(
        "crosshair[diffbehavior]",
        "failed" if problems else "passed",
        len(per_rule),
        time.perf_counter() - started,
        "\n".join(problems),
        {"rules": per_rule},
    )


def check_symbolic_machine(impls: Mapping[str, Any], profile: Profile) -> CheckResult:
    """The plain-family state machine driven by the CrossHair backend."""
    try:
        import hypothesis_crosshair_provider  # noqa: F401
    except ImportError:
        return CheckResult("machine[symbolic]", "skipped", detail="hypothesis-crosshair is not installed")
    result = run_machine(impls, "plain", profile, backend="crosshair")
    result.name = "machine[symbolic]"
    return result


def symbolic_checks(impls: Mapping[str, Any], profile: Profile) -> list[Check]:
    return [
        Check("crosshair[contracts]", check_contracts),
        Check("crosshair[diffbehavior]", check_diffbehavior),
        Check("machine[symbolic]", lambda: check_symbolic_machine(impls, profile)),
    ]
