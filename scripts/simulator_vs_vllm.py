"""``blockspace simulate``'s scheduler against vLLM 0.9.2's real v0 Scheduler, step by step.

The simulator claims to make vLLM's decisions. This script checks it: the
same Mooncake requests go through vLLM's ``vllm.core.scheduler.Scheduler``
(with vLLM's own block manager, driven by the engine loop of
``scripts/vllm_scheduler_bench.py``: a virtual clock of ``--step-ms`` a
step) and through the simulator with a step-time model of exactly
``--step-ms`` a step (every other cost 0) and the fast manager. At every
step it compares the scheduled groups with their chunk sizes (in batch
order), the preempted and ignored requests, and every scheduled sequence's
block table. It prints the first step that differs, or that none does
(exit status 0). The simulator's compiled engine is then held to its Python
engine, record for record (decisions, and block tables, copy-on-write pairs
and swap mappings by their digest), so both engines are checked against
vLLM on every run.

With ``--n N`` > 1 each trace request samples N sequences, as vLLM 0.9.2's
engine adds such a request: ``ParallelSampleSequenceGroup.add_request``
(vLLM's own, called with a stand-in for ``LLMEngine`` that does what its
``_add_processed_request`` does for the scheduler) makes N groups of one
sequence sampling n=1, ids ``{request}_parallel_sample_{i}`` in order,
sequence ids from the engine's counter, all added to the waiting queue at
once. Sample ``i`` of request ``r`` generates ``output_token_id(r, i,
position)`` on both sides.

Usage (an environment with vLLM 0.9.2 and blockspace; see docs/performance.md)::

    python scripts/simulator_vs_vllm.py --requests 500
    python scripts/simulator_vs_vllm.py --trace TRACE.jsonl --requests 2000 --caching off
    python scripts/simulator_vs_vllm.py --requests 300 --n 3
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import sys
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

from blockspace.interfaces import load_manager_class
from blockspace.simulator import SchedulerConfig, Simulation, SimulationConfig
from blockspace.simulator.compiled.engine import run_compiled
from blockspace.simulator.gpu import StepTimeModel
from blockspace.simulator.report import first_difference
from blockspace.workloads import load_trace, output_token_id

BENCH = Path(__file__).resolve().parent / "vllm_scheduler_bench.py"


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("vllm_scheduler_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["vllm_scheduler_bench"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class Engine:
    """What vLLM 0.9.2's ``ParallelSampleSequenceGroup.add_request`` reads of
    ``LLMEngine``: ``_add_processed_request`` (one sequence, its id from the
    engine's counter, a group added to the scheduler) and
    ``seq_id_to_seq_group``. ``samples`` maps each sequence id to its
    (request, sample), for the tokens it generates."""

    def __init__(self, v: Any, scheduler: Any, block_size: int) -> None:
        self.v, self.scheduler, self.block_size = v, scheduler, block_size
        self.seq_counter = itertools.count()
        self.seq_id_to_seq_group: dict[str, Any] = {}
        self.samples: dict[int, tuple[int, int]] = {}

    def _add_processed_request(self, request_id: str, processed_inputs: Any, params: Any, arrival_time: float,
                               **_: Any) -> Any:  # fmt: skip
        seq = self.v.Sequence(next(self.seq_counter), processed_inputs, self.block_size)
        group = self.v.SequenceGroup(request_id, [seq], arrival_time=arrival_time, sampling_params=params)
        self.scheduler.add_seq_group(group)
        return group

    def add_request(self, request: Any, n: int) -> None:
        """``LLMEngine.add_request`` for a trace request, sampling ``n``."""
        params = self.v.SamplingParams(n=n, max_tokens=request.max_tokens, ignore_eos=True, detokenize=False)
        inputs = self.v.token_inputs(request.prompt)
        first = len(self.samples)
        if n > 1:
            from vllm.sequence import ParallelSampleSequenceGroup

            ParallelSampleSequenceGroup.add_request(
                str(request.index), self, params, processed_inputs=inputs, arrival_time=request.arrival_s,
                lora_request=None, trace_headers=None, prompt_adapter_request=None, priority=0,
            )  # fmt: skip
        else:
            self._add_processed_request(str(request.index), inputs, params, request.arrival_s)
        self.samples.update((first + i, (request.index, i)) for i in range(n))


def vllm_steps(bench: Any, settings: Any, requests: list, caching: bool, n: int = 1) -> list[tuple]:
    """Per step of vLLM's scheduler: (scheduled, preempted, ignored, tables)."""
    v = bench.import_vllm()
    max_model_len = bench.default_max_model_len(requests)
    scheduler = bench.build_scheduler(v, settings, caching, max_model_len)
    stop_checker = v.StopChecker(max_model_len, lambda seq: None)
    engine = Engine(v, scheduler, settings.block_size)
    # the bench's model output generates output_token_id(seq_id, 0, position): here sample i of request r's
    bench.output_token_id = lambda seq_id, _, position: output_token_id(*engine.samples[seq_id], position)
    pending, steps = deque(requests), []
    with bench.virtual_time(v.scheduler_module) as clock:
        clock.now = 0.0
        while pending or scheduler.has_unfinished_seqs():
            if pending and not scheduler.has_unfinished_seqs():
                clock.now = max(clock.now, pending[0].arrival_s)
            while pending and pending[0].arrival_s <= clock.now:
                engine.add_request(pending.popleft(), n)
            running_before = {g.request_id for g in scheduler.running}
            metadata_list, outputs, _ = scheduler.schedule()
            tables = [(seq_id, tuple(table)) for m in metadata_list for seq_id, table in m.block_tables.items()]
            steps.append((
                [(s.seq_group.request_id, s.token_chunk_size) for s in outputs.scheduled_seq_groups],
                sorted(bench.preempted_ids(scheduler, running_before)),
                [g.request_id for g in outputs.ignored_seq_groups],
                tables,
            ))  # fmt: skip
            bench.apply_model_output(v, scheduler, stop_checker, metadata_list, outputs)
            clock.now += settings.step_s
    return steps


def simulator_config(settings: Any, caching: bool, n: int) -> SimulationConfig:
    """The simulator's configuration for vLLM's settings (fast manager, a step of ``step_s``)."""
    return SimulationConfig(
        num_gpu_blocks=settings.num_gpu_blocks,
        num_cpu_blocks=settings.num_cpu_blocks,
        scheduler=SchedulerConfig(
            block_size=settings.block_size,
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            enable_prefix_caching=caching,
            preemption_mode=settings.preemption_mode or "recompute",
            record_tables=True,
        ),
        step_time=StepTimeModel(settings.step_s * 1000.0, 0.0, 0.0, 0.0, 0.0),
        num_samples=n,
    )


def simulator_steps(settings: Any, trace: list, caching: bool, n: int = 1) -> tuple[list[tuple], list[Any]]:
    """The same per step of the simulator's Python engine, and its records."""
    simulation = Simulation(trace, load_manager_class("fast"), simulator_config(settings, caching, n))
    path, tables = simulation.scheduler.path, []
    touch = path.touch

    def touch_and_keep(prefills: list, decodes: list, now: float, record_tables: bool) -> list:
        result = touch(prefills, decodes, now, record_tables)
        tables.append(result)  # the tables of each step, as the digest takes them
        return result

    path.touch = touch_and_keep  # type: ignore[method-assign]  # this run's path only
    records = simulation.run().records
    steps = [
        (record.scheduled, sorted(record.preempted + record.swapped_out), record.ignored, table)
        for record, table in zip(records, tables)
    ]
    return steps, records


def compiled_difference(settings: Any, trace: list, caching: bool, n: int, records: list[Any]) -> str | None:
    """Where the compiled engine's records part from the Python engine's
    (``records``), None if nowhere: its tables are compared by their digest,
    so with the Python engine equal to vLLM, so is the compiled one."""
    config = replace(simulator_config(settings, caching, n), engine="compiled")
    return first_difference(records, run_compiled(trace, load_manager_class("fast"), config).records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=None, help="Mooncake trace (default: $BLOCKSPACE_TRACE, else the sample)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--caching", choices=("on", "off"), default="on")
    parser.add_argument("--num-gpu-blocks", type=int, default=49152)
    parser.add_argument("--num-cpu-blocks", type=int, default=0)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--preemption-mode", choices=("recompute", "swap"), default=None)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--n", type=int, default=1, help="samples per request (vLLM's parallel sampling)")
    args = parser.parse_args(argv)
    bench = _bench()
    bench_argv = ["--requests", str(args.requests), "--num-gpu-blocks", str(args.num_gpu_blocks), "--step-ms",
                  str(args.step_ms), "--num-cpu-blocks", str(args.num_cpu_blocks),
                  "--max-num-batched-tokens", str(args.max_num_batched_tokens),
                  "--max-num-seqs", str(args.max_num_seqs)]  # fmt: skip
    bench_argv += (["--trace", args.trace] if args.trace else []) + (
        ["--preemption-mode", args.preemption_mode] if args.preemption_mode else []
    )
    settings = bench.parse_args(bench_argv)
    trace = load_trace(args.trace, args.requests)
    caching = args.caching == "on"
    if args.n < 1:
        parser.error(f"--n must be >= 1, got {args.n}")
    theirs = vllm_steps(bench, settings, bench.make_requests(trace), caching, args.n)
    ours, records = simulator_steps(settings, trace, caching, args.n)
    parts = ("scheduled (request, chunk)", "preempted", "ignored", "block tables")
    for step, (a, b) in enumerate(zip(theirs, ours)):
        for name, x, y in zip(parts, a, b):
            if x != y:
                print(f"step {step}: {name} differ\n  vLLM:      {str(x)[:600]}\n  simulator: {str(y)[:600]}")
                return 1
    if len(theirs) != len(ours):
        print(f"vLLM took {len(theirs)} steps, the simulator {len(ours)}")
        return 1
    difference = compiled_difference(settings, trace, caching, args.n, records)
    if difference is not None:
        print(f"the compiled engine parts from the Python engine (and so from vLLM): {difference}")
        return 1
    print(
        f"{len(trace)} requests, n={args.n}, prefix caching {args.caching}, {settings.preemption_mode or 'recompute'}"
        f" preemption: {len(ours):,} steps, {sum(len(step[1]) for step in ours):,} preemptions, "
        "every decision and block table identical (both engines)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
