"""``blockspace soak``: a long run that looks for leaks and drift.

Two parts, each optional:

* ``--ops N``: N random legal operations (the scheduler walk of
  ``blockspace.conformance.walk``) on long-lived managers of one
  implementation, in three configurations (prefix caching with swaps and
  forks; plain with lookahead; sliding window). Every ``--check-every``
  calls ``check_invariants()`` runs; after every walk all sequences are
  finished and every block must be free again (a leak is an error). The
  resident set size is sampled as the run goes, to show it is flat after
  warm-up.
* ``--trace PATH``: the whole trace through the simulator with two managers
  (``--compare``), which must make identical decisions and report the same
  prefix-cache hit rate.

Results go to stdout and, with ``--json``, to a file (docs/reliability.md
quotes them). Not part of the test suite: it runs for minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from blockspace.conformance.walk import Config, Solo, walk
from blockspace.interfaces import load_manager_class

CONFIGS = {
    "caching": Config(4, 64, 32, enable_caching=True, lookahead=(0, 0, 3), max_prompt=48),
    "plain": Config(2, 64, 32, watermark=0.05, lookahead=(0, 2), max_prompt=40),
    "window": Config(4, 48, 16, sliding_window=8, lookahead=(0, 2), max_prompt=40),
}
STEPS_PER_WALK = 200


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def soak_ops(impl: str, num_ops: int, check_every: int) -> dict[str, Any]:
    cls = load_manager_class(impl)
    managers, drivers = {}, {}
    for name, config in CONFIGS.items():
        args, kwargs = config.args()
        managers[name] = cls(*args, **kwargs)

        def check(driver: Solo, manager: Any = managers[name]) -> None:
            if driver.num_calls % check_every == 0:
                manager.check_invariants()

        drivers[name] = Solo(managers[name], on_call=check)
    samples, num_walks, seed = [], 0, 0
    start = time.perf_counter()
    while sum(d.num_calls for d in drivers.values()) < num_ops:
        for name, config in CONFIGS.items():
            manager = managers[name]
            walk(drivers[name], config, seed, STEPS_PER_WALK)
            seed += 1
            num_walks += 1
            manager.check_invariants()
            null = 1 if manager.snapshot()["null_block"] is not None else 0
            leaked = (config.num_gpu_blocks - null - manager.get_num_free_gpu_blocks()) + (
                config.num_cpu_blocks - manager.get_num_free_cpu_blocks()
            )
            if leaked:
                raise AssertionError(f"{name}: {leaked} blocks still in use after walk {seed - 1}")
        samples.append(
            (sum(d.num_calls for d in drivers.values()), round(time.perf_counter() - start, 1), round(rss_mib(), 1))
        )
    warm = samples[max(0, len(samples) // 5 - 1)]
    return {
        "implementation": impl,
        "num_ops": samples[-1][0],
        "num_walks": num_walks,
        "seconds": samples[-1][1],
        "ops_per_second": round(samples[-1][0] / samples[-1][1]),
        "leaked_blocks": 0,
        "rss_mib_after_warmup": warm[2],
        "rss_mib_at_end": samples[-1][2],
        "rss_samples": samples[:: max(1, len(samples) // 40)] + [samples[-1]],
    }


def soak_trace(path: str, compare: str, out: str) -> dict[str, Any]:
    from blockspace.simulator.cli import main as simulate

    start = time.perf_counter()
    code = simulate(["--trace", path, "--compare", compare, "--out", out, "--quiet", "--no-plot"])
    with open(os.path.join(out, "simulation.json")) as f:
        figures = json.load(f)
    return {"exit_code": code, "seconds": round(time.perf_counter() - start, 1), "figures": figures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="blockspace soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", default="fast", help="implementation for the random operations")
    parser.add_argument("--ops", type=int, default=10_000_000, help="random legal operations (0: skip)")
    parser.add_argument("--check-every", type=int, default=10_000, help="check_invariants() every N calls")
    parser.add_argument("--trace", default=None, help="also replay this trace with --compare")
    parser.add_argument("--compare", default="reference,fast")
    parser.add_argument("--out", default="out/soak")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    if args.ops:
        results["ops"] = soak_ops(args.impl, args.ops, args.check_every)
        ops = results["ops"]
        print(
            f"{ops['num_ops']:,} operations in {ops['num_walks']} walks, {ops['seconds']} s "
            f"({ops['ops_per_second']:,}/s): 0 leaked blocks; RSS {ops['rss_mib_after_warmup']} MiB after "
            f"warm-up, {ops['rss_mib_at_end']} MiB at the end"
        )
    if args.trace:
        results["trace"] = soak_trace(args.trace, args.compare, args.out)
        print(f"trace replay with {args.compare}: exit code {results['trace']['exit_code']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
