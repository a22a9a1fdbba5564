"""Replay a Mooncake request trace in lockstep: real prefix sharing, real
prompt lengths, pool pressure, all compared call by call.

A small FCFS scheduler (admission, decode steps that accept
``tokens_per_step`` tokens at once as speculative decoding does, swap or
recompute preemption when ``can_append_slots`` says no, swap-in when room
comes back) drives every manager through a ``Lockstep``; return values and
snapshots are compared after every call. Token ids come from the chunk ids
(``blockspace.workloads``), so requests that share chunk ids share real
prefixes. ``VARIANTS`` are the two replays the kit runs: as above, and with
every decode step one row step of the whole batch. The trace is the one
``blockspace.workloads.load_trace`` finds:
``BLOCKSPACE_TRACE`` if set, else the sample the package ships.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from blockspace.conformance.check import Check, CheckResult
from blockspace.conformance.lockstep import Divergence, Lockstep
from blockspace.conformance.script import Script
from blockspace.enums import AllocStatus, Device, SequenceStatus
from blockspace.sequence import Sequence, SequenceGroup
from blockspace.workloads import TraceError, TraceRequest, load_trace, trace_source


def replay(
    impls: Mapping[str, Any],
    requests: list[TraceRequest],
    *,
    block_size: int = 32,
    num_gpu_blocks: int = 1024,
    num_cpu_blocks: int = 512,
    enable_caching: bool = True,
    max_output: int = 64,
    tokens_per_step: int | tuple[int, ...] = 16,
    max_prompt: int | None = None,
    rows: bool = False,
) -> int:
    """Run the trace to the end in lockstep; returns the number of calls.
    Raises ``Divergence`` at the first disagreement. A tuple of
    ``tokens_per_step`` gives request ``i`` its ``i % len``-th entry;
    ``max_prompt`` cuts every prompt (the shared prefixes stay); ``rows``
    makes each decode step one ``Lockstep.row_step`` of every running group
    (the row API where a manager offers it), preempting the latest admitted
    until they fit together."""
    config = dict(
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=num_cpu_blocks,
        watermark=0.0,
        enable_caching=enable_caching,
    )
    script = Script(impls, config)
    script.do("from blockspace.workloads import prompt_token_ids")
    lock = Lockstep.build(impls, script, every_call=False, **config)
    steps = (tokens_per_step,) if isinstance(tokens_per_step, int) else tokens_per_step
    scheduler = _Scheduler(lock, script, enable_caching, steps, rows)
    for index, request in enumerate(requests):
        length = request.input_length if max_prompt is None else min(request.input_length, max_prompt)
        scheduler.add(index, request.hash_ids, length, min(request.output_length, max_output))
    while scheduler.waiting or scheduler.running or scheduler.swapped:
        scheduler.step()
    scheduler.end()
    return lock.num_calls


def _seq(group: SequenceGroup) -> Sequence:
    return group.get_seqs()[0]  # a trace request is one sequence


def _name(group: SequenceGroup) -> str:
    return f"s{_seq(group).seq_id}"  # its name in the script


@dataclass
class _Scheduler:
    """The replay's FCFS scheduler: its three queues, and each step's calls in
    vLLM's order (swap-ins, admissions, appends with preemption, the model step).
    Every world change is a ``script`` line and every manager call goes through
    ``lock``, so a divergence prints a runnable repro."""

    lock: Lockstep
    script: Script
    caching: bool
    tokens_per_step: tuple[int, ...]  # request i accepts the (i % len)-th entry per decode step
    rows: bool  # each decode step one row step of every running group
    waiting: list[SequenceGroup] = field(default_factory=list)
    running: list[SequenceGroup] = field(default_factory=list)  # in admission order: the last goes first
    swapped: list[SequenceGroup] = field(default_factory=list)
    requests: list[SequenceGroup] = field(default_factory=list)  # every one, in the trace's order
    outputs_left: dict[str, int] = field(default_factory=dict)  # request id -> output tokens still to come
    clock: float = 0.0

    def add(self, index: int, hash_ids: Iterable[int], length: int, output: int) -> None:
        """Request ``index`` waits: sequence ``s{index}`` of ``length`` prompt tokens from the chunk ids."""
        self.script.do(f"s{index} = Sequence({index}, prompt_token_ids({list(hash_ids)!r}, {length}))")
        self.script.do(f"g{index} = SequenceGroup('g{index}', [s{index}])")
        group = self.script.get(f"g{index}")
        self.requests.append(group)
        self.waiting.append(group)
        self.outputs_left[group.request_id] = output

    def step(self) -> None:
        """One scheduler step, with a snapshot comparison before it."""
        self.clock += 1.0
        self.lock.checkpoint(f"scheduler step {int(self.clock) - 1}")
        self.swap_in()
        self.admit()
        self.make_room()
        self.mark_computed()
        self.run_model()

    def swap_in(self) -> None:
        """Swapped groups come back first, in order; the first is aborted if it
        cannot come back even with nothing running."""
        if self.swapped and not self.running and not self._can_swap_in():
            group = self.swapped.pop(0)
            self._set_status(group, SequenceStatus.FINISHED_ABORTED)
            self.lock.value("free", _seq(group))
        while self.swapped and self._can_swap_in():
            group = self.swapped.pop(0)
            self.lock.value("swap_in", group)
            self._set_status(group, SequenceStatus.RUNNING)
            self.running.append(group)

    def admit(self) -> None:
        """Waiting groups in order, while none is swapped out, until one must
        wait for room; one that can never fit is ignored."""
        while self.waiting and not self.swapped:
            group = self.waiting[0]
            status = self._can_allocate(group)
            if status == AllocStatus.LATER:
                if self.caching:
                    self.lock.value("remove_seq_from_computed_blocks_tracker", _seq(group))
                return
            self.waiting.pop(0)
            if status == AllocStatus.NEVER:
                self._set_status(group, SequenceStatus.FINISHED_IGNORED)
            else:
                self.lock.value("allocate", group)
                self._set_status(group, SequenceStatus.RUNNING)
                self.running.append(group)

    def make_room(self) -> None:
        """Room for each running group's next tokens, preempting the latest
        admitted until it fits; then the appends, one group at a time or (with
        ``rows``) one row step of them all, preempting until they fit together."""
        for group in list(self.running):
            while group in self.running and not self.lock.value("can_append_slots", group, 0):
                self.preempt_latest()
            if group in self.running and not self.rows:
                self._append(group)
        while self.rows and self.running and self.lock.row_step(self.running, 0, self.clock).raised:
            self.preempt_latest()

    def preempt_latest(self) -> None:
        """The latest admitted goes first, as in vLLM: swapped out where the CPU
        has room, else freed to be computed again."""
        victim = self.running.pop()
        if self.lock.value("can_swap_out", victim):
            self.lock.value("swap_out", victim)
            self._set_status(victim, SequenceStatus.SWAPPED)
            self.swapped.append(victim)
        else:
            self._set_status(victim, SequenceStatus.WAITING)
            self.lock.value("free", _seq(victim))
            self.script.do(f"{_name(victim)}.data.reset_state_for_recompute()")
            self.waiting.insert(0, victim)

    def mark_computed(self) -> None:
        """What the step will compute is marked computed, and the hit rates read, as vLLM's scheduler does."""
        for group in self.running:
            self.lock.value("mark_blocks_as_computed", group, _seq(group).data.get_num_uncomputed_tokens())
        self._read_hit_rates()

    def run_model(self) -> None:
        """The model step: each running group computes the whole prompt, then its
        accepted tokens; one with no output left finishes and is freed."""
        for group in list(self.running):
            seq = _seq(group)
            self.script.do(f"{_name(group)}.data.update_num_computed_tokens({seq.data.get_num_uncomputed_tokens()})")
            if self.outputs_left[group.request_id] == 0:
                self._set_status(group, SequenceStatus.FINISHED_STOPPED)
                self.lock.value("free", seq)
                self.running.remove(group)
                continue
            self.outputs_left[group.request_id] -= 1
            for token in range(self.tokens_per_step[seq.seq_id % len(self.tokens_per_step)]):
                self.script.do(f"{_name(group)}.append_token_id({7 + token})")

    def end(self) -> None:
        """The observations after the last step, then the prefix cache reset and a last comparison."""
        for group in self.requests:
            self.lock.value("get_num_cached_tokens", _seq(group))
        self._read_hit_rates()
        self.lock.value("reset_prefix_cache")
        self.lock.checkpoint("the end of the trace")

    def _can_swap_in(self) -> bool:
        return self.lock.value("can_swap_in", self.swapped[0], 0) == AllocStatus.OK

    def _can_allocate(self, group: SequenceGroup) -> AllocStatus:
        """``can_allocate``'s answer, but NEVER where it says LATER with nothing running (it cannot fit even alone)."""
        if self.caching:
            self.lock.value("get_num_cached_tokens", _seq(group))
        status = self.lock.value("can_allocate", group, 0)
        return AllocStatus.NEVER if status == AllocStatus.LATER and not self.running else status

    def _append(self, group: SequenceGroup) -> None:
        """One group's slots appended, its table read and its blocks touched, as a decode step does."""
        seq = _seq(group)
        self.lock.value("append_slots", seq, 0)
        self.lock.value("get_block_table", seq)
        self.lock.value("access_all_blocks_in_seq", seq, self.clock)
        if self.caching:
            self.lock.value("get_common_computed_block_ids", [seq])

    def _set_status(self, group: SequenceGroup, status: SequenceStatus) -> None:
        self.script.do(f"{_name(group)}.status = SequenceStatus.{status.name}")

    def _read_hit_rates(self) -> None:
        for device in (Device.GPU, Device.CPU):  # as vLLM's scheduler names them
            self.lock.value("get_prefix_cache_hit_rate", device)


# The row-step replay: prompts cut to two chunks (the first shared by every
# request, the second a sibling of the others') and a pool that holds about
# three of them, so decode batches of 2-4 rows (accepting 16, 3 or 7 tokens a
# step: some fill a block while others do not) take fresh blocks, and run
# out together and preempt.
ROWS_REPLAY = dict(
    block_size=16, num_gpu_blocks=192, num_cpu_blocks=128, max_prompt=1024, max_output=32,
    tokens_per_step=(16, 3, 7), rows=True,
)  # fmt: skip
VARIANTS: dict[str, dict[str, Any]] = {"trace[mooncake]": {}, "trace[mooncake-rows]": ROWS_REPLAY}


def trace_check(
    impls: Mapping[str, Any], num_requests: int, capabilities: Mapping[str, bool], name: str = "trace[mooncake]"
) -> Check:
    """The replay ``name`` of ``VARIANTS`` as a check."""

    def run() -> CheckResult:
        try:
            requests = load_trace(max_requests=num_requests)
        except TraceError as error:  # only a BLOCKSPACE_TRACE naming a bad file: the sample always ships
            return CheckResult(name, "failed", detail=str(error))
        caching = capabilities.get("supports_caching", True)
        started = time.perf_counter()
        try:
            num_calls = replay(impls, requests, enable_caching=caching, **VARIANTS[name])
        except Divergence as failure:
            detail = str(failure)
            if len(detail) > 20_000:  # a trace repro is long: keep the head and the diverging tail
                detail = detail[:4_000] + "\n...\n" + detail[-8_000:]
            return CheckResult(name, "failed", len(requests), time.perf_counter() - started, detail)
        seconds = time.perf_counter() - started
        extra = {"calls": num_calls, "trace": trace_source()}
        return CheckResult(name, "passed", len(requests), seconds, extra=extra)

    return Check(name, run, reads=frozenset({"supports_caching"}))  # it replays without caching, not skips


def trace_checks(impls: Mapping[str, Any], num_requests: int, capabilities: Mapping[str, bool]) -> list[Check]:
    return [trace_check(impls, num_requests, capabilities, name) for name in VARIANTS]


__all__ = ["SequenceStatus", "TraceRequest", "replay", "trace_check", "trace_checks"]
