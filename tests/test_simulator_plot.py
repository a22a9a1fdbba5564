"""The simulator's plots, read through matplotlib's API rather than by
pixels: shares on 0-100 axes, counts from 0, no range around 0 for a
series that is all zero, the latency panels over the finished requests
and saying how many those are, and titles that say what ran."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest

from blockspace.interfaces import load_manager_class
from blockspace.simulator.plot import MAX_POINTS, cdf, latency_samples, run_figure, title_of
from blockspace.simulator.scheduler import SchedulerConfig
from blockspace.simulator.simulation import SimulationConfig, run_simulation
from blockspace.simulator.slo import SLO
from blockspace.simulator.sweep import sweep_figure, sweep_title
from blockspace.workloads import load_trace


def sweep_rows(with_slo: bool) -> list[dict]:
    """Three runs as ``headline_row`` gives them: the small pool ignores 9
    requests, no run preempts, shares close together."""
    rows = []
    for blocks, finished, ignored, hit, peak in (
        (2000, 91, 9, 4.7, 97.9),
        (4000, 97, 3, 4.0, 98.7),
        (8000, 100, 0, 3.3, 98.8),
    ):
        row = {"num_gpu_blocks": blocks, "finished": finished, "ignored": ignored, "aborted": 0}
        if with_slo:
            row |= {"slo_attainment_pct": finished / 4, "goodput_req_per_s": finished / 400}
        row |= {"ttft_p50_s": 30.0, "ttft_p99_s": 80.0, "e2e_p50_s": 35.0, "e2e_p99_s": 85.0}
        row |= {"output_tokens_per_s": 300.0, "hit_rate_pct": hit, "preemptions": 0, "peak_kv_use_pct": peak}
        rows.append(row)
    return rows


def panels(figure) -> dict:
    return {axis.get_title(): axis for axis in figure.axes}


def test_the_sweep_plot_puts_shares_on_0_to_100_and_counts_from_0():
    sweeps = [("num_gpu_blocks", [2000, 4000, 8000])]
    figure = sweep_figure(sweeps, sweep_rows(with_slo=True), "title")
    try:
        by_title = panels(figure)
        assert len(by_title) == 9
        for title, axis in by_title.items():
            assert axis.get_ylim()[0] == 0, title
            assert axis.get_xlabel() == "num_gpu_blocks"
        shares = [axis.get_ylim() for title, axis in by_title.items() if "%" in title]
        assert shares == [(0, 100)] * 3  # hit rate, peak KV use, SLO attainment
        counts = by_title["requests: finished, ignored, aborted"]
        assert counts.get_ylim()[1] >= 100 and [t.get_text() for t in counts.get_legend().get_texts()] == [
            "finished", "ignored", "aborted",
        ]  # fmt: skip
        assert all(tick == int(tick) for tick in counts.get_yticks())
        assert by_title["preemptions (recompute + swap out)"].get_ylim() == (0, 1)  # all zero: on the floor
        assert "TTFT (s), over finished requests" in by_title
        assert "end-to-end latency (s), over finished requests" in by_title
        assert {"SLO attainment (% of all requests)", "goodput (requests/s meeting the SLO)"} <= set(by_title)
        hit_rate = by_title["prefix-cache hit rate (% of full-block lookups)"]
        assert [text.get_text() for text in hit_rate.texts] == ["4.7", "4.0", "3.3"]  # on 0-100: values printed
        assert [tick.get_text() for tick in hit_rate.get_xticklabels()] == ["2,000", "4,000", "8,000"]
    finally:
        plt.close(figure)
    figure = sweep_figure(sweeps, sweep_rows(with_slo=False), "title")
    try:
        assert len(figure.axes) == 7 and not any("SLO" in title for title in panels(figure))
    finally:
        plt.close(figure)


def test_a_second_swept_key_is_one_colour_each_named_once():
    sweeps = [("num_gpu_blocks", [2000, 4000, 8000]), ("enable_prefix_caching", [True, False])]
    rows = [
        {**row, "enable_prefix_caching": caching} for row in sweep_rows(with_slo=False) for caching in (True, False)
    ]
    figure = sweep_figure(sweeps, rows, "title")
    try:
        (legend,) = figure.legends
        assert [t.get_text() for t in legend.get_texts()] == [
            "enable_prefix_caching=True",
            "enable_prefix_caching=False",
        ]
        assert len(panels(figure)["throughput (output tokens/s)"].lines) == 2
        hit_rate = panels(figure)["prefix-cache hit rate (% of full-block lookups)"]
        labels = [(text.get_text(), text.get_color()) for text in hit_rate.texts]  # each line's values, in its colour
        assert labels == [(f"{hit:.1f}", f"C{group}") for group in (0, 1) for hit in (4.7, 4.0, 3.3)]
    finally:
        plt.close(figure)


def test_the_sweep_title_says_what_was_swept_over_what():
    sweeps = [("num_gpu_blocks", [2000, 4000, 8000]), ("enable_prefix_caching", [True, False])]
    title = sweep_title(sweeps, "100", "the sample", SLO(ttft_s=20, tpot_s=0.2))
    assert title.splitlines() == [
        "sweep of num_gpu_blocks (3 values) x enable_prefix_caching (2 values): 6 runs of 100 requests of the sample",
        "one colour per value of enable_prefix_caching (legend at the bottom); SLO ttft=20s,tpot=200ms",
    ]
    assert (
        sweep_title(sweeps[:1], "100", "the sample", None)
        == "sweep of num_gpu_blocks (3 values): 3 runs of 100 requests of the sample"
    )


def test_a_cdf_rises_from_0_to_100_percent():
    xs, ys = cdf([3.0, 1.0, 2.0, 2.0])
    assert list(xs) == [1.0, 1.0, 2.0, 2.0, 3.0] and list(ys) == [0.0, 25.0, 50.0, 75.0, 100.0]
    xs, ys = cdf(np.arange(10 * MAX_POINTS, 0, -1))  # thinned, ends kept
    assert len(xs) == MAX_POINTS + 1 and (xs[1], xs[-1], ys[-1]) == (1, 10 * MAX_POINTS, 100)
    assert ys[len(ys) // 2] == pytest.approx(50, abs=0.01)


def test_the_run_plot_draws_latency_cdfs_of_the_finished_requests():
    """1,200 GPU blocks leave some of the first 30 prompts ignored: the
    latency panels say how many finished and draw only those."""
    config = SimulationConfig(
        num_gpu_blocks=1200, num_cpu_blocks=0, scheduler=SchedulerConfig(enable_prefix_caching=False)
    )
    result = run_simulation(load_trace(None, 30), load_manager_class("fast"), config)
    outcomes = result.metrics.outcomes()
    finished = sum(r.status == "finished" for r in outcomes)
    ignored = sum(r.status == "ignored" for r in outcomes)
    assert 0 < ignored and finished + ignored == 30
    title = title_of(result, "the bundled sample")
    assert "FastBlockSpaceManager" in title and "block size 16" in title and "1,200 GPU blocks" in title
    assert "prefix caching off" in title and "30 requests of the bundled sample" in title

    samples = latency_samples(result)
    assert len(samples["ttft"]) == len(samples["tpot"]) == len(samples["e2e"]) == finished
    assert len(samples["itl"]) == len(result.metrics.itl_s)
    figure = run_figure([result], "the bundled sample")
    try:
        kv, queues, hits, manager, seconds, milliseconds = figure.axes
        assert kv.get_ylim() == (0, 100) and hits.get_ylim() == (0, 100) and queues.get_ylim()[0] == 0
        assert manager.get_xlabel() == "simulated time (s)"
        assert seconds.get_xlabel() == "latency (s)" and milliseconds.get_xlabel().startswith("latency (ms")
        for axis in (seconds, milliseconds):
            assert axis.get_ylim() == (0, 100) and axis.get_xlim()[0] == 0
        legends = [t.get_text() for axis in (seconds, milliseconds) for t in axis.get_legend().get_texts()]
        assert legends == [
            f"TTFT ({finished} requests)", f"end-to-end ({finished} requests)",
            f"TPOT ({finished} requests)", f"ITL ({len(result.metrics.itl_s):,} gaps)",
        ]  # fmt: skip
        ttft = seconds.lines[0].get_xdata()
        assert max(ttft) == pytest.approx(float(np.max(samples["ttft"])))  # in seconds
        assert max(milliseconds.lines[0].get_xdata()) == pytest.approx(1e3 * float(np.max(samples["tpot"])))
        (heading,) = figure.subfigs[1].texts
        assert heading.get_text().startswith(f"latency CDFs: {finished} of 30 requests finished ({ignored} ignored")
    finally:
        plt.close(figure)
    figure = run_figure([result], "the bundled sample", SLO(ttft_s=2.0, tpot_s=0.05))
    try:  # --slo: each bound a dashed vertical in its curve's colour, on its own axis's unit (issue #40)
        seconds, milliseconds = figure.axes[4:]
        bounds = {axis: [(line.get_xdata()[0], line.get_color()) for line in axis.lines if line.get_linestyle() == "--"]
                  for axis in (seconds, milliseconds)}  # fmt: skip
        assert bounds[seconds] == [(2.0, seconds.lines[0].get_color())]  # TTFT, in s
        assert bounds[milliseconds] == [(50.0, milliseconds.lines[0].get_color())]  # TPOT, in ms
        assert "SLO TTFT <= 2 s" in [t.get_text() for t in seconds.get_legend().get_texts()]
    finally:
        plt.close(figure)
