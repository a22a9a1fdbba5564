"""What replaying a fleet on one clock costs over its replicas replayed apart.

The fleet (``blockspace/simulator/fleet.py``) advances its replicas
together, so a router can read them at each arrival. Replayed apart, each
replica's share of the trace makes exactly the same steps under round
robin. The ratio of the two times is then the price of the one clock alone.
It is measured in turns, three times, on the Python engine, with 4 replicas.
The trace is ``$BLOCKSPACE_TRACE`` or the bundled sample, first 2,000 requests.

    python scripts/fleet_overhead.py
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

from blockspace.interfaces import load_manager_class
from blockspace.simulator.engines import replay
from blockspace.simulator.simulation import SimulationConfig
from blockspace.workloads import load_trace, trace_source

REPLICAS, REQUESTS, TURNS = 4, 2_000, 3


def main() -> None:
    trace, fast = load_trace(None, REQUESTS), load_manager_class("fast")
    single = SimulationConfig(49_152, 2_048, engine="python")
    print(f"{len(trace):,} requests of {trace_source(None)}, {REPLICAS} replicas under round robin, python engine")
    ratios = []
    for turn in range(TURNS):
        started = time.perf_counter()
        together = replay(trace, fast, replace(single, replicas=REPLICAS))
        one_clock = time.perf_counter() - started
        started = time.perf_counter()
        apart = [replay(trace[k::REPLICAS], fast, single) for k in range(REPLICAS)]
        separately = time.perf_counter() - started
        assert len(together.metrics.timeline.step_s) == sum(len(r.metrics.timeline.step_s) for r in apart)
        ratios.append(one_clock / separately)
        print(f"turn {turn}: one clock {one_clock:.2f} s, apart {separately:.2f} s, ratio {ratios[-1]:.3f}, "
              f"{len(together.metrics.timeline.step_s):,} steps")  # fmt: skip
    print(f"median ratio {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
