"""Service-level objectives: which requests were served well enough, and
the goodput they make.

A serving engineer sizes a deployment against latency targets, not against
throughput alone: "TTFT under 2 s and TPOT under 100 ms" (vLLM's benchmark
calls the rate of requests meeting them *goodput*). ``--slo`` takes any
subset of three bounds, ``ttft=2s,tpot=100ms,e2e=30s``. A trace request
meets the SLO when it finished and each given bound holds for it; ignored,
aborted and unfinished requests miss it, so a configuration cannot look
better by dropping the requests it cannot serve.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from blockspace.errors import InvalidArgumentError
from blockspace.simulator.metrics import TraceOutcome

UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
# A sign is read, so that a negative bound is refused as one ("must be a time above 0"), not as text
# that is no bound at all.
_BOUND = re.compile(r"^\s*([a-z_0-9]+)\s*=\s*([-+]?[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*(s|ms|us)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class SLO:
    """Upper bounds in seconds; None: not bounded."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def bounds(self) -> dict[str, float]:
        """The given bounds by name (``ttft``, ``tpot``, ``e2e``)."""
        given = {"ttft": self.ttft_s, "tpot": self.tpot_s, "e2e": self.e2e_s}
        return {name: bound for name, bound in given.items() if bound is not None}

    def __str__(self) -> str:
        return ",".join(f"{name}={_seconds_text(bound)}" for name, bound in self.bounds().items())

    def met_by(self, outcome: TraceOutcome) -> bool:
        """Whether a trace request finished within every given bound."""
        if outcome.status != "finished":
            return False
        figures = {"ttft": outcome.ttft_s, "tpot": outcome.tpot_s, "e2e": outcome.e2e_s}
        return all(_within(figures[name], bound) for name, bound in self.bounds().items())


def _within(figure: float | None, bound: float) -> bool:
    return figure is not None and figure <= bound


def _seconds_text(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:g}ms"
    return f"{seconds * 1e6:g}us"


def parse_slo(text: str) -> SLO:
    """``ttft=2s,tpot=100ms`` (any subset of ttft, tpot, e2e; units s, ms,
    us) as an ``SLO``; ``InvalidArgumentError`` naming what is wrong."""
    bounds: dict[str, float] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        match = _BOUND.match(item)
        if match is None:
            raise InvalidArgumentError(
                f"--slo: {item.strip()!r} is not NAME=VALUE with a unit, e.g. ttft=2s or tpot=100ms"
            )
        name, value, unit = match[1].lower(), float(match[2]), match[3].lower()
        if name not in ("ttft", "tpot", "e2e"):
            raise InvalidArgumentError(f"--slo: unknown bound {name!r}: use ttft, tpot or e2e")
        if name in bounds:
            raise InvalidArgumentError(f"--slo: {name} is given twice")
        seconds = value * UNITS[unit]
        if not math.isfinite(seconds) or seconds <= 0:
            raise InvalidArgumentError(f"--slo: {name} must be a time above 0, got {item.strip()!r}")
        bounds[name] = seconds
    if not bounds:
        raise InvalidArgumentError("--slo: give at least one bound, e.g. ttft=2s,tpot=100ms")
    return SLO(bounds.get("ttft"), bounds.get("tpot"), bounds.get("e2e"))


@dataclass(frozen=True)
class Attainment:
    """How the trace requests fared against an SLO (``attainment``)."""

    bounds_s: dict[str, float]  # ttft_s, tpot_s, e2e_s: the given bounds
    text: str  # the SLO as --slo takes it
    met: int
    of: int
    attainment: float  # met / of: ignored, aborted and unfinished requests miss
    goodput_requests_per_s: float


def attainment(slo: SLO, outcomes: list[TraceOutcome], span_s: float) -> Attainment:
    """How the trace requests fared against ``slo``: how many met it, their
    share of all that arrived (ignored, aborted and unfinished ones miss),
    and goodput (requests meeting it per second of ``span_s``)."""
    met = sum(slo.met_by(outcome) for outcome in outcomes)
    return Attainment(
        {f"{name}_s": bound for name, bound in slo.bounds().items()},
        str(slo),
        met,
        len(outcomes),
        met / len(outcomes) if outcomes else 0.0,
        met / span_s if span_s > 0 else 0.0,
    )


__all__ = ["SLO", "UNITS", "Attainment", "attainment", "parse_slo"]
