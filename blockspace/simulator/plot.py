"""The run over simulated time, as one PNG (matplotlib, Agg backend).

Four panels share the time axis: KV-cache usage (share of GPU blocks held
by sequences), the running/waiting/swapped queue lengths, the prefix-cache
hit rate (vLLM's GPU block metric, cumulative), and the real CPU time the
manager took per step (one line per manager when comparing). Long runs are
thinned to ``MAX_POINTS`` evenly spaced steps so plotting stays quick.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from blockspace.simulator.simulation import SimulationResult

MAX_POINTS = 20_000


def _picks(num_steps: int) -> np.ndarray:
    if num_steps <= MAX_POINTS:
        return np.arange(num_steps)
    return np.linspace(0, num_steps - 1, MAX_POINTS).astype(int)


def plot_runs(path: Path, results: list[SimulationResult]) -> None:
    """Write the plot of ``results[0]`` (and the manager time of every run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = results[0]
    timeline = first.timeline
    picks = _picks(len(timeline.time_s))
    time_s = np.asarray(timeline.time_s)[picks]
    figure, axes = plt.subplots(4, 1, figsize=(11, 10), sharex=True)

    used = np.asarray(timeline.kv_used_blocks, dtype=float)[picks] / first.config.num_gpu_blocks * 100
    axes[0].plot(time_s, used, color="tab:blue", linewidth=0.8)
    axes[0].set_ylabel("KV usage (% of GPU blocks)")
    axes[0].set_ylim(0, 105)

    for name, color in (("num_running", "tab:green"), ("num_waiting", "tab:orange"), ("num_swapped", "tab:red")):
        values = np.asarray(getattr(timeline, name))[picks]
        axes[1].plot(time_s, values, label=name.removeprefix("num_"), color=color, linewidth=0.8)
    axes[1].set_ylabel("requests")
    axes[1].legend(loc="upper left")

    if first.config.scheduler.enable_prefix_caching:
        axes[2].plot(time_s, np.asarray(timeline.hit_rate)[picks] * 100, color="tab:purple", linewidth=0.8)
    else:
        axes[2].text(0.5, 0.5, "prefix caching off", ha="center", va="center", transform=axes[2].transAxes)
    axes[2].set_ylabel("prefix-cache hit rate (%)")

    for result in results:
        manager_ms = np.asarray(result.timeline.manager_s)[picks] * 1e3
        name = result.manager_name.rsplit(".", 1)[-1]
        axes[3].plot(time_s, manager_ms, label=name, linewidth=0.6)
    axes[3].set_ylabel("manager CPU per step (ms)")
    axes[3].set_yscale("log")
    axes[3].legend(loc="upper left")
    axes[3].set_xlabel("simulated time (s)")

    figure.suptitle(f"blockspace simulate: {len(first.requests)} requests, {first.config.num_gpu_blocks:,} GPU blocks")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


__all__ = ["plot_runs"]
