"""The figures of a run: the summary, its text form, the comparison of two
runs, and the JSON file.

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
also says how many trace requests met it and the goodput they make. Throughput is over the
simulated time from the first arrival to the last finish. KV usage is the
GPU blocks held by sequences (``num_gpu_blocks - get_num_free_gpu_blocks()``,
so idle cached blocks count as free, as in vLLM); its mean is weighted by
step time. Manager time is the wall time spent inside the manager's calls
on this machine (``TimedManager``), after the warm-up; the warm-up itself is
the start-up line.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from blockspace.outputs import write_text
from blockspace.simulator.decisions import StepRecord
from blockspace.simulator.runs import SimulationResult
from blockspace.simulator.slo import SLO, attainment

MAX_TIMELINE_POINTS = 2000  # per-step series are thinned to this many points in the JSON


SHARES = np.true_divide([50, 90, 99], 100)  # the percentiles a summary gives, as np.percentile takes them


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


def _percentiles(values: Any) -> dict[str, float | int | None]:
    """p50, p90, p99 and mean of ``values``, and ``count``: how many there are."""
    array = np.asarray(values, dtype=float)
    if not array.size:
        return {"p50": None, "p90": None, "p99": None, "mean": None, "count": 0}
    p50, p90, p99 = percentiles(array, SHARES)
    mean = float(array.sum()) / array.size  # np.mean's sum and division, without its checks
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": mean, "count": array.size}


# What the wall-time row holds. A compared run records every step's block tables, CoW pairs
# and swap mappings to check the two runs against each other, and that recording takes time
# of its own, inside the manager (its table reads) and outside it: such a run is slower than
# the same run alone, and the row says so rather than pass it off as the replay alone.
COMPILED_MANAGER_TIME = "inside the compiled step, not timed apart (the wall time below is all of it)"
COMPILED_STARTUP = " (compiling the step, or loading it from Numba's cache; not in the figures above)"
ALONE = " (the replay alone: start-up, loading and reporting left out)"
RECORDED = " (the replay with every step's tables recorded for --compare: slower than a run alone)"


# A run is saturated when it served requests more slowly than they came and the queue grew
# with them: at least this share of the offered rate went unserved, and at least this share of
# the requests were still waiting for admission when the last one arrived. Why the queue too:
# a short trace served well still ends after its last arrival (its tail), so its served rate
# alone falls below the offered one; a stable queue stays short however short the trace.
SATURATION_RATE_SHARE = 0.1
SATURATION_QUEUE_SHARE = 0.1


def load_of(
    arrivals: list[float], num_finished: int, span: float, timelines: list[Any], num_samples: int = 1
) -> dict[str, Any]:
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
    return {
        "offered_requests_per_s": offered,
        "served_requests_per_s": served,
        "queued_requests": len(arrivals) * num_samples,  # the scheduler's requests: n to each trace request
        "waiting_at_last_arrival": at_last,
        "peak_waiting": int(waiting.max()) if waiting.size else 0,
        "saturated": saturated,
    }


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


def summarize(result: SimulationResult, slo: SLO | None = None) -> dict[str, Any]:
    """Every figure of one run, as plain data (with ``slo``: who met it)."""
    config = result.config
    metrics = result.metrics
    counts = metrics.counts
    timeline = metrics.timeline
    outcomes = metrics.outcomes()  # per trace request, over its samples
    finished = [r for r in outcomes if r.status == "finished"]
    num_output_tokens = sum(r.num_output_tokens for r in finished)
    num_prompt_tokens = sum(r.num_prompt_tokens for r in finished)
    start = min((r.arrival_s for r in outcomes), default=0.0)
    end = max((r.finish_s for r in finished if r.finish_s is not None), default=start)
    span = max(end - start, 1e-12)
    step_s = np.asarray(timeline.step_s, dtype=float)
    used = np.asarray(timeline.kv_used_blocks, dtype=float)
    manager_us = np.asarray(timeline.manager_s, dtype=float) * 1e6
    busy = float(step_s.sum())
    return {
        "manager": result.manager_name,
        "engine": config.engine,
        "requests": {
            "arrived": len(outcomes),
            "finished": len(finished),
            "ignored": sum(r.status == "ignored" for r in outcomes),
            "aborted": sum(r.status == "aborted" for r in outcomes),
        },
        "simulated_s": end - start,
        "load": load_of(
            [r.arrival_s for r in outcomes],
            len(finished),
            span,
            [r.metrics.timeline for r in result.replicas] or [timeline],
            config.num_samples,
        ),  # fmt: skip
        "busy_s": busy,
        "steps": len(timeline.step_s),
        "throughput": {
            "output_tokens_per_s": num_output_tokens / span,
            "total_tokens_per_s": (num_output_tokens + num_prompt_tokens) / span,
            "requests_per_s": len(finished) / span,
        },
        "ttft_s": _percentiles([r.ttft_s for r in finished if r.ttft_s is not None]),
        "tpot_s": _percentiles([r.tpot_s for r in finished if r.tpot_s is not None]),
        "itl_s": _percentiles(metrics.itl_s),
        "e2e_latency_s": _percentiles([r.e2e_s for r in finished if r.e2e_s is not None]),
        "slo": None if slo is None else attainment(slo, outcomes, span),
        "prefix_cache": {
            "enabled": config.scheduler.enable_prefix_caching,
            "gpu_block_hit_rate": metrics.final_hit_rate,
            "prefill_tokens_from_cache": counts.cached_tokens_admitted / max(1, counts.prefill_tokens_admitted),
        },
        "preemption": {
            "recompute": counts.recompute_preemptions,
            "swap_out": counts.swap_outs,
            "swap_in": counts.swap_ins,
            "blocks_swapped_out": counts.blocks_swapped_out,
            "blocks_swapped_in": counts.blocks_swapped_in,
            "copy_on_writes": counts.copy_on_writes,
        },
        "kv_cache": {
            "block_size": config.scheduler.block_size,
            "num_gpu_blocks": config.num_gpu_blocks,
            "num_cpu_blocks": config.num_cpu_blocks,
            "peak_used_blocks": int(used.max()) if used.size else 0,
            "peak_usage": float(used.max() / config.num_gpu_blocks) if used.size else 0.0,
            "mean_usage": float((used * step_s).sum() / busy / config.num_gpu_blocks) if busy > 0 else 0.0,
        },
        "manager_time": {  # wall time inside the manager's calls
            "total_s": float(manager_us.sum() / 1e6),
            "per_step_mean_us": float(manager_us.mean()) if manager_us.size else 0.0,
            "per_step_p99_us": float(percentiles(manager_us, SHARES[2:])[0]) if manager_us.size else 0.0,
            "calls": metrics.manager_calls,
            "by_method": {  # the busiest first
                name: {"total_s": seconds, "calls": calls}
                for name, (seconds, calls) in sorted(metrics.manager_by_method.items(), key=lambda kv: -kv[1][0])
            },
        },
        "manager_startup_s": metrics.startup_s,
        "wall_s": metrics.wall_s,
        "tables_recorded": config.scheduler.record_tables,  # --compare: the times include the recording
        "fleet": None
        if not result.replicas
        else {
            "replicas": config.replicas,
            "router": config.router,
            "router_weight": config.router_weight,
            "requests_per_replica": np.bincount(result.assignment, minlength=config.replicas).tolist(),
            "each": [summarize(replica, slo) for replica in result.replicas],
        },
    }


def warnings_for(summary: dict[str, Any]) -> list[str]:
    """What makes a run's figures empty or misleading, in words."""
    requests = summary["requests"]
    if requests["arrived"] == 0:
        return ["the trace holds no requests: every figure is empty"]
    if requests["finished"] == 0:
        return [
            f"no request finished ({requests['ignored']:,} ignored as too large for the GPU, "
            f"{requests['aborted']:,} aborted): latency and throughput are empty"
        ]
    if requests["ignored"] + requests["aborted"] > requests["finished"]:
        return [f"most requests did not run ({requests['ignored']:,} ignored, {requests['aborted']:,} aborted)"]
    return []


def significant(value: float, digits: int = 4) -> str:
    """``value`` to ``digits`` significant digits, never in exponent form,
    thousands separated: a search's rates run from thousandths of a request
    a second to thousands, and ``48`` beside ``1.229e+04`` reads badly."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    text = f"{round(value, decimals):,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}{unit}" if abs(value) < 1000 else f"{value:,.0f}{unit}"
    return f"{value:,}{unit}"


# The latency lines of the summary: label, key, and what the figures are over.
LATENCIES = (
    ("TTFT", "ttft_s", lambda p: f"{p['count']:,} finished requests"),
    ("TPOT", "tpot_s", lambda p: f"{p['count']:,} finished requests"),
    ("ITL", "itl_s", lambda p: f"{p['count']:,} gaps between tokens"),
    ("end-to-end latency", "e2e_latency_s", lambda p: f"{p['count']:,} finished requests"),
)


def load_line(summary: dict[str, Any]) -> str:
    """The load in one line, saying plainly when the run is saturated."""
    load = summary["load"]
    offered, served = load["offered_requests_per_s"], load["served_requests_per_s"]
    rates = f"{'-' if offered is None else f'{offered:.3g}'} req/s offered, {served:.3g} req/s served"
    queue = f"{load['waiting_at_last_arrival']:,} of {load['queued_requests']:,} requests waiting when the last arrived"
    if load["saturated"]:
        return f"SATURATED: {rates}; {queue} (peak {load['peak_waiting']:,}): latencies measure the queue"
    return f"{rates}; {queue} (peak {load['peak_waiting']:,})"


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) lines of the text summary."""
    requests = summary["requests"]
    cache = summary["prefix_cache"]
    pre = summary["preemption"]
    kv = summary["kv_cache"]
    cpu = summary["manager_time"]
    rows = [
        (
            "requests finished",
            f"{requests['finished']:,} of {requests['arrived']:,} "
            f"({requests['ignored']:,} ignored, {requests['aborted']:,} aborted)",
        ),
        ("simulated time", _fmt(summary["simulated_s"], " s") + f" ({summary['steps']:,} steps)"),
        (
            "throughput",
            f"{summary['throughput']['output_tokens_per_s']:,.0f} output tok/s, "
            f"{summary['throughput']['total_tokens_per_s']:,.0f} total tok/s, "
            f"{summary['throughput']['requests_per_s']:.2f} req/s",
        ),
    ]
    rows.append(("load", load_line(summary)))
    for name, key, over in LATENCIES:
        p = summary[key]
        rows.append(
            (f"{name} p50/p90/p99", " / ".join(_fmt(p[q], " s") for q in ("p50", "p90", "p99")) + f" ({over(p)})")
        )
    slo = summary.get("slo")
    if slo is not None:
        rows.append(
            (
                f"SLO {slo['text']}",
                f"met by {slo['met']:,} of {slo['of']:,} requests ({slo['attainment']:.1%}; ignored, aborted and "
                f"unfinished ones miss it), goodput {slo['goodput_requests_per_s']:.2f} req/s",
            )
        )
    if cache["enabled"]:
        rows.append(
            (
                "prefix-cache hit rate",
                f"{cache['gpu_block_hit_rate']:.1%} of full-block lookups, "
                f"{cache['prefill_tokens_from_cache']:.1%} of prefill tokens",
            )
        )
    else:
        rows.append(("prefix-cache hit rate", "caching off"))
    rows += [
        ("preemptions", f"{pre['recompute']:,} recompute, {pre['swap_out']:,} swap out / {pre['swap_in']:,} swap in"),
        ("swap volume", f"{pre['blocks_swapped_out']:,} blocks out, {pre['blocks_swapped_in']:,} blocks in"),
        (
            "KV usage peak / mean",
            f"{kv['peak_usage']:.1%} / {kv['mean_usage']:.1%} of {kv['num_gpu_blocks']:,} "
            f"GPU blocks ({kv['peak_used_blocks']:,} peak)",
        ),
        (
            "wall time in the manager / step",
            f"mean {cpu['per_step_mean_us']:,.1f} us, "
            f"p99 {cpu['per_step_p99_us']:,.1f} us (total {cpu['total_s']:.2f} s, {cpu['calls']:,} calls)"
            if summary["engine"] == "python"
            else COMPILED_MANAGER_TIME,
        ),
        (
            "manager start-up",
            _fmt(summary["manager_startup_s"], " s")
            + (" (warm-up, not in the figures above)" if summary["engine"] == "python" else COMPILED_STARTUP),
        ),
        ("wall time", _fmt(summary["wall_s"], " s") + (RECORDED if summary["tables_recorded"] else ALONE)),
    ]
    return rows


def run_name(summary: dict[str, Any]) -> str:
    """A run's manager class and engine, short: ``FastBlockSpaceManager (compiled)``."""
    return f"{summary['manager'].rsplit('.', 1)[-1]} ({summary['engine']})"


def format_summary(summary: dict[str, Any]) -> str:
    rows = summary_rows(summary)
    width = max(len(label) for label, _ in rows)
    lines = [f"manager: {summary['manager']}, {summary['engine']} engine"]
    lines += [f"  {label:<{width}}  {value}" for label, value in rows]
    return "\n".join(lines + fleet_lines(summary))


def fleet_lines(summary: dict[str, Any]) -> list[str]:
    """A fleet's router, then a line per replica (none for one engine)."""
    fleet = summary.get("fleet")
    if not fleet:
        return []
    weight = f" (weight {fleet['router_weight']:g})" if fleet["router"] == "kv_aware" else ""
    lines = [f"fleet: {fleet['replicas']} replicas, router {fleet['router']}{weight}; the figures above are the "
             "fleet's (KV usage: per replica, the fullest one's peak)"]  # fmt: skip
    header = ("replica", "requests", "finished", "TTFT p50", "e2e p50", "hit rate", "KV peak", "preempted", "load")
    table = [header]
    for k, (each, count) in enumerate(zip(fleet["each"], fleet["requests_per_replica"], strict=True)):
        pre = each["preemption"]
        table.append((
            str(k), f"{count:,}", f"{each['requests']['finished']:,}", _fmt(each["ttft_s"]["p50"], " s"),
            _fmt(each["e2e_latency_s"]["p50"], " s"), f"{each['prefix_cache']['gpu_block_hit_rate']:.1%}",
            f"{each['kv_cache']['peak_usage']:.1%}", f"{pre['recompute'] + pre['swap_out']:,}",
            "SATURATED" if each["load"]["saturated"] else "keeps up",
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines += ["  " + "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in table]
    return lines


def format_comparison(summaries: list[dict[str, Any]]) -> str:
    """The runs side by side, with the ratio of the wall time inside the
    managers (of the whole replays, where an engine is compiled)."""
    names = [run_name(s) for s in summaries]
    table = [summary_rows(s) for s in summaries]
    width = max(len(label) for label, _ in table[0])
    column = max(max(len(value) for _, value in rows) for rows in table)
    column = min(column, 60)
    lines = [f"  {'':<{width}}  " + "  ".join(f"{name:<{column}}" for name in names)]
    for index, (label, _) in enumerate(table[0]):
        values = [rows[index][1] for rows in table]
        lines.append(f"  {label:<{width}}  " + "  ".join(f"{value:<{column}}" for value in values))
    key: tuple[str, ...]
    if all(summary["engine"] == "python" for summary in summaries):
        what, key = "inside the manager", ("manager_time", "total_s")
    else:  # a compiled step does not time its manager calls apart
        what, key = "of the replay", ("wall_s",)
    base = _read(summaries[0], key)
    for name, summary in zip(names[1:], summaries[1:]):
        other = _read(summary, key)
        ratio = base / other if other > 0 else float("inf")
        lines.append(f"  wall time {what} {names[0]} / {name}: {ratio:.2f}x (table recording included)")
    return "\n".join(lines)


def _read(summary: dict[str, Any], key: tuple[str, ...]) -> float:
    value: Any = summary
    for part in key:
        value = value[part]
    return float(value)


def first_difference(a: list[StepRecord], b: list[StepRecord]) -> str | None:
    """Where two runs' decisions part, in words (None if they never do)."""
    for left, right in zip(a, b):
        if left != right:
            fields = [f.name for f in dataclasses.fields(StepRecord) if getattr(left, f.name) != getattr(right, f.name)]
            detail = "; ".join(f"{name}: {getattr(left, name)!r} != {getattr(right, name)!r}" for name in fields)
            return f"step {left.step}: {detail}"[:2000]
    if len(a) != len(b):
        return f"one run took {len(a)} steps, the other {len(b)}"
    return None


def _thin(values: Sequence[Any]) -> list[Any]:
    if len(values) <= MAX_TIMELINE_POINTS:
        return list(values)
    picks = np.linspace(0, len(values) - 1, MAX_TIMELINE_POINTS).astype(int)
    return [values[i] for i in picks]


def write_json(
    path: Path, results: list[SimulationResult], summaries: list[dict[str, Any]], extra: dict[str, Any]
) -> None:
    """Config, every summary figure, and the per-step series (thinned)."""
    timeline = results[0].metrics.timeline
    document = {
        "config": dataclasses.asdict(results[0].config),
        **extra,
        "runs": summaries,
        "timeline": {column.name: _thin(getattr(timeline, column.name)) for column in dataclasses.fields(timeline)},
        "manager_s_per_step": {s["manager"]: _thin(r.metrics.timeline.manager_s) for s, r in zip(summaries, results)},
    }
    write_text(path, json.dumps(document, indent=1, default=str))  # a swept path (--step-model) as text


__all__ = [
    "first_difference",
    "format_comparison",
    "format_summary",
    "percentiles",
    "summarize",
    "summary_rows",
    "warnings_for",
    "write_json",
]
