"""``capacity.png``: the curves of ``--find max-rate`` or ``--find
min-replicas``, a line per configuration (``--sweep``), each answer on it.

Searches over routers or sizes often meet at the same points (round robin
and least loaded both pass at 8 replicas), and the answer is the figure's
point, so:

* each answer is written beside its marker ("kv_aware: 6"), a ring around
  the point, on the side where its curve passes (no curve there runs
  below the target); each label a line below the last, so none overlap;
* each curve has its own marker, size and dash, the later ones smaller and
  drawn on top, so a line that runs under another still shows;
* every value tried is a tick: a log axis labels only its own round values
  (1, 2, 4, 8), not the counts between them the search tried. Labels that
  would overlap a neighbour's are left off (the answers' never), the tick
  kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from blockspace.outputs import replacing
from blockspace.simulator.capacity import RateAnswer
from blockspace.simulator.fleet_size import ReplicaAnswer
from blockspace.simulator.min_cost import CostAnswer
from blockspace.simulator.report import significant

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
DASHES = ("-", "--", "-.", ":")
TICK_FONT_PT = 8
LABEL_PT, LABEL_GAP_PT = 9, 9  # an answer's label, and its distance from the answer
RING_SIZE = 14  # the answer's ring, wider than any curve's marker
RING = "_ring"  # the rings' label: none in the legend
LINE_PT = 14  # between two answers' labels


class Search(NamedTuple):
    """How one kind of search is drawn: its variable (a field of a curve's
    points, called ``word``), the answer's field and name, the right-hand
    panel (a field of the points and its label; ``share``: a fraction,
    drawn 0-100 %) and how values read."""

    variable: str
    word: str
    xlabel: str
    log_base: float
    answer: str
    answer_name: str
    passing_side: int  # 1: the values above the answer pass (replicas), -1: those below (rates)
    right: str
    right_label: str
    share: bool
    number: Callable[[float], str]
    unit: str


RATE = Search(
    "rate_requests_per_s", "rate", "request rate (req/s, log scale)", 10, "max_rate_requests_per_s", "max rate", -1,
    "goodput_requests_per_s", "goodput (req/s)", False, significant, " req/s",
)  # fmt: skip
REPLICAS = Search(
    "replicas", "replica count", "replicas (log scale)", 2, "min_replicas", "min replicas", 1, "hit_rate",
    "prefix-cache hit rate (%)", True,
    lambda count: f"{count:,.0f}", "",
)  # fmt: skip
SEARCHES = {"max-rate": RATE, "min-replicas": REPLICAS}


Answers = Sequence[RateAnswer | ReplicaAnswer]  # the searches of one --find, all of one kind


def name_of(search: RateAnswer | ReplicaAnswer) -> str:
    """A configuration's name: its swept value alone where one key is swept
    ("kv_aware"), its pairs where several are, else a fleet's router."""
    values = search.values
    if len(values) == 1:
        return str(next(iter(values.values())))
    return ", ".join(f"{name}={value}" for name, value in values.items()) or getattr(search, "router", None) or ""


def answer_label(search: RateAnswer | ReplicaAnswer, kind: Search) -> str:
    """The words beside an answer's marker: "kv_aware: 6", or without a
    name "max rate: 6.19 req/s"."""
    return f"{name_of(search) or kind.answer_name}: {kind.number(getattr(search, kind.answer))}{kind.unit}"


def range_band(search: Any) -> tuple[float, float] | None:
    """The span of a search's answers on a faster and a slower clock and on
    other draws of the arrivals (an answer not found: left out), or None without a range."""
    ends = [] if search.clock_range is None else [search.clock_range.faster, search.clock_range.slower]
    ends += [] if search.seed_range is None else list(search.seed_range.answers)
    found = [end for end in ends if end is not None]
    if not found or search.value is None:
        return None
    return min(found + [search.value]), max(found + [search.value])


def curves_figure(searches: Answers, title: str, find: str) -> Any:
    """The figure: the share meeting the SLO (left) and ``find``'s other
    figure (right) against the variable, a line per search."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kind = SEARCHES[find]
    figure, (share, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    answered = []  # (the answer, its share, its label, its colour), in the searches' order
    for index, search in enumerate(searches):
        style: dict[str, Any] = {"color": f"C{index % 10}", "marker": MARKERS[index % len(MARKERS)],
                 "linestyle": DASHES[index % len(DASHES)], "markersize": max(7 - 1.2 * index, 3),
                 "zorder": 2 + index}  # fmt: skip
        xs = [getattr(point, kind.variable) for point in search.curve]
        shares = [100 * point.attainment for point in search.curve]
        rights = [(100 if kind.share else 1) * getattr(point, kind.right) for point in search.curve]
        answer = getattr(search, kind.answer)
        missing = "" if answer is not None else " (no effect)" if search.no_effect else " (none found)"
        share.plot(xs, shares, label=(name_of(search) or "requests within the SLO") + missing, **style)
        right.plot(xs, rights, label=(name_of(search) or kind.right_label) + missing, **style)
        band = range_band(search)
        if band is not None:  # the answers of a clock faster and slower by its error, and of other draws
            for axis in (share, right):
                axis.axvspan(*band, color=style["color"], alpha=0.12, zorder=1,
                             label="the answer's range" if axis is share and index == 0 else None)  # fmt: skip
        if answer is not None:
            at = min(range(len(xs)), key=lambda i: abs(xs[i] - answer))  # the answer is a point tried
            for axis, ys in ((share, shares), (right, rights)):
                ring(axis, answer, ys[at], style["color"])
            answered.append((answer, shares[at], answer_label(search, kind), style["color"]))
    target = searches[0].target
    share.axhline(100 * target, color="grey", linestyle="--", label=f"target {target:.0%}")
    if kind is RATE:
        offered = sorted({getattr(point, kind.variable) for search in searches for point in search.curve})
        right.plot(offered, offered, ":", color="grey", label="offered rate")
    if not answered:
        said = f"no {kind.word} tried meets the target"
        share.text(0.5, 0.5, said, transform=share.transAxes, ha="center", color="grey")
    share.set_ylabel("requests meeting the SLO (%)")
    share.set_ylim(0, 100)
    right.set_ylabel(kind.right_label)
    right.set_ylim(0, 100 if kind.share else None)
    for axis in (share, right):
        axis.set_xscale("log", base=kind.log_base)
        axis.set_xlabel(kind.xlabel + "; a ring: the answer")
        axis.grid(axis="y", alpha=0.3)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    label_answers(share, answered, kind.passing_side)
    right.set_xlim(share.get_xlim())
    tried = sorted({getattr(point, kind.variable) for search in searches for point in search.curve})
    for axis in (share, right):
        tick_every(axis, tried, {answer for answer, *_ in answered}, kind.number)
        axis.legend(fontsize=8)
    figure.tight_layout()
    return figure


def ring(axis: Any, x: float, y: float, color: str) -> None:
    """A ring around an answer's point, wider than those already at its
    value: answers at one value (whose points are close, or one) show as
    concentric rings."""
    around = sum(drawn.get_label() == RING and drawn.get_xdata()[0] == x for drawn in axis.lines)
    axis.plot([x], [y], marker="o", markersize=RING_SIZE + 5 * around, markerfacecolor="none", markeredgewidth=1.5,
              color=color, linestyle="none", zorder=20, label=RING)  # fmt: skip


def label_answers(axis: Any, answered: list[tuple[float, float, str, str]], side: int) -> None:
    """Each answer's label beside its ring, on the ``side`` where its curve
    passes (``Search.passing_side``), below it, each a line lower than the
    last so that no two overlap; the axis widened on that side until every
    label fits inside it."""
    low, high = (math.log(limit) for limit in axis.get_xlim())
    width_in = axis.figure.get_size_inches()[0] * axis.get_position().width
    for answer, _, label, _ in answered:  # the share of the axis the label takes beyond its answer
        need = min((len(label) * 0.62 * LABEL_PT + LABEL_GAP_PT) / 72 / width_in, 0.6)
        if side > 0:
            high = max(high, (math.log(answer) - need * low) / (1 - need))
        else:
            low = min(low, (math.log(answer) - need * high) / (1 - need))
    axis.set_xlim(math.exp(low), math.exp(high))
    for level, (answer, at, label, color) in enumerate(answered):
        axis.annotate(label, (answer, at), xytext=(side * LABEL_GAP_PT, -LINE_PT * (level + 1)),
                      textcoords="offset points", ha="left" if side > 0 else "right", color=color,
                      fontsize=LABEL_PT, fontweight="bold",
                      bbox={"facecolor": "white", "alpha": 0.7, "edgecolor": "none", "pad": 0.1})  # fmt: skip


def tick_every(axis: Any, tried: list[float], answers: set[float], number: Callable[[float], str]) -> None:
    """A tick at each value ``tried``, labelled unless its label would
    overlap one already kept (the answers' kept first), and no other tick."""
    from matplotlib.ticker import NullLocator

    low, high = axis.get_xlim()
    width_in = axis.figure.get_size_inches()[0] * axis.get_position().width
    char_in = 0.6 * TICK_FONT_PT / 72

    def at_in(value: float) -> float:  # where on the axis, in inches (log scale)
        return (math.log(value) - math.log(low)) / (math.log(high) - math.log(low)) * width_in

    kept: list[float] = []
    for value in sorted(tried, key=lambda v: (v not in answers, v)):
        if all(abs(at_in(value) - at_in(other)) >= (len(number(value)) + len(number(other)) + 2) / 2 * char_in
               for other in kept):  # fmt: skip
            kept.append(value)
    axis.xaxis.set_minor_locator(NullLocator())
    axis.set_xticks(tried, [number(value) if value in kept else "" for value in tried], fontsize=TICK_FONT_PT)
    axis.set_xlim(low, high)


def cost_figure(searches: Sequence[ReplicaAnswer], costs: CostAnswer, title: str) -> Any:
    """``--find min-cost``'s figure: the share meeting the SLO against what
    each fleet tried costs an hour, a line per configuration, the cheapest
    that keeps the target marked with a star."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 5.4))
    for index, (search, option) in enumerate(zip(searches, costs.options, strict=True)):
        style: dict[str, Any] = {
            "color": f"C{index % 10}",
            "marker": MARKERS[index % len(MARKERS)],
            "linestyle": DASHES[index % len(DASHES)],
            "markersize": max(7 - 0.6 * index, 3),
        }
        xs = [option.price(point.replicas) for point in search.curve]
        answer = "none found" if option.replicas is None else f"{option.replicas:,} replica(s)"
        axis.plot(xs, [100 * point.attainment for point in search.curve], label=f"{option.name}: {answer}", **style)
    best = costs.cheapest
    if best is not None and best.replicas is not None:  # the cheapest has an answer
        search = searches[costs.options.index(best)]
        at = next(point for point in search.curve if point.replicas == best.replicas)
        dollars = best.price(best.replicas)
        axis.plot(
            [dollars],
            [100 * at.attainment],
            marker="*",
            markersize=20,
            color="black",
            linestyle="none",
            zorder=20,
            label=f"cheapest: {best.name}, {best.replicas:,} replica(s), ${dollars:,.2f}/hour",
        )
    else:
        axis.text(0.5, 0.5, "no configuration keeps the target", transform=axis.transAxes, ha="center", color="grey")
    target = searches[0].target
    axis.axhline(100 * target, color="grey", linestyle="--", label=f"target {target:.0%}")
    axis.set_xscale("log")
    axis.set_xlabel("the fleet's price (dollars an hour, log scale): replicas x tensor-parallel GPUs x --gpu-cost")
    axis.set_ylabel("requests meeting the SLO (%)")
    axis.set_ylim(0, 100)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="lower right")
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    tried = {option.price(point.replicas) for search, option in zip(searches, costs.options)
             for point in search.curve}  # fmt: skip
    best_dollars = set() if best is None or best.replicas is None else {best.price(best.replicas)}
    tick_every(axis, sorted(tried), best_dollars, lambda value: f"${value:,.4g}")
    return figure


def plot_costs(path: Path, searches: Sequence[ReplicaAnswer], costs: CostAnswer, title: str) -> None:
    """Write ``cost_figure`` as a PNG."""
    save(path, cost_figure(searches, costs, title))


def plot_curves(path: Path, searches: Answers, title: str, find: str) -> None:
    """Write ``curves_figure`` as a PNG."""
    save(path, curves_figure(searches, title, find))


def save(path: Path, figure: Any) -> None:
    """Write ``figure`` as a PNG, whole or not at all (outputs.py), and close it."""
    import matplotlib.pyplot as plt

    try:
        with replacing(path) as partial:  # whole or not at all (outputs.py)
            figure.savefig(partial, dpi=110)
    finally:
        plt.close(figure)


__all__ = ["REPLICAS", "RATE", "RING", "SEARCHES", "Search", "answer_label", "curves_figure", "label_answers",
           "name_of", "plot_costs", "plot_curves", "ring", "tick_every"]  # fmt: skip
