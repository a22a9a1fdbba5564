"""The figures of a run in words and in a file: the summary's text form
(``summary.py`` makes the ``Summary``), the comparison of two runs, where
two runs' decisions part, and the JSON file.
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
from blockspace.simulator.summary import Cost, Disaggregation, Outages, Pool, Spread, Summary

MAX_TIMELINE_POINTS = 2000  # per-step series are thinned to this many points in the JSON


# What the wall-time row holds. A compared run records every step's block tables, CoW pairs
# and swap mappings to check the two runs against each other, and that recording takes time
# of its own, inside the manager (its table reads) and outside it: such a run is slower than
# the same run alone, and the row says so rather than pass it off as the replay alone.
COMPILED_MANAGER_TIME = "inside the compiled step, not timed apart (the wall time below is all of it)"
COMPILED_STARTUP = " (compiling the step, or loading it from Numba's cache; not in the figures above)"
ALONE = " (the replay alone: start-up, loading and reporting left out)"
RECORDED = " (the replay with every step's tables recorded for --compare: slower than a run alone)"


def warnings_for(summary: Summary) -> list[str]:
    """What makes a run's figures empty or misleading, in words."""
    requests = summary.requests
    if requests.arrived == 0:
        return ["the trace holds no requests: every figure is empty"]
    if requests.finished == 0:
        return [
            f"no request finished ({requests.ignored:,} ignored as too large for the GPU, "
            f"{requests.aborted:,} aborted): latency and throughput are empty"
        ]
    if requests.ignored + requests.aborted > requests.finished:
        return [f"most requests did not run ({requests.ignored:,} ignored, {requests.aborted:,} aborted)"]
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


# The latency lines of the summary: label, the figure, and what it is over.
LATENCIES: tuple[tuple[str, Any, Any], ...] = (
    ("TTFT", lambda s: s.ttft_s, lambda p: f"{p.count:,} finished requests"),
    ("TPOT", lambda s: s.tpot_s, lambda p: f"{p.count:,} finished requests"),
    ("ITL", lambda s: s.itl_s, lambda p: f"{p.count:,} gaps between tokens"),
    ("end-to-end latency", lambda s: s.e2e_latency_s, lambda p: f"{p.count:,} finished requests"),
)


def load_line(summary: Summary) -> str:
    """The load in one line, saying plainly when the run is saturated."""
    load = summary.load
    offered, served = load.offered_requests_per_s, load.served_requests_per_s
    rates = f"{'-' if offered is None else f'{offered:.3g}'} req/s offered, {served:.3g} req/s served"
    queue = f"{load.waiting_at_last_arrival:,} of {load.queued_requests:,} requests waiting when the last arrived"
    if load.saturated:
        return f"SATURATED: {rates}; {queue} (peak {load.peak_waiting:,}): latencies measure the queue"
    return f"{rates}; {queue} (peak {load.peak_waiting:,})"


def _spread_line(p: Spread) -> str:
    return " / ".join(_fmt(q, " s") for q in (p.p50, p.p90, p.p99))


def summary_rows(summary: Summary) -> list[tuple[str, str]]:
    """(label, value) lines of the text summary."""
    requests, cache, pre, kv, cpu = (
        summary.requests, summary.prefix_cache, summary.preemption, summary.kv_cache, summary.manager_time
    )  # fmt: skip
    throughput, python = summary.throughput, summary.engine == "python"
    rows = [
        (
            "requests finished",
            f"{requests.finished:,} of {requests.arrived:,} "
            f"({requests.ignored:,} ignored, {requests.aborted:,} aborted)",
        ),
        ("simulated time", _fmt(summary.simulated_s, " s") + f" ({summary.steps:,} steps)"),
        ("clock", summary.clock),
        (
            "throughput",
            f"{throughput.output_tokens_per_s:,.0f} output tok/s, {throughput.total_tokens_per_s:,.0f} total tok/s, "
            f"{throughput.requests_per_s:.2f} req/s",
        ),
        ("load", load_line(summary)),
    ]
    for name, figure, over in LATENCIES:
        rows.append((f"{name} p50/p90/p99", f"{_spread_line(figure(summary))} ({over(figure(summary))})"))
    slo = summary.slo
    if slo is not None:
        rows.append(
            (
                f"SLO {slo.text}",
                f"met by {slo.met:,} of {slo.of:,} requests ({slo.attainment:.1%}; ignored, aborted and "
                f"unfinished ones miss it), goodput {slo.goodput_requests_per_s:.2f} req/s",
            )
        )
    if summary.failures is not None:
        rows += failure_rows(summary.failures, requests.arrived)
    if summary.disaggregation is not None:
        rows += disaggregation_rows(summary.disaggregation)
    hits = (
        f"{cache.gpu_block_hit_rate:.1%} of full-block lookups, {cache.prefill_tokens_from_cache:.1%} of prefill tokens"
    )
    rows += [
        ("prefix-cache hit rate", hits if cache.enabled else "caching off"),
        ("preemptions", f"{pre.recompute:,} recompute, {pre.swap_out:,} swap out / {pre.swap_in:,} swap in"),
        ("swap volume", f"{pre.blocks_swapped_out:,} blocks out, {pre.blocks_swapped_in:,} blocks in"),
        (
            "KV usage peak / mean",
            f"{kv.peak_usage:.1%} / {kv.mean_usage:.1%} of {kv.num_gpu_blocks:,} "
            f"GPU blocks ({kv.peak_used_blocks:,} peak)",
        ),
        (
            "wall time in the manager / step",
            f"mean {cpu.per_step_mean_us:,.1f} us, "
            f"p99 {cpu.per_step_p99_us:,.1f} us (total {cpu.total_s:.2f} s, {cpu.calls:,} calls)"
            if python
            else COMPILED_MANAGER_TIME,
        ),
        (
            "manager start-up",
            _fmt(summary.manager_startup_s, " s")
            + (" (warm-up, not in the figures above)" if python else COMPILED_STARTUP),
        ),
        ("wall time", _fmt(summary.wall_s, " s") + (RECORDED if summary.tables_recorded else ALONE)),
    ]
    if summary.cost is not None:
        rows.append(("cost", cost_line(summary.cost)))
    return rows


def cost_line(cost: Cost) -> str:
    """The price in one line: per million output tokens, and in all."""
    per_million = "-" if cost.dollars_per_million_output_tokens is None else \
        f"${cost.dollars_per_million_output_tokens:,.2f}"  # fmt: skip
    return (f"{per_million} per million output tokens; ${cost.dollars:,.2f} for {cost.gpu_hours:,.3f} GPU-hours "
            f"({cost.gpus} GPUs at ${cost.dollars_per_gpu_hour:g} an hour)")  # fmt: skip


def run_name(summary: Summary) -> str:
    """A run's manager class and engine, short: ``FastBlockSpaceManager (compiled)``."""
    return f"{summary.manager.rsplit('.', 1)[-1]} ({summary.engine})"


def format_summary(summary: Summary) -> str:
    rows = summary_rows(summary)
    width = max(len(label) for label, _ in rows)
    lines = [f"manager: {summary.manager}, {summary.engine} engine"]
    lines += [f"  {label:<{width}}  {value}" for label, value in rows]
    return "\n".join(lines + fleet_lines(summary))


def disaggregation_rows(split: Disaggregation) -> list[tuple[str, str]]:
    """Prefill and decode apart: each pool's busy share, KV usage and hit rate, and the link."""

    def pool(figures: Pool) -> str:
        return (f"{figures.replicas:,} replica(s), busy {figures.utilisation:.1%} of the time, KV"
                f" {figures.mean_kv_usage:.1%} used while busy, hit rate {figures.hit_rate:.1%}")  # fmt: skip

    moved = split.transfer_s
    return [
        ("prefill pool", pool(split.prefill)),
        ("decode pool", pool(split.decode)),
        ("KV link", f"{split.kv_link_gbps:g} Gb/s: {split.gigabytes_moved:,.1f} GB moved, each request's transfer"
                    f" {_spread_line(moved)} (p50/p90/p99)"),
    ]  # fmt: skip


def failure_rows(failures: Outages, arrived: int) -> list[tuple[str, str]]:
    """What ``--fail`` did: the outages, the requests lost and sent again, the SLO during and outside them."""
    rows = [
        ("failures", ", ".join(failures.outages)),
        ("lost and retried", f"{failures.affected:,} requests lost by a failed replica, {failures.retries:,} sends"
                             f" again; {failures.arrived_during:,} of {arrived:,} arrived while one was down"),
    ]  # fmt: skip
    during, outside = failures.slo_during, failures.slo_outside
    if during is not None and outside is not None:
        rows.append(("SLO during / outside", f"{during.attainment:.1%} of {during.of:,} / {outside.attainment:.1%} of"
                                             f" {outside.of:,} requests"))  # fmt: skip
    return rows


def fleet_lines(summary: Summary) -> list[str]:
    """A fleet's router, then a line per replica (none for one engine)."""
    fleet = summary.fleet
    if not fleet:
        return []
    weight = f" (weight {fleet.router_weight:g})" if fleet.router == "kv_aware" else ""
    lines = [f"fleet: {fleet.replicas} replicas, router {fleet.router}{weight}; the figures above are the "
             "fleet's (KV usage: per replica, the fullest one's peak)"]  # fmt: skip
    header = ("replica", "requests", "finished", "TTFT p50", "e2e p50", "hit rate", "KV peak", "preempted", "load")
    table = [header]
    split = summary.disaggregation.prefill.replicas if summary.disaggregation is not None else 0
    names = [str(k) if not split else f"prefill {k}" if k < split else f"decode {k - split}"
             for k in range(len(fleet.each))]  # fmt: skip
    for name, each, count in zip(names, fleet.each, fleet.requests_per_replica, strict=True):
        table.append((
            name, f"{count:,}", f"{each.requests.finished:,}", _fmt(each.ttft_s.p50, " s"),
            _fmt(each.e2e_latency_s.p50, " s"), f"{each.prefix_cache.gpu_block_hit_rate:.1%}",
            f"{each.kv_cache.peak_usage:.1%}", f"{each.preemption.recompute + each.preemption.swap_out:,}",
            "SATURATED" if each.load.saturated else "keeps up",
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines += ["  " + "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in table]
    return lines


def format_comparison(summaries: list[Summary]) -> str:
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
    if all(summary.engine == "python" for summary in summaries):
        what, seconds = "inside the manager", [summary.manager_time.total_s for summary in summaries]
    else:  # a compiled step does not time its manager calls apart
        what, seconds = "of the replay", [summary.wall_s for summary in summaries]
    base = seconds[0]
    for name, other in zip(names[1:], seconds[1:]):
        ratio = base / other if other > 0 else float("inf")
        lines.append(f"  wall time {what} {names[0]} / {name}: {ratio:.2f}x (table recording included)")
    return "\n".join(lines)


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


def write_json(path: Path, results: list[SimulationResult], summaries: list[Summary], extra: dict[str, Any]) -> None:
    """Config, every summary figure, and the per-step series (thinned)."""
    timeline = results[0].metrics.timeline
    document = {
        "config": dataclasses.asdict(results[0].config),
        **extra,
        "runs": [summary.to_json() for summary in summaries],
        "timeline": {column.name: _thin(getattr(timeline, column.name)) for column in dataclasses.fields(timeline)},
        "manager_s_per_step": {s.manager: _thin(r.metrics.timeline.manager_s) for s, r in zip(summaries, results)},
    }
    write_text(path, json.dumps(document, indent=1, default=str))  # a swept path (--step-model) as text


__all__ = [
    "first_difference",
    "format_comparison",
    "format_summary",
    "summary_rows",
    "warnings_for",
    "write_json",
]
