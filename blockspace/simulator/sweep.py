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
cluster. Runs are independent, so their figures do not depend on the
executor or on the order in which they finish. Written under ``--out``:

    sweep/run-<k>.json   each run's full figures (as ``simulation.json``)
    sweep.json           every configuration and its summary
    sweep.csv            the headline figures, one row per run
    sweep.png            one panel per headline figure against the swept value
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from blockspace.errors import InvalidArgumentError, MissingExtraError
from blockspace.validation import Range, check_output_dir, option_name
from blockspace.workloads import TraceRequest

TRUE, FALSE = ("on", "true", "yes", "1"), ("off", "false", "no", "0")
OUTPUTS = ("sweep.json", "sweep.csv", "sweep.png")  # what a sweep writes under --out, beside sweep/
NOT_SWEPT = ("trace", "manager", "compare", "sweep", "workers", "executor", "out", "no_plot", "quiet")

# The headline figures: (column, label, how to read it off a run's summary).
HEADLINES: tuple[tuple[str, str, Callable[[dict[str, Any]], Any]], ...] = (
    ("ttft_p50_s", "TTFT p50 (s)", lambda s: s["ttft_s"]["p50"]),
    ("ttft_p99_s", "TTFT p99 (s)", lambda s: s["ttft_s"]["p99"]),
    ("e2e_p50_s", "end-to-end p50 (s)", lambda s: s["e2e_latency_s"]["p50"]),
    ("e2e_p99_s", "end-to-end p99 (s)", lambda s: s["e2e_latency_s"]["p99"]),
    ("output_tokens_per_s", "throughput (output tok/s)", lambda s: s["throughput"]["output_tokens_per_s"]),
    ("hit_rate", "prefix-cache hit rate (final)", lambda s: s["prefix_cache"]["gpu_block_hit_rate"]),
    (
        "preemptions",
        "preemptions (recompute + swap out)",
        lambda s: s["preemption"]["recompute"] + s["preemption"]["swap_out"],
    ),  # fmt: skip
    ("peak_kv_usage", "peak KV use (share of GPU blocks)", lambda s: s["kv_cache"]["peak_usage"]),
)
PANELS = (  # the plot's panels: the columns drawn in each
    ("latency: TTFT (s)", ("ttft_p50_s", "ttft_p99_s")),
    ("latency: end-to-end (s)", ("e2e_p50_s", "e2e_p99_s")),
    ("throughput (output tok/s)", ("output_tokens_per_s",)),
    ("prefix-cache hit rate", ("hit_rate",)),
    ("preemptions", ("preemptions",)),
    ("peak KV use (share of GPU blocks)", ("peak_kv_usage",)),
)


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


def parse_sweeps(
    specs: list[str], parser: argparse.ArgumentParser, ranges: Mapping[str, Range] | None = None
) -> list[tuple[str, list[Any]]]:
    """``KEY=V1,V2`` specs as ``(option dest, values)``, each value parsed as
    the option parses it and in the option's range of ``ranges``
    (``InvalidArgumentError`` naming ``--sweep`` and the first bad value)."""
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest not in NOT_SWEPT and a.dest != "help"}
    sweeps: list[tuple[str, list[Any]]] = []
    for spec in specs:
        key, equals, text = spec.partition("=")
        dest = key.strip().lstrip("-").replace("-", "_")
        if not equals or not text.strip():
            raise InvalidArgumentError(f"--sweep {spec!r}: expected KEY=V1,V2,...")
        if dest not in actions:
            raise InvalidArgumentError(
                f"--sweep: no option {key.strip()!r} to sweep (options: {', '.join(sorted(actions))})"
            )
        if dest in (name for name, _ in sweeps):
            raise InvalidArgumentError(f"--sweep: {dest} is swept twice")
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


def run_job(job: Job) -> tuple[int, dict[str, Any]]:
    """Run one configuration, write its JSON; returns its index and summary."""
    from blockspace.interfaces import load_manager_class
    from blockspace.simulator.report import summarize, write_json
    from blockspace.simulator.simulation import run_simulation

    result = run_simulation(job.trace, load_manager_class(job.manager), job.config)
    summary = summarize(result)
    write_json(job.path, [result], [summary], {"trace": job.trace_label, "sweep": job.values})
    return job.index, summary


def ray_pool() -> type:
    """Ray's ``Pool`` class (``MissingExtraError`` without Ray)."""
    try:
        from ray.util.multiprocessing import Pool
    except ImportError:
        raise MissingExtraError("--executor ray needs Ray installed: pip install ray") from None
    return Pool


def _pool(executor: str, workers: int) -> Any:
    """A pool with ``imap_unordered``: worker processes, or Ray's."""
    if executor == "ray":
        return ray_pool()(processes=workers)
    import multiprocessing

    return multiprocessing.get_context("spawn").Pool(processes=workers)


def run_jobs(jobs: list[Job], workers: int, executor: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(index, summary)`` of every job as it finishes; one worker runs them
    in this process, more use a pool."""
    if executor == "process" and workers == 1:
        yield from map(run_job, jobs)
        return
    pool = _pool(executor, min(workers, len(jobs)))
    try:
        yield from pool.imap_unordered(run_job, jobs)
    finally:
        pool.close()
        pool.join()


# -- the outputs -----------------------------------------------------------------------------
def headline_row(values: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    return {**values, **{column: read(summary) for column, _, read in HEADLINES}}


def format_table(rows: list[dict[str, Any]]) -> str:
    columns = list(rows[0])
    cells = [[_cell(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(f"{c:>{w}}" for c, w in zip(columns, widths))]
    lines += ["  ".join(f"{v:>{w}}" for v, w in zip(line, widths)) for line in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def write_outputs(
    out: Path, sweeps: list[tuple[str, list[Any]]], rows: list[dict[str, Any]], summaries: list[Any]
) -> None:
    (out / "sweep.json").write_text(
        json.dumps(
            {
                "swept": dict(sweeps),
                "runs": [{"values": {k: r[k] for k, _ in sweeps}, "summary": s} for r, s in zip(rows, summaries)],
            },
            indent=1,
        )  # fmt: skip
    )
    with open(out / "sweep.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot_sweep(path: Path, sweeps: list[tuple[str, list[Any]]], rows: list[dict[str, Any]], title: str) -> None:
    """One panel per headline figure against the first swept key; one line
    per combination of the other keys."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key, values = sweeps[0]
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    positions = values if numeric else list(range(len(values)))
    others = [name for name, _ in sweeps[1:]]
    series: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        series.setdefault(tuple(row[name] for name in others), []).append(row)
    labels = {column: label for column, label, _ in HEADLINES}
    figure, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for axis, (panel, columns) in zip(axes.flat, PANELS):
        for group, members in series.items():
            at = [positions[values.index(m[key])] for m in members]
            for column, style in zip(columns, ("-o", "--s")):
                name = ", ".join(f"{n}={v}" for n, v in zip(others, group))
                label = (labels[column].split(" (")[0] if len(columns) > 1 else "") + (f" [{name}]" if name else "")
                ys = [float("nan") if m[column] is None else m[column] for m in members]
                axis.plot(at, ys, style, label=label.strip() or None, linewidth=1.2, markersize=4)
        axis.set_title(panel, fontsize=10)
        axis.set_xlabel(key)
        if not numeric:
            axis.set_xticks(positions, [str(v) for v in values])
        if len(columns) > 1 or others:
            axis.legend(fontsize=7)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def progress(total: int, enabled: bool) -> tuple[Callable[[str], None], Callable[[], None]]:
    """(advance with a note, stop): a rich bar on a terminal, else a line per run."""
    if not enabled:
        return (lambda note: None), (lambda: None)
    if sys.stdout.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=True)
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
    paths are checked then too."""
    chosen = configurations(sweeps)
    prepared = [prepare(argparse.Namespace(**{**vars(args), **values})) for values in chosen]
    if args.executor == "ray":
        ray_pool()
    runs_dir = args.out / "sweep"
    check_output_dir(args.out, "--out", OUTPUTS)
    check_output_dir(runs_dir, "--out", (f"run-{k}.json" for k in range(len(chosen))))
    runs_dir.mkdir(parents=True, exist_ok=True)
    jobs = [
        Job(k, values, config, args.manager, trace, trace_label, runs_dir / f"run-{k}.json")
        for k, (values, (config, trace)) in enumerate(zip(chosen, prepared))
    ]
    sizes = sorted({len(job.trace) for job in jobs})
    requests = f"{sizes[0]:,}" if len(sizes) == 1 else f"{sizes[0]:,}-{sizes[-1]:,}"
    workers = min(args.workers or os.cpu_count() or 1, len(jobs))
    print(f"sweep: {len(jobs)} runs of {requests} requests from {trace_label}, {workers} worker(s), {args.executor}")
    advance, stop = progress(len(jobs), not args.quiet)
    summaries: list[Any] = [None] * len(jobs)
    started = time.perf_counter()
    try:
        for index, summary in run_jobs(jobs, workers, args.executor):
            summaries[index] = summary
            advance(", ".join(f"{k}={v}" for k, v in chosen[index].items()) + f": {summary['wall_s']:.1f} s")
    finally:
        stop()
    rows = [headline_row(values, summary) for values, summary in zip(chosen, summaries)]
    write_outputs(args.out, sweeps, rows, summaries)
    print(format_table(rows))
    print(f"{len(jobs)} runs in {time.perf_counter() - started:.1f} s wall; per-run figures: {runs_dir}/")
    print(f"summary: {args.out / 'sweep.json'}, {args.out / 'sweep.csv'}")
    if not args.no_plot:
        swept = " x ".join(f"{k} ({len(v)})" for k, v in sweeps)
        plot_sweep(args.out / "sweep.png", sweeps, rows, f"sweep of {swept}: {requests} requests of {trace_label}")
        print(f"plot:    {args.out / 'sweep.png'}")
    return 0


__all__ = ["HEADLINES", "Job", "configurations", "parse_sweeps", "plot_sweep", "run_job", "run_jobs", "sweep"]
