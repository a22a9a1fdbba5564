"""A run as one PNG (matplotlib, Agg backend).

Four panels share the simulated time axis:

* KV-cache usage (% of the GPU blocks held by sequences);
* the running, waiting and swapped queue lengths;
* the prefix-cache hit rate since the start (vLLM's GPU block metric, which
  is cumulative), in %;
* the wall time spent inside the manager per step (one line per manager
  when comparing), after the warm-up, where the Python engine timed one
  engine's steps; else (the compiled engine inlines the manager's calls,
  and a fleet's replicas step apart) the tokens computed per simulated
  second, which every run knows.

A fleet's replicas each step on their own clock, so their steps, merged in
time order, alternate between replicas: drawn as one line, every panel
would saw between them. Its figure draws the fleet instead (``FleetSeries``),
each replica's state held from its step's end until its next: the queues
summed, KV usage as the mean over the replicas with the emptiest and the
fullest as a band, and the fleet's hit rate (the replicas' weighted by the
prompt tokens each admitted, as the summary's) with the lowest and highest
replica's as a band.

Below them, the latency of the requests as cumulative distributions: TTFT
and end-to-end latency in seconds, TPOT and ITL in milliseconds (their
scales differ a thousandfold). A distribution reads well with a few dozen
requests, where percentiles per time bin were mostly empty bins; the
legend says how many requests (or gaps) each curve is over, and the panel
title how many requests finished, were ignored or aborted.

The title says what ran: manager, block size, GPU blocks, caching, trace,
and a fleet's replicas and router.
Long runs are thinned to ``MAX_POINTS`` evenly spaced steps so plotting
stays quick.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from blockspace.outputs import replacing
from blockspace.simulator.metrics import Timeline
from blockspace.simulator.runs import SimulationResult
from blockspace.simulator.slo import SLO

MAX_POINTS = 20_000
RATE_BINS = 100  # the tokens-per-second panel's time bins, at most


def _picks(num_steps: int) -> np.ndarray:
    if num_steps <= MAX_POINTS:
        return np.arange(num_steps)
    return np.linspace(0, num_steps - 1, MAX_POINTS).astype(int)


def latency_samples(result: SimulationResult) -> dict[str, np.ndarray]:
    """Per finished trace request its TTFT, TPOT and end-to-end latency
    (seconds), and every inter-token gap (``itl``, over all requests, as in
    the summary)."""
    finished = [r for r in result.metrics.outcomes() if r.status == "finished"]
    return {
        "ttft": np.array([r.ttft_s for r in finished if r.ttft_s is not None]),
        "tpot": np.array([r.tpot_s for r in finished if r.tpot_s is not None]),
        "e2e": np.array([r.e2e_s for r in finished if r.e2e_s is not None]),
        "itl": np.asarray(result.metrics.itl_s, dtype=float),
    }


def cdf(values: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF as a step curve: sorted values and the % of values
    at or below each (from 0 % at the smallest). Over ``MAX_POINTS`` values
    (a long run's ITL has millions) it keeps evenly spaced ranks, the
    largest among them, so plotting stays quick and the shape is the same."""
    xs = np.sort(np.asarray(values, dtype=float))
    shares = np.arange(1, xs.size + 1) / xs.size * 100
    if xs.size > MAX_POINTS:
        keep = np.linspace(0, xs.size - 1, MAX_POINTS).astype(int)
        xs, shares = xs[keep], shares[keep]
    return np.concatenate([xs[:1], xs]), np.concatenate([[0.0], shares])


def title_of(result: SimulationResult, trace_label: str) -> str:
    config = result.config
    caching = "prefix caching on" if config.scheduler.enable_prefix_caching else "prefix caching off"
    num_requests = len(result.metrics.outcomes())  # trace requests, not their samples
    manager = result.manager_name.rsplit(".", 1)[-1]
    blocks = f"{config.num_gpu_blocks:,} GPU blocks"
    if result.replicas:
        weight = f" (weight {config.router_weight:g})" if config.router == "kv_aware" else ""
        manager, blocks = f"{manager}, {len(result.replicas)} replicas, {config.router}{weight}", blocks + " each"
    return (
        f"{manager}: block size {config.scheduler.block_size}, {blocks}, {caching}\n"
        f"{num_requests:,} requests of {trace_label}"
    )


class FleetSeries(NamedTuple):
    """A fleet over time, at ``time_s`` (its steps' end times, thinned to
    ``MAX_POINTS``): each replica's state is its latest step's, and nothing
    before its first. KV usage in % of a replica's GPU blocks, hit rates in
    %; the hit band is over the replicas that had admitted a prompt (NaN
    where none had)."""

    time_s: np.ndarray
    kv_mean: np.ndarray
    kv_low: np.ndarray
    kv_high: np.ndarray
    running: np.ndarray  # summed over the replicas, as are the next two
    waiting: np.ndarray
    swapped: np.ndarray
    hit_rate: np.ndarray  # the fleet's: each replica's weighted by the prompt tokens it admitted
    hit_low: np.ndarray
    hit_high: np.ndarray


def fleet_series(fleet: SimulationResult) -> FleetSeries:
    """``FleetSeries`` of a fleet's result (its ``replicas``), one replica
    at a time so that a thousand replicas cost a thousand passes over the
    times, not a thousand copies of them."""
    times = np.asarray(fleet.metrics.timeline.time_s)
    times = times[_picks(len(times))]
    sums = {name: np.zeros(len(times)) for name in ("kv", "running", "waiting", "swapped", "hits", "admitted")}
    kv_low, kv_high = np.full(len(times), np.inf), np.full(len(times), -np.inf)
    hit_low, hit_high = kv_low.copy(), kv_high.copy()
    for replica in fleet.replicas:
        timeline = replica.metrics.timeline
        at = np.searchsorted(np.asarray(timeline.time_s), times, side="right") - 1  # its latest step by then
        kv = held(timeline, "kv_used_blocks", at) / fleet.config.num_gpu_blocks * 100
        rate, admitted = held(timeline, "hit_rate", at) * 100, held(timeline, "prefill_tokens_admitted", at)
        sums["kv"] += kv
        for name in ("running", "waiting", "swapped"):
            sums[name] += held(timeline, f"num_{name}", at)
        sums["hits"] += rate * admitted
        sums["admitted"] += admitted
        np.minimum(kv_low, kv, out=kv_low)
        np.maximum(kv_high, kv, out=kv_high)
        np.minimum(hit_low, np.where(admitted > 0, rate, np.inf), out=hit_low)
        np.maximum(hit_high, np.where(admitted > 0, rate, -np.inf), out=hit_high)
    admitted = sums["admitted"]
    hit_rate = np.divide(sums["hits"], admitted, out=np.zeros(len(times)), where=admitted > 0)
    return FleetSeries(
        times, sums["kv"] / max(len(fleet.replicas), 1), kv_low, kv_high, sums["running"], sums["waiting"],
        sums["swapped"], hit_rate, np.where(admitted > 0, hit_low, np.nan), np.where(admitted > 0, hit_high, np.nan),
    )  # fmt: skip


def held(timeline: Timeline, column: str, at: np.ndarray) -> np.ndarray:
    """``column`` of ``timeline`` at the steps ``at`` (-1: before the first step, 0)."""
    values = np.asarray(getattr(timeline, column), dtype=float)
    return np.where(at >= 0, values[np.maximum(at, 0)], 0.0) if values.size else np.zeros(len(at))


def tokens_per_second(timeline: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """The tokens computed (prefill and decode, cache hits left out) per
    simulated second, in up to ``RATE_BINS`` equal bins from the first
    step's start to the last step's end, each step counted in the bin it
    ends in: (the bins' edges, the rate in each). A fleet's merged timeline
    gives the fleet's, its steps' order not mattering to a sum."""
    ends = np.asarray(timeline.time_s)
    if not ends.size:
        return np.zeros(1), np.zeros(0)
    start = float(np.min(ends - np.asarray(timeline.step_s)))
    edges = np.linspace(start, max(float(ends.max()), start + 1e-9), min(RATE_BINS, ends.size) + 1)
    tokens, _ = np.histogram(ends, edges, weights=np.asarray(timeline.num_batched_tokens, dtype=float))
    return edges, tokens / np.diff(edges)


def _counts_line(result: SimulationResult) -> str:
    """What the latency panels are over: the finished requests, with those
    that did not finish counted."""
    outcomes = result.metrics.outcomes()
    count = {status: sum(r.status == status for r in outcomes) for status in ("finished", "ignored", "aborted")}
    return (
        f"latency CDFs: {count['finished']:,} of {len(outcomes):,} requests finished ({count['ignored']:,} ignored, "
        f"{count['aborted']:,} aborted); TTFT, TPOT and end-to-end are over the finished ones"
    )


QUEUES = (("num_running", "tab:green"), ("num_waiting", "tab:orange"), ("num_swapped", "tab:red"))


class CDFPanel(NamedTuple):
    """One of the latency panels: its x label, its unit in seconds, whether
    its x axis is symlog, and its curves: (sample, label, colour, what the
    sample counts)."""

    xlabel: str
    unit_s: float
    symlog: bool
    curves: tuple[tuple[str, str, str, str], ...]


# TPOT and ITL have long tails (a preempted request waits seconds between two tokens, most
# gaps are milliseconds), so their axis is symlog: linear up to 1 ms, so that zeros (a
# one-token output's TPOT) still show, logarithmic above.
CDF_PANELS = (
    CDFPanel(
        "latency (s)",
        1.0,
        False,
        (("ttft", "TTFT", "tab:cyan", "requests"), ("e2e", "end-to-end", "tab:brown", "requests")),
    ),
    CDFPanel(
        "latency (ms; log scale above 1 ms)",
        1e-3,
        True,
        (("tpot", "TPOT", "tab:olive", "requests"), ("itl", "ITL", "tab:gray", "gaps")),
    ),
)


def _plot_cdfs(axis: Any, samples: dict[str, np.ndarray], panel: CDFPanel, bounds: dict[str, float]) -> None:
    """The panel's curves, and each of ``bounds`` (``--slo``'s, in seconds
    by sample name) as a dashed vertical in its curve's colour: where the
    curve crosses it is the share of requests within that bound."""
    from matplotlib.ticker import FuncFormatter

    drawn = False
    for name, label, color, over in panel.curves:
        values = samples[name]
        if values.size:
            xs, ys = cdf(values / panel.unit_s)
            axis.step(xs, ys, where="post", color=color, linewidth=1.2, label=f"{label} ({values.size:,} {over})")
            drawn = True
        if name in bounds:
            bound, unit = bounds[name] / panel.unit_s, "s" if panel.unit_s == 1 else "ms"
            axis.axvline(bound, color=color, linestyle="--", linewidth=1, label=f"SLO {label} <= {bound:g} {unit}")
    if axis.get_legend_handles_labels()[0]:
        axis.legend(loc="best", fontsize=8)
    if not drawn:
        axis.text(0.5, 0.5, "no request finished", ha="center", va="center", transform=axis.transAxes)
    if panel.symlog:
        axis.set_xscale("symlog", linthresh=1)
        axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # 1000, not 10^3
    axis.set_xlim(left=0)
    axis.set_ylim(0, 100)
    axis.set_yticks([0, 25, 50, 75, 90, 100])
    axis.grid(alpha=0.3)
    axis.set_xlabel(panel.xlabel)
    axis.set_ylabel("% at or below")


def _one_over_time(result: SimulationResult, kv: Any, queues: Any, hits: Any) -> None:
    """One engine's state after each of its steps."""
    timeline = result.metrics.timeline
    picks = _picks(len(timeline.time_s))
    time_s = np.asarray(timeline.time_s)[picks]
    used = np.asarray(timeline.kv_used_blocks, dtype=float)[picks] / result.config.num_gpu_blocks * 100
    kv.plot(time_s, used, color="tab:blue", linewidth=0.8)
    for name, color in QUEUES:
        values = np.asarray(getattr(timeline, name))[picks]
        queues.plot(time_s, values, label=name.removeprefix("num_"), color=color, linewidth=0.8)
    queues.set_ylabel("requests")
    if result.config.scheduler.enable_prefix_caching:
        label = f"final {result.metrics.final_hit_rate:.1%}"
        hits.plot(time_s, np.asarray(timeline.hit_rate)[picks] * 100, color="tab:purple", linewidth=0.8, label=label)
        hits.legend(loc="upper right")


def _fleet_over_time(fleet: SimulationResult, kv: Any, queues: Any, hits: Any) -> None:
    """A fleet's state (``FleetSeries``): its totals, and its replicas' spread as bands."""
    series, count = fleet_series(fleet), len(fleet.replicas)
    time_s = series.time_s
    kv.fill_between(time_s, series.kv_low, series.kv_high, color="tab:blue", alpha=0.25, linewidth=0,
                    label="emptiest to fullest replica")  # fmt: skip
    kv.plot(time_s, series.kv_mean, color="tab:blue", linewidth=0.8, label=f"mean of the {count} replicas")
    kv.legend(loc="upper left")
    for name, color in QUEUES:
        label = name.removeprefix("num_")
        queues.plot(time_s, getattr(series, label), label=label, color=color, linewidth=0.8)
    queues.set_ylabel(f"requests, summed\nover the {count} replicas")
    if fleet.config.scheduler.enable_prefix_caching:
        hits.fill_between(time_s, series.hit_low, series.hit_high, color="tab:purple", alpha=0.2, linewidth=0,
                          label="lowest to highest replica")  # fmt: skip
        label = f"the fleet's (prompt tokens weighted), final {fleet.metrics.final_hit_rate:.1%}"
        hits.plot(time_s, series.hit_rate, color="tab:purple", linewidth=0.8, label=label)
        hits.legend(loc="upper right")


def _manager_time(axis: Any, timed: list[SimulationResult]) -> None:
    """The wall time inside the manager at each step, a line per run."""
    for result in timed:
        timeline = result.metrics.timeline
        picks = _picks(len(timeline.time_s))
        manager_ms = np.asarray(timeline.manager_s)[picks] * 1e3
        name = result.manager_name.rsplit(".", 1)[-1]
        axis.plot(np.asarray(timeline.time_s)[picks], manager_ms, label=name, linewidth=0.6)
    axis.set_ylabel("wall time inside the\nmanager per step (ms)")
    axis.set_yscale("log")
    axis.legend(loc="upper left")


def _tokens_per_second(axis: Any, timeline: Timeline) -> None:
    """``tokens_per_second`` as stairs, on a log scale: a bin with a prompt
    computes tens of times the tokens of one that only decodes, and both
    should show (a bin where nothing ran drops off the bottom)."""
    edges, rates = tokens_per_second(timeline)
    width = f"{edges[1] - edges[0]:.3g} s" if rates.size else "no step"
    axis.stairs(rates, edges, color="tab:gray", label=f"prefill + decode, cache hits left out; bins of {width}")
    axis.set_ylabel("tokens computed per\nsimulated second")
    if rates.any():
        axis.set_yscale("log")
        axis.set_ylim(max(float(rates[rates > 0].min()) / 2, 1), float(rates.max()) * 5)  # room for the legend
    axis.legend(loc="upper left")


def run_figure(results: list[SimulationResult], trace_label: str = "the trace", slo: SLO | None = None) -> Any:
    """The figure of ``plot_runs``: ``results[0]`` over time and its latency
    CDFs (with ``slo``'s bounds marked on them), with the manager time of
    every run the Python engine timed one engine of."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = results[0]
    figure = plt.figure(figsize=(11, 15.5), layout="constrained")
    over_time, latency = figure.subfigures(2, 1, squeeze=False, height_ratios=(4, 1.5))[:, 0]
    kv, queues, hits, last = over_time.subplots(4, 1, sharex=True)
    (_fleet_over_time if first.replicas else _one_over_time)(first, kv, queues, hits)
    kv.set_ylabel("KV usage\n(% of GPU blocks)")
    kv.set_ylim(0, 100)
    queues.set_ylim(bottom=0)
    queues.legend(loc="upper left")
    if not first.config.scheduler.enable_prefix_caching:
        hits.text(0.5, 0.5, "prefix caching off", ha="center", va="center", transform=hits.transAxes)
    hits.set_ylabel("prefix-cache hit rate\n(%, cumulative)")
    hits.set_ylim(0, 100)
    timed = [result for result in results if result.config.engine == "python"]  # compiled: not timed apart
    if timed and not first.replicas:
        _manager_time(last, timed)
    else:
        _tokens_per_second(last, first.metrics.timeline)
    last.set_xlabel("simulated time (s)")

    samples = latency_samples(first)
    bounds = {} if slo is None else slo.bounds()
    for axis, panel in zip(latency.subplots(1, 2), CDF_PANELS):
        _plot_cdfs(axis, samples, panel, bounds)
    latency.suptitle(_counts_line(first), fontsize=11)

    figure.suptitle(title_of(first, trace_label))
    return figure


def plot_runs(
    path: Path, results: list[SimulationResult], trace_label: str = "the trace", slo: SLO | None = None
) -> None:
    """Write ``run_figure`` as a PNG."""
    import matplotlib.pyplot as plt

    figure = run_figure(results, trace_label, slo)
    with replacing(path) as partial:
        figure.savefig(partial, dpi=110)
    plt.close(figure)


__all__ = ["FleetSeries", "cdf", "fleet_series", "latency_samples", "plot_runs", "run_figure", "title_of",
           "tokens_per_second"]  # fmt: skip
