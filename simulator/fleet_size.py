"""``--find min-replicas``: the fewest replicas that meet the SLO.

The fleet question: how many engines, behind the router chosen, does this
traffic need so that at least the target share of its requests meet the
SLO? Each try replays the whole trace (at its own arrivals, or at
``--request-rate``'s) through a fleet of ``k`` replicas (``fleet.py``).

With ``--spare K``, each count runs with K of its replicas down over the
stretch of the trace that brings the most work (``failures.busiest_window``),
and a count passes when the share holds both for the requests that arrive
while they are down and for the rest (where any arrive): the lower share is
its attainment.

Disaggregated, ``k`` counts one side, the other given: the decode replicas
behind ``--prefill-replicas P``, or the prefill replicas in front of
``--decode-replicas D``; sweep the side given to find the cheapest split.

Attainment is assumed to rise with ``k`` (more replicas, shorter queues).
Every count tried is reported, so a curve that does not rise can be seen.
The search runs in rounds of as many counts as there are workers, on the
sweep's executor (``executor.py``):

1. bracket: 1, 2, 4, ... until a count meets the target (at most ``MAX_REPLICAS``,
   or the largest fleet whose estimated memory fits: ``memory.py``), or
   until doubling stops helping (``stops_rising``: the largest fleet kept
   up with its traffic, and two doublings gained less than half a point);
2. narrow: between the highest failing count and the lowest passing one,
   try counts spread evenly, until the two are adjacent.

The answer is the lowest passing count above the highest failing one.
Where no count passes and every count gave the same attainment, the count
had no effect (``no_effect``, as ``capacity.py`` says it): the search says
so. Where every count passes, 1 is a real answer: no fleet is smaller.

The answer is a typed record, ``ReplicaAnswer``, of the counts tried
(``ReplicaPoint``), as ``capacity.py``'s is (why there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from blockspace.interrupts import Interrupted, incomplete_line
from blockspace.simulator.capacity import Answer, has_no_effect, no_effect_line
from blockspace.simulator.failures import spares_down
from blockspace.simulator.slo import SLO
from blockspace.workloads import TraceRequest

MAX_REPLICAS = 1024  # the search gives up beyond this many


@dataclass(frozen=True)
class Try:
    """One replay of the fleet at ``replicas``: picklable, for a worker process."""

    replicas: int
    trace: list[TraceRequest]
    config: Any  # SimulationConfig
    manager: str
    slo: SLO
    spare: int = 0  # --spare: replicas down over ``window``
    window: tuple[float, float] = (0.0, 0.0)
    decode: int = 0  # disaggregated, the decode replicas given: the count is the prefill replicas in front of them


@dataclass(frozen=True)
class ReplicaPoint:
    """One replica count tried (``run_try``): how the SLO fared, and the prefix cache."""

    replicas: int
    attainment: float  # the share of requests meeting the SLO, 0-1
    goodput_requests_per_s: float
    finished: int
    hit_rate: float  # the GPU prefix cache's block hit rate
    ttft_p90_s: float | None  # None: no request finished
    saturated: bool
    dollars_per_million_output_tokens: float | None = None  # with --gpu-cost


@dataclass(frozen=True, kw_only=True)
class ReplicaAnswer(Answer):
    """``find_min_replicas``'s answer: the fewest replicas (None where none
    passed), and every count tried (``curve``, fewest first)."""

    router: str | None = None  # the fleet's, which the command adds
    complete: bool  # False: Ctrl-C stopped it
    min_replicas: int | None
    target: float
    runs: int
    most: int  # the largest count it could try
    no_effect: bool
    stopped_rising: bool = False  # the doubling stopped: more replicas no longer helped (``stops_rising``)
    curve: tuple[ReplicaPoint, ...]

    OPTIONAL = (*Answer.OPTIONAL, "router")

    @property
    def value(self) -> float | None:
        return self.min_replicas

    def in_brief(self) -> str:
        return "no effect" if self.no_effect else "none found" if self.min_replicas is None else str(self.min_replicas)


def run_try(attempt: Try) -> ReplicaPoint:
    """Replay the fleet at ``attempt.replicas`` and say how the SLO fared."""
    from blockspace.interfaces import load_manager_class
    from blockspace.simulator.engines import replay
    from blockspace.simulator.summary import summarize

    failures = spares_down(attempt.spare, attempt.replicas, attempt.window) if attempt.spare else ()
    prefill = attempt.config.prefill_replicas
    if attempt.decode:  # disaggregated: the count is the prefill replicas, in front of the decode ones given
        replicas, prefill = attempt.replicas + attempt.decode, attempt.replicas
    else:  # or the decode replicas, behind the prefill ones given (none: aggregated)
        replicas = attempt.replicas + prefill
    config = replace(attempt.config, replicas=replicas, prefill_replicas=prefill, failures=failures)
    summary = summarize(replay(attempt.trace, load_manager_class(attempt.manager), config), attempt.slo)
    assert summary.slo is not None  # a search has an SLO
    attainment = summary.slo.attainment
    if summary.failures is not None:  # --spare: the SLO must hold while they are down, and outside that
        sides = (summary.failures.slo_during, summary.failures.slo_outside)
        attainment = min(side.attainment for side in sides if side is not None and side.of)
    return ReplicaPoint(
        replicas=attempt.replicas,
        attainment=attainment,
        goodput_requests_per_s=summary.slo.goodput_requests_per_s,
        finished=summary.requests.finished,
        hit_rate=summary.prefix_cache.gpu_block_hit_rate,
        ttft_p90_s=summary.ttft_s.p90,
        saturated=summary.load.saturated,
        dollars_per_million_output_tokens=None
        if summary.cost is None
        else summary.cost.dollars_per_million_output_tokens,
    )


def next_counts(tried: dict[int, bool], width: int, most: int = MAX_REPLICAS) -> list[int]:
    """The replica counts of the next round (``tried``: count -> passed), or
    [] when the search is over: found, or past ``most`` (``MAX_REPLICAS``,
    or fewer: the largest fleet that fits in memory, ``memory.py``)."""
    passing = [k for k, passed in tried.items() if passed]
    low = max((k for k, passed in tried.items() if not passed), default=0)  # the highest failing count
    if not passing:
        top = max(tried)
        return [] if top >= most else sorted({min(top * 2 ** (i + 1), most) for i in range(width)})
    high = min(k for k in passing if k > low)
    if high - low <= 1:
        return []
    step = (high - low) / (min(width, high - low - 1) + 1)
    return sorted({low + round(step * (i + 1)) for i in range(min(width, high - low - 1))} - set(tried))


FLAT = 0.005  # attainment that rose less than this over two doublings of the fleet has stopped rising


def last_doublings(counts: Iterable[int]) -> tuple[int, int, int]:
    """The largest count tried, the largest at most half of it, and the
    largest at most half of that (0 where there is none)."""
    tried = list(counts)
    top = max(tried)
    half = max((count for count in tried if count <= top // 2), default=0)
    return top, half, max((count for count in tried if count <= half // 2), default=0)


def stops_rising(tries: dict[int, ReplicaPoint]) -> bool:
    """Has doubling the fleet stopped helping? The largest count tried kept
    up with its traffic (its queue did not grow), some of its requests met
    the SLO, and the last two doublings raised that share by less than
    ``FLAT``. Then what misses is, in all likelihood, what misses on a
    replica to itself: a prompt whose prefill alone outlasts the TTFT bound.
    More replicas would only cost runs, each larger than the last (issue
    #53: a slower clock's search doubled to 1,024 replicas of 2,000
    requests for nothing).

    A heuristic, and why two doublings and not one: requests that arrive
    together share a replica's steps without its queue growing, so a fleet
    can keep up and still meet the SLO no more often at twice its size
    (none of 4 requests arriving at once met ``ttft=350ms`` on 1 or 2
    replicas, all of them on 4). A share of 0 never stops it: nothing met
    the SLO yet, so nothing says the misses are the prompts' own."""
    top, half, quarter = last_doublings(tries)
    if not quarter or tries[top].saturated or tries[top].attainment == 0:
        return False
    return (
        tries[top].attainment - tries[quarter].attainment < FLAT
        and tries[top].attainment <= tries[half].attainment + FLAT
    )


def find_min_replicas(
    evaluate: Callable[[list[int]], Iterable[ReplicaPoint]],
    target: float,
    width: int,
    most: int = MAX_REPLICAS,
    near: int | None = None,
) -> ReplicaAnswer:
    """Search (see the module doc). ``evaluate(counts)`` replays those counts
    (in parallel) and returns ``run_try``'s points; ``target`` is the
    attainment wanted (0-1), ``width`` the counts per round; ``near``, an
    answer expected close by (a range's: the central one), makes the first
    round that count and the one below it. Stopped by Ctrl-C, it raises
    ``Interrupted`` with the counts tried so far (``complete`` False)."""
    tries: dict[int, ReplicaPoint] = {}
    counts = sorted({min(2**i, most) for i in range(width)})  # ``most``: as ``next_counts``
    if near is not None:
        counts = sorted({max(1, near - 1), min(near, most)})
    complete, stopped_rising = True, False
    try:
        while counts:
            for point in evaluate(counts):
                tries[point.replicas] = point
            passed = {k: t.attainment >= target for k, t in tries.items()}
            stopped_rising = not any(passed.values()) and stops_rising(tries)
            counts = [] if stopped_rising else next_counts(passed, width, most)
    except KeyboardInterrupt:
        complete = False
    failing = max((k for k, t in tries.items() if t.attainment < target), default=0)
    passing = [k for k, t in tries.items() if t.attainment >= target and k > failing]
    found = ReplicaAnswer(
        complete=complete,
        min_replicas=min(passing, default=None),
        target=target,
        runs=len(tries),
        most=most,
        no_effect=not passing and has_no_effect([t.attainment for t in tries.values()]),
        stopped_rising=stopped_rising,
        curve=tuple(tries[k] for k in sorted(tries)),
    )
    if not complete:
        raise Interrupted(partial=found)
    return found


def evaluator(
    template: Try, workers: int, executor: str, say: Callable[[str], None] | None = None
) -> Callable[[list[int]], Iterable[ReplicaPoint]]:
    """``evaluate`` for ``find_min_replicas``: each round's counts (the
    ``template`` at each) in parallel, and with ``say`` a line per round
    (``executor.rounds``)."""
    from blockspace.simulator.executor import rounds

    return rounds(run_try, lambda count: replace(template, replicas=count), lambda p: p.replicas, workers, executor,
                  say, lambda p: f"{p.replicas} replica(s) {p.attainment:.1%}")  # fmt: skip


def format_answer(found: ReplicaAnswer, slo: SLO, router: str) -> str:
    """The curve as a table, then the answer in a sentence."""
    lines = [f"{'replicas':>8}  {'attainment':>10}  {'goodput':>9}  {'hit rate':>8}  {'TTFT p90':>10}  load"]
    for point in found.curve:
        ttft = "-" if point.ttft_p90_s is None else f"{point.ttft_p90_s:.3f} s"
        lines.append(
            f"{point.replicas:>8}  {point.attainment:>10.1%}  {point.goodput_requests_per_s:>9.4g}  "
            f"{point.hit_rate:>8.1%}  {ttft:>10}  {'SATURATED' if point.saturated else 'keeps up'}"
        )
    target = f"{found.target:.0%} of requests within {slo}"
    if not found.complete:
        lines.append(incomplete_line("min replicas", found.runs))
    elif found.no_effect:
        tried = f"replica count tried, up to {found.curve[-1].replicas:,}"
        lines.append(no_effect_line(found.curve[0].attainment, found.runs, "min replicas", tried))
    elif found.min_replicas is None and found.stopped_rising:
        at = {point.replicas: point for point in found.curve}
        top, half, quarter = (at[count] for count in last_doublings(at))
        shares = " and ".join(f"{point.attainment:.1%} at {point.replicas:,}" for point in (half, quarter))
        lines.append(
            f"min replicas: none found under {router} for {target}: more replicas stopped helping, {top.attainment:.1%}"
            f" at {top.replicas:,} against {shares}, the load kept up (what misses, in all likelihood misses on a"
            f" replica to itself); {found.runs} runs"
        )
    elif found.min_replicas is None:
        bound = "" if found.most >= MAX_REPLICAS else ", the largest fleet that fits in memory"
        lines.append(f"min replicas: none found up to {found.most:,}{bound} under {router} for {target}; "
                     f"{found.runs} runs")  # fmt: skip
    else:
        span = found.ranges(lambda count: f"{count:.0f}")
        lines.append(f"min replicas: {found.min_replicas}{span} under {router} keep {target}; {found.runs} runs"
                     + price_at(found))  # fmt: skip
    return "\n".join(lines)


def price_at(found: ReplicaAnswer) -> str:
    """``, $X per million output tokens`` at the answer, with --gpu-cost (else nothing)."""
    point = next((p for p in found.curve if p.replicas == found.min_replicas), None)
    if point is None or point.dollars_per_million_output_tokens is None:
        return ""
    return f", ${point.dollars_per_million_output_tokens:,.2f} per million output tokens"


__all__ = ["MAX_REPLICAS", "ReplicaAnswer", "ReplicaPoint", "Try", "evaluator", "find_min_replicas", "format_answer",
           "next_counts", "run_try", "stops_rising"]  # fmt: skip
