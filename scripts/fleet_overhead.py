"""What replaying a fleet on one clock costs over its replicas replayed apart.

The fleet (``simulator/fleet.py``) advances its replicas
together, so that a router can read them at each arrival. Once a fleet
has run, its assignment is known: each replica's share of the trace,
replayed on its own, makes exactly the same steps (checked here). The
ratio of the two times is the price of the one clock, with the router's
reading of the replicas: for ``kv_aware``, a probe of every replica's
prefix cache at every arrival. It is measured in turns, three times, with
4 replicas, on each engine and router given. The trace is
``$BLOCKSPACE_TRACE`` or the bundled sample, first 2,000 requests.

    python scripts/fleet_overhead.py [ENGINE:ROUTER ...]   # default: compiled:least_loaded compiled:kv_aware
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace

from blockspace.interfaces import load_manager_class
from blockspace.simulator.engines import replay
from blockspace.simulator.runs import SimulationConfig
from blockspace.workloads import load_trace, trace_source

REPLICAS, REQUESTS, TURNS = 4, 2_000, 3
DEFAULT = ("compiled:least_loaded", "compiled:kv_aware")


def main(cases: list[str]) -> None:
    trace, fast = load_trace(None, REQUESTS), load_manager_class("fast")
    print(f"{len(trace):,} requests of {trace_source(None)}, {REPLICAS} replicas")
    for case in cases:
        engine, _, router = case.partition(":")
        single = SimulationConfig(49_152, 2_048, engine=engine)
        replay(trace[:50], fast, replace(single, replicas=REPLICAS, router=router))  # compiled before the turns
        ratios = []
        for turn in range(TURNS):
            started = time.perf_counter()
            together = replay(trace, fast, replace(single, replicas=REPLICAS, router=router))
            one_clock = time.perf_counter() - started
            shares = [[entry for entry, k in zip(trace, together.assignment, strict=True) if k == replica]
                      for replica in range(REPLICAS)]  # fmt: skip
            started = time.perf_counter()
            apart = [replay(share, fast, single) for share in shares]
            separately = time.perf_counter() - started
            steps = len(together.metrics.timeline.step_s)
            assert steps == sum(len(result.metrics.timeline.step_s) for result in apart)
            ratios.append(one_clock / separately)
            print(f"{engine} {router} turn {turn}: one clock {one_clock:.2f} s, apart {separately:.2f} s, "
                  f"ratio {ratios[-1]:.3f}, {steps:,} steps")  # fmt: skip
        print(f"{engine} {router}: median ratio {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main(sys.argv[1:] or list(DEFAULT))
