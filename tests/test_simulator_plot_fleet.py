"""The figure of a fleet (issue #51, "pictures of a fleet no one can
read"), read through matplotlib's artists, not pixels: ``simulation.png``
draws a fleet's totals, never its replicas' steps interleaved, and says
the replicas and the router; no panel is left empty on either engine."""

from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt
import numpy as np
import pytest

from blockspace.interfaces import load_manager_class
from blockspace.simulator.engines import replay
from blockspace.simulator.plot import run_figure, tokens_per_second
from blockspace.simulator.scheduler import SchedulerConfig
from blockspace.simulator.simulation import SimulationConfig, SimulationResult
from blockspace.workloads import load_trace

FAST = load_manager_class("fast")


def config(**fields) -> SimulationConfig:
    """A pool small enough that the bundled sample's burst queues and fills it."""
    return SimulationConfig(num_gpu_blocks=1500, num_cpu_blocks=0, max_output_len=24,
                            scheduler=SchedulerConfig(max_num_seqs=16), **fields)  # fmt: skip


@pytest.fixture(scope="module")
def fleet() -> SimulationResult:
    return replay(load_trace(None, 30), FAST, config(replicas=3, router="kv_aware"))


def state_at(result: SimulationResult, column: str, at: float) -> float:
    """A replica's ``column`` after its last step ending at or before ``at`` (0 before its first)."""
    timeline = result.metrics.timeline
    latest = [value for time_s, value in zip(timeline.time_s, getattr(timeline, column)) if time_s <= at]
    return float(latest[-1]) if latest else 0.0


def line(axis, label: str):
    (found,) = [drawn for drawn in axis.lines if drawn.get_label() == label]
    return found


def test_a_fleets_figure_draws_the_fleets_totals_not_its_replicas_interleaved(fleet):
    """Issue #51: each panel of a 6-replica fleet's figure drew every
    replica's steps in the order they ended, so each line sawed between the
    replicas' values. Now, at every time drawn: the queues are summed over
    the replicas, KV usage is their mean between the emptiest and the
    fullest, and the hit rate the fleet's, ending at the summary's."""
    replicas = fleet.replicas
    assert len(replicas) == 3 and all(len(r.metrics.timeline.time_s) for r in replicas)
    figure = run_figure([fleet], "the bundled sample")
    try:
        kv, queues, hits, tokens = figure.axes[:4]
        assert figure.get_suptitle().startswith("FastBlockSpaceManager, 3 replicas, kv_aware (weight 1): block size")
        assert "1,500 GPU blocks each" in figure.get_suptitle()

        running = line(queues, "running")
        times = running.get_xdata()
        assert list(times) == sorted(fleet.metrics.timeline.time_s)  # every step of the fleet, in time order
        for name in ("running", "waiting", "swapped"):
            drawn = line(queues, name).get_ydata()
            for i in range(0, len(times), 7):
                assert drawn[i] == sum(state_at(r, f"num_{name}", times[i]) for r in replicas), (name, times[i])
        assert queues.get_ylabel() == "requests, summed\nover the 3 replicas"
        assert max(running.get_ydata()) > max(max(r.metrics.timeline.num_running) for r in replicas)

        mean = line(kv, "mean of the 3 replicas")
        (band,) = kv.collections  # fill_between: the emptiest replica's usage up to the fullest's
        assert band.get_label() == "emptiest to fullest replica"
        edges = band.get_paths()[0].vertices
        for i in range(0, len(times), 11):
            usage = [100 * state_at(r, "kv_used_blocks", times[i]) / 1500 for r in replicas]
            assert mean.get_ydata()[i] == pytest.approx(sum(usage) / 3)
            for bound in (min(usage), max(usage)):  # both ends of the band at this time
                assert np.isclose(edges[:, 0], times[i]).any()
                assert np.isclose(edges[np.isclose(edges[:, 0], times[i]), 1], bound).any()

        rate = [drawn for drawn in hits.lines if drawn.get_label().startswith("the fleet's")][0]
        assert rate.get_ydata()[-1] == pytest.approx(100 * fleet.metrics.final_hit_rate)
        assert rate.get_label().endswith(f"final {fleet.metrics.final_hit_rate:.1%}")
        assert [c.get_label() for c in hits.collections] == ["lowest to highest replica"]

        (stairs,) = tokens.patches  # a fleet is not timed per step: the tokens it computed instead
        rates, bin_edges = stairs.get_data()[:2]
        total = sum(sum(r.metrics.timeline.num_batched_tokens) for r in replicas)
        assert float(np.sum(rates * np.diff(bin_edges))) == pytest.approx(total)
    finally:
        plt.close(figure)


def test_the_timeline_counts_the_prompt_tokens_admitted_as_the_counts_do(fleet):
    """The column the fleet's hit rate is weighted by, at each step, ends
    at the run's count (both engines fill it: ``test_fleet.py``)."""
    for replica in fleet.replicas:
        admitted = list(replica.metrics.timeline.prefill_tokens_admitted)
        assert admitted == sorted(admitted) and admitted[-1] == replica.metrics.counts.prefill_tokens_admitted


def test_the_compiled_engines_figure_has_no_empty_panel():
    """Issue #51: on the compiled engine the manager-time panel, a quarter of
    the figure, said only "not timed apart". It now draws what that engine
    knows: the tokens computed per simulated second."""
    trace = load_trace(None, 20)
    for result in (replay(trace, FAST, config(engine="compiled")),
                   replay(trace, FAST, config(engine="compiled", replicas=2))):  # fmt: skip
        figure = run_figure([result], "the bundled sample")
        try:
            panels = figure.axes[:4]
            for axis in panels:
                assert axis.lines or axis.patches, axis.get_ylabel()
                assert not any("not timed apart" in text.get_text() for text in axis.texts)
            assert panels[3].get_ylabel() == "tokens computed per\nsimulated second"
            rates, edges = panels[3].patches[0].get_data()[:2]
            assert float(np.sum(rates * np.diff(edges))) == pytest.approx(
                sum(result.metrics.timeline.num_batched_tokens)
            )
        finally:
            plt.close(figure)


def test_one_engine_on_the_python_engine_still_draws_the_manager_time():
    result = replay(load_trace(None, 10), FAST, config())
    figure = run_figure([result, dataclasses.replace(result, manager_name="other.Manager")], "the bundled sample")
    try:
        manager = figure.axes[3]
        assert manager.get_yscale() == "log" and [line.get_label() for line in manager.lines] == [
            "FastBlockSpaceManager", "Manager",
        ]  # fmt: skip
        assert "replicas" not in figure.get_suptitle()
    finally:
        plt.close(figure)


def test_the_guides_example_computes_its_prompts_then_only_decodes():
    """docs/simulator.md, the fourth panel of ``--max-requests 50``: 16,000
    to 21,700 tokens a second while prompts wait (to 29 s), about 1,800 from
    30 s, when only decodes remain, falling as the last requests finish."""
    result = replay(load_trace(None, 50), FAST, SimulationConfig(num_gpu_blocks=49152, num_cpu_blocks=0))
    edges, rates = tokens_per_second(result.metrics.timeline)
    starts = edges[:-1]
    assert len(rates) == 100
    assert 16_000 <= rates[starts < 29].min() and rates[starts < 29].max() <= 21_800
    decoding = rates[(starts >= 29.7) & (starts < 35)]
    assert 1_700 <= decoding.min() and decoding.max() <= 2_100
    assert rates[-1] < 500
