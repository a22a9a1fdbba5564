"""``--find max-rate``: the highest request rate at which a configuration
still meets its SLO.

The capacity question a serving engineer asks is not "how fast is this
trace served" but "how much of this traffic can one replica take within
our latency targets". The answer here: replay the trace with its arrivals
compressed or stretched (rate scale ``r``: every arrival time divided by
``r``, so ``r = 2`` is twice the trace's request rate), and find the largest
``r`` at which the share of requests meeting the SLO (``slo.py``: ignored,
aborted and unfinished requests miss it) is at least the target.

The search assumes attainment falls as the rate rises, which queueing makes
true in practice, and reports every rate it tried, so a curve that does not
fall can be seen. It runs in rounds of as many rates as there are workers,
in parallel on the sweep's executor (``executor.py``):

1. bracket: from the trace's own rate, double (or halve) until one rate
   passes and a higher one fails;
2. narrow: split the bracket evenly at each round until its ends are within
   ``tolerance`` of each other (relative), or the runs run out.

The answer is the highest passing rate found below the lowest failing one.
A search whose every rate gave the same attainment names no rate: there
the rate had no effect (``no_effect``), and a bound read off it would mean
nothing.

A search's answer is a typed record, ``RateAnswer`` (``ReplicaAnswer`` in
``fleet_size.py``), of the points it tried (``RatePoint``): the table, the
sentence, the plot (``capacity_plot.py``) and the tests read its fields by
name, which the type checker knows, where a dict's keys were strings that a
misspelling turned into a ``KeyError`` at the end of a long search.
``capacity.json`` is written from the records (``Answer.to_json``): their
fields are its keys, in their order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from blockspace.errors import InvalidArgumentError
from blockspace.interrupts import Interrupted, incomplete_line
from blockspace.simulator.report import significant
from blockspace.simulator.slo import SLO
from blockspace.workloads import TraceRequest, scale_arrivals

MIN_SCALE, MAX_SCALE = 2.0**-12, 2.0**12  # the search gives up beyond these rate scales
DEFAULT_TOLERANCE = 0.02  # the bracket's ends this close (relative): found
DEFAULT_MAX_RUNS = 40


def base_rate(trace: list[TraceRequest]) -> float:
    """The trace's mean request rate (requests per second between its first
    and last arrival); ``InvalidArgumentError`` if it has none."""
    if len(trace) < 2 or trace[-1].arrival_s <= trace[0].arrival_s:
        raise InvalidArgumentError(
            "--find max-rate scales the trace's arrivals: it needs at least two requests arriving at different times"
        )
    return (len(trace) - 1) / (trace[-1].arrival_s - trace[0].arrival_s)


@dataclass(frozen=True)
class Probe:
    """One replay at rate scale ``scale`` of a trace whose own rate is
    ``rate`` (req/s): picklable, for a worker process."""

    scale: float
    trace: list[TraceRequest]  # at scale 1
    config: Any  # SimulationConfig
    manager: str
    slo: SLO
    rate: float


@dataclass(frozen=True)
class RatePoint:
    """One rate tried (``run_probe``): how the SLO fared, and the load."""

    scale: float
    attainment: float  # the share of requests meeting the SLO, 0-1
    goodput_requests_per_s: float
    finished: int
    ignored: int
    aborted: int
    ttft_p90_s: float | None  # None: no request finished
    tpot_p90_s: float | None
    served_requests_per_s: float
    saturated: bool
    rate_requests_per_s: float  # scale times the trace's own rate (``Probe.rate``)


@dataclass(frozen=True, kw_only=True)
class Answer:
    """What either search's answer (``RateAnswer``, ``fleet_size.ReplicaAnswer``)
    holds besides its own figures: the configuration searched, which the
    command adds (``dataclasses.replace``) and the search does not know.

    The fields named in ``OPTIONAL``, all of them the command's, are left
    out of the JSON while None: it adds some only to a search that finished
    (a rate search's ``arrival_times``, a fleet search's ``router``), and a
    search Ctrl-C stopped has always gone without them."""

    values: dict[str, Any] = field(default_factory=dict)  # the swept options' values; {} without --sweep
    config: Any = None  # SimulationConfig, written as its fields
    requests: int | None = None  # how many the trace has
    workload: dict[str, Any] | None = None  # workloads.describe
    clock_range: ClockRange | None = None  # the answers of a clock faster and slower by its measured error
    seed_range: SeedRange | None = None  # the answers on other draws of the arrivals (--seeds)

    OPTIONAL: ClassVar[tuple[str, ...]] = ("config", "requests", "workload", "clock_range", "seed_range")

    def to_json(self) -> dict[str, Any]:
        """``capacity.json``'s entry: every field, in order, less an
        ``OPTIONAL`` one that is None."""
        return {name: value for name, value in dataclasses.asdict(self).items()
                if value is not None or name not in self.OPTIONAL}  # fmt: skip

    def in_brief(self) -> str:
        """The answer in a word or two, for a sweep's list (``format_answers``)."""
        raise NotImplementedError

    def ranges(self, unit: Callable[[float], str]) -> str:
        """`` (5 to 7 with ...; 6 over 3 draws ...)``: the answer's ranges in words (nothing without one)."""
        said = [found.text(unit) for found in (self.clock_range, self.seed_range) if found is not None]
        return f" ({'; '.join(said)})" if said else ""

    @property
    def value(self) -> float | None:
        """The answer itself (None where none was found)."""
        raise NotImplementedError


@dataclass(frozen=True)
class ClockRange:
    """A search run again with every step ``1 - error`` and ``1 + error``
    times as long, ``error`` the clock's measured error
    (``roofline.HELD_OUT_ERROR``): the answers the clock's error allows."""

    error: float
    faster: float | None  # the answer with every step shorter
    slower: float | None
    runs: int = 0  # the two searches' runs, besides the central answer's

    def text(self, unit: Callable[[float], str]) -> str:
        """``5 to 7 with ...``: the two answers, and what the range covers."""
        faster, slower = ("none found" if value is None else unit(value) for value in (self.faster, self.slower))
        span = faster if faster == slower else f"{faster} to {slower}"
        return f"{span} with every step {self.error:.1%} shorter to longer, the clock's held-out median error"


@dataclass(frozen=True)
class SeedRange:
    """A search run again on other draws of the arrivals (``--seeds K``):
    where arrivals are random, so is the answer, and one draw's is one sample."""

    seeds: tuple[int, ...]  # the first is the central answer's
    answers: tuple[float | None, ...]  # in the seeds' order; None: none found on that draw
    runs: int = 0  # the other draws' searches' runs, besides the central answer's

    def text(self, unit: Callable[[float], str]) -> str:
        """``5 to 7 over 3 draws ...``: the lowest and highest answers, and what the range covers."""
        found = sorted(answer for answer in self.answers if answer is not None)
        missing = len(self.answers) - len(found)
        low, high = (unit(found[0]), unit(found[-1])) if found else ("none found", "none found")
        span = low if low == high else f"{low} to {high}"
        none = f", none found on {missing}" if found and missing else ""
        return f"{span} over {len(self.seeds)} draws of the arrivals, seeds {self.seeds[0]} to {self.seeds[-1]}{none}"


@dataclass(frozen=True, kw_only=True)
class RateAnswer(Answer):
    """``find_max_rate``'s answer: the max rate (None where none passed, or
    the rate had no effect), and every rate tried (``curve``, lowest first)."""

    arrival_times: int | None = None  # the trace's distinct arrival times (``arrival_times``)
    offered_requests_per_s: float | None = None  # the trace's rate as drawn (``base_rate``)
    complete: bool  # False: Ctrl-C stopped it
    max_rate_requests_per_s: float | None
    rate_scale: float | None  # the max rate over the trace's own rate
    lowest_failing_rate_requests_per_s: float | None
    trace_rate_requests_per_s: float
    target: float
    runs: int
    converged: bool  # False: the runs ran out before the bracket closed
    no_effect: bool
    curve: tuple[RatePoint, ...]

    OPTIONAL = (*Answer.OPTIONAL, "arrival_times", "offered_requests_per_s")

    @property
    def value(self) -> float | None:
        return self.max_rate_requests_per_s

    def in_brief(self) -> str:
        rate = self.max_rate_requests_per_s
        return "no effect" if self.no_effect else "none found" if rate is None else f"{significant(rate)} req/s"


def run_probe(probe: Probe) -> RatePoint:
    """Replay at ``probe.scale`` and say how the SLO fared."""
    from blockspace.interfaces import load_manager_class
    from blockspace.simulator.engines import replay
    from blockspace.simulator.summary import summarize

    trace = scale_arrivals(probe.trace, 1.0 / probe.scale)
    summary = summarize(replay(trace, load_manager_class(probe.manager), probe.config), probe.slo)
    requests, slo = summary.requests, summary.slo
    assert slo is not None  # a search has an SLO
    return RatePoint(
        scale=probe.scale,
        attainment=slo.attainment,
        goodput_requests_per_s=slo.goodput_requests_per_s,
        finished=requests.finished,
        ignored=requests.ignored,
        aborted=requests.aborted,
        ttft_p90_s=summary.ttft_s.p90,
        tpot_p90_s=summary.tpot_s.p90,
        served_requests_per_s=summary.load.served_requests_per_s,
        saturated=summary.load.saturated,
        rate_requests_per_s=probe.scale * probe.rate,
    )


def next_scales(tried: dict[float, bool], width: int, tolerance: float) -> list[float]:
    """The rate scales of the next round (``tried``: scale -> passed), or []
    when the search is over: found, or beyond ``MIN_SCALE``/``MAX_SCALE``."""
    failing = [scale for scale, passed in tried.items() if not passed]
    high = min(failing, default=None)
    passing = [scale for scale, passed in tried.items() if passed and (high is None or scale < high)]
    low = max(passing, default=None)
    if low is None:  # nothing passed: lower rates
        least = min(tried)
        return [] if least <= MIN_SCALE else [least / 2.0 ** (i + 1) for i in range(width)]
    if high is None:  # everything passed: higher rates
        most = max(tried)
        return [] if most >= MAX_SCALE else [most * 2.0 ** (i + 1) for i in range(width)]
    if (high - low) / low <= tolerance:
        return []
    return [low + (high - low) * (i + 1) / (width + 1) for i in range(width)]


def find_max_rate(
    evaluate: Callable[[list[float]], Iterable[RatePoint]],
    rate: float,
    target: float,
    width: int,
    tolerance: float = DEFAULT_TOLERANCE,
    max_runs: int = DEFAULT_MAX_RUNS,
    near: float | None = None,
) -> RateAnswer:
    """Search (see the module doc). ``evaluate(scales)`` runs those rate
    scales (in parallel) and returns ``run_probe``'s points; ``rate`` is
    the trace's own request rate, ``target`` the attainment wanted (0-1),
    ``width`` the rates per round; ``near``, a rate scale expected close by
    (a range's: the central answer's), makes the first round bracket it.
    Stopped by Ctrl-C, it raises ``Interrupted`` with the rates tried so far
    (``complete`` False)."""
    probes: dict[float, RatePoint] = {}
    scales = [2.0**i for i in range(width)]  # the first round: the trace's rate and up
    if near is not None:  # an answer expected close by: bracket it at once
        scales = [near * (1 - tolerance), near * (1 + tolerance)]
    complete = True
    try:
        while scales and len(probes) < max_runs:
            for point in evaluate(scales[: max_runs - len(probes)]):
                probes[point.scale] = point
            scales = next_scales({s: p.attainment >= target for s, p in probes.items()}, width, tolerance)
    except KeyboardInterrupt:
        complete = False
    failing = min((s for s, p in probes.items() if p.attainment < target), default=None)
    passing = [s for s, p in probes.items() if p.attainment >= target and (failing is None or s < failing)]
    no_effect = has_no_effect([p.attainment for p in probes.values()])
    best = None if no_effect else max(passing, default=None)
    found = RateAnswer(
        complete=complete,
        max_rate_requests_per_s=None if best is None else best * rate,
        rate_scale=best,
        lowest_failing_rate_requests_per_s=None if failing is None else failing * rate,
        trace_rate_requests_per_s=rate,
        target=target,
        runs=len(probes),
        converged=not scales,
        no_effect=no_effect,
        curve=tuple(probes[s] for s in sorted(probes)),
    )
    if not complete:
        raise Interrupted(partial=found)
    return found


def has_no_effect(attainments: list[float]) -> bool:
    """Every point of a search (two or more) gave the same attainment: its
    variable changed nothing within the range tried (a shared rule of both
    searches, ``fleet_size.py`` too)."""
    return len(attainments) >= 2 and len(set(attainments)) == 1


def no_effect_line(attainment: float, runs: int, variable: str, tried: str) -> str:
    """What a search with no effect (``attainment`` at every point) says
    instead of a bound."""
    return (
        f"{variable}: no bound: {attainment:.1%} of requests meet the SLO at every {tried},"
        f" so it has no effect here; {runs} runs"
    )


# -- the command ------------------------------------------------------------------------------
OUTPUTS = ("capacity.json", "capacity.png", "cost.png")  # what --find writes under --out (cost.png: min-cost)


def evaluator(
    trace: list[TraceRequest],
    config: Any,
    manager: str,
    slo: SLO,
    workers: int,
    executor: str,
    rate: float,
    say: Callable[[str], None] | None = None,
) -> Callable[[list[float]], Iterable[RatePoint]]:
    """``evaluate`` for ``find_max_rate``: each round's rate scales in
    parallel, and with ``say`` a line per round (``executor.rounds``)."""
    from blockspace.simulator.executor import rounds

    return rounds(run_probe, lambda scale: Probe(scale, trace, config, manager, slo, rate), lambda p: p.scale,
                  workers, executor, say,
                  lambda p: f"{significant(p.rate_requests_per_s)} req/s {p.attainment:.1%}")  # fmt: skip


def format_answer(found: RateAnswer, slo: SLO) -> str:
    """The curve as a table, then the answer in a sentence. Rates have four
    significant digits (``report.significant``): a search that halves the
    rate down to 1/4096 of the trace's goes far below a thousandth of a
    request a second, one that doubles it to thousands."""
    lines = [f"{'rate (req/s)':>13}  {'scale':>8}  {'attainment':>10}  {'goodput':>9}  {'served':>9}  "
             f"{'load':>9}  finished/ignored/aborted"]  # fmt: skip
    for point in found.curve:
        load = "SATURATED" if point.saturated else "keeps up"
        lines.append(
            f"{significant(point.rate_requests_per_s):>13}  {significant(point.scale):>8}  "
            f"{point.attainment:>10.1%}  {significant(point.goodput_requests_per_s):>9}  "
            f"{significant(point.served_requests_per_s):>9}  {load:>9}  "
            f"{point.finished:,}/{point.ignored:,}/{point.aborted:,}"
        )
    target = f"{found.target:.0%} of requests within {slo}"
    trace_rate = significant(found.trace_rate_requests_per_s)
    if not found.complete:
        lines.append(incomplete_line("max rate", found.runs))
    elif found.no_effect:
        low, high = found.curve[0], found.curve[-1]
        tried = f"rate tried, {significant(low.rate_requests_per_s)} to {significant(high.rate_requests_per_s)} req/s"
        lines.append(no_effect_line(low.attainment, found.runs, "max rate", tried))
    elif found.max_rate_requests_per_s is None or found.rate_scale is None:  # None together
        lowest = found.curve[0]
        lines.append(
            f"max rate: none found: even {significant(lowest.rate_requests_per_s)} req/s "
            f"({significant(lowest.scale)}x the trace's {trace_rate} req/s) misses {target}; {found.runs} runs"
        )
        flat = flat_floor(found.curve)
        if flat is not None:
            lines.append(why_flat(flat, found))
    else:
        above = found.lowest_failing_rate_requests_per_s
        bound = (
            ": every rate tried does, the max is higher" if above is None else f", {significant(above)} req/s does not"
        )
        span = found.ranges(lambda rate: f"{significant(rate)} req/s")
        lines.append(
            f"max rate: {significant(found.max_rate_requests_per_s)} req/s{span} ({significant(found.rate_scale)}x"
            f" the trace's {trace_rate} req/s) keeps {target}{bound}; {found.runs} runs"
            + ("" if found.converged else " (stopped at the run limit before the bracket closed)")
        )
    return "\n".join(lines)


FLAT_POINTS = 3  # this many of the lowest rates with one attainment: lowering the rate no longer helps


def flat_floor(curve: Sequence[RatePoint]) -> RatePoint | None:
    """The highest of the lowest rates that all have the lowest rate's
    attainment, when there are ``FLAT_POINTS`` of them or more; else None."""
    floor = curve[0].attainment
    same = 0
    while same < len(curve) and curve[same].attainment == floor:
        same += 1
    return curve[same - 1] if same >= FLAT_POINTS else None


def why_flat(point: RatePoint, found: RateAnswer) -> str:
    """Why the attainment stopped rising as the rate fell: scaling the
    arrivals spreads the bursts apart but keeps each burst together, and a
    request that misses when it has the GPU to itself misses at any rate."""
    said = (
        f"why: attainment stays at {point.attainment:.1%} from {significant(point.rate_requests_per_s)} req/s"
        " down, so lowering the rate no longer helps. Scaling the arrivals keeps requests that arrive together together"
    )
    if found.requests is not None and found.arrival_times is not None:
        said += f" ({found.requests:,} requests arrive at {found.arrival_times:,} distinct times)"
    return said + ", and a request that misses the SLO on an idle GPU misses it at any rate."


def arrival_times(trace: list[TraceRequest]) -> int:
    """How many distinct arrival times the trace has: its bursts, which no rate scale splits."""
    return len({request.arrival_s for request in trace})


def format_answers(searches: Sequence[Answer], answer: str) -> str:
    """One line per configuration of a sweep, under ``answer`` ("max rate",
    "min replicas"): its values and its answer (``Answer.in_brief``)."""
    lines = [f"{answer} per configuration:"]
    for search in searches:
        values = ", ".join(f"{name}={value}" for name, value in search.values.items())
        lines.append(f"  {values}: {search.in_brief()}")
    return "\n".join(lines)


__all__ = [
    "OUTPUTS",
    "Answer",
    "arrival_times",
    "Probe",
    "RateAnswer",
    "RatePoint",
    "SeedRange",
    "base_rate",
    "evaluator",
    "find_max_rate",
    "format_answer",
    "format_answers",
    "next_scales",
    "run_probe",
]
