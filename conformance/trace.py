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
from collections.abc import Mapping
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
    waiting: list[SequenceGroup] = []
    for index, request in enumerate(requests):
        length = request.input_length if max_prompt is None else min(request.input_length, max_prompt)
        script.do(f"s{index} = Sequence({index}, prompt_token_ids({list(request.hash_ids)!r}, {length}))")
        script.do(f"g{index} = SequenceGroup('g{index}', [s{index}])")
        waiting.append(script.get(f"g{index}"))
    budget = {g.request_id: min(r.output_length, max_output) for g, r in zip(waiting, requests)}
    running: list[SequenceGroup] = []
    swapped: list[SequenceGroup] = []
    clock = 0.0

    def seq(group: SequenceGroup) -> Sequence:
        return group.get_seqs()[0]

    def name(group: SequenceGroup) -> str:
        return f"s{seq(group).seq_id}"

    def preempt_latest() -> None:
        victim = running.pop()  # the latest admitted goes first, as in vLLM
        if lock.value("can_swap_out", victim):
            lock.value("swap_out", victim)
            script.do(f"{name(victim)}.status = SequenceStatus.SWAPPED")
            swapped.append(victim)
        else:
            script.do(f"{name(victim)}.status = SequenceStatus.WAITING")
            lock.value("free", seq(victim))
            script.do(f"{name(victim)}.data.reset_state_for_recompute()")
            waiting.insert(0, victim)

    while waiting or running or swapped:
        clock += 1.0
        lock.checkpoint(f"scheduler step {int(clock) - 1}")
        if swapped and not running and lock.value("can_swap_in", swapped[0], 0) != AllocStatus.OK:
            group = swapped.pop(0)  # it cannot come back even alone: abort it
            script.do(f"{name(group)}.status = SequenceStatus.FINISHED_ABORTED")
            lock.value("free", seq(group))
        while swapped and lock.value("can_swap_in", swapped[0], 0) == AllocStatus.OK:
            group = swapped.pop(0)
            lock.value("swap_in", group)
            script.do(f"{name(group)}.status = SequenceStatus.RUNNING")
            running.append(group)
        while waiting and not swapped:
            group = waiting[0]
            if enable_caching:
                lock.value("get_num_cached_tokens", seq(group))
            status = lock.value("can_allocate", group, 0)
            if status == AllocStatus.LATER and not running:
                status = AllocStatus.NEVER  # it cannot fit even alone
            if status == AllocStatus.LATER:
                if enable_caching:
                    lock.value("remove_seq_from_computed_blocks_tracker", seq(group))
                break
            waiting.pop(0)
            if status == AllocStatus.NEVER:
                script.do(f"{name(group)}.status = SequenceStatus.FINISHED_IGNORED")
                continue
            lock.value("allocate", group)
            script.do(f"{name(group)}.status = SequenceStatus.RUNNING")
            running.append(group)
        for group in list(running):
            while group in running and not lock.value("can_append_slots", group, 0):
                preempt_latest()
            if group not in running or rows:
                continue
            lock.value("append_slots", seq(group), 0)
            lock.value("get_block_table", seq(group))
            lock.value("access_all_blocks_in_seq", seq(group), clock)
            if enable_caching:
                lock.value("get_common_computed_block_ids", [seq(group)])
        while rows and running and lock.row_step(running, 0, clock).raised:  # each fits, not all together
            preempt_latest()
        for group in running:
            lock.value("mark_blocks_as_computed", group, seq(group).data.get_num_uncomputed_tokens())
        for device in (Device.GPU, Device.CPU):  # as vLLM's scheduler names them
            lock.value("get_prefix_cache_hit_rate", device)
        for group in list(running):  # the model step: the whole prompt, then one token per step
            s = seq(group)
            script.do(f"{name(group)}.data.update_num_computed_tokens({s.data.get_num_uncomputed_tokens()})")
            if budget[group.request_id] == 0:
                script.do(f"{name(group)}.status = SequenceStatus.FINISHED_STOPPED")
                lock.value("free", s)
                running.remove(group)
                continue
            budget[group.request_id] -= 1
            steps = (tokens_per_step,) if isinstance(tokens_per_step, int) else tokens_per_step
            for token in range(steps[s.seq_id % len(steps)]):
                script.do(f"{name(group)}.append_token_id({7 + token})")
    for index in range(len(requests)):
        lock.value("get_num_cached_tokens", script.get(f"s{index}"))
    for device in (Device.GPU, Device.CPU):  # as vLLM's scheduler names them
        lock.value("get_prefix_cache_hit_rate", device)
    lock.value("reset_prefix_cache")
    lock.checkpoint("the end of the trace")
    return lock.num_calls


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
