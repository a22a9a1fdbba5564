"""``blockspace simulate``: a continuous-batching scheduler simulator.

It replays a request trace (the Mooncake format, read by
``blockspace.workloads``; a sample is bundled)
through a scheduler that follows vLLM v0's policy and embeds any block
manager, on a simulated GPU clock, and reports latency, throughput, cache
and preemption figures plus the wall time spent inside the manager.

    request.py     a trace request as a SequenceGroup, with its timing
    scheduler.py   the scheduling policy and the decision record
    timed.py       the wall time inside the manager, call by call
    gpu.py         the step-time model and bytes per KV block
    simulation.py  the loop: arrivals, steps, sampling, clock
    report.py      summary, comparison, JSON
    plot.py        the PNG
    cli.py         the command line
"""

from blockspace.simulator.decisions import StepRecord
from blockspace.simulator.scheduler import Scheduler, SchedulerConfig
from blockspace.simulator.simulation import Simulation, SimulationConfig, SimulationResult, run_simulation
from blockspace.workloads import TraceError, TraceRequest, load_trace

__all__ = [
    "Scheduler",
    "SchedulerConfig",
    "Simulation",
    "SimulationConfig",
    "SimulationResult",
    "StepRecord",
    "TraceError",
    "TraceRequest",
    "load_trace",
    "run_simulation",
]
