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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

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
    """One replay at rate scale ``scale``: picklable, for a worker process."""

    scale: float
    trace: list[TraceRequest]  # at scale 1
    config: Any  # SimulationConfig
    manager: str
    slo: SLO


def run_probe(probe: Probe) -> dict[str, Any]:
    """Replay at ``probe.scale`` and say how the SLO fared."""
    from blockspace.interfaces import load_manager_class
    from blockspace.simulator.engines import replay
    from blockspace.simulator.summary import summarize

    trace = scale_arrivals(probe.trace, 1.0 / probe.scale)
    summary = summarize(replay(trace, load_manager_class(probe.manager), probe.config), probe.slo)
    requests, slo = summary.requests, summary.slo
    assert slo is not None  # a search has an SLO
    return {
        "scale": probe.scale,
        "attainment": slo.attainment,
        "goodput_requests_per_s": slo.goodput_requests_per_s,
        "finished": requests.finished,
        "ignored": requests.ignored,
        "aborted": requests.aborted,
        "ttft_p90_s": summary.ttft_s.p90,
        "tpot_p90_s": summary.tpot_s.p90,
        "served_requests_per_s": summary.load.served_requests_per_s,
        "saturated": summary.load.saturated,
    }


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
    evaluate: Callable[[list[float]], Iterable[dict[str, Any]]],
    rate: float,
    target: float,
    width: int,
    tolerance: float = DEFAULT_TOLERANCE,
    max_runs: int = DEFAULT_MAX_RUNS,
) -> dict[str, Any]:
    """Search (see the module doc). ``evaluate(scales)`` runs those rate
    scales (in parallel) and returns ``run_probe``'s answers; ``rate`` is
    the trace's own request rate, ``target`` the attainment wanted (0-1),
    ``width`` the rates per round. Stopped by Ctrl-C, it raises
    ``Interrupted`` with the rates tried so far (``complete`` False)."""
    probes: dict[float, dict[str, Any]] = {}
    scales = [2.0**i for i in range(width)]  # the first round: the trace's rate and up
    complete = True
    try:
        while scales and len(probes) < max_runs:
            for answer in evaluate(scales[: max_runs - len(probes)]):
                probes[answer["scale"]] = answer
            scales = next_scales({s: p["attainment"] >= target for s, p in probes.items()}, width, tolerance)
    except KeyboardInterrupt:
        complete = False
    failing = min((s for s, p in probes.items() if p["attainment"] < target), default=None)
    passing = [s for s, p in probes.items() if p["attainment"] >= target and (failing is None or s < failing)]
    no_effect = has_no_effect(list(probes.values()))
    best = None if no_effect else max(passing, default=None)
    curve = [{**probes[s], "rate_requests_per_s": s * rate} for s in sorted(probes)]
    found = {
        "complete": complete,
        "max_rate_requests_per_s": None if best is None else best * rate,
        "rate_scale": best,
        "lowest_failing_rate_requests_per_s": None if failing is None else failing * rate,
        "trace_rate_requests_per_s": rate,
        "target": target,
        "runs": len(probes),
        "converged": not scales,
        "no_effect": no_effect,
        "curve": curve,
    }
    if not complete:
        raise Interrupted(partial=found)
    return found


def has_no_effect(points: list[dict[str, Any]]) -> bool:
    """Every point of a search (two or more) gave the same attainment: its
    variable changed nothing within the range tried (a shared rule of both
    searches, ``fleet_size.py`` too)."""
    return len(points) >= 2 and len({point["attainment"] for point in points}) == 1


def no_effect_line(found: dict[str, Any], variable: str, tried: str) -> str:
    """What a search with no effect says instead of a bound."""
    return (
        f"{variable}: no bound: {found['curve'][0]['attainment']:.1%} of requests meet the SLO at every {tried},"
        f" so it has no effect here; {found['runs']} runs"
    )


# -- the command ------------------------------------------------------------------------------
OUTPUTS = ("capacity.json", "capacity.png")  # what --find max-rate writes under --out


def evaluator(
    trace: list[TraceRequest],
    config: Any,
    manager: str,
    slo: SLO,
    workers: int,
    executor: str,
    rate: float,
    say: Callable[[str], None] | None = None,
) -> Callable[[list[float]], Iterable[dict[str, Any]]]:
    """``evaluate`` for ``find_max_rate``: each round's rate scales in
    parallel, and with ``say`` a line per round (``executor.rounds``)."""
    from blockspace.simulator.executor import rounds

    return rounds(run_probe, lambda scale: Probe(scale, trace, config, manager, slo), "scale", workers, executor,
                  say, lambda a: f"{significant(a['scale'] * rate)} req/s {a['attainment']:.1%}")  # fmt: skip


def format_answer(found: dict[str, Any], slo: SLO) -> str:
    """The curve as a table, then the answer in a sentence. Rates have four
    significant digits (``report.significant``): a search that halves the
    rate down to 1/4096 of the trace's goes far below a thousandth of a
    request a second, one that doubles it to thousands."""
    lines = [f"{'rate (req/s)':>13}  {'scale':>8}  {'attainment':>10}  {'goodput':>9}  {'served':>9}  "
             f"{'load':>9}  finished/ignored/aborted"]  # fmt: skip
    for point in found["curve"]:
        load = "SATURATED" if point["saturated"] else "keeps up"
        lines.append(
            f"{significant(point['rate_requests_per_s']):>13}  {significant(point['scale']):>8}  "
            f"{point['attainment']:>10.1%}  {significant(point['goodput_requests_per_s']):>9}  "
            f"{significant(point['served_requests_per_s']):>9}  {load:>9}  "
            f"{point['finished']:,}/{point['ignored']:,}/{point['aborted']:,}"
        )
    target = f"{found['target']:.0%} of requests within {slo}"
    trace_rate = significant(found["trace_rate_requests_per_s"])
    if not found["complete"]:
        lines.append(incomplete_line("max rate", found["runs"]))
    elif found["no_effect"]:
        low, high = found["curve"][0], found["curve"][-1]
        tried = (
            f"rate tried, {significant(low['rate_requests_per_s'])} to {significant(high['rate_requests_per_s'])} req/s"
        )
        lines.append(no_effect_line(found, "max rate", tried))
    elif found["max_rate_requests_per_s"] is None:
        lowest = found["curve"][0]
        lines.append(
            f"max rate: none found: even {significant(lowest['rate_requests_per_s'])} req/s "
            f"({significant(lowest['scale'])}x the trace's {trace_rate} req/s) misses {target}; {found['runs']} runs"
        )
        flat = flat_floor(found["curve"])
        if flat is not None:
            lines.append(why_flat(flat, found))
    else:
        above = found["lowest_failing_rate_requests_per_s"]
        bound = (
            ": every rate tried does, the max is higher" if above is None else f", {significant(above)} req/s does not"
        )
        lines.append(
            f"max rate: {significant(found['max_rate_requests_per_s'])} req/s ({significant(found['rate_scale'])}x the"
            f" trace's {trace_rate} req/s) keeps {target}{bound}; {found['runs']} runs"
            + ("" if found["converged"] else " (stopped at the run limit before the bracket closed)")
        )
    return "\n".join(lines)


FLAT_POINTS = 3  # this many of the lowest rates with one attainment: lowering the rate no longer helps


def flat_floor(curve: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The highest of the lowest rates that all have the lowest rate's
    attainment, when there are ``FLAT_POINTS`` of them or more; else None."""
    floor = curve[0]["attainment"]
    same = 0
    while same < len(curve) and curve[same]["attainment"] == floor:
        same += 1
    return curve[same - 1] if same >= FLAT_POINTS else None


def why_flat(point: dict[str, Any], found: dict[str, Any]) -> str:
    """Why the attainment stopped rising as the rate fell: scaling the
    arrivals spreads the bursts apart but keeps each burst together, and a
    request that misses when it has the GPU to itself misses at any rate."""
    said = (
        f"why: attainment stays at {point['attainment']:.1%} from {significant(point['rate_requests_per_s'])} req/s"
        " down, so lowering the rate no longer helps. Scaling the arrivals keeps requests that arrive together together"
    )
    if "arrival_times" in found:
        said += f" ({found['requests']:,} requests arrive at {found['arrival_times']:,} distinct times)"
    return said + ", and a request that misses the SLO on an idle GPU misses it at any rate."


def arrival_times(trace: list[TraceRequest]) -> int:
    """How many distinct arrival times the trace has: its bursts, which no rate scale splits."""
    return len({request.arrival_s for request in trace})


def format_answers(searches: list[dict[str, Any]]) -> str:
    """One line per configuration of a sweep: its values and the max rate."""
    lines = ["max rate per configuration:"]
    for search in searches:
        values = ", ".join(f"{name}={value}" for name, value in search["values"].items())
        rate = search["max_rate_requests_per_s"]
        answer = "no effect" if search["no_effect"] else "none found" if rate is None else f"{significant(rate)} req/s"
        lines.append(f"  {values}: {answer}")
    return "\n".join(lines)


__all__ = [
    "OUTPUTS",
    "arrival_times",
    "Probe",
    "base_rate",
    "evaluator",
    "find_max_rate",
    "format_answer",
    "format_answers",
    "next_scales",
    "run_probe",
]
