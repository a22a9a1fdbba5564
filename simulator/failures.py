"""Replicas that go down (``--fail``): when, which, and what a run says of them.

A serving engineer sizes a fleet for the day a replica is gone: a rolling
restart, a crash, a spot instance taken back. ``--fail`` takes a replica
out of the fleet for a while, on either engine (``fleet.py`` drives it):

- ``REPLICA@TIME[+DURATION]``: replica ``REPLICA`` (0-based) goes down at
  ``TIME`` seconds of simulated time and comes back ``DURATION`` seconds
  later (never, without ``+DURATION``). Repeatable.
- ``rolling@START/INTERVAL/DOWNTIME``: a rolling restart: replica k goes
  down at ``START + k x INTERVAL`` for ``DOWNTIME`` seconds, each in turn.

What a failure does, and why (``fleet.py`` carries it out):

- **At a step's end.** A replica goes down at the end of the step it runs
  at ``TIME`` (a step is whole, as everywhere in the simulator): the
  tokens of that step were sent.
- **Its requests are retried.** Every request routed there and not done
  (waiting, running, swapped) loses its KV with the replica, so the router
  sends it again at ``TIME``, over the live replicas, as a client retries:
  it is prefilled again and its output starts again from the first token.
  A retried request keeps its original arrival time: its TTFT is from the
  arrival to its first token ever received (perhaps from the replica that
  went down), its end-to-end latency runs to its last token on the replica
  that finished it, so the retry's wait and recompute count against it.
- **Routers see the live replicas only**; round robin goes on in index
  order from the replica after the last it chose. With none live, the
  router holds what arrives until one comes back.
- **It comes back empty**: a fresh engine, its prefix cache cold.

``Failures`` is what the run reports: the outages, the requests affected,
the retries; and the summary (``summary.py``) splits SLO attainment
between requests that arrived while a replica was down and the rest.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from blockspace.errors import InvalidArgumentError
from blockspace.workloads import TraceRequest

_NUMBER = r"([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)"
_ONE = re.compile(rf"^\s*([0-9]+)\s*@\s*{_NUMBER}\s*(?:\+\s*{_NUMBER}\s*)?$", re.IGNORECASE)
_ROLLING = re.compile(rf"^\s*rolling\s*@\s*{_NUMBER}\s*/\s*{_NUMBER}\s*/\s*{_NUMBER}\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Outage:
    """Replica ``replica`` is down from ``start_s`` until ``end_s`` (None: for
    good; not infinity, which JSON cannot write)."""

    replica: int
    start_s: float
    end_s: float | None = None

    @property
    def until_s(self) -> float:
        return math.inf if self.end_s is None else self.end_s

    def __str__(self) -> str:
        duration = "" if self.end_s is None else f"+{self.end_s - self.start_s:g}"
        return f"{self.replica}@{self.start_s:g}{duration}"


@dataclass(frozen=True)
class Rolling:
    """A rolling restart: replica k down from ``start_s + k * interval_s`` for ``downtime_s``."""

    start_s: float
    interval_s: float
    downtime_s: float

    def __str__(self) -> str:
        return f"rolling@{self.start_s:g}/{self.interval_s:g}/{self.downtime_s:g}"


Failure = Outage | Rolling


def parse_fail(text: str) -> Failure:
    """One ``--fail`` value (the module doc's two forms), or ``InvalidArgumentError`` saying why not."""
    one, rolling = _ONE.match(text), _ROLLING.match(text)
    if one is not None:
        replica, start = int(one[1]), float(one[2])
        duration = None if one[3] is None else float(one[3])
        if not math.isfinite(start) or duration is not None and not (math.isfinite(duration) and duration > 0):
            raise InvalidArgumentError(f"--fail {text!r}: the time must be finite and the duration above 0")
        return Outage(replica, start, None if duration is None else start + duration)
    if rolling is not None:
        start, interval, downtime = float(rolling[1]), float(rolling[2]), float(rolling[3])
        if not all(math.isfinite(value) for value in (start, interval, downtime)) or not downtime > 0:
            raise InvalidArgumentError(f"--fail {text!r}: the times must be finite and the downtime above 0")
        return Rolling(start, interval, downtime)
    raise InvalidArgumentError(
        f"--fail {text!r}: give REPLICA@TIME[+DURATION] (e.g. 1@60+30) or rolling@START/INTERVAL/DOWNTIME"
        " (e.g. rolling@0/120/60), in seconds"
    )


def outages_of(failures: tuple[Failure, ...], replicas: int) -> list[Outage]:
    """The outages ``failures`` make in a fleet of ``replicas``, by start;
    ``InvalidArgumentError`` for a replica the fleet lacks, or two outages
    of one replica that overlap (it cannot go down while it is down)."""
    outages: list[Outage] = []
    for failure in failures:
        if isinstance(failure, Rolling):
            outages += [Outage(k, failure.start_s + k * failure.interval_s,
                               failure.start_s + k * failure.interval_s + failure.downtime_s)
                        for k in range(replicas)]  # fmt: skip
        elif failure.replica >= replicas:
            raise InvalidArgumentError(
                f"--fail {failure}: the fleet has {replicas} replica(s), numbered 0 to {replicas - 1}"
            )
        else:
            outages.append(failure)
    outages.sort(key=lambda outage: (outage.start_s, outage.replica))
    if {outage.replica for outage in outages if outage.end_s is None} == set(range(replicas)):
        raise InvalidArgumentError("--fail: every replica would be down for good, and nothing would serve what is left")
    for k in range(replicas):
        mine = [outage for outage in outages if outage.replica == k]
        for before, after in zip(mine, mine[1:]):
            if after.start_s < before.until_s:
                raise InvalidArgumentError(f"--fail: replica {k} would go down at {after.start_s:g} s while down"
                                           f" ({before} and {after})")  # fmt: skip
    return outages


def down_at(outages: list[Outage], at: float) -> bool:
    """Is some replica down at ``at``?"""
    return any(outage.start_s <= at < outage.until_s for outage in outages)


def busiest_window(trace: Sequence[TraceRequest], seconds: float) -> tuple[float, float]:
    """The stretch of ``seconds`` from an arrival on whose arrivals bring the
    most tokens (prompt and output), the earliest of equals: where
    ``--find min-replicas --spare K`` takes K replicas down.

    Why this stretch: the fleet has the least headroom where the most work
    arrives, so K replicas lost there cost the most; and trying every
    stretch would multiply each count's runs by the stretches. Why tokens,
    not requests: a replica's load is the tokens it prefills and decodes."""
    arrivals = np.array([entry.arrival_s for entry in trace], dtype=float)
    work = np.array([entry.input_length + entry.output_length for entry in trace], dtype=float)
    order = np.argsort(arrivals, kind="stable")
    arrivals, work = arrivals[order], work[order]
    before = np.concatenate(([0.0], np.cumsum(work)))  # the tokens of the arrivals before each place
    ends = np.searchsorted(arrivals, arrivals + seconds, side="left")
    first = int(np.argmax(before[ends] - before[: len(arrivals)]))
    return float(arrivals[first]), float(arrivals[first]) + seconds


def spares_down(spare: int, replicas: int, window: tuple[float, float]) -> tuple[Outage, ...]:
    """``spare`` replicas of ``replicas`` (the first ones; every one, if it has fewer) down over ``window``."""
    return tuple(Outage(k, *window) for k in range(min(spare, replicas)))


@dataclass
class Failures:
    """What the failures did to a run (``fleet.py`` fills it)."""

    outages: list[Outage]
    affected: set[int] = field(default_factory=set)  # trace requests on a replica when it went down, not done
    retries: int = 0  # the sends again: a request may be retried more than once
    original_arrival_s: dict[int, float] = field(default_factory=dict)  # a retried trace request's arrival

    def arrived_during(self, arrival_s: float) -> bool:
        """Did a request arriving at ``arrival_s`` arrive while a replica was down?"""
        return down_at(self.outages, arrival_s)


__all__ = ["Failure", "Failures", "Outage", "Rolling", "busiest_window", "down_at", "outages_of", "parse_fail",
           "spares_down"]  # fmt: skip
