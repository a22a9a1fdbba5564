"""The simulator's manager time per step, manager against manager and step
path against step path, measured in turns.

    python -m blockspace.bench.simulator --max-requests 200 --rounds 3
    python -m blockspace.bench.simulator --trace conversation.jsonl --max-requests 2000 --no-enable-prefix-caching

Each way (``reference``, ``fast@calls``, ``fast@rows`` by default: a manager
and the scheduler's step path, ``simulator/row_step.py``) replays
the same trace with the same settings; the rounds take the ways in turn, so
a slow spell of a shared machine slows them alike, and the best round of
each is kept. Every way must make the same decisions (the per-step records
are compared), or the run fails. Printed: the wall time inside the manager
per step and in all, its ratio to the first way, and the run's wall time. A
benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from blockspace.errors import BlockSpaceError, InvalidArgumentError
from blockspace.interfaces import load_manager_class
from blockspace.simulator import SchedulerConfig, SimulationConfig, run_simulation
from blockspace.simulator.report import first_difference
from blockspace.simulator.runs import STEP_PATHS
from blockspace.validation import (
    Range,
    check_output_file,
    check_ranges,
    command_parser,
    load_manager,
    refuse,
    write_output,
)
from blockspace.workloads import load_trace_option, trace_source


class DecidedDifferently(Exception):
    """Two ways made different decisions: their times compare nothing."""


def measure(trace: list, config: SimulationConfig, ways: list[str], rounds: int) -> dict[str, dict[str, Any]]:
    """Per way: the best round's manager seconds, steps and wall seconds."""
    best: dict[str, dict[str, Any]] = {}
    records: dict[str, list] = {}
    for _ in range(rounds):
        for way in ways:
            name, _, step = way.partition("@")
            run_config = replace(config, scheduler=replace(config.scheduler, step=step or "auto"))
            result = run_simulation(trace, load_manager_class(name), run_config)
            timeline = result.metrics.timeline
            manager_s = sum(timeline.manager_s)
            records.setdefault(way, result.records)
            if way not in best or manager_s < best[way]["manager_s"]:
                best[way] = {"manager_s": manager_s, "steps": len(timeline.manager_s),
                             "wall_s": result.metrics.wall_s, "calls": result.metrics.manager_calls,
                             "by_method": result.metrics.manager_by_method}  # fmt: skip
    first = ways[0]
    for way in ways[1:]:
        difference = first_difference(records[first], records[way])
        if difference is not None:
            raise DecidedDifferently(f"{way} decided differently from {first}: {difference}")
    return best


def table(best: dict[str, dict[str, Any]]) -> str:
    ways = list(best)
    base = best[ways[0]]["manager_s"]
    lines = [
        f"| way | manager us / step | manager s | {ways[0]} / way | calls | wall s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for way, figures in best.items():
        per_step = figures["manager_s"] / figures["steps"] * 1e6
        ratio = base / figures["manager_s"] if figures["manager_s"] else float("inf")
        lines.append(
            f"| {way} | {per_step:,.1f} | {figures['manager_s']:.2f} | {ratio:.2f}x | {figures['calls']:,} | "
            f"{figures['wall_s']:.1f} |"
        )
    return "\n".join(lines)


def step_table(best: dict[str, dict[str, Any]]) -> str:
    """Where a step's wall time goes, way by way (each way's best round):
    every manager method in microseconds per step, then the rest of the
    replay (the scheduler's policy, the model's side and the bookkeeping)."""
    ways = list(best)
    names = sorted({name for way in ways for name in best[way]["by_method"]},
                   key=lambda name: -max(best[way]["by_method"].get(name, (0.0, 0))[0] for way in ways))  # fmt: skip
    lines = ["| us / step | " + " | ".join(ways) + " |", "| --- |" + " ---: |" * len(ways)]

    def row(label: str, seconds: list[float]) -> str:
        cells = [f"{s / best[way]['steps'] * 1e6:,.1f}" for s, way in zip(seconds, ways)]
        return f"| {label} | " + " | ".join(cells) + " |"

    for name in names:
        lines.append(row(f"`{name}`", [best[way]["by_method"].get(name, (0.0, 0))[0] for way in ways]))
    lines.append(row("**inside the manager**", [best[way]["manager_s"] for way in ways]))
    lines.append(row("**outside it** (policy, model, bookkeeping)",
                     [best[way]["wall_s"] - best[way]["manager_s"] for way in ways]))  # fmt: skip
    lines.append(row("**the whole step**", [best[way]["wall_s"] for way in ways]))
    return "\n".join(lines)


RANGES = {"max_requests": Range(least=1), "rounds": Range(least=1), "num_gpu_blocks": Range(least=1),
          "num_cpu_blocks": Range(least=0)}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("python -m blockspace.bench.simulator", __doc__)
    parser.add_argument(
        "--trace", type=Path, help="Mooncake-format JSONL (default: $BLOCKSPACE_TRACE, else the sample)"
    )
    parser.add_argument("--max-requests", type=int, default=200, help="the first N requests")
    parser.add_argument("--ways", default="reference,fast@calls,fast@rows", help="MANAGER[@calls|@rows],...")
    parser.add_argument("--rounds", type=int, default=2, help="rounds in turns; the best of each way is kept")
    parser.add_argument("--num-gpu-blocks", type=int, default=49_152, help="GPU blocks")
    parser.add_argument("--num-cpu-blocks", type=int, default=2_048, help="CPU blocks")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                        help="prefix caching")  # fmt: skip
    parser.add_argument("--by-method", action="store_true", help="also: where a step's time goes, method by method")
    parser.add_argument("--json", type=Path, help="write the figures here (default: not written)")
    return parser


def checked_ways(text: str) -> list[str]:
    """``MANAGER[@STEP],...``, each manager loaded and its step path one it
    offers, before anything is timed (``InvalidArgumentError`` naming ``--ways``)."""
    from blockspace.simulator.cli import check_step

    ways = [way.strip() for way in text.split(",") if way.strip()]
    if not ways:
        raise InvalidArgumentError(f"--ways: no way in {text!r}: give MANAGER[@calls|@rows],...")
    for way in ways:
        name, at, step = way.partition("@")
        if at and step not in STEP_PATHS:
            raise InvalidArgumentError(f"--ways: {way!r}: the step path after @ must be one of {', '.join(STEP_PATHS)}")
        check_step(load_manager(name, "--ways"), step, f"--ways: {way!r}")
    return ways


def main(argv: list[str] | None = None) -> int:
    """Exit status 0; 1 when the ways decide differently; 2 for a bad option,
    said before anything is timed."""
    try:
        args = build_parser().parse_args(argv)
        check_ranges(args, RANGES)
        ways = checked_ways(args.ways)
        if args.json:
            check_output_file(args.json, "--json")
        trace = load_trace_option(args.trace, args.max_requests)
        config = SimulationConfig(
            args.num_gpu_blocks,
            args.num_cpu_blocks,
            scheduler=SchedulerConfig(enable_prefix_caching=args.enable_prefix_caching),
        )
    except BlockSpaceError as error:
        return refuse(error)
    caching = "on" if args.enable_prefix_caching else "off"
    print(
        f"{len(trace):,} requests of {trace_source(args.trace)}, prefix caching {caching}, "
        f"{args.rounds} round(s) in turns"
    )
    try:
        best = measure(trace, config, ways, args.rounds)
    except DecidedDifferently as error:
        return refuse(error, 1)
    print(table(best))
    if args.by_method:
        print()
        print(step_table(best))
    if args.json:
        write_output(args.json, json.dumps({"requests": len(trace), "caching": caching, "ways": best}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
