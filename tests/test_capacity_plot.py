"""``capacity.png`` (issue #51: "the min-replicas capacity.png does not
state the answer"), read through matplotlib's artists, not pixels: each
answer written beside its marker, a tick at every value tried, and curves
that meet kept apart."""

from __future__ import annotations

from dataclasses import replace

import matplotlib.pyplot as plt
import pytest

from blockspace.simulator.capacity import RatePoint, find_max_rate
from blockspace.simulator.capacity_plot import MARKERS, RING, RING_SIZE, curves_figure
from blockspace.simulator.fleet_size import ReplicaAnswer, ReplicaPoint, find_min_replicas


def fleet_try(replicas: int, attainment: float) -> ReplicaPoint:
    """What ``fleet_size.run_try`` answers, made up."""
    return ReplicaPoint(replicas=replicas, attainment=attainment, goodput_requests_per_s=attainment, finished=1,
                        hit_rate=0.05, ttft_p90_s=1.0, saturated=False)  # fmt: skip


def min_replicas(router: str, attainments: dict[int, float]) -> ReplicaAnswer:
    """A ``--find min-replicas`` search of one router, as the command keeps it."""
    found = find_min_replicas(lambda counts: [fleet_try(k, attainments[k]) for k in counts], 0.9, 2)
    return replace(found, values={"router": router}, router=router)


# The run: round robin and least loaded both answer 8, and meet at 8.
ROUTERS = {
    "round_robin": {1: 0.003, 2: 0.22, 4: 0.76, 5: 0.85, 6: 0.87, 7: 0.89, 8: 0.91},
    "least_loaded": {1: 0.003, 2: 0.17, 4: 0.74, 5: 0.81, 6: 0.86, 7: 0.887, 8: 0.91},
    "kv_aware": {1: 0.003, 2: 0.16, 4: 0.77, 5: 0.85, 6: 0.897, 7: 0.93, 8: 0.927},
}


def test_the_min_replicas_figure_writes_each_answer_ticks_every_count_and_keeps_curves_apart():
    """Issue #51: the answer was a dotted vertical and nothing said it; the
    log axis was labelled at 1, 2, 4 and 8 only; round robin's line at 8 hid
    under least loaded's."""
    searches = [min_replicas(router, attainments) for router, attainments in ROUTERS.items()]
    assert [s.min_replicas for s in searches] == [8, 8, 7]
    figure = curves_figure(searches, "title", "min-replicas")
    try:
        share, hits = figure.axes
        labels = {text.get_text(): text for text in share.texts}
        assert set(labels) == {"round_robin: 8", "least_loaded: 8", "kv_aware: 7"}
        assert labels["round_robin: 8"].xy == (8, 100 * 0.91) == labels["least_loaded: 8"].xy
        assert labels["round_robin: 8"].xyann != labels["least_loaded: 8"].xyann  # one point, two lines of text
        for axis in (share, hits):
            tried = [1, 2, 4, 5, 6, 7, 8]  # 6 by kv_aware alone
            assert list(axis.get_xticks()) == tried
            assert [tick.get_text() for tick in axis.get_xticklabels()] == [str(k) for k in tried]
            assert len(axis.xaxis.get_minor_locator().tick_values(1, 8)) == 0
            curves = [drawn for drawn in axis.lines if drawn.get_label() in ROUTERS]
            assert len({curve.get_marker() for curve in curves}) == 3 == len({c.get_linestyle() for c in curves})
            assert [curve.get_marker() for curve in curves] == list(MARKERS[:3])
            sizes = [curve.get_markersize() for curve in curves]
            assert sizes == sorted(sizes, reverse=True)  # the later, drawn on top, smaller: both show
            rings = [drawn for drawn in axis.lines if drawn.get_label() == RING]
            assert [list(ring.get_xdata()) for ring in rings] == [[8], [8], [7]]
            assert [ring.get_color() for ring in rings] == [curve.get_color() for curve in curves]
            assert [ring.get_markersize() for ring in rings] == [RING_SIZE, RING_SIZE + 5, RING_SIZE]  # concentric
        assert [t.get_text() for t in share.get_legend().get_texts()] == [*ROUTERS, "target 90%"]
    finally:
        plt.close(figure)


def probe(scale: float, attainment: float) -> RatePoint:
    """What ``capacity.run_probe`` answers, made up (a trace of 1 req/s)."""
    return RatePoint(scale=scale, attainment=attainment, goodput_requests_per_s=attainment * scale, finished=0,
                     ignored=0, aborted=0, ttft_p90_s=None, tpot_p90_s=None, served_requests_per_s=attainment * scale,
                     saturated=attainment < 0.5, rate_requests_per_s=scale)  # fmt: skip


def test_the_max_rate_figure_writes_the_answer_and_ticks_every_rate():
    """The rate search narrows to rates 2 % apart, whose labels would print
    over each other: every rate is a tick, the answer's always labelled."""
    found = find_max_rate(lambda scales: [probe(s, 1.0 if s <= 3.3 else 0.5) for s in scales], 1.0, 0.9, 2)
    figure = curves_figure([found], "title", "max-rate")
    try:
        share, good = figure.axes
        answer = found.max_rate_requests_per_s
        rates = [point.rate_requests_per_s for point in found.curve]
        assert len(rates) > 8 and answer in rates
        assert [text.get_text() for text in share.texts] == [f"max rate: {answer:.4g} req/s"]
        for axis in (share, good):
            assert list(axis.get_xticks()) == rates
            labels = dict(zip(rates, [tick.get_text() for tick in axis.get_xticklabels()], strict=True))
            assert labels[answer] == f"{answer:.4g}" and labels[rates[0]] == f"{rates[0]:g}"
            assert "" in labels.values()  # those 2 % from the answer are ticks without words
    finally:
        plt.close(figure)


@pytest.mark.parametrize(
    ("attainment", "said"), [(lambda s: 0.4 / (1 + s), "none found"), (lambda s: 0.3, "no effect")]
)
def test_a_search_without_an_answer_says_why_and_marks_none(attainment, said):
    found = find_max_rate(lambda scales: [probe(s, attainment(s)) for s in scales], 1.0, 0.5, 2)
    figure = curves_figure([found], "title", "max-rate")
    try:
        share, _ = figure.axes
        assert [t.get_text() for t in share.get_legend().get_texts()][0] == f"requests within the SLO ({said})"
        assert [t.get_text() for t in share.texts] == ["no rate tried meets the target"]
        assert not [drawn for drawn in share.lines if drawn.get_label() == RING]
    finally:
        plt.close(figure)


def test_an_answer_with_a_clock_range_is_drawn_with_its_band():
    """Issue #53: a search on the roofline clock answers with the counts of a clock faster and slower
    by its error; the figure shades the span between them behind the curve, in the curve's colour."""
    from blockspace.simulator.capacity import ClockRange

    search = replace(min_replicas("round_robin", ROUTERS["round_robin"]), clock_range=ClockRange(0.115, 6, None))
    figure = curves_figure([search], "title", "min-replicas")
    try:
        for axis in figure.axes:
            (band,) = axis.patches
            xs = [band.get_x(), band.get_x() + band.get_width()]  # in data units along x
            assert xs == [6, 8] and band.get_facecolor()[:3] == plt.matplotlib.colors.to_rgb("C0")
        assert "the answer's range" in [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    finally:
        plt.close(figure)
