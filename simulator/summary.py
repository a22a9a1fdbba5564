"""A run's figures as one typed record, ``Summary``, and how they are taken
from its ``Metrics`` (``summarize``).

Why typed: the summary is read by the text report, the sweeps' tables, the
searches and the tests. As a nested dict each of them read it by string
keys, and a misspelt key was a ``KeyError`` at the end of a long run; as
records, a reader names a field the type checker knows. The JSON file is
``Summary.to_json()``: the records' fields are its keys, in their order.

Request figures are per trace request: with ``--n`` > 1 its n samples run
as n requests (as in vLLM 0.9.2), and the trace request counts as finished
once all of them have, its TTFT from the earliest sample's first token and
its end-to-end latency to the last sample's finish (what a client of vLLM
sees for one request with n outputs), and its TPOT (time per output token
after the first, (end-to-end - TTFT) / (output tokens - 1), as vLLM's
benchmark has it) the slowest sample's. ITL (inter-token latency) is every
gap between two tokens of a request, over all requests. Latency figures
count the requests that finished, and every place that shows one says how
many those are; ignored (too large for the GPU) and aborted requests (one
of its samples was) are counted apart. With an SLO (``slo.py``) the summary
also says how many trace requests met it and the goodput they make.
Throughput is over the simulated time from the first arrival to the last
finish. KV usage is the GPU blocks held by sequences (``num_gpu_blocks -
get_num_free_gpu_blocks()``, so idle cached blocks count as free, as in
vLLM); its mean is weighted by step time. Manager time is the wall time
spent inside the manager's calls on this machine (``TimedManager``), after
the warm-up; the warm-up itself is the start-up line.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from blockspace.simulator.failures import Failures
from blockspace.simulator.metrics import TraceOutcome
from blockspace.simulator.runs import SimulationResult
from blockspace.simulator.slo import SLO, Attainment, attainment

SHARES = np.true_divide([50, 90, 99], 100)  # the percentiles a summary gives, as np.percentile takes them

# A run is saturated when it served requests more slowly than they came and the queue grew
# with them: at least this share of the offered rate went unserved, and at least this share of
# the requests were still waiting for admission when the last one arrived. Why the queue too:
# a short trace served well still ends after its last arrival (its tail), so its served rate
# alone falls below the offered one; a stable queue stays short however short the trace.
SATURATION_RATE_SHARE = 0.1
SATURATION_QUEUE_SHARE = 0.1


@dataclass(frozen=True)
class RequestCounts:
    """Trace requests: arrived, and of those finished, ignored, aborted."""

    arrived: int
    finished: int
    ignored: int
    aborted: int


@dataclass(frozen=True)
class Load:
    """Offered and served rates, the admission queue, and saturation (``load_of``)."""

    offered_requests_per_s: float | None
    served_requests_per_s: float
    queued_requests: int  # the scheduler's requests: n to each trace request
    waiting_at_last_arrival: int
    peak_waiting: int
    saturated: bool


@dataclass(frozen=True)
class Throughput:
    output_tokens_per_s: float
    total_tokens_per_s: float
    requests_per_s: float


@dataclass(frozen=True)
class Spread:
    """p50, p90, p99 and mean of a latency (None when there is none), and how many values."""

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None
    count: int


@dataclass(frozen=True)
class PrefixCache:
    enabled: bool
    gpu_block_hit_rate: float
    prefill_tokens_from_cache: float


@dataclass(frozen=True)
class Preemption:
    recompute: int
    swap_out: int
    swap_in: int
    blocks_swapped_out: int
    blocks_swapped_in: int
    copy_on_writes: int


@dataclass(frozen=True)
class KVCache:
    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    peak_used_blocks: int
    peak_usage: float
    mean_usage: float


@dataclass(frozen=True)
class MethodTime:
    total_s: float
    calls: int


@dataclass(frozen=True)
class ManagerTime:
    """Wall time inside the manager's calls (the Python engine's; the compiled step does not time them apart)."""

    total_s: float
    per_step_mean_us: float
    per_step_p99_us: float
    calls: int
    by_method: dict[str, MethodTime]  # the busiest first


@dataclass(frozen=True)
class Cost:
    """The run's price at ``--gpu-cost`` dollars a GPU-hour: every GPU held
    from the first arrival to the last finish (an idle GPU is paid too)."""

    dollars_per_gpu_hour: float
    gpus: int  # replicas x tensor-parallel GPUs
    gpu_hours: float
    dollars: float
    dollars_per_million_output_tokens: float | None  # None: no output token


@dataclass(frozen=True)
class Fleet:
    replicas: int
    router: str
    router_weight: float
    requests_per_replica: list[int]
    each: list[Summary]


@dataclass(frozen=True)
class Outages:
    """What ``--fail`` did (``failures.py``): the outages as ``--fail`` writes
    them, the trace requests a failed replica lost and the sends again, and
    the SLO apart for the requests that arrived while a replica was down."""

    outages: list[str]
    affected: int
    retries: int
    arrived_during: int
    slo_during: Attainment | None  # with --slo
    slo_outside: Attainment | None


@dataclass(frozen=True)
class Pool:
    """One pool of a disaggregated fleet: its replicas, the share of the
    run's span they ran a batch (each replica's busy time over the span,
    averaged), their mean KV usage while busy, and their hit rate."""

    replicas: int
    utilisation: float
    mean_kv_usage: float
    hit_rate: float


@dataclass(frozen=True)
class Disaggregation:
    """Prefill and decode apart (``disaggregated.py``): each pool, the link, and what crossed it."""

    prefill: Pool
    decode: Pool
    kv_link_gbps: float
    transfer_s: Spread
    gigabytes_moved: float


@dataclass(frozen=True)
class Summary:
    """Every figure of one run (see the module doc)."""

    manager: str
    engine: str
    clock: str  # the step time's source: linear constants, a --step-model file, or a roofline (clock.Clock.describe)
    requests: RequestCounts
    simulated_s: float
    load: Load
    busy_s: float
    steps: int
    throughput: Throughput
    ttft_s: Spread
    tpot_s: Spread
    itl_s: Spread
    e2e_latency_s: Spread
    slo: Attainment | None
    prefix_cache: PrefixCache
    preemption: Preemption
    kv_cache: KVCache
    manager_time: ManagerTime
    manager_startup_s: float
    wall_s: float
    tables_recorded: bool  # --compare: the times include the recording
    fleet: Fleet | None
    cost: Cost | None  # with --gpu-cost
    failures: Outages | None  # with --fail
    disaggregation: Disaggregation | None  # with --prefill-replicas and --decode-replicas

    def to_json(self) -> dict[str, Any]:
        """The summary as the JSON files hold it: each record a nested object."""
        return dataclasses.asdict(self)


def percentiles(values: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """``np.percentile(values, 100 * shares)`` of a non-empty 1-D array:
    numpy's default rule ("linear": between the two nearest sorted values)
    in numpy's own arithmetic, so each figure is the same to the bit
    (``tests/test_report_percentiles.py``). Why not call numpy's: its checks
    cost ~100 us a call, whatever the size, and a fleet's summary makes
    five for each replica (a fleet of 256: 0.15 s, a fifth of its report).
    Why each share in Python floats, one numpy call for all (the partial
    sort): the arithmetic of a few shares is IEEE's either way, and a numpy
    call on three values costs more than the values (~1 us each)."""
    last = len(values) - 1
    places = [last * share for share in shares.tolist()]  # where each share falls among the sorted values
    lows = [math.floor(at) for at in places]
    highs = [min(low + 1, last) for low in lows]
    ordered = np.partition(values, sorted({last, *lows, *highs}))  # those places sorted
    if np.isnan(ordered[last]):  # NaN sorts last, and numpy then answers NaN
        return np.full(len(shares), np.nan)
    answers = []
    for at, low, high in zip(places, ordered[lows].tolist(), ordered[highs].tolist()):
        weight, span = at - math.floor(at), high - low
        answers.append(high - span * (1 - weight) if weight >= 0.5 else low + span * weight)  # numpy's two halves
    return np.array(answers)


def spread(values: Any) -> Spread:
    """p50, p90, p99 and mean of ``values``, and how many there are."""
    array = np.asarray(values, dtype=float)
    if not array.size:
        return Spread(None, None, None, None, 0)
    p50, p90, p99 = percentiles(array, SHARES)
    mean = float(array.sum()) / array.size  # np.mean's sum and division, without its checks
    return Spread(float(p50), float(p90), float(p99), mean, array.size)


def load_of(arrivals: list[float], num_finished: int, span: float, timelines: list[Any], num_samples: int = 1) -> Load:
    """The offered rate (requests a second between the first arrival and
    the last), the served rate (finished requests over the simulated time),
    the queue waiting for admission (at the last arrival, and at its peak;
    a fleet's is the sum of its replicas' queues, ``timelines``), and
    whether the run is saturated (``SATURATION_*``). Rates count trace
    requests; the queue counts the scheduler's, ``num_samples`` to each."""
    window = max(arrivals) - min(arrivals) if arrivals else 0.0
    offered = (len(arrivals) - 1) / window if window > 0 else None
    served = num_finished / span
    times, waiting = queue_over_time(timelines)
    before_last = np.searchsorted(times, max(arrivals, default=0.0), "right")
    at_last = int(waiting[before_last - 1]) if before_last else 0
    saturated = (
        offered is not None
        and served < (1 - SATURATION_RATE_SHARE) * offered
        and at_last >= SATURATION_QUEUE_SHARE * len(arrivals) * num_samples
    )
    return Load(offered, served, len(arrivals) * num_samples, at_last, int(waiting.max()) if waiting.size else 0,
                saturated)  # fmt: skip


def queue_over_time(timelines: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The requests waiting for admission across ``timelines`` (one per
    replica), after each step of any of them: each replica's queue holds
    from the end of one of its steps to the end of its next."""
    ends = [np.asarray(t.time_s, dtype=float) for t in timelines]
    changes = [np.diff(np.asarray(t.num_waiting, dtype=np.int64), prepend=0) for t in timelines]
    if not ends:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    order = np.argsort(np.concatenate(ends), kind="stable")
    return np.concatenate(ends)[order], np.cumsum(np.concatenate(changes)[order])


def summarize(result: SimulationResult, slo: SLO | None = None) -> Summary:
    """Every figure of one run (with ``slo``: who met it)."""
    config, metrics = result.config, result.metrics
    counts, timeline = metrics.counts, metrics.timeline
    outcomes = metrics.outcomes()  # per trace request, over its samples
    finished = [r for r in outcomes if r.status == "finished"]
    num_output_tokens = sum(r.num_output_tokens for r in finished)
    num_prompt_tokens = sum(r.num_prompt_tokens for r in finished)
    start = min((r.arrival_s for r in outcomes), default=0.0)
    end = max((r.finish_s for r in finished if r.finish_s is not None), default=start)
    span = max(end - start, 1e-12)
    step_s = np.asarray(timeline.step_s, dtype=float)
    busy = float(step_s.sum())
    timelines = [r.metrics.timeline for r in result.replicas] or [timeline]
    replicas = [summarize(replica, slo) for replica in result.replicas]
    return Summary(
        manager=result.manager_name,
        engine=config.engine,
        clock=config.step_time.describe(),
        requests=RequestCounts(
            len(outcomes),
            len(finished),
            sum(r.status == "ignored" for r in outcomes),
            sum(r.status == "aborted" for r in outcomes),
        ),  # fmt: skip
        simulated_s=end - start,
        load=load_of([r.arrival_s for r in outcomes], len(finished), span, timelines, config.num_samples),
        busy_s=busy,
        steps=len(timeline.step_s),
        throughput=Throughput(
            num_output_tokens / span, (num_output_tokens + num_prompt_tokens) / span, len(finished) / span
        ),  # fmt: skip
        ttft_s=spread([r.ttft_s for r in finished if r.ttft_s is not None]),
        tpot_s=spread([r.tpot_s for r in finished if r.tpot_s is not None]),
        itl_s=spread(metrics.itl_s),
        e2e_latency_s=spread([r.e2e_s for r in finished if r.e2e_s is not None]),
        slo=None if slo is None else attainment(slo, outcomes, span),
        prefix_cache=PrefixCache(
            config.scheduler.enable_prefix_caching,
            metrics.final_hit_rate,
            counts.cached_tokens_admitted / max(1, counts.prefill_tokens_admitted),
        ),  # fmt: skip
        preemption=Preemption(
            counts.recompute_preemptions,
            counts.swap_outs,
            counts.swap_ins,
            counts.blocks_swapped_out,
            counts.blocks_swapped_in,
            counts.copy_on_writes,
        ),  # fmt: skip
        kv_cache=kv_cache(result, step_s, busy),
        manager_time=manager_time(result),
        manager_startup_s=metrics.startup_s,
        wall_s=metrics.wall_s,
        tables_recorded=config.scheduler.record_tables,
        fleet=None
        if not result.replicas
        else Fleet(
            config.replicas,
            config.router,
            config.router_weight,
            [each.requests.arrived for each in replicas],
            replicas,
        ),  # fmt: skip
        cost=None
        if config.gpu_cost_per_hour is None
        else cost_of(config.gpu_cost_per_hour, config.gpus, end - start, num_output_tokens),  # fmt: skip
        failures=None if result.failures is None else outages(result.failures, outcomes, slo, span),
        disaggregation=None if result.transfers is None else disaggregation(result, span),
    )


def disaggregation(result: SimulationResult, span: float) -> Disaggregation:
    """Each pool's figures (its replicas are the first ``prefill_replicas`` of the fleet's, then the rest)."""
    config, transfers = result.config, result.transfers
    assert transfers is not None
    split = config.prefill_replicas

    def pool(replicas: list[SimulationResult]) -> Pool:
        busy = [float(np.asarray(r.metrics.timeline.step_s, dtype=float).sum()) for r in replicas]
        usage = [kv_cache(r, np.asarray(r.metrics.timeline.step_s, dtype=float), b).mean_usage
                 for r, b in zip(replicas, busy, strict=True)]  # fmt: skip
        admitted = np.array([r.metrics.counts.prefill_tokens_admitted for r in replicas], dtype=float)
        rates = np.array([r.metrics.final_hit_rate for r in replicas])
        return Pool(len(replicas), sum(busy) / len(busy) / span, sum(usage) / len(usage),
                    float(rates @ admitted / admitted.sum()) if admitted.sum() else 0.0)  # fmt: skip

    return Disaggregation(pool(result.replicas[:split]), pool(result.replicas[split:]), config.kv_link_gbps,
                          spread(transfers.seconds), transfers.bytes / 1e9)  # fmt: skip


def outages(failures: Failures, outcomes: list[TraceOutcome], slo: SLO | None, span: float) -> Outages:
    """``Outages`` of a run's ``failures``: its requests split by whether they arrived while a replica was down."""
    during = [outcome for outcome in outcomes if failures.arrived_during(outcome.arrival_s)]
    outside = [outcome for outcome in outcomes if not failures.arrived_during(outcome.arrival_s)]
    return Outages(
        [str(outage) for outage in failures.outages], len(failures.affected), failures.retries, len(during),
        None if slo is None else attainment(slo, during, span), None if slo is None else attainment(slo, outside, span),
    )  # fmt: skip


def cost_of(dollars_per_gpu_hour: float, gpus: int, seconds: float, output_tokens: int) -> Cost:
    """``gpus`` held for ``seconds`` at ``dollars_per_gpu_hour``, and per million of ``output_tokens``."""
    gpu_hours = gpus * seconds / 3600
    dollars = gpu_hours * dollars_per_gpu_hour
    per_million = dollars / output_tokens * 1e6 if output_tokens else None
    return Cost(dollars_per_gpu_hour, gpus, gpu_hours, dollars, per_million)


def kv_cache(result: SimulationResult, step_s: np.ndarray, busy: float) -> KVCache:
    """The pools' sizes, and the GPU blocks in use at the peak and on average over busy time."""
    config = result.config
    used = np.asarray(result.metrics.timeline.kv_used_blocks, dtype=float)
    return KVCache(
        config.scheduler.block_size, config.num_gpu_blocks, config.num_cpu_blocks,
        int(used.max()) if used.size else 0,
        float(used.max() / config.num_gpu_blocks) if used.size else 0.0,
        float((used * step_s).sum() / busy / config.num_gpu_blocks) if busy > 0 else 0.0,
    )  # fmt: skip


def manager_time(result: SimulationResult) -> ManagerTime:
    """The wall time inside the manager's calls, per step and by method."""
    metrics = result.metrics
    manager_us = np.asarray(metrics.timeline.manager_s, dtype=float) * 1e6
    by_method = sorted(metrics.manager_by_method.items(), key=lambda kv: -kv[1][0])
    return ManagerTime(
        float(manager_us.sum() / 1e6),
        float(manager_us.mean()) if manager_us.size else 0.0,
        float(percentiles(manager_us, SHARES[2:])[0]) if manager_us.size else 0.0,
        metrics.manager_calls,
        {name: MethodTime(seconds, calls) for name, (seconds, calls) in by_method},
    )


__all__ = [
    "Cost",
    "Disaggregation",
    "Fleet",
    "KVCache",
    "Load",
    "ManagerTime",
    "MethodTime",
    "Outages",
    "Pool",
    "PrefixCache",
    "Preemption",
    "RequestCounts",
    "Spread",
    "Summary",
    "Throughput",
    "load_of",
    "percentiles",
    "spread",
    "summarize",
]
