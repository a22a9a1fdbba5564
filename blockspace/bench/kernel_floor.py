"""The time a replay spends inside the fast manager's compiled kernels, per
simulator step: the floor of a simulator whose own loop costs nothing.

    python -m blockspace.bench.kernel_floor --trace conversation.jsonl --max-requests 2000

Why: issue #41 asks for a compiled simulation core that calls fast's
kernels with no Python in between. Such a core still does every kernel
call the Python replay does, so the kernels' own time bounds it from below,
whatever the loop around them costs. This measures that bound on a real
trace, kernel by kernel. If the bound is above a target, calling today's
kernels from compiled code cannot meet it: the kernels' work must shrink.

How: one warm-up replay binds every kernel's compiled entry point
(``fast/dispatch.py``). Then each name of ``blockspace.fast.kernels`` is
wrapped in a timer, the replay runs with the default settings (the fast
manager, row path), and the timers are read. The timer's own cost per call
is measured on an empty call and taken off. A benchmark, not a test: nothing
here asserts a speed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blockspace.bench.timing import report, trace_command
from blockspace.errors import BlockSpaceError
from blockspace.interfaces import load_manager_class
from blockspace.simulator import SchedulerConfig, SimulationConfig, run_simulation
from blockspace.validation import Range, command_parser, refuse
from blockspace.workloads import TRACE_ENV, trace_source

RANGES = {"max_requests": Range(least=1)}
WARM_UP_REQUESTS = 50
TIMER_CALLS = 200_000  # empty calls timed to learn the timer's own cost


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("python -m blockspace.bench.kernel_floor", __doc__)
    parser.add_argument(
        "--trace", type=Path, help=f"Mooncake-format JSONL (default: ${TRACE_ENV}, else the bundled sample)"
    )
    parser.add_argument("--max-requests", type=int, help="replay only the first N requests (default: all)")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                        help="prefix caching")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the figures here (default: not written)")
    return parser


class Timers:
    """Seconds and calls per kernel name, and wrappers that add to them."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def wrap(self, name: str, kernel: Callable[..., Any]) -> Callable[..., Any]:
        self.seconds[name], self.calls[name] = 0.0, 0
        clock = time.perf_counter

        def timed(*args: Any) -> Any:
            started = clock()
            answer = kernel(*args)
            self.seconds[name] += clock() - started
            self.calls[name] += 1
            return answer

        return timed


def timer_cost() -> float:
    """Seconds one wrapped call adds around an empty one."""
    timers = Timers()
    empty = timers.wrap("empty", lambda *args: None)
    for _ in range(TIMER_CALLS):
        empty(1, 2)
    return timers.seconds["empty"] / TIMER_CALLS


def measure(trace: list, config: SimulationConfig) -> dict[str, Any]:
    """Replay ``trace`` with every kernel of ``blockspace.fast.kernels`` timed
    (the names are put back afterwards)."""
    from blockspace.fast import kernels

    fast = load_manager_class("fast")
    run_simulation(trace[:WARM_UP_REQUESTS], fast, config)  # binds the entry points the replay calls
    names = [name for name, value in vars(kernels).items() if callable(value) and not name.startswith("_")]
    names = [name for name in names if name not in ("direct", "rebind_module")]
    saved = {name: getattr(kernels, name) for name in names}
    timers = Timers()
    cost = timer_cost()
    try:
        for name in names:
            setattr(kernels, name, timers.wrap(name, saved[name]))
        started = time.perf_counter()
        result = run_simulation(trace, fast, config)
        replay_s = time.perf_counter() - started
    finally:
        for name, kernel in saved.items():
            setattr(kernels, name, kernel)
    steps = len(result.records)
    per_kernel = {
        name: {"calls": timers.calls[name], "seconds": timers.seconds[name] - timers.calls[name] * cost}
        for name in names
        if timers.calls[name]
    }
    inside = sum(figures["seconds"] for figures in per_kernel.values())
    return {"requests": len(trace), "steps": steps, "replay_s": replay_s, "kernels_s": inside,
            "timer_cost_us": cost * 1e6, "kernels": per_kernel}  # fmt: skip


def table(figures: dict[str, Any], top: int = 10) -> str:
    steps = figures["steps"]
    lines = [
        f"{figures['requests']:,} requests, {steps:,} steps: the replay {figures['replay_s']:.2f} s (kernels timed), "
        f"inside the kernels {figures['kernels_s']:.3f} s = {figures['kernels_s'] / steps * 1e6:.1f} us a step "
        f"(the timer's {figures['timer_cost_us']:.2f} us a call taken off)",
        "",
        "| kernel | calls | us / step | us / call |",
        "| --- | ---: | ---: | ---: |",
    ]
    ranked = sorted(figures["kernels"].items(), key=lambda item: -item[1]["seconds"])
    for name, kernel in ranked[:top]:
        lines.append(
            f"| `{name}` | {kernel['calls']:,} | {kernel['seconds'] / steps * 1e6:.2f} | "
            f"{kernel['seconds'] / kernel['calls'] * 1e6:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Exit status 0; 2 for a bad option, said before anything is timed."""
    try:
        args, trace = trace_command(build_parser(), argv, RANGES)
    except BlockSpaceError as error:
        return refuse(error)
    config = SimulationConfig(
        49_152, 2_048, scheduler=SchedulerConfig(enable_prefix_caching=args.enable_prefix_caching)
    )
    print(f"{trace_source(args.trace)}, prefix caching {'on' if args.enable_prefix_caching else 'off'}", flush=True)
    figures = measure(trace, config)
    report(table(figures), figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
