"""``blockspace simulate --sweep KEY=V1,V2,...``: one run per configuration,
in parallel worker processes, with a summary table and a plot.

A capacity question (how many GPU blocks does this traffic need, which
block size, recompute or swap, prefix caching or not) is a dozen runs that
differ in one or two settings. Every ``--sweep`` names a simulate option
(``num_gpu_blocks``, ``block-size``, ``enable_prefix_caching``,
``preemption_mode``...) and its values; the runs are the product of all of
them, every other option as given. Values are parsed and every
configuration is checked before the first run starts.

The runs go to a pool of worker processes (``--workers``, one per core by
default; spawned, so each starts clean) or, with ``--executor ray``, to
Ray's ``Pool``, which has the same interface and spreads the runs over a
cluster (``executor.py``). Runs are independent, so their figures do not
depend on the executor or on the order in which they finish. Written
under ``--out``:

    sweep/run-<k>.json   each run's full figures (as ``simulation.json``)
    sweep.json           every configuration and its summary
    sweep.csv            one row per run: the request counts, the SLO's
                         attainment and goodput (with ``--slo``), and the
                         headline figures
    sweep.png            the same figures in panels, against the first swept key

Stopped by Ctrl-C, a sweep ends its workers at once and writes sweep.json
and sweep.csv of the runs that finished, marked incomplete (``"complete":
false``, and a line under the table); no plot (``interrupts.py``).

Latencies are over the finished requests only, so the counts of ignored
and aborted requests stand beside them in every output: without them a
configuration that turns requests away would look faster.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from blockspace.errors import InvalidArgumentError
from blockspace.interrupts import Interrupted
from blockspace.outputs import remove_partials, replacing, write_text
from blockspace.simulator.executor import map_unordered, use_ray
from blockspace.simulator.slo import SLO
from blockspace.validation import Range, check_output_dir, option_name
from blockspace.workloads import TraceRequest, describe

if TYPE_CHECKING:
    from matplotlib.typing import LineStyleType

    from blockspace.simulator.summary import Summary

TRUE, FALSE = ("on", "true", "yes", "1"), ("off", "false", "no", "0")
OUTPUTS = ("sweep.json", "sweep.csv", "sweep.png")  # what a sweep writes under --out, beside sweep/
# The options that cannot be swept, and why: each run of a sweep is one configuration of the
# scheduler, the cache, the model and the trace's requests; these choose what runs, how, or
# what is written, once for the whole sweep. Every other option of simulate's parser is
# sweepable, and each run reads its own value (tests/test_cli_modes.py holds both to that).
NOT_SWEPT = {
    "trace": "a sweep replays one trace (sweep max_requests or time_scale to vary its requests)",
    "workload": "a sweep replays one kind of workload (sweep the synthetic workload's options to vary it)",
    "manager": "a sweep runs one manager, --manager",
    "compare": "a sweep runs one manager, --manager",
    "sweep": "it names what is swept",
    "workers": "it is how many runs go at once, not part of a run",
    "executor": "it is where the runs go, not part of a run",
    "out": "the sweep writes its runs under one --out",
    "no_plot": "it is about the sweep's outputs, not a run",
    "quiet": "it is about the sweep's outputs, not a run",
    "slo": "it judges the runs rather than configuring them: give --slo once, every run is judged by it",
    "requests_out": "it writes the requests of one run, and a sweep makes many",
    "find": "it turns each configuration into a search: give --find once beside --sweep",
    "target": "it belongs to --find, given once for every configuration",
    "seeds": "it belongs to --find, given once for every configuration",
    "address": "it names the Ray cluster every run goes to, not part of a run",
    "spare": "it belongs to --find, given once for every configuration",
    "spare_window": "it belongs to --find, given once for every configuration",
    "fail": "it lists outages: give --fail once for each, every run has them",
}

# The headline figures: (column, how to read it off a run's summary). The request counts
# come first: latencies are over the finished requests only, so a configuration that
# ignores (or aborts) the requests it cannot serve would look faster without them. With
# --slo, the attainment and goodput follow: they count every request that arrived (ignored,
# aborted and unfinished ones miss the SLO), so they are the fair comparison. Shares are in
# percent, as in simulation.png and the text summary.
COUNTS: tuple[tuple[str, Callable[[Summary], Any]], ...] = (
    ("finished", lambda s: s.requests.finished),
    ("ignored", lambda s: s.requests.ignored),
    ("aborted", lambda s: s.requests.aborted),
    ("saturated", lambda s: "yes" if s.load.saturated else "no"),  # summary.load_of: the queue grew
)
SLO_HEADLINES: tuple[tuple[str, Callable[[Summary], Any]], ...] = (
    ("slo_attainment_pct", lambda s: 100 * s.slo.attainment),  # type: ignore[union-attr]  # with an SLO only
    ("goodput_req_per_s", lambda s: s.slo.goodput_requests_per_s),  # type: ignore[union-attr]
)
FIGURES: tuple[tuple[str, Callable[[Summary], Any]], ...] = (
    ("ttft_p50_s", lambda s: s.ttft_s.p50),
    ("ttft_p99_s", lambda s: s.ttft_s.p99),
    ("e2e_p50_s", lambda s: s.e2e_latency_s.p50),
    ("e2e_p99_s", lambda s: s.e2e_latency_s.p99),
    ("output_tokens_per_s", lambda s: s.throughput.output_tokens_per_s),
    ("hit_rate_pct", lambda s: 100 * s.prefix_cache.gpu_block_hit_rate),
    ("preemptions", lambda s: s.preemption.recompute + s.preemption.swap_out),
    ("peak_kv_use_pct", lambda s: 100 * s.kv_cache.peak_usage),
)

# The plot's panels: title, the columns drawn, and the kind of Y axis: "count" (whole
# numbers from 0), "percent" (0 to 100, so a change of a point looks like one) or "zero"
# (from 0, so a change looks as large as it is).
PANELS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("requests: finished, ignored, aborted", ("finished", "ignored", "aborted"), "count"),
    ("TTFT (s), over finished requests", ("ttft_p50_s", "ttft_p99_s"), "zero"),
    ("end-to-end latency (s), over finished requests", ("e2e_p50_s", "e2e_p99_s"), "zero"),
    ("throughput (output tokens/s)", ("output_tokens_per_s",), "zero"),
    ("prefix-cache hit rate (% of full-block lookups)", ("hit_rate_pct",), "percent"),
    ("preemptions (recompute + swap out)", ("preemptions",), "count"),
    ("peak KV use (% of GPU blocks)", ("peak_kv_use_pct",), "percent"),
)
SLO_PANELS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("SLO attainment (% of all requests)", ("slo_attainment_pct",), "percent"),
    ("goodput (requests/s meeting the SLO)", ("goodput_req_per_s",), "zero"),
)
LEGEND = {"ttft_p50_s": "p50", "ttft_p99_s": "p99", "e2e_p50_s": "p50", "e2e_p99_s": "p99"}  # else the column
STYLES: tuple[tuple[LineStyleType, str], ...] = (("-", "o"), ("--", "s"), (":", "^"))  # a panel's columns, in order


# -- parsing ----------------------------------------------------------------------------------
def _converter(action: argparse.Action) -> Callable[[str], Any]:
    """How a value of this option is read from text (as argparse would)."""
    if isinstance(action, argparse.BooleanOptionalAction):

        def boolean(text: str) -> bool:
            if text.lower() in TRUE:
                return True
            if text.lower() in FALSE:
                return False
            raise ValueError(f"expected one of {', '.join(TRUE + FALSE)}")

        return boolean
    # typeshed also allows a type's registered name here; every option of ours gives a callable
    convert = cast(Callable[[str], Any], action.type or str)

    def checked(text: str) -> Any:
        value = convert(text)
        if action.choices is not None and value not in action.choices:
            raise ValueError(f"expected one of {', '.join(map(str, action.choices))}")
        return value

    return checked


def sweepable(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The options a sweep can vary, by destination: every option of the
    parser but those of ``NOT_SWEPT``."""
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest not in NOT_SWEPT and a.dest != "help"}


def swept_dest(spec: str) -> str:
    """The option a ``KEY=V1,V2`` spec sweeps, as its parser's dest."""
    return spec.partition("=")[0].strip().lstrip("-").replace("-", "_")


def parse_sweeps(
    specs: list[str],
    parser: argparse.ArgumentParser,
    ranges: Mapping[str, Range] | None = None,
    given: frozenset[str] = frozenset(),
) -> list[tuple[str, list[Any]]]:
    """``KEY=V1,V2`` specs as ``(option dest, values)``, each value parsed as
    the option parses it and in the option's range of ``ranges``
    (``InvalidArgumentError`` naming ``--sweep`` and the first bad value).

    A key must be sweepable (``NOT_SWEPT`` says why not), not also written
    as an option (``given``: the runs would replace its value), and not
    beside another member of its mutually exclusive group, given or swept
    (``--num-gpu-blocks`` beside a swept ``kv_memory_gib`` would win in
    every run): each would leave an option that changes nothing."""
    actions = sweepable(parser)
    sweeps: list[tuple[str, list[Any]]] = []
    for spec in specs:
        key, equals, text = spec.partition("=")
        dest = swept_dest(spec)
        if not equals or not text.strip():
            raise InvalidArgumentError(f"--sweep {spec!r}: expected KEY=V1,V2,...")
        if dest in NOT_SWEPT:
            raise InvalidArgumentError(f"--sweep: {dest} cannot be swept: {NOT_SWEPT[dest]}")
        if dest not in actions:
            raise InvalidArgumentError(
                f"--sweep: no option {key.strip()!r} to sweep (options: {', '.join(sorted(actions))})"
            )
        if dest in (name for name, _ in sweeps):
            raise InvalidArgumentError(f"--sweep: {dest} is swept twice")
        if dest in given:
            raise InvalidArgumentError(f"--sweep: {dest} is swept and given as {option_name(dest)}: keep one")
        for group in parser._mutually_exclusive_groups:
            members = {action.dest for action in group._group_actions}
            rivals = (members - {dest}) & (given | {name for name, _ in sweeps}) if dest in members else set()
            if rivals:
                raise InvalidArgumentError(
                    f"--sweep: {dest} and {option_name(min(rivals))} cannot go together (they set one thing two ways)"
                )
        convert, allowed, values = _converter(actions[dest]), (ranges or {}).get(dest), []
        for item in text.split(","):
            try:
                values.append(convert(item.strip()))
                if allowed is not None:
                    allowed.check(option_name(dest), values[-1])
            except ValueError as error:
                raise InvalidArgumentError(f"--sweep {dest}: {item.strip()!r} is not a valid value ({error})") from None
        if len(set(values)) != len(values):
            raise InvalidArgumentError(f"--sweep {dest}: a value appears twice")
        sweeps.append((dest, values))
    return sweeps


def configurations(sweeps: list[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
    """Every combination of the swept values, in order (the last key varies fastest)."""
    names = [name for name, _ in sweeps]
    return [dict(zip(names, combo)) for combo in itertools.product(*(values for _, values in sweeps))]


# -- the runs ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """One run: everything a worker process needs, picklable."""

    index: int
    values: dict[str, Any]
    config: Any  # SimulationConfig
    manager: str
    trace: list[TraceRequest]
    trace_label: str
    path: Path
    slo: SLO | None  # --slo: the summary then says who met it


def run_job(job: Job) -> tuple[int, Summary]:
    """Run one configuration, write its JSON; returns its index and summary."""
    from blockspace.interfaces import load_manager_class
    from blockspace.simulator.engines import replay
    from blockspace.simulator.report import write_json
    from blockspace.simulator.summary import summarize

    result = replay(job.trace, load_manager_class(job.manager), job.config)
    summary = summarize(result, job.slo)
    write_json(job.path, [result], [summary], {"trace": job.trace_label, "workload": describe(job.trace),
                                               "sweep": job.values})  # fmt: skip
    return job.index, summary


# -- the outputs -----------------------------------------------------------------------------
def headline_row(values: dict[str, Any], summary: Summary) -> dict[str, Any]:
    """The swept values and the run's headline figures (the SLO's only when it has one)."""
    read = COUNTS + (SLO_HEADLINES if summary.slo is not None else ()) + FIGURES
    return {**values, **{column: figure(summary) for column, figure in read}}


def format_table(rows: list[dict[str, Any]]) -> str:
    columns = list(rows[0])
    cells = [[_cell(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(f"{c:>{w}}" for c, w in zip(columns, widths))]
    lines += ["  ".join(f"{v:>{w}}" for v, w in zip(line, widths)) for line in cells]
    return "\n".join(lines)


def table_note(slo: SLO | None) -> str:
    """What the table's figures are over, printed under it: the latencies
    leave out the requests a configuration did not serve."""
    note = "latencies (ttft_*, e2e_*) are over each run's finished requests; ignored and aborted ones are counted apart"
    if slo is None:
        return note
    return f"{note}\nSLO {slo}: attainment over all of a run's requests (ignored, aborted and unfinished ones miss it)"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def write_outputs(
    out: Path,
    sweeps: list[tuple[str, list[Any]]],
    rows: list[dict[str, Any]],
    summaries: list[Summary],
    complete: bool = True,
) -> None:
    """sweep.json and sweep.csv of the runs that finished (``rows``, in the
    order of ``configurations``); ``complete`` False after Ctrl-C, where
    some did not (sweep.json says so; the CSV then has no row for
    them). Each file written whole (``outputs.py``)."""
    write_text(
        out / "sweep.json",
        json.dumps(
            {
                "swept": dict(sweeps),
                "complete": complete,
                "runs": [
                    {"values": {k: r[k] for k, _ in sweeps}, "summary": s.to_json()} for r, s in zip(rows, summaries)
                ],
            },
            indent=1,
            default=str,  # a swept path (step_model) as text
        ),
    )
    if not rows:  # Ctrl-C before any run finished: no table, and not an earlier sweep's under this one's name
        (out / "sweep.csv").unlink(missing_ok=True)
        return
    with replacing(out / "sweep.csv") as partial, open(partial, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def sweep_title(sweeps: list[tuple[str, list[Any]]], requests: str, trace_label: str, slo: SLO | None) -> str:
    """What was swept, over how many values, on which requests; what the
    lines are when more than one key was swept; the SLO if any."""
    swept = " x ".join(f"{key} ({len(values)} values)" for key, values in sweeps)
    runs = len(configurations(sweeps))
    detail = [f"one colour per value of {key} (legend at the bottom)" for key, _ in sweeps[1:]]
    if slo is not None:
        detail.append(f"SLO {slo}")
    title = f"sweep of {swept}: {runs} runs of {requests} requests of {trace_label}"
    return f"{title}\n{'; '.join(detail)}" if detail else title


def _tick(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _scale(axis: Any, kind: str, highest: float) -> None:
    """The Y axis of a panel: shares 0 to 100, counts and the rest from 0
    (to 1 when every value is 0, so an all-zero series sits on the floor
    rather than in the middle of a range around 0)."""
    from matplotlib.ticker import MaxNLocator

    if kind == "percent":
        axis.set_ylim(0, 100)
        return
    axis.set_ylim(0, highest * 1.08 if highest > 0 else 1)
    if kind == "count":
        axis.yaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))


def _label_points(axis: Any, xs: list[Any], ys: list[Any], color: str) -> None:
    """Each point's value, in its line's colour, on a 0-100 axis where a
    change of a few points would not show: below the point near the top,
    else above it."""
    for x, y in zip(xs, ys):
        if not math.isnan(y):
            offset = (0, -12) if y > 80 else (0, 6)
            axis.annotate(f"{y:.1f}", (x, y), xytext=offset, textcoords="offset points", ha="center", fontsize=7,
                          color=color)  # fmt: skip


def sweep_figure(sweeps: list[tuple[str, list[Any]]], rows: list[dict[str, Any]], title: str) -> Any:
    """The figure of ``plot_sweep``: one panel per headline figure (and the
    SLO's, when the rows have it) against the first swept key. With more
    keys, one colour per combination of the others, named in one legend at
    the bottom, and a panel's columns told apart by line style; with one key,
    one colour per column."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    key, values = sweeps[0]
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    positions = values if numeric else list(range(len(values)))
    others = [name for name, _ in sweeps[1:]]
    series: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        series.setdefault(tuple(row[name] for name in others), []).append(row)
    grouped = len(series) > 1
    panels = PANELS + (SLO_PANELS if SLO_HEADLINES[0][0] in rows[0] else ())
    num_rows = -(-len(panels) // 3)
    figure, axes = plt.subplots(num_rows, 3, figsize=(15, 4.2 * num_rows + 1), squeeze=False, layout="constrained")
    for axis in axes.flat[len(panels) :]:
        axis.remove()
    for axis, (panel, columns, kind) in zip(axes.flat, panels):
        for number, members in enumerate(series.values()):
            at = [positions[values.index(m[key])] for m in members]
            for place, column in enumerate(columns):
                ys = [float("nan") if m[column] is None else m[column] for m in members]
                line, marker = STYLES[place]
                color = f"C{number}" if grouped else f"C{place}"
                axis.plot(at, ys, linestyle=line, marker=marker, color=color, markersize=5, clip_on=False)
                if kind == "percent":
                    _label_points(axis, at, ys, color)
        highest = max((row[c] for row in rows for c in columns if row[c] is not None), default=0)
        _scale(axis, kind, highest)
        axis.set_title(panel, fontsize=10)
        axis.set_xlabel(key)
        axis.set_xticks(positions, [_tick(v) for v in values])
        axis.grid(alpha=0.3)
        if len(columns) > 1:
            styles = [
                Line2D([], [], linestyle=line, marker=marker, color="grey" if grouped else f"C{place}")
                for place, (line, marker) in enumerate(STYLES[: len(columns)])
            ]
            labels = [LEGEND.get(column, column) for column in columns]
            axis.legend(styles, labels, fontsize=7, loc="center right" if kind == "count" else "best")
    figure.suptitle(title)
    if grouped:
        colours = [Line2D([], [], marker="o", color=f"C{number}") for number in range(len(series))]
        names = [", ".join(f"{name}={value}" for name, value in zip(others, group)) for group in series]
        figure.legend(colours, names, loc="outside lower center", ncol=min(len(names), 4), fontsize=9)
    return figure


def plot_sweep(path: Path, sweeps: list[tuple[str, list[Any]]], rows: list[dict[str, Any]], title: str) -> None:
    """Write ``sweep_figure`` as a PNG."""
    import matplotlib.pyplot as plt

    figure = sweep_figure(sweeps, rows, title)
    with replacing(path) as partial:
        figure.savefig(partial, dpi=110)
    plt.close(figure)


def progress(total: int, enabled: bool) -> tuple[Callable[[str], None], Callable[[], None]]:
    """(advance with a note, stop): a rich bar on a terminal, else a line per run."""
    if not enabled:
        return (lambda note: None), (lambda: None)
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        columns = (TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        bar = Progress(*columns, console=Console(), transient=True)  # its own console, as in cli.py
        task = bar.add_task("sweep", total=total)
        bar.start()
        return (lambda note: bar.update(task, advance=1)), bar.stop
    done = [0]

    def line(note: str) -> None:
        done[0] += 1
        print(f"[{done[0]}/{total}] {note}", flush=True)

    return line, (lambda: None)


def sweep(
    args: argparse.Namespace,
    sweeps: list[tuple[str, list[Any]]],
    prepare: Callable[[argparse.Namespace], tuple[Any, list[TraceRequest]]],
    trace_label: str,
) -> int:
    """Check every configuration, run them all, write and print the outputs.
    ``prepare`` turns one run's options into its configuration and its
    requests (``max_requests`` and ``time_scale`` may be swept too); it
    raises for a bad one before anything runs. The executor and the output
    paths are checked then too. ``args.slo`` is an ``SLO`` or None, as
    ``check_arguments`` leaves it."""
    chosen = configurations(sweeps)
    prepared = [prepare(argparse.Namespace(**{**vars(args), **values})) for values in chosen]
    runs_dir = args.out / "sweep"
    check_output_dir(args.out, "--out", OUTPUTS)
    check_output_dir(runs_dir, "--out", (f"run-{k}.json" for k in range(len(chosen))))
    if args.executor == "ray":  # the last check: it joins the cluster
        use_ray(args.address)
    runs_dir.mkdir(parents=True, exist_ok=True)
    jobs = [
        Job(k, values, config, args.manager, trace, trace_label, runs_dir / f"run-{k}.json", args.slo)
        for k, (values, (config, trace)) in enumerate(zip(chosen, prepared))
    ]
    sizes = sorted({len(job.trace) for job in jobs})
    requests = f"{sizes[0]:,}" if len(sizes) == 1 else f"{sizes[0]:,}-{sizes[-1]:,}"
    workers = min(args.workers or os.cpu_count() or 1, len(jobs))
    print(f"sweep: {len(jobs)} runs of {requests} requests from {trace_label}, {workers} worker(s), {args.executor}")
    advance, stop = progress(len(jobs), not args.quiet)
    summaries: list[Any] = [None] * len(jobs)
    started = time.perf_counter()
    complete = True
    try:
        for index, summary in map_unordered(run_job, jobs, workers, args.executor):
            summaries[index] = summary
            advance(", ".join(f"{k}={v}" for k, v in chosen[index].items()) + f": {summary.wall_s:.1f} s")
    except KeyboardInterrupt:  # the workers are ended (executor.py): keep the runs that finished
        complete = False
        remove_partials(runs_dir)  # a worker ended while it wrote its run's file
    finally:
        stop()
    finished = [(values, summary) for values, summary in zip(chosen, summaries) if summary is not None]
    rows = [headline_row(values, summary) for values, summary in finished]
    write_outputs(args.out, sweeps, rows, [summary for _, summary in finished], complete)
    if rows:
        print(format_table(rows))
        print(table_note(args.slo))
    if not complete:
        print(f"incomplete: Ctrl-C stopped the sweep after {len(rows)} of {len(jobs)} runs; the table holds those")
        raise Interrupted(f"{len(rows)} of {len(jobs)} runs finished, kept in {args.out / 'sweep.json'}"
                          + (f" and {args.out / 'sweep.csv'}" if rows else "") + ", marked incomplete")  # fmt: skip
    print(f"{len(jobs)} runs in {time.perf_counter() - started:.1f} s wall; per-run figures: {runs_dir}/")
    print(f"summary: {args.out / 'sweep.json'}, {args.out / 'sweep.csv'}")
    if not args.no_plot:
        plot_sweep(args.out / "sweep.png", sweeps, rows, sweep_title(sweeps, requests, trace_label, args.slo))
        print(f"plot:    {args.out / 'sweep.png'}")
    return 0


__all__ = [
    "COUNTS",
    "FIGURES",
    "SLO_HEADLINES",
    "Job",
    "configurations",
    "headline_row",
    "parse_sweeps",
    "sweepable",
    "swept_dest",
    "plot_sweep",
    "run_job",
    "sweep",
    "sweep_figure",
    "sweep_title",
]
