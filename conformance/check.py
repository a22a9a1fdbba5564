"""What a check is, and the two ways a run becomes one: ``Check`` (a name
and how to run it), ``CheckResult`` (passed / failed with its repro /
skipped and why), ``scripted_check`` (a deterministic run in lockstep) and
``run_machine`` (the state machine over one configuration family, under
the shrink budget).

Why a module of its own: every check module (``trace``, ``explore``,
``long_runs``, ``sweeps``, ``symbolic``) builds its checks from these, and
``runner.py`` gathers those modules into profiles. With the two in one
module, each imported the other and an import inside a function hid the
circle; here the imports go one way, checks to this module, runner to both.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

try:  # where Hypothesis keeps its shrink time limit (see shrink_budget)
    # Any: an internal, gone where Hypothesis moved it; it declares the limit an int, shrink_budget sets a float
    hypothesis_engine: Any
    import hypothesis.internal.conjecture.engine as hypothesis_engine
except ImportError:  # pragma: no cover - a Hypothesis that moved it: no budget
    hypothesis_engine = None
try:  # where Hypothesis keeps the constants it reads from loaded modules (see fixed_constants)
    hypothesis_providers: Any
    import hypothesis.internal.conjecture.providers as hypothesis_providers
except ImportError:  # pragma: no cover
    hypothesis_providers = None
from hypothesis import HealthCheck, settings
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

from blockspace.conformance.lockstep import EXCLUDED, REPRO_HEADING, Divergence
from blockspace.conformance.machine import machine_for
from blockspace.conformance.reduce import shorten
from blockspace.kit_options import Profile

REPRO = REPRO_HEADING.lstrip("\n")  # what separates a Divergence's message from its script
PLACE = re.compile(r"^(?:in .+? with \d+ GPU and \d+ CPU blocks|at step \d+): ")  # a sweep's play, a long run's step
NUMBERS = re.compile(r"-?\d+(?:[.,] ?-?\d+)*")  # 5, -1, 0.25, [0, 1, 2]: counts, ids, rates
VALUES = re.compile(r" \(.* vs .*\)(?=\)$)")  # a mismatch's values whole: "(value: length 2 != 3 ([...] vs [...]))"


def failure_signature(message: str) -> str:
    """What a failure looks like, whichever check met it: the call its
    repro ends in (the first line of its ``Divergence`` message, without
    the place in the check: a sweep's play, a long run's step) and how the
    answers differ, with every number as ``#`` (block ids and counts follow
    the configuration). Where both answered a value, how they differ is
    the mismatch's first difference (``(value[0][0]: 3 != 5)``), not the
    values whole: a swap of two pairs and one of three, each in reverse
    order, are one bug. Else (an error, a state or an invariant) the two
    lines after the first. Why: one bug is met by many checks, each in its
    own configuration (one wrong free count by 13 of the quick profile's);
    the report gives each signature one repro and the list of checks that met it."""
    lines = [line.strip() for line in message.partition(REPRO)[0].splitlines() if line.strip()]
    if not lines:
        return ""
    answered = len(lines) > 3 and all(" returned " in line for line in lines[1:3]) and lines[3].startswith("(")
    kept = [PLACE.sub("", lines[0]), *([VALUES.sub("", lines[3])] if answered else lines[1:3])]
    return NUMBERS.sub("#", "\n".join(kept))


@dataclass
class CheckResult:
    name: str
    status: str  # "passed", "failed" or "skipped"
    examples: int = 0
    seconds: float = 0.0
    detail: str = ""  # the failure with its repro, or why it was skipped
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def signature(self) -> str:
        """``failure_signature`` of a failure (a state machine's detail starts with its note: left out)."""
        return failure_signature(self.detail.partition("\n")[2] if "found_s" in self.extra else self.detail)

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
    """A check of the kit: its name, how to run it, and what of the
    implementation's capabilities it looks at. ``needs``: the flag without
    which it is skipped (None: it runs on any manager); ``reads``: flags it
    reads without being skipped (a trace replays without caching instead).
    Both are known before it runs, so ``blockspace conformance`` can refuse a
    run that would skip every check, or a ``--without`` that changes nothing."""

    name: str
    run: Callable[[], CheckResult]
    needs: str | None = None
    reads: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.run = _with_exclusions(self.run)

    def capabilities_read(self) -> frozenset[str]:
        return self.reads | ({self.needs} if self.needs else frozenset())


def _with_exclusions(run: Callable[[], CheckResult]) -> Callable[[], CheckResult]:
    """``run`` whose result names, under ``not_compared``, the calls a
    manager refused to be compared on while it ran, by reason
    (``lockstep.EXCLUDED``; the explorer reports its own as ``excluded``)."""

    def counted() -> CheckResult:
        before = Counter(EXCLUDED)
        result = run()
        if refused := EXCLUDED - before:
            result.extra["not_compared"] = dict(refused.most_common())
        return result

    return counted


def scripted_check(
    name: str, needs: str | None, capabilities: Mapping[str, bool], examples: int, run: Callable[[], int]
) -> Check:
    """A deterministic check in lockstep (a long run, a sweep): ``run()``
    makes its calls and returns how many; skipped when the capability
    ``needs`` is False, failed with the ``Divergence`` (its repro) it raises."""

    def result() -> CheckResult:
        if needs is not None and not capabilities.get(needs, True):
            return CheckResult(name, "skipped", detail=f"{needs} is False")
        started = time.perf_counter()
        try:
            num_calls = run()
        except Divergence as failure:
            return CheckResult(name, "failed", examples, time.perf_counter() - started, str(failure))
        return CheckResult(name, "passed", examples, time.perf_counter() - started, extra={"calls": num_calls})

    return Check(name, result, needs)


def hypothesis_settings(profile: Profile, **changes: Any) -> settings:
    options: dict[str, Any] = dict(
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


@contextmanager
def shrink_budget(seconds: float) -> Iterator[None]:
    """Hypothesis stops shrinking after ``seconds`` (its own limit is 5
    minutes, a module constant it reads at each shrink: the one knob it has).
    Why a budget: almost all of a failing run is shrinking, and a repro a
    few calls longer, printed in seconds, is worth more in a CI log than
    the shortest one after minutes."""
    default = getattr(hypothesis_engine, "MAX_SHRINKING_SECONDS", None)
    if default is None:
        yield
        return
    hypothesis_engine.MAX_SHRINKING_SECONDS = seconds
    try:
        yield
    finally:
        hypothesis_engine.MAX_SHRINKING_SECONDS = default


@contextmanager
def fixed_constants() -> Iterator[None]:
    """Hypothesis draws with none of the constants it reads from the user's
    modules. Why: it mixes into its draws the constants of every local module
    loaded so far (Hypothesis 6.131 on), so a derandomized run drew other
    examples after another test had imported a module, and once missed the
    bug it had always found (``ReversedSwapIn`` in CI). Its own constants
    stay; its cache of the allowed ones is emptied on the way in and out."""
    if hypothesis_providers is None or not hasattr(hypothesis_providers, "_get_local_constants"):
        yield  # pragma: no cover
        return
    loaded = hypothesis_providers._get_local_constants
    hypothesis_providers._get_local_constants = hypothesis_providers.Constants
    hypothesis_providers.CONSTANTS_CACHE.cache.clear()
    try:
        yield
    finally:
        hypothesis_providers._get_local_constants = loaded
        hypothesis_providers.CONSTANTS_CACHE.cache.clear()


HYPOTHESIS_SHARE = 0.75  # of the shrink budget; the rest deletes lines from its repro (reduce.py)


def _silent(text: object) -> None:
    pass


FirstFailure = Callable[[str, float, str], None]  # (check name, seconds in, message): a failure was found


def run_machine(
    impls: Mapping[str, Any], family: str, profile: Profile, on_failure: FirstFailure | None = None, **changes: Any
) -> CheckResult:
    """The state machine over one configuration family, shrinking a failure
    for at most ``profile.shrink_seconds``; ``on_failure`` hears of the
    first failure as soon as it is found, before shrinking."""
    name = f"machine[{family}]"
    machine = machine_for(impls, family)
    started = time.perf_counter()
    found: list[float] = []

    def first_failure(message: str) -> None:
        if not found:
            found.append(time.perf_counter())
            if on_failure is not None:
                on_failure(name, found[0] - started, message)

    machine.on_failure = staticmethod(first_failure)
    limit = profile.shrink_seconds
    options = hypothesis_settings(profile, **changes)
    try:
        # Hypothesis' own report (the falsifying steps, its note on a shrink cut short) is left out:
        # the kit prints the repro and the budget itself.
        with (
            shrink_budget(limit * HYPOTHESIS_SHARE if profile.reduce_repro else limit),
            with_reporter(_silent),
            fixed_constants() if options.derandomize else nullcontext(),
        ):
            run_state_machine_as_test(machine, settings=options)
    except Divergence as failure:
        found_at = found[0] if found else started
        left = limit - (time.perf_counter() - found_at)  # at least the reducer's share
        message, repro = shorten(failure, max(left, limit * (1 - HYPOTHESIS_SHARE)) if profile.reduce_repro else 0.0)
        message += "\n\n"
        ended = time.perf_counter()
        num_calls = sum(line.startswith("lock.call(") for line in repro.splitlines())
        note = (
            f"found after {found_at - started:.1f} s, shrunk to {num_calls} call{'s' * (num_calls != 1)} in "
            f"{ended - found_at:.1f} s (budget {limit:g} s)"
        )
        extra = {"found_s": round(found_at - started, 2), "shrink_s": round(ended - found_at, 2),
                 "shrink_budget_s": limit, "repro_calls": num_calls}  # fmt: skip
        detail = f"{note}\n{message}{REPRO}{repro}"
        return CheckResult(name, "failed", len(machine.runs), ended - started, detail, extra)
    return CheckResult(name, "passed", len(machine.runs), time.perf_counter() - started)
