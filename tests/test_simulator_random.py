"""Random small traces under random configurations: every manager and step
path the simulator offers makes the same decisions, step by step.

The fixed configurations of ``test_simulator_compare.py`` were chosen by
hand; here Hypothesis draws the trace (bursts, shared prompt chunks, prompts
shorter and longer than a chunk, outputs of one token) and the knobs (block
sizes that do and do not divide a chunk, pools small enough to ignore,
preempt and swap, the watermark, caching, n samples, the token and sequence
budgets), then replays it through the reference on the per-call path and
through fast on the per-call and the row paths, with every step's block
tables, copy-on-write pairs and swap mappings recorded. Any difference fails
with a snippet that replays the case, runnable as printed.

The compiled engine (``simulator/compiled``) is one more run:
fast's kernels driven by the compiled step instead of the Python policy,
held to the same records and figures. The harness compares whatever
``RUNS`` names.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from blockspace.interfaces import load_manager_class
from blockspace.simulator import SchedulerConfig, SimulationConfig
from blockspace.simulator.engines import replay as run_engine
from blockspace.simulator.report import first_difference
from blockspace.simulator.simulation import SimulationStalledError
from blockspace.simulator.summary import Summary, summarize
from blockspace.workloads import CHUNK_TOKENS, parse_lines
from helpers import jit_or

# (manager, step path or "compiled" for the compiled engine), the first the yardstick
RUNS = (("reference", "calls"), ("fast", "calls"), ("fast", "rows"), ("fast", "compiled"))


@st.composite
def traces(draw: st.DrawFn) -> list[str]:
    """Up to 10 requests as Mooncake lines: arrivals in bursts (gaps of 0
    ms are common), prompts of 1 to 3 chunks drawn from 4 chunk ids (so
    prompts share prefixes), outputs of 1 to 150 tokens."""
    lines, now = [], 0
    for _ in range(draw(st.integers(1, 10))):
        now += draw(st.sampled_from([0, 0, 50, 400, 3000]))
        input_length = draw(st.integers(1, 3 * CHUNK_TOKENS))
        chunks = draw(st.lists(st.integers(0, 3), min_size=-(-input_length // CHUNK_TOKENS),
                               max_size=-(-input_length // CHUNK_TOKENS)))  # fmt: skip
        output_length = draw(st.sampled_from([1, 2, 17, 60, 150]))
        lines.append(json.dumps({"timestamp": now, "input_length": input_length,
                                 "output_length": output_length, "hash_ids": chunks}))  # fmt: skip
    return lines


@st.composite
def configs(draw: st.DrawFn, lines: list[str]) -> SimulationConfig:
    """A configuration vLLM accepts for the trace ``lines``, its GPU pool a
    share of what all its requests need at once: from too small for the
    largest (ignored) through tight (preempted, swapped) to roomy."""
    caching = draw(st.booleans())
    block_size = draw(st.sampled_from([1, 4, 16, 48]))  # 48 does not divide a 512-token chunk
    max_num_seqs = draw(st.integers(1, 6))
    least_tokens = max(max_num_seqs, block_size if caching else 1)
    scheduler = SchedulerConfig(
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=draw(st.integers(least_tokens, 700)),
        enable_prefix_caching=caching,
        preemption_mode=draw(st.sampled_from(["recompute", "swap"])),
        record_tables=True,
    )
    needs = [-(-(row["input_length"] + row["output_length"]) // block_size) for row in map(json.loads, lines)]
    share = draw(st.sampled_from([0.2, 0.35, 0.5, 0.8, 2.0]))  # of what every request needs at once
    num_gpu_blocks = max(2, int(sum(needs) * share))
    return SimulationConfig(
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=int(num_gpu_blocks * draw(st.sampled_from([0.0, 0.5, 4.0]))),
        watermark=draw(st.sampled_from([0.0, 0.01, 0.1])),
        scheduler=scheduler,
        num_samples=draw(st.integers(1, 3)),
    )


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[str], SimulationConfig]:
    lines = draw(traces())
    return lines, draw(configs(lines))


def repro(lines: list[str], config: SimulationConfig) -> str:
    """A snippet that replays the case through every run and prints where they part."""
    runs = ", ".join(f"({manager!r}, {step!r})" for manager, step in RUNS)
    return "\n".join([
        "from dataclasses import replace",
        "from blockspace.interfaces import load_manager_class",
        "from blockspace.simulator import SchedulerConfig, SimulationConfig",
        "from blockspace.simulator.engines import replay",
        "from blockspace.simulator.gpu import StepTimeModel",
        "from blockspace.simulator.report import first_difference",
        "from blockspace.workloads import parse_lines",
        f"trace = parse_lines({lines!r}, 'repro')",
        f"config = {config!r}",
        f"runs = [replay(trace, load_manager_class(m), replace(config, engine='compiled') if s == 'compiled' else "
        f"replace(config, scheduler=replace(config.scheduler, step=s))) for m, s in [{runs}]]",
        "print([first_difference(runs[0].records, run.records) for run in runs[1:]])",
    ])  # fmt: skip


def replay(lines: list[str], config: SimulationConfig, manager: str, step: str) -> object:
    """The run's result, or the stall it ended in (a stall is a decision too)."""
    if step == "compiled":
        config = replace(config, engine="compiled")
    else:
        config = replace(config, scheduler=replace(config.scheduler, step=step))
    try:
        return run_engine(parse_lines(lines, "random trace"), load_manager_class(manager), config)
    except SimulationStalledError as stalled:
        return str(stalled)


def figures(summary: Summary) -> dict:
    """A summary without what the wall clock decides (time spent) and what names the run (manager, engine)."""
    dropped = ("manager", "engine", "manager_time", "wall_s", "manager_startup_s")
    return {key: value for key, value in summary.to_json().items() if key not in dropped}


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
@settings(max_examples=jit_or(150, 40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_every_manager_step_path_and_engine_decides_alike(case):
    lines, config = case
    note(repro(lines, config))
    first, *others = (replay(lines, config, manager, step) for manager, step in RUNS)
    for (manager, step), other in zip(RUNS[1:], others):
        if isinstance(first, str) or isinstance(other, str):
            assert first == other, (manager, step)
            continue
        difference = first_difference(first.records, other.records)
        assert difference is None, f"{manager}@{step}: {difference}"
        assert figures(summarize(first)) == figures(summarize(other)), f"{manager}@{step}"
