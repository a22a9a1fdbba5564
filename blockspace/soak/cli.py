"""``blockspace soak``: a long run that looks for leaks and drift.

Two parts, each optional:

* ``--ops N``: N random legal operations (the scheduler walk of
  ``blockspace.conformance.walk``) on long-lived managers of one
  implementation, in three configurations (prefix caching with swaps and
  forks; plain with lookahead; sliding window). Every ``--check-every``
  calls ``check_invariants()`` runs; after every walk all sequences are
  finished and every block must be free again (a leak is a failure). The
  resident set size is sampled as the run goes, to show it is flat after
  warm-up.
* ``--trace PATH``: the whole trace through the simulator with two managers
  (``--compare``), which must make identical decisions.

Every option, both managers, the trace and the output paths are checked
before anything runs (a bad one: one ``error:`` line, exit status 2), and
so is an option of a part that does not run (``--impl`` or ``--check-every``
with ``--ops 0``, ``--compare`` or ``--out`` without ``--trace``): it would
change nothing. The exit status is 1 when a check fails: a leak, a broken
invariant, a manager that raises, a replay that diverges or fails. Progress
goes to stderr every few seconds; the results to stdout and, with
``--json``, to a file holding only what this run found (docs/reliability.md
quotes them). Not part of the test suite: the default run takes a minute or
two.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from blockspace.conformance.walk import Config, Solo, walk
from blockspace.errors import BlockSpaceError, InvalidArgumentError
from blockspace.outputs import write_text
from blockspace.soak.options import MODES, NEEDS, RANGES, build_parser
from blockspace.validation import (
    check_distinct_outputs,
    check_mode_options,
    check_output_file,
    check_ranges,
    given_options,
    load_manager,
    refuse,
)

CONFIGS = {
    "caching": Config(4, 64, 32, enable_caching=True, lookahead=(0, 0, 3), max_prompt=48),
    "plain": Config(2, 64, 32, watermark=0.05, lookahead=(0, 2), max_prompt=40),
    "window": Config(4, 48, 16, sliding_window=8, lookahead=(0, 2), max_prompt=40),
}
STEPS_PER_WALK = 200
PROGRESS_EVERY_S = 5.0  # a progress line on stderr at most this often


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def soak_ops(cls: type, num_ops: int, check_every: int) -> dict[str, Any]:
    """At least ``num_ops`` calls of random walks on managers of ``cls``; the
    figures, with ``failure`` saying what went wrong (``None``: nothing). It
    stops at the first failure: every later figure would be about a broken
    manager."""
    managers, drivers = {}, {}
    checks = [0]  # check_invariants() calls, every --check-every calls and after every walk
    for name, config in CONFIGS.items():
        args, kwargs = config.args()
        managers[name] = cls(*args, **kwargs)

        def check(driver: Solo, manager: Any = managers[name]) -> None:
            if driver.num_calls % check_every == 0:
                checks[0] += 1
                manager.check_invariants()

        drivers[name] = Solo(managers[name], on_call=check)
    samples, num_walks, seed, leaked, failure = [], 0, 0, 0, None
    start = last_progress = time.perf_counter()
    while failure is None and sum(d.num_calls for d in drivers.values()) < num_ops:
        for name, config in CONFIGS.items():
            manager = managers[name]
            try:
                walk(drivers[name], config, seed, STEPS_PER_WALK)
                checks[0] += 1
                manager.check_invariants()
                null = 1 if manager.snapshot()["null_block"] is not None else 0
                leaked = (config.num_gpu_blocks - null - manager.get_num_free_gpu_blocks()) + (
                    config.num_cpu_blocks - manager.get_num_free_cpu_blocks()
                )
                if leaked:
                    failure = f"{name}: {leaked} blocks still in use after the walk of seed {seed}"
            except Exception as error:  # the manager under test raised: what the soak is looking for
                failure = f"{name}: the walk of seed {seed}: {type(error).__name__}: {error}"
            seed += 1
            num_walks += 1
            if failure is not None:
                break
        done, now = sum(d.num_calls for d in drivers.values()), time.perf_counter()
        samples.append((done, round(now - start, 1), round(rss_mib(), 1)))
        if now - last_progress >= PROGRESS_EVERY_S:
            last_progress = now
            print(f"soak: {done:,} of {num_ops:,} operations, {num_walks:,} walks, {now - start:.0f} s, "
                  f"RSS {samples[-1][2]} MiB", file=sys.stderr, flush=True)  # fmt: skip
    seconds = time.perf_counter() - start
    warm = samples[max(0, len(samples) // 5 - 1)]
    return {
        "implementation": f"{cls.__module__}.{cls.__qualname__}",
        "num_ops": samples[-1][0],
        "num_walks": num_walks,
        "seconds": round(seconds, 1),
        "ops_per_second": round(samples[-1][0] / seconds),
        "leaked_blocks": leaked,
        "invariant_checks": checks[0],
        "failure": failure,
        "rss_mib_after_warmup": warm[2],
        "rss_mib_at_end": samples[-1][2],
        "rss_samples": samples[:: max(1, len(samples) // 40)] + [samples[-1]],
    }


def describe_ops(ops: dict[str, Any]) -> str:
    """The line the operations part prints."""
    figures = (
        f"{ops['num_ops']:,} operations in {ops['num_walks']} walks, {ops['seconds']} s ({ops['ops_per_second']:,}/s)"
    )
    if ops["failure"] is not None:
        return f"{figures}: FAILED: {ops['failure']}"
    return (
        f"{figures}: 0 leaked blocks; RSS {ops['rss_mib_after_warmup']} MiB after warm-up, "
        f"{ops['rss_mib_at_end']} MiB at the end"
    )


def main(argv: list[str] | None = None) -> int:
    """Exit status 0 when every check holds, 1 when one fails, 2 for a bad option."""
    from blockspace.simulator.cli import execute, prepare

    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        check_ranges(args, RANGES)
        if not args.ops and not args.trace:
            raise InvalidArgumentError("--ops 0 and no --trace: nothing to run")
        given = given_options(parser, sys.argv[1:] if argv is None else argv)
        check_mode_options(given, (mode for mode in MODES if getattr(args, mode)), NEEDS, {})
        impl = load_manager(args.impl, "--impl") if args.ops else None
        replay = None
        if args.trace:
            replay = prepare([f"--trace={args.trace}", f"--compare={args.compare}", f"--out={args.out}", "--no-plot"])
        if args.json:
            check_output_file(args.json, "--json")
            if replay is not None:
                files = {"--json": args.json, "--out's simulation.json": Path(args.out) / "simulation.json"}
                check_distinct_outputs(files, {"--out": Path(args.out)})
    except BlockSpaceError as error:
        return refuse(error)

    results: dict[str, Any] = {}
    failed = False
    if impl is not None:
        print(f"soak: {args.ops:,} operations on {impl.__name__} ...", file=sys.stderr, flush=True)
        results["ops"] = ops = soak_ops(impl, args.ops, args.check_every)
        print(describe_ops(ops))
        failed = ops["failure"] is not None
    if replay is not None:
        print(f"soak: replaying {args.trace} with {args.compare} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        code, figures = execute(replay)
        results["trace"] = {"exit_code": code, "seconds": round(time.perf_counter() - start, 1), "figures": figures}
        print(f"trace replay with {args.compare}: " + ("identical decisions" if code == 0 else "FAILED"))
        failed = failed or code != 0
    results["passed"] = not failed
    if args.json:
        write_text(args.json, json.dumps(results, indent=1))  # whole, then renamed (outputs.py)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
