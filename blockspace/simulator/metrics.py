"""Every figure of a run, in one object: the report, the sweeps and the plot
read this and nothing else.

Why one object: the policy (``scheduler.py``) decides and never counts, the
simulation (``simulation.py``) keeps the clock and times the manager, and
both hand what they saw to ``Metrics`` at fixed points of a step. A new
figure is then one field here, filled at one of those points, and read by
``report.py``; no reader reaches into the scheduler or the requests.

The points, in the order of a step:

* ``arrived``: the requests (samples) of a trace request joined the queue;
* ``decided``: the policy's ``StepOutput`` (admissions, preemptions, swaps,
  copy-on-writes, ignored and aborted requests are all in it);
* ``sampled`` (a prompt's last chunk gave a token: the first one is kept)
  and ``finished``: the model's side, at the simulated time;
* ``stepped``: the state after the step, one timeline entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blockspace.enums import SequenceStatus
from blockspace.simulator.decisions import StepOutput
from blockspace.simulator.request import SimRequest


@dataclass
class Timeline:
    """One entry per step, taken after the step (time = end of the step)."""

    time_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    kv_used_blocks: list[int] = field(default_factory=list)
    num_running: list[int] = field(default_factory=list)
    num_waiting: list[int] = field(default_factory=list)
    num_swapped: list[int] = field(default_factory=list)
    hit_rate: list[float] = field(default_factory=list)
    num_batched_tokens: list[int] = field(default_factory=list)
    manager_s: list[float] = field(default_factory=list)


@dataclass
class Counts:
    """Running totals of the policy's decisions (ignored and aborted
    requests are counted per trace request, by ``outcomes``)."""

    recompute_preemptions: int = 0
    swap_outs: int = 0
    swap_ins: int = 0
    blocks_swapped_out: int = 0
    blocks_swapped_in: int = 0
    copy_on_writes: int = 0
    prefill_tokens_admitted: int = 0  # prompt tokens of the admitted requests (at admission)
    cached_tokens_admitted: int = 0  # of those, found in the prefix cache


@dataclass(frozen=True)
class TraceOutcome:
    """One trace request over its n samples, as a benchmark of vLLM sees it:
    the first token is the earliest sample's, the finish the last sample's."""

    index: int
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int  # over every sample
    first_token_s: float | None
    finish_s: float | None  # None unless every sample finished
    status: str  # "finished", "ignored" (a sample was), "aborted" (a sample was), or "unfinished"


class Metrics:
    """The figures of one run (see the module doc)."""

    def __init__(self) -> None:
        self.timeline = Timeline()
        self.counts = Counts()
        self.requests: list[SimRequest] = []  # every sample, in arrival order
        self.first_token_s: dict[str, float] = {}  # request id -> simulated time of its first token
        self.finish_s: dict[str, float] = {}  # request id -> simulated time it finished
        self.final_hit_rate = 0.0
        self.manager_calls = 0
        self.manager_by_method: dict[str, tuple[float, int]] = {}  # name -> (seconds, calls) inside the manager
        self.startup_s = 0.0  # the warm-up before the run (kept out of the manager-time figures)
        self.wall_s = 0.0  # the replay's wall time

    # -- the points of a step ------------------------------------------------------------
    def arrived(self, samples: list[SimRequest]) -> None:
        self.requests += samples

    def decided(self, output: StepOutput) -> None:
        record, counts = output.record, self.counts
        counts.recompute_preemptions += len(record.preempted)
        counts.swap_outs += len(record.swapped_out)
        counts.swap_ins += len(record.swapped_in)
        counts.blocks_swapped_out += len(output.blocks_to_swap_out)
        counts.blocks_swapped_in += len(output.blocks_to_swap_in)
        counts.copy_on_writes += len(output.blocks_to_copy)
        for group in output.prefills[: len(record.admitted)]:  # the new prefills come first
            counts.prefill_tokens_admitted += group.request.seqs[0].get_len()
            counts.cached_tokens_admitted += group.token_chunk_size - group.num_uncached_tokens

    def sampled(self, request: SimRequest, now: float) -> None:
        self.first_token_s.setdefault(request.request_id, now)

    def finished(self, requests: list[SimRequest], now: float) -> None:
        for request in requests:
            self.finish_s[request.request_id] = now

    def stepped(
        self,
        now: float,
        step_s: float,
        num_batched_tokens: int,
        used_blocks: int,
        queues: tuple[int, int, int],
        hit_rate: float,
        manager_s: float,
    ) -> None:
        """The state after a step: ``num_batched_tokens`` computed (cache
        hits left out), ``queues`` are (running, waiting, swapped)."""
        timeline = self.timeline
        timeline.time_s.append(now)
        timeline.step_s.append(step_s)
        timeline.kv_used_blocks.append(used_blocks)
        timeline.num_running.append(queues[0])
        timeline.num_waiting.append(queues[1])
        timeline.num_swapped.append(queues[2])
        timeline.hit_rate.append(hit_rate)
        timeline.num_batched_tokens.append(num_batched_tokens)
        timeline.manager_s.append(manager_s)

    # -- what the readers take -------------------------------------------------------------
    def outcomes(self) -> list[TraceOutcome]:
        """The samples grouped by trace request, in trace order."""
        by_index: dict[int, list[SimRequest]] = {}
        for request in self.requests:
            by_index.setdefault(request.index, []).append(request)
        return [self._outcome(index, samples) for index, samples in by_index.items()]

    def _outcome(self, index: int, samples: list[SimRequest]) -> TraceOutcome:
        statuses = {seq.status for r in samples for seq in r.seqs}
        finishes = [self.finish_s.get(r.request_id) for r in samples]
        if SequenceStatus.FINISHED_IGNORED in statuses:
            status = "ignored"
        elif SequenceStatus.FINISHED_ABORTED in statuses:
            status = "aborted"
        elif all(finish is not None for finish in finishes):
            status = "finished"
        else:
            status = "unfinished"
        firsts = [self.first_token_s[r.request_id] for r in samples if r.request_id in self.first_token_s]
        return TraceOutcome(
            index,
            samples[0].arrival_s,
            samples[0].num_prompt_tokens,
            sum(seq.get_output_len() for r in samples for seq in r.seqs),
            min(firsts) if firsts else None,
            max(f for f in finishes if f is not None) if status == "finished" else None,
            status,
        )


__all__ = ["Counts", "Metrics", "TraceOutcome", "Timeline"]
