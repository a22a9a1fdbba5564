"""A run over simulated time, as one PNG (matplotlib, Agg backend).

Five panels share the time axis:

* KV-cache usage (share of GPU blocks held by sequences);
* the running, waiting and swapped queue lengths;
* latency: TTFT and end-to-end p50 and p99 of the requests that finished in
  each time bin (a latency that climbs means the queue is building up);
* the prefix-cache hit rate since the start (vLLM's GPU block metric, which
  is cumulative);
* the wall time spent inside the manager per step (one line per manager
  when comparing), after the warm-up.

The title says what ran: manager, block size, GPU blocks, caching, trace.
Long runs are thinned to ``MAX_POINTS`` evenly spaced steps so plotting
stays quick.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from blockspace.simulator.simulation import SimulationResult

MAX_POINTS = 20_000
LATENCY_BINS = 60  # time bins of the latency panel


def _picks(num_steps: int) -> np.ndarray:
    if num_steps <= MAX_POINTS:
        return np.arange(num_steps)
    return np.linspace(0, num_steps - 1, MAX_POINTS).astype(int)


def latency_over_time(result: SimulationResult, num_bins: int = LATENCY_BINS) -> dict[str, np.ndarray]:
    """Per time bin (by finish time): its middle, and the TTFT and end-to-end
    p50/p99 of the requests that finished in it (NaN where none did)."""
    done = [
        (r.arrival_s, r.first_token_s, r.finish_s)
        for r in result.metrics.outcomes()  # per trace request, over its samples
        if r.finish_s is not None and r.first_token_s is not None
    ]
    if not done:
        return {}
    finish = np.array([finish_s for _, _, finish_s in done])
    ttft = np.array([first_s - arrival_s for arrival_s, first_s, _ in done])
    e2e = np.array([finish_s - arrival_s for arrival_s, _, finish_s in done])
    edges = np.linspace(finish.min(), finish.max() + 1e-9, num_bins + 1)
    which = np.clip(np.searchsorted(edges, finish, side="right") - 1, 0, num_bins - 1)
    curves = {"time_s": (edges[:-1] + edges[1:]) / 2}
    for name, values in (("ttft", ttft), ("e2e", e2e)):
        for q in (50, 99):
            curves[f"{name}_p{q}"] = np.array(
                [np.percentile(values[which == b], q) if (which == b).any() else np.nan for b in range(num_bins)]
            )
    return curves


def title_of(result: SimulationResult, trace_label: str) -> str:
    config = result.config
    caching = "prefix caching on" if config.scheduler.enable_prefix_caching else "prefix caching off"
    num_requests = len(result.metrics.outcomes())  # trace requests, not their samples
    return (
        f"{result.manager_name.rsplit('.', 1)[-1]}: block size {config.scheduler.block_size}, "
        f"{config.num_gpu_blocks:,} GPU blocks, {caching}\n{num_requests:,} requests of {trace_label}"
    )


def plot_runs(path: Path, results: list[SimulationResult], trace_label: str = "the trace") -> None:
    """Write the plot of ``results[0]`` (and the manager time of every run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = results[0]
    timeline = first.metrics.timeline
    picks = _picks(len(timeline.time_s))
    time_s = np.asarray(timeline.time_s)[picks]
    figure, axes = plt.subplots(5, 1, figsize=(11, 12.5), sharex=True)

    used = np.asarray(timeline.kv_used_blocks, dtype=float)[picks] / first.config.num_gpu_blocks * 100
    axes[0].plot(time_s, used, color="tab:blue", linewidth=0.8)
    axes[0].set_ylabel("KV usage\n(% of GPU blocks)")
    axes[0].set_ylim(0, 105)

    for name, color in (("num_running", "tab:green"), ("num_waiting", "tab:orange"), ("num_swapped", "tab:red")):
        values = np.asarray(getattr(timeline, name))[picks]
        axes[1].plot(time_s, values, label=name.removeprefix("num_"), color=color, linewidth=0.8)
    axes[1].set_ylabel("requests")
    axes[1].legend(loc="upper left")

    curves = latency_over_time(first)
    if curves:
        styles = {
            "ttft_p50": ("TTFT p50", "tab:cyan", "-"),
            "ttft_p99": ("TTFT p99", "tab:cyan", "--"),
            "e2e_p50": ("end-to-end p50", "tab:brown", "-"),
            "e2e_p99": ("end-to-end p99", "tab:brown", "--"),
        }
        for key, (label, color, line) in styles.items():
            axes[2].plot(curves["time_s"], curves[key], label=label, color=color, linestyle=line, linewidth=0.9)
        axes[2].legend(loc="upper left", ncol=2)
    else:
        axes[2].text(0.5, 0.5, "no request finished", ha="center", va="center", transform=axes[2].transAxes)
    axes[2].set_ylabel("latency (s)\nby finish time")

    if first.config.scheduler.enable_prefix_caching:
        axes[3].plot(time_s, np.asarray(timeline.hit_rate)[picks] * 100, color="tab:purple", linewidth=0.8)
    else:
        axes[3].text(0.5, 0.5, "prefix caching off", ha="center", va="center", transform=axes[3].transAxes)
    axes[3].set_ylabel("prefix-cache hit rate\n(%, cumulative)")

    for result in results:
        manager_ms = np.asarray(result.metrics.timeline.manager_s)[picks] * 1e3
        name = result.manager_name.rsplit(".", 1)[-1]
        axes[4].plot(time_s, manager_ms, label=name, linewidth=0.6)
    axes[4].set_ylabel("wall time inside the\nmanager per step (ms)")
    axes[4].set_yscale("log")
    axes[4].legend(loc="upper left")
    axes[4].set_xlabel("simulated time (s)")

    figure.suptitle(title_of(first, trace_label))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


__all__ = ["latency_over_time", "plot_runs", "title_of"]
