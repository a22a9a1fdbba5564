"""A fleet's replay against one replica's (or a smaller fleet's) over the
same trace: the whole command timed, the two in turns.

The fleet's target (docs/simulator.md): N replicas over a trace cost no
more than 1.3 times one replica's replay of it. Each router's fleet
(``blockspace simulate --replicas N --router R``, A) and the single
replica (B) run one after the other, ``--runs`` times after a warm-up of
each. With ``--against K``, B is the fleet of K replicas under the same
router: issue #51's target, a fleet of 256 under ``round_robin`` no slower
per request than a fleet of 4 (``--replicas 256 --against 4 --target 1
round_robin``; the same requests, so the ratio is the ratio per request).
The ratio A/B is taken pair by pair, since the two runs of a pair
are close in time and a shared machine's speed drifts. The median pair is
reported, with the spread. Wall time is read from a monotonic clock; user
CPU time is the finished child's own accounting (``os.wait4``). The exit
status is 1 when a router's median wall ratio is over ``--target``.

    python scripts/fleet_vs_one.py [--trace PATH] [--requests 2000] [--replicas 4] [--against 1]
                                   [--runs 7] [--target 1.3] [ROUTER ...]   # default: every router
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from blockspace.simulator.routers import ROUTERS


def timed(command: list[str]) -> tuple[float, float]:
    """Wall and user CPU seconds of one run of ``command`` (its output thrown away)."""
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"error: {' '.join(command)} exited {os.waitstatus_to_exitcode(status)}")
    return wall, usage.ru_utime


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f} to {max(values):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("routers", nargs="*", metavar="ROUTER", help=f"of {', '.join(ROUTERS)} (default: every one)")
    parser.add_argument("--trace", help="a Mooncake trace (JSONL); default: the bundled sample")
    parser.add_argument("--requests", type=int, default=2_000, help="the trace's first N requests (default 2000)")
    parser.add_argument("--replicas", type=int, default=4, help="the fleet's size (default 4)")
    parser.add_argument("--against", type=int, default=1, help="the smaller fleet's size, B (default 1: one replica)")
    parser.add_argument("--runs", type=int, default=7, help="pairs timed per router, after a warm-up (default 7)")
    parser.add_argument("--target", type=float, default=1.3, help="the highest median wall ratio (default 1.3)")
    args = parser.parse_args()
    if args.requests < 1 or args.replicas < 2 or args.runs < 1 or args.target <= 0:
        parser.error("--requests and --runs must be at least 1, --replicas at least 2, --target above 0")
    if not 1 <= args.against < args.replicas:
        parser.error(f"--against {args.against}: from 1 to fewer than --replicas ({args.replicas})")
    unknown = [router for router in args.routers if router not in ROUTERS]
    if unknown:
        parser.error(f"no router {', '.join(unknown)}: choose one of {', '.join(ROUTERS)}")
    if args.trace is not None and not Path(args.trace).is_file():
        parser.error(f"--trace {args.trace}: no such file")
    with tempfile.TemporaryDirectory() as out:
        one = [sys.executable, "-m", "blockspace", "simulate", "--max-requests", str(args.requests), "--no-plot",
                "--quiet", "--out", out, *(["--trace", args.trace] if args.trace else [])]  # fmt: skip
        print(f"{args.replicas} replicas against {args.against}, {args.requests:,} requests, "
              f"{args.runs} pairs in turns")  # fmt: skip
        print(f"{'router':<14} {f'{args.replicas} wall s':>22} {f'{args.against} wall s':>22} {'wall ratio':>22} "
              f"{'user CPU ratio':>22}")  # fmt: skip
        over = []
        for router in args.routers or list(ROUTERS):
            fleet = [*one, "--replicas", str(args.replicas), "--router", router]
            smaller = [*one, "--replicas", str(args.against), "--router", router] if args.against > 1 else one
            timed(fleet), timed(smaller)  # the warm-up: Numba's cache loaded, the trace in the page cache
            pairs = [(timed(fleet), timed(smaller)) for _ in range(args.runs)]
            walls = [a[0] / b[0] for a, b in pairs]
            users = [a[1] / b[1] for a, b in pairs]
            print(f"{router:<14} {spread([a[0] for a, _ in pairs]):>22} {spread([b[0] for _, b in pairs]):>22} "
                  f"{spread(walls):>22} {spread(users):>22}")  # fmt: skip
            if statistics.median(walls) > args.target:
                over.append(router)
        print(f"over {args.target}x by the median wall ratio: {', '.join(over)}" if over else
              f"every router within {args.target}x by the median wall ratio")  # fmt: skip
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
