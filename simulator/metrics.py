"""Every figure of a run, in one object: the report, the sweeps and the plot
read this and nothing else.

Why one object: the policy (``scheduler.py``) decides and never counts, the
simulation (``simulation.py``) keeps the clock and times the manager, and
both hand what they saw to ``Metrics`` at fixed points of a step. A new
figure is then one field here, filled at one of those points, and read by
``summary.py``; no reader reaches into the scheduler or the requests.

The points, in the order of a step:

* ``arrived``: the requests (samples) of a trace request joined the queue;
* ``decided``: the policy's ``StepOutput`` (admissions, preemptions, swaps,
  copy-on-writes, ignored and aborted requests are all in it);
* ``sampled`` (a prompt's last chunk gave a token), ``decoded`` (the
  step's decodes gave one each) and ``finished``: the model's side, at the
  simulated time (the gaps between a request's tokens are the ITL);
* ``stepped``: the state after the step, one timeline entry.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from blockspace.enums import SequenceStatus
from blockspace.simulator.decisions import StepOutput
from blockspace.simulator.request import SimRequest

if TYPE_CHECKING:
    from blockspace.simulator.slo import SLO


class EndedSequence(Protocol):
    """What a request's record reads of its sequence once the run is over."""

    @property
    def status(self) -> SequenceStatus: ...

    def get_output_len(self) -> int: ...


class ArrivedRequest(Protocol):
    """What the records read of a request (a sample): a ``SimRequest`` of
    the Python engine, or a ``ReplayedRequest`` (below)."""

    @property
    def request_id(self) -> str: ...

    @property
    def index(self) -> int: ...

    @property
    def sample(self) -> int: ...

    @property
    def arrival_s(self) -> float: ...

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def seq(self) -> EndedSequence: ...


@dataclass(slots=True)
class ReplayedSequence:
    """What ``Metrics`` reads of a sequence once the run is over."""

    status: SequenceStatus
    num_output_tokens: int

    def get_output_len(self) -> int:
        return self.num_output_tokens


@dataclass(slots=True)
class ReplayedRequest:
    """What ``Metrics`` reads of a request that is over: the compiled engine's
    (a ``SimRequest`` of the Python engine), and a fleet's retried request
    (``fleet.py``: its arrival its first)."""

    request_id: str
    index: int
    sample: int
    arrival_s: float
    num_prompt_tokens: int
    seq: ReplayedSequence


def _floats() -> array[float]:
    return array("d")


def _ints() -> array[int]:
    return array("q")


def filled(target: array[Any], values: np.ndarray) -> None:
    """``target`` extended by ``values``, cast to its type, in one copy
    (``frombytes`` reads the array's own buffer)."""
    target.frombytes(np.ascontiguousarray(values, dtype=target.typecode).data.cast("B"))


@dataclass
class Timeline:
    """One entry per step, taken after the step (time = end of the step).

    Why typed arrays, not lists: a fleet's replay runs some 10^5 steps, and
    a list holds a Python object per entry. An ``array`` appends as a list
    does (the Python engine), is filled from the compiled loop's row in one
    copy, and hands numpy its buffer without converting an entry (the
    report, the fleet's merge); reading one entry gives a plain ``int`` or
    ``float``."""

    time_s: array[float] = field(default_factory=_floats)
    step_s: array[float] = field(default_factory=_floats)
    kv_used_blocks: array[int] = field(default_factory=_ints)
    num_running: array[int] = field(default_factory=_ints)
    num_waiting: array[int] = field(default_factory=_ints)
    num_swapped: array[int] = field(default_factory=_ints)
    hit_rate: array[float] = field(default_factory=_floats)
    num_batched_tokens: array[int] = field(default_factory=_ints)
    # the prompt tokens admitted so far (``Counts.prefill_tokens_admitted``): a fleet weighs its
    # replicas' hit rates by it, at each time as at the end (``plot.py``, ``fleet.merged``)
    prefill_tokens_admitted: array[int] = field(default_factory=_ints)
    manager_s: array[float] = field(default_factory=_floats)


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
    the first token is the earliest sample's, the finish the last sample's,
    and the time per output token the slowest sample's (what bounds the
    whole answer)."""

    index: int
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int  # over every sample
    first_token_s: float | None
    finish_s: float | None  # None unless every sample finished
    status: str  # "finished", "ignored" (a sample was), "aborted" (a sample was), or "unfinished"
    tpot_s: float | None = None  # None unless finished

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None or self.status != "finished" else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s


def tpot(first_token_s: float, finish_s: float, num_output_tokens: int) -> float:
    """Time per output token after the first, vLLM's benchmark's TPOT:
    (end-to-end - TTFT) / (output tokens - 1); 0 for a single token."""
    return (finish_s - first_token_s) / (num_output_tokens - 1) if num_output_tokens > 1 else 0.0


# The fields of a request's record (``--requests-out``, one JSON line each): JSON
# type(s) and meaning. docs/simulator.md shows this table, and the tests hold every
# line written to it.
REQUEST_SCHEMA: dict[str, tuple[str, str]] = {
    "manager": ("string", "the manager of the run (with --compare, each run writes its lines)"),
    "request_id": ("string", "vLLM's request id: the trace index, or {index}_parallel_sample_{i} with --n"),
    "trace_index": ("integer", "the request's line in the trace, from 0"),
    "sample": ("integer", "which of the trace request's n samples, from 0"),
    "replica": ("integer", "the replica the router sent it to (--replicas; 0 for one engine)"),
    "status": ("string", "finished, ignored, aborted or unfinished"),
    "reason": ("string|null", "why it did not finish; null when it did"),
    "arrival_s": ("number", "arrival, simulated seconds (after --time-scale or --request-rate)"),
    "admitted_s": ("number|null", "its first admission (start of that step); null if never admitted"),
    "readmissions_s": ("array", "each later admission, after a recompute preemption"),
    "first_token_s": ("number|null", "end of the step that gave its first token"),
    "finish_s": ("number|null", "end of the step that gave its last token"),
    "prompt_tokens": ("integer", "prompt length"),
    "output_tokens": ("integer", "tokens generated"),
    "cached_tokens": ("integer", "tokens found in the prefix cache at its admissions, summed"),
    "preemptions": ("integer", "recompute preemptions"),
    "swap_outs": ("integer", "times swapped out to the CPU"),
    "ttft_s": ("number|null", "first_token_s - arrival_s, when it finished"),
    "tpot_s": ("number|null", "(finish_s - first_token_s) / (output_tokens - 1), 0 for one token, when it finished"),
    "e2e_s": ("number|null", "finish_s - arrival_s, when it finished"),
    "met_slo": ("boolean|null", "whether its trace request (all n samples) met --slo; null without --slo"),
}

# Why a request that did not finish did not (the ``reason`` of its record).
REASONS = {
    "ignored": "the block manager answered NEVER: the request needs more GPU blocks than the pool has",
    "aborted": "its prefill could not go on even alone on the GPU (it would be preempted for ever)",
    "unfinished": "the replay ended first",
}


class Metrics:
    """The figures of one run (see the module doc)."""

    def __init__(self) -> None:
        self.timeline = Timeline()
        self.counts = Counts()
        self.requests: list[ArrivedRequest] = []  # every sample, in arrival order
        self.first_token_s: dict[str, float] = {}  # request id -> simulated time of its first token
        self.finish_s: dict[str, float] = {}  # request id -> simulated time it finished
        self.admitted_s: dict[str, list[float]] = {}  # request id -> each admission (re-admissions after recompute)
        # request id -> tokens found in the prefix cache, over its admissions
        self.cached_tokens: dict[str, int] = {}
        self.preemptions: dict[str, int] = {}  # request id -> recompute preemptions
        self.swap_outs: dict[str, int] = {}  # request id -> times swapped out
        self.last_token_s: dict[str, float] = {}  # request id -> simulated time of its latest token
        self.itl_s = array("d")  # every gap between two tokens of a request (inter-token latency)
        self.replica_of: dict[int, int] = {}  # a fleet's: trace index -> the replica that served it
        self.final_hit_rate = 0.0
        self.manager_calls = 0
        self.manager_by_method: dict[str, tuple[float, int]] = {}  # name -> (seconds, calls) inside the manager
        self.startup_s = 0.0  # the warm-up before the run (kept out of the manager-time figures)
        self.wall_s = 0.0  # the replay's wall time

    # -- the points of a step ------------------------------------------------------------
    def arrived(self, samples: Iterable[ArrivedRequest]) -> None:
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
            request_id, cached = group.request.request_id, group.token_chunk_size - group.num_uncached_tokens
            counts.prefill_tokens_admitted += group.request.seqs[0].get_len()
            counts.cached_tokens_admitted += cached
            self.admitted_s.setdefault(request_id, []).append(record.time_s)
            self.cached_tokens[request_id] = self.cached_tokens.get(request_id, 0) + cached
        for request_id in record.preempted:
            self.preemptions[request_id] = self.preemptions.get(request_id, 0) + 1
        for request_id in record.swapped_out:
            self.swap_outs[request_id] = self.swap_outs.get(request_id, 0) + 1

    def sampled(self, request: SimRequest, now: float) -> None:
        """A prompt's last chunk gave a token: the first, or (after a
        recompute preemption) the next one after a long gap."""
        request_id = request.request_id
        self.first_token_s.setdefault(request_id, now)
        last = self.last_token_s.get(request_id)
        if last is not None:
            self.itl_s.append(now - last)
        self.last_token_s[request_id] = now

    def decoded(self, requests: list[SimRequest], now: float) -> None:
        """The step's decodes gave a token each (every one has an earlier token)."""
        last, gaps = self.last_token_s, self.itl_s
        for request in requests:
            request_id = request.request_id
            gaps.append(now - last[request_id])
            last[request_id] = now

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
        timeline.prefill_tokens_admitted.append(self.counts.prefill_tokens_admitted)
        timeline.manager_s.append(manager_s)

    # -- what the readers take -------------------------------------------------------------
    def outcomes(self) -> list[TraceOutcome]:
        """The samples grouped by trace request, in trace order."""
        by_index: dict[int, list[ArrivedRequest]] = {}
        for request in self.requests:
            by_index.setdefault(request.index, []).append(request)
        return [self._outcome(index, samples) for index, samples in by_index.items()]

    def _outcome(self, index: int, samples: list[ArrivedRequest]) -> TraceOutcome:
        records = [self.request_record(request) for request in samples]
        statuses = {record["status"] for record in records}
        status = next((s for s in ("ignored", "aborted", "unfinished") if s in statuses), "finished")
        firsts = [record["first_token_s"] for record in records if record["first_token_s"] is not None]
        finished = status == "finished"
        return TraceOutcome(
            index,
            samples[0].arrival_s,
            samples[0].num_prompt_tokens,
            sum(record["output_tokens"] for record in records),
            min(firsts) if firsts else None,
            max(record["finish_s"] for record in records) if finished else None,
            status,
            max(record["tpot_s"] for record in records) if finished else None,
        )

    def request_record(self, request: ArrivedRequest) -> dict[str, Any]:
        """Everything that happened to one request (one sample), as plain
        data: the ``--requests-out`` line (its schema: docs/simulator.md)."""
        request_id = request.request_id
        seq = request.seq
        first, finish = self.first_token_s.get(request_id), self.finish_s.get(request_id)
        if seq.status == SequenceStatus.FINISHED_IGNORED:
            status = "ignored"
        elif seq.status == SequenceStatus.FINISHED_ABORTED:
            status = "aborted"
        else:
            status = "finished" if finish is not None else "unfinished"
        admitted = self.admitted_s.get(request_id, [])
        num_output = seq.get_output_len()
        ttft_s = tpot_s = e2e_s = None  # latencies count for finished requests only
        if status == "finished" and first is not None and finish is not None:
            ttft_s, tpot_s, e2e_s = (
                first - request.arrival_s,
                tpot(first, finish, num_output),
                finish - request.arrival_s,
            )
        return {
            "request_id": request_id,
            "trace_index": request.index,
            "sample": request.sample,
            "replica": self.replica_of.get(request.index, 0),
            "status": status,
            "reason": REASONS.get(status),
            "arrival_s": request.arrival_s,
            "admitted_s": admitted[0] if admitted else None,
            "readmissions_s": admitted[1:],
            "first_token_s": first,
            "finish_s": finish,
            "prompt_tokens": request.num_prompt_tokens,
            "output_tokens": num_output,
            "cached_tokens": self.cached_tokens.get(request_id, 0),
            "preemptions": self.preemptions.get(request_id, 0),
            "swap_outs": self.swap_outs.get(request_id, 0),
            "ttft_s": ttft_s,
            "tpot_s": tpot_s,
            "e2e_s": e2e_s,
        }

    def request_records(self, slo: SLO | None = None) -> list[dict[str, Any]]:
        """``request_record`` of every request (sample), in arrival order,
        each with whether its trace request met ``slo`` (None without one):
        the SLO holds for a whole answer, over its n samples."""
        met = {outcome.index: slo.met_by(outcome) for outcome in self.outcomes()} if slo is not None else {}
        return [{**self.request_record(request), "met_slo": met.get(request.index)} for request in self.requests]


__all__ = [
    "REASONS",
    "REQUEST_SCHEMA",
    "ArrivedRequest",
    "Counts",
    "EndedSequence",
    "Metrics",
    "ReplayedRequest",
    "ReplayedSequence",
    "TraceOutcome",
    "Timeline",
    "tpot",
]
