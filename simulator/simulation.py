"""The simulation loop: trace arrivals, scheduler steps, the model's side of
each step (tokens computed and sampled), and the simulated clock. This is
the Python engine; its twin is ``compiled/engine.py`` (with the loop in
``compiled/loop.py``), held equal record for record by
``tests/test_compiled_engine.py``; what both take and give is ``runs.py``.

The clock is simulated GPU time: each step advances it by the step-time
model's cost of the batch, and when nothing is queued it jumps to the next
arrival. Requests join the waiting queue once the clock has reached their
arrival time, in trace order. After each step the model "samples" the next
token of every sequence whose prompt is complete (deterministic ids, see
``blockspace/workloads.py``) and ends a sequence after its output length.
A trace request with n > 1 samples arrives as n requests of one sequence
each, as vLLM 0.9.2's engine adds it (``ParallelSampleSequenceGroup``): they
share the prompt only through the prefix cache. The wall time
spent inside the manager is measured per step along the way, after a warm-up
on a throwaway manager (``warm_up``) so that compiling or loading the fast
manager's kernels is reported as start-up, not as the first steps' work.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any

import numpy as np

from blockspace.enums import AllocStatus, Device, SequenceStatus
from blockspace.sequence import Sequence, SequenceGroup
from blockspace.simulator.clock import chunk_attention, step_seconds
from blockspace.simulator.decisions import StepOutput
from blockspace.simulator.metrics import Metrics
from blockspace.simulator.request import SimRequest, decode_step
from blockspace.simulator.routers import blocks_of
from blockspace.simulator.row_step import offers_rows
from blockspace.simulator.runs import (
    ENGINES,
    SimulationConfig,
    SimulationResult,
    SimulationStalledError,
    collector_paused,
    manager_name_of,
)
from blockspace.simulator.scheduler import Scheduler
from blockspace.simulator.timed import TimedManager
from blockspace.workloads import TraceRequest, prompt_token_ids


class Simulation:
    """One replay of a trace through one manager."""

    def __init__(
        self,
        trace: list[TraceRequest],
        manager_class: type,
        config: SimulationConfig,
        on_step: Callable[[Scheduler], None] | None = None,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        self.trace = trace
        self.config = config
        self.manager = manager_class(**self.manager_kwargs())
        self.manager_name = manager_name_of(manager_class)
        self.timed = TimedManager(self.manager)  # the wall time inside the manager, read once per step
        self.scheduler = Scheduler(self.timed, config.scheduler)
        self.metrics = Metrics()
        self.on_step = on_step
        self.on_progress = on_progress
        self.num_done = 0  # requests finished, ignored or aborted
        self.clock = 0.0
        self.clock_kind = config.step_time.kind  # the step time: clock.step_seconds of these
        self.clock_coefficients = config.step_time.coefficients(config.scheduler.block_size)
        self.pending = deque(trace)  # trace requests not yet arrived at the clock, in arrival order
        self.routed = len(trace) * config.num_samples  # requests (samples) routed here
        self.routed_blocks = sum(self._blocks(entry.input_length) for entry in trace) * config.num_samples
        self.done_at: list[float] = []  # when each request was done (finished, ignored or aborted), in order
        self.done_blocks = 0  # prompt blocks of the requests done: routed_blocks less these are outstanding
        self.finished: list[tuple[int, float]] = []  # (trace index, time) of each request finished, in order
        self.stalled = ""  # why nothing queued can run, until a request arrives (``advance``)
        self._by_id: dict[str, SimRequest] = {}

    def manager_kwargs(self) -> dict[str, Any]:
        """The manager's constructor arguments, as keywords (as vLLM's scheduler builds it)."""
        config = self.config
        return {
            "block_size": config.scheduler.block_size,
            "num_gpu_blocks": config.num_gpu_blocks,
            "num_cpu_blocks": config.num_cpu_blocks,
            "watermark": config.watermark,
            "enable_caching": config.scheduler.enable_prefix_caching,
        }

    def _arrive(self, entry: TraceRequest) -> list[SimRequest]:
        """The trace request as vLLM 0.9.2's engine adds it: with n > 1,
        ``ParallelSampleSequenceGroup.add_request`` makes n requests of one
        sequence sampling n=1, ids ``{index}_parallel_sample_{i}`` in order,
        sequence ids from the engine's counter (here ``index * n + i``: the
        trace arrives in order)."""
        n = self.config.num_samples
        output_length = entry.output_length
        if self.config.max_output_len is not None:
            output_length = min(output_length, self.config.max_output_len)
        hash_ids = list(entry.hash_ids)
        samples = [
            SimRequest(
                entry.index,
                partial(prompt_token_ids, hash_ids, entry.input_length),
                entry.input_length,
                output_length,
                entry.arrival_s,
                seq_id=entry.index * n + sample,
                sample=sample,
                num_samples=n,
            )
            for sample in range(n)
        ]
        for request in samples:
            self._by_id[request.request_id] = request
        self.metrics.arrived(samples)
        return samples

    def run(self) -> SimulationResult:
        """Replay the trace. Python's cyclic garbage collector is paused for
        the replay: everything a run makes (requests, records, timeline)
        stays referenced until it ends, so a collection finds nothing to free,
        yet full ones walk all of it again and again (about 7 % of the replay
        on the first 1,000 conversation requests)."""
        with collector_paused():
            return self._replay()

    def _replay(self) -> SimulationResult:
        startup_s = warm_up(type(self.manager), self.manager_kwargs())
        started = time.perf_counter()
        self.advance(math.inf)
        return self.result(time.perf_counter() - started, startup_s)

    # -- a replica of a fleet (fleet.py; what a router reads: routers.Replica) ---------------
    def add(self, entry: TraceRequest) -> None:
        """A trace request routed here: it arrives at its time, after every
        request added before it."""
        self.pending.append(entry)
        self.routed += self.config.num_samples
        self.routed_blocks += self._blocks(entry.input_length) * self.config.num_samples

    def outstanding(self) -> int:
        """Requests routed here and not yet done (finished, ignored or aborted)."""
        return self.routed - len(self.done_at)

    def outstanding_blocks(self) -> int:
        """Prompt blocks of the requests routed here and not yet done."""
        return self.routed_blocks - self.done_blocks

    def cached_tokens(self, entry: TraceRequest) -> int:
        """Tokens of the request's prompt that this replica's prefix cache
        holds, asked of the manager on a probe sequence (id -1: the replay's
        are never negative) that is then forgotten: no block is touched and
        no hit counted, so the replay goes on as if it had not been asked."""
        if not self.config.scheduler.enable_prefix_caching:
            return 0
        probe = Sequence(-1, probe_prompt(entry))
        try:
            return int(self.manager.get_num_cached_tokens(probe))
        finally:
            self.manager.remove_seq_from_computed_blocks_tracker(probe)

    def num_done_by(self, at: float) -> int:
        """Requests done at or before ``at`` (as far as the replica has run)."""
        return bisect_right(self.done_at, at)

    def done_after(self, at: float) -> list[float]:
        """When the requests done after ``at`` were done, in order."""
        return self.done_at[bisect_right(self.done_at, at) :]

    def has_work(self) -> bool:
        """Requests routed here and not done: pending, queued or running."""
        return bool(self.pending) or self.scheduler.has_unfinished()

    def finished_at(self) -> list[tuple[int, float]]:
        """(trace index, time) of each request finished here (not ignored or aborted), in the order they finished."""
        return self.finished

    def unfinished(self) -> list[int]:
        """The trace indexes of the requests routed here and not done, in
        order (a failed replica's, which the fleet sends again)."""
        scheduler = self.scheduler
        queued = [group.index for queue in (scheduler.running, scheduler.waiting, scheduler.swapped) for group in queue]
        return sorted({*queued, *(entry.index for entry in self.pending)})

    def _blocks(self, num_tokens: int) -> int:
        return blocks_of(num_tokens, self.config.scheduler.block_size)

    def _done(self, request: SimRequest) -> None:
        request.release_tokens()
        self.done_at.append(self.clock)
        self.done_blocks += self._blocks(request.num_prompt_tokens)

    def advance(self, until: float) -> None:
        """Run every step that starts before ``until``: the whole replay when
        it is infinite. Steps are whole, so the clock may end past ``until``;
        a request added later joins at the first step that starts at or after
        its arrival, as it would have had it been in the trace from the start.
        Nothing queued can run and nothing is pending: a stall, an error only
        at the end (in a fleet, a later request may be routed here)."""
        pending, scheduler = self.pending, self.scheduler
        if self.stalled:  # as the replay would have: wait for the next arrival, or fail
            if not pending:
                if until < math.inf:
                    return
                raise SimulationStalledError(self.stalled)
            self.clock, self.stalled = pending[0].arrival_s, ""
        while pending or scheduler.has_unfinished():
            while pending and pending[0].arrival_s <= self.clock:
                for request in self._arrive(pending.popleft()):
                    scheduler.add_request(request)
            if not scheduler.has_unfinished():
                self.clock = pending[0].arrival_s  # idle GPU: jump to the next arrival
                continue
            if self.clock >= until:
                return
            output = scheduler.schedule(self.clock)
            self.metrics.decided(output)
            for request_id in output.record.ignored + output.record.aborted:
                self._done(self._by_id[request_id])
            self._report_progress(len(output.record.ignored) + len(output.record.aborted))
            if not output.prefills and not output.decodes:
                record = output.record
                if record.ignored or record.aborted or record.preempted or record.swapped_out:
                    continue  # the queues changed: schedule again
                if pending:
                    self.clock = pending[0].arrival_s
                    continue
                self.stalled = (f"step {record.step}: {len(scheduler.waiting)} waiting, "
                                f"{len(scheduler.swapped)} swapped, nothing can run")  # fmt: skip
                return self.advance(until)
            self._run_model(output)

    def result(self, wall_s: float, startup_s: float) -> SimulationResult:
        """The run's result, once ``advance(math.inf)`` has returned."""
        metrics, scheduler = self.metrics, self.scheduler
        metrics.wall_s = wall_s
        metrics.startup_s = startup_s
        metrics.final_hit_rate = self._hit_rate()
        metrics.manager_calls = self.timed.num_calls
        metrics.manager_by_method = {
            name: (seconds, int(calls)) for name, (seconds, calls) in self.timed.by_method.items() if calls
        }
        return SimulationResult(self.manager_name, self.config, metrics, scheduler.records, self.manager)

    def _run_model(self, output: StepOutput) -> None:
        """Advance the clock by the batch's cost, then compute and sample."""
        prefills = output.prefills
        num_prefill_tokens = prefill_context = prefill_pairs = 0
        for group in prefills:  # each chunk's computed tokens come after its cached and earlier ones
            new = group.num_uncached_tokens
            start = group.request.seq.data.get_num_computed_tokens() + group.token_chunk_size - new
            num_prefill_tokens += new
            prefill_context += start
            prefill_pairs += chunk_attention(start, new)
        decoded, num_context_tokens = decode_step(output.decodes)  # each decode reads its whole context
        step_s = step_seconds(
            self.clock_kind, self.clock_coefficients, num_prefill_tokens, len(output.decodes), len(prefills),
            num_context_tokens, prefill_context, prefill_pairs,
            len(output.blocks_to_swap_in) + len(output.blocks_to_swap_out),
        )  # fmt: skip
        self.clock += step_s
        self.metrics.decoded(output.decodes, self.clock)
        finished: list[Sequence] = []
        for group in prefills:
            request = group.request
            request.update_num_computed_tokens(group.token_chunk_size)
            if request.is_prefill():
                continue  # a prefill chunk that does not end the prompt samples nothing
            self.metrics.sampled(request, self.clock)
            if request.sample_next():
                finished.append(request.seq)
        finished += decoded  # vLLM's order: the batch's, prefills first
        for seq in finished:
            seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED
        done = self.scheduler.free_finished(finished)
        self.metrics.finished(done, self.clock)
        self.finished += [(request.index, self.clock) for request in done]
        for request in done:
            self._done(request)
        self._report_progress(len(done))
        self._record(step_s, num_prefill_tokens + len(output.decodes))
        if self.on_step is not None:
            self.on_step(self.scheduler)

    def _report_progress(self, num_done: int) -> None:
        if num_done:
            self.num_done += num_done
            if self.on_progress is not None:
                self.on_progress(self.num_done)

    def _record(self, step_s: float, num_batched_tokens: int) -> None:
        scheduler = self.scheduler
        self.metrics.stepped(
            self.clock,
            step_s,
            num_batched_tokens,
            self.config.num_gpu_blocks - self.manager.get_num_free_gpu_blocks(),
            (len(scheduler.running), len(scheduler.waiting), len(scheduler.swapped)),
            self._hit_rate(),
            self.timed.take_seconds(),
        )

    def _hit_rate(self) -> float:
        """The GPU prefix-cache hit rate so far (0 without caching), read outside the timed calls."""
        if not self.config.scheduler.enable_prefix_caching:
            return 0.0
        return float(self.manager.get_prefix_cache_hit_rate(Device.GPU))


@lru_cache(maxsize=1)
def probe_prompt(entry: TraceRequest) -> list[int]:
    """The arriving request's prompt, made once for all the replicas a router asks."""
    return entry.prompt_token_ids()


def warm_up(manager_class: type, manager_kwargs: dict[str, Any]) -> float:
    """Seconds to build a throwaway manager like the run's and make, once,
    every call the scheduler makes: a fast manager compiles its kernels (or
    loads them from Numba's cache) here, not in the run's first steps."""
    started = time.perf_counter()
    manager = manager_class(**manager_kwargs)
    block_size = manager_kwargs["block_size"]
    group = SequenceGroup.from_prompt("warm-up", range(2 * block_size + 1), first_seq_id=0)
    seq = group.seqs[0]
    caching = manager_kwargs["enable_caching"]
    if caching:
        manager.get_num_cached_tokens(seq)
    if manager.can_allocate(group, 0) == AllocStatus.OK:
        manager.allocate(group)
        seq.status = SequenceStatus.RUNNING
        for step in range(2):
            manager.get_block_table(seq)
            manager.access_all_blocks_in_seq(seq, float(step))
            if caching:
                manager.get_common_computed_block_ids([seq])
            manager.mark_blocks_as_computed(group, 1)
            seq.data.update_num_computed_tokens(seq.data.get_num_uncomputed_tokens())
            seq.append_token_id(step)
            if offers_rows(manager) and step == 1:  # the row path's kernels too: the run may use them
                rows, lengths = manager.rows_of([seq]), np.array([seq.get_len()])
                if manager.can_append_slots_rows(rows, lengths, 0, np.array([1]))[0]:
                    manager.append_slots_rows(rows, lengths, 0, token_ids=[seq.get_token_ids()] if caching else None)
                manager.access_all_blocks_rows(rows, float(step))
                manager.num_computed_blocks_rows(rows, [seq.get_token_ids()] if caching else None)
                manager.block_table_array(rows, -1)
            elif manager.can_append_slots(group, 0):
                manager.append_slots(seq, 0)
        if manager.can_swap_out(group):
            manager.swap_out(group)
            seq.status = SequenceStatus.SWAPPED
            if manager.can_swap_in(group, 0) == AllocStatus.OK:
                manager.swap_in(group)
                seq.status = SequenceStatus.RUNNING
        manager.free(seq)
    elif caching:
        manager.remove_seq_from_computed_blocks_tracker(seq)
    manager.get_num_free_gpu_blocks()
    if caching:
        manager.get_prefix_cache_hit_rate(Device.GPU)
    return time.perf_counter() - started


def run_simulation(
    trace: list[TraceRequest], manager_class: type, config: SimulationConfig, **hooks: Any
) -> SimulationResult:
    """Replay ``trace`` through a fresh ``manager_class`` and return the result."""
    return Simulation(trace, manager_class, config, **hooks).run()


__all__ = [
    "ENGINES",
    "SimulationConfig",
    "SimulationResult",
    "SimulationStalledError",
    "Simulation",
    "manager_name_of",
    "run_simulation",
    "warm_up",
]
