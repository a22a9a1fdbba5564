"""A run as one PNG (matplotlib, Agg backend).

Four panels share the simulated time axis:

* KV-cache usage (% of the GPU blocks held by sequences);
* the running, waiting and swapped queue lengths;
* the prefix-cache hit rate since the start (vLLM's GPU block metric, which
  is cumulative), in %;
* the wall time spent inside the manager per step (one line per manager
  when comparing), after the warm-up.

Below them, the latency of the requests as cumulative distributions: TTFT
and end-to-end latency in seconds, TPOT and ITL in milliseconds (their
scales differ a thousandfold). A distribution reads well with a few dozen
requests, where percentiles per time bin were mostly empty bins; the
legend says how many requests (or gaps) each curve is over, and the panel
title how many requests finished, were ignored or aborted.

The title says what ran: manager, block size, GPU blocks, caching, trace.
Long runs are thinned to ``MAX_POINTS`` evenly spaced steps so plotting
stays quick.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from blockspace.simulator.simulation import SimulationResult
from blockspace.simulator.slo import SLO

MAX_POINTS = 20_000


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
    return (
        f"{result.manager_name.rsplit('.', 1)[-1]}: block size {config.scheduler.block_size}, "
        f"{config.num_gpu_blocks:,} GPU blocks, {caching}\n{num_requests:,} requests of {trace_label}"
    )


def _counts_line(result: SimulationResult) -> str:
    """What the latency panels are over: the finished requests, with those
    that did not finish counted."""
    outcomes = result.metrics.outcomes()
    count = {status: sum(r.status == status for r in outcomes) for status in ("finished", "ignored", "aborted")}
    return (
        f"latency CDFs: {count['finished']:,} of {len(outcomes):,} requests finished ({count['ignored']:,} ignored, "
        f"{count['aborted']:,} aborted); TTFT, TPOT and end-to-end are over the finished ones"
    )


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


def run_figure(results: list[SimulationResult], trace_label: str = "the trace", slo: SLO | None = None) -> Any:
    """The figure of ``plot_runs``: ``results[0]`` over time and its latency
    CDFs (with ``slo``'s bounds marked on them), with the manager time of
    every run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = results[0]
    timeline = first.metrics.timeline
    picks = _picks(len(timeline.time_s))
    time_s = np.asarray(timeline.time_s)[picks]
    figure = plt.figure(figsize=(11, 15.5), layout="constrained")
    over_time, latency = figure.subfigures(2, 1, squeeze=False, height_ratios=(4, 1.5))[:, 0]
    kv, queues, hits, manager = over_time.subplots(4, 1, sharex=True)

    used = np.asarray(timeline.kv_used_blocks, dtype=float)[picks] / first.config.num_gpu_blocks * 100
    kv.plot(time_s, used, color="tab:blue", linewidth=0.8)
    kv.set_ylabel("KV usage\n(% of GPU blocks)")
    kv.set_ylim(0, 100)

    for name, color in (("num_running", "tab:green"), ("num_waiting", "tab:orange"), ("num_swapped", "tab:red")):
        values = np.asarray(getattr(timeline, name))[picks]
        queues.plot(time_s, values, label=name.removeprefix("num_"), color=color, linewidth=0.8)
    queues.set_ylabel("requests")
    queues.set_ylim(bottom=0)
    queues.legend(loc="upper left")

    if first.config.scheduler.enable_prefix_caching:
        label = f"final {first.metrics.final_hit_rate:.1%}"
        hits.plot(time_s, np.asarray(timeline.hit_rate)[picks] * 100, color="tab:purple", linewidth=0.8, label=label)
        hits.legend(loc="upper right")
    else:
        hits.text(0.5, 0.5, "prefix caching off", ha="center", va="center", transform=hits.transAxes)
    hits.set_ylabel("prefix-cache hit rate\n(%, cumulative)")
    hits.set_ylim(0, 100)

    timed = [result for result in results if result.config.engine == "python"]  # compiled: not timed apart
    for result in timed:
        manager_ms = np.asarray(result.metrics.timeline.manager_s)[picks] * 1e3
        name = result.manager_name.rsplit(".", 1)[-1]
        manager.plot(time_s, manager_ms, label=name, linewidth=0.6)
    manager.set_ylabel("wall time inside the\nmanager per step (ms)")
    if timed:
        manager.set_yscale("log")
        manager.legend(loc="upper left")
    else:
        manager.text(0.5, 0.5, "compiled engine: the manager's calls are inside the compiled step, not timed apart",
                     ha="center", va="center", transform=manager.transAxes)  # fmt: skip
    manager.set_xlabel("simulated time (s)")

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
    figure.savefig(path, dpi=110)
    plt.close(figure)


__all__ = ["cdf", "latency_samples", "plot_runs", "run_figure", "title_of"]
