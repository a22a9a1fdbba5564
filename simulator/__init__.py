"""``blockspace simulate``: a continuous-batching scheduler simulator.

It replays a request trace (the Mooncake format, read by
``blockspace.workloads``; a sample is bundled)
through a scheduler that follows vLLM v0's policy and embeds any block
manager, on a simulated GPU clock, and reports latency, throughput, cache
and preemption figures plus the wall time spent inside the manager.

    request.py     a trace request as a SequenceGroup of one sequence
    scheduler.py   the scheduling policy (vLLM v0's decisions)
    budget.py      one step's token and sequence budget
    decisions.py   what a step decides, as data, and its record
    calls.py       the step path of one call per sequence
    row_step.py    the step path through the fast manager's row API
    timed.py       the wall time inside the manager, call by call
    gpu.py         the step-time model and bytes per KV block
    clock.py       the step time of a batch: one function both engines call
    roofline.py    a step time from the GPU (gpus.py) and the model (models.py)
    step_model.py  a step-time model from a file (blockspace gpu-profile writes one)
    simulation.py  the loop: arrivals, steps, sampling, clock
    metrics.py     every figure of a run, and each request's record
    slo.py         latency targets, attainment and goodput
    summary.py     the run's figures as one typed record (Summary)
    report.py      the summary in words, the comparison, the JSON
    plot.py        the PNG
    sweep.py       --sweep: many configurations
    capacity.py    --find max-rate: the highest rate within the SLO
    executor.py    where many runs go: here, worker processes or Ray
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
