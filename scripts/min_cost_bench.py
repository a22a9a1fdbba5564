"""Time ``blockspace simulate --find min-cost`` and say where the time goes (issue #53).

Runs the command given after ``--`` in this process, with each search timed: the
central answers, the clock range's searches (every step shorter and longer by the
clock's error) and the other draws' searches (``--seeds``), each with its runs. The
rest of the wall time is loading, checking, compiling and writing.

    python scripts/min_cost_bench.py --json out.json -- --trace T --max-requests 2000 \\
        --model llama-3.1-70b --sweep gpu=H100-SXM,H200 --sweep tensor_parallel=2,4,8 \\
        --find min-cost --slo ttft=2s,tpot=100ms --gpu-cost H100-SXM=3,H200=3.8 --quiet --out /tmp/mc
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from typing import Any

import blockspace.simulator.cli as simulate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then blockspace simulate's options")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    phases: dict[str, dict[str, float]] = defaultdict(lambda: {"searches": 0, "runs": 0, "seconds": 0.0})
    search_once = simulate.search_once

    def timed(run_args: Any, config: Any, trace: Any, rate: Any, most: int, near: Any, say: Any) -> Any:
        started = time.perf_counter()
        found = search_once(run_args, config, trace, rate, most, near, say)
        pace = getattr(config.step_time, "pace", 1.0)
        phase = "central" if near is None else "clock range" if pace != 1.0 else "other draws"
        phases[phase]["searches"] += 1
        phases[phase]["runs"] += found.runs
        phases[phase]["seconds"] += time.perf_counter() - started
        return found

    simulate.search_once = timed  # type: ignore[assignment]
    started = time.perf_counter()
    status = simulate.main(command)
    wall = time.perf_counter() - started
    searched = sum(phase["seconds"] for phase in phases.values())
    print(f"\n{'phase':<12}  {'searches':>8}  {'runs':>5}  {'seconds':>8}  {'s/run':>6}")
    for name, phase in phases.items():
        per_run = phase["seconds"] / max(phase["runs"], 1)
        print(
            f"{name:<12}  {phase['searches']:>8.0f}  {phase['runs']:>5.0f}  {phase['seconds']:>8.1f}  {per_run:>6.2f}"
        )
    print(f"{'the rest':<12}  {'':>8}  {'':>5}  {wall - searched:>8.1f}  (loading, checking, compiling, writing)")
    print(f"{'wall':<12}  {'':>8}  {'':>5}  {wall:>8.1f}  exit {status}")
    if args.json:
        figures = {"command": command, "exit": status, "wall_s": wall, "phases": dict(phases)}
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
