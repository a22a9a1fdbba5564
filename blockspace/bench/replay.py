"""The bench's replay: a decode-heavy run of the Mooncake trace through a
small v0-style scheduler (spec §16), for manager calls per second."""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from blockspace.bench.floor import Floor, Recorder
from blockspace.bench.timing import Clocked, implementations
from blockspace.enums import AllocStatus, SequenceStatus
from blockspace.sequence import SequenceGroup
from blockspace.workloads import load_trace, output_token_id


def load_requests(num_requests: int) -> list[tuple[list[int], int]]:
    """``(prompt token ids, output length)`` of the first requests of the trace."""
    return [(request.prompt_token_ids(), request.output_length) for request in load_trace(max_requests=num_requests)]


def replay(
    manager: Any,
    requests: list[tuple[list[int], int]],
    *,
    max_running: int = 16,
    max_output: int = 32,
    caching: bool = True,
) -> int:
    """Serve the requests through ``manager`` with continuous batching and
    recompute preemption; returns the number of manager calls made."""
    waiting: deque[tuple[SequenceGroup, int]] = deque()
    for index, (prompt, output_length) in enumerate(requests):
        group = SequenceGroup.from_prompt(f"r{index}", prompt, first_seq_id=index)
        waiting.append((group, min(output_length, max_output)))
    running: list[list[Any]] = []  # [group, sequence, tokens still to generate]
    calls, clock = 0, 0.0
    while waiting or running:
        clock += 1.0
        while waiting and len(running) < max_running:
            group, remaining = waiting[0]
            seq = group.seqs[0]
            if caching:
                manager.get_num_cached_tokens(seq)
            status = manager.can_allocate(group)
            calls += 1 + caching
            if status != AllocStatus.OK:
                if caching:
                    manager.remove_seq_from_computed_blocks_tracker(seq)
                    calls += 1
                if status == AllocStatus.NEVER:
                    waiting.popleft()
                    continue
                break
            manager.allocate(group)
            calls += 1
            seq.status = SequenceStatus.RUNNING
            running.append([group, seq, remaining])
            waiting.popleft()
        for entry in list(running):
            if entry not in running:
                continue
            group, seq, _ = entry
            while not manager.can_append_slots(group, 0):
                calls += 1
                victim = running.pop()
                manager.free(victim[1])
                calls += 1
                victim[1].status = SequenceStatus.WAITING
                victim[1].data.reset_state_for_recompute()
                waiting.appendleft((victim[0], victim[2]))
                if victim is entry:
                    break
            calls += 1
            if entry not in running:
                continue
            manager.append_slots(seq, 0)
            manager.get_block_table(seq)
            manager.access_all_blocks_in_seq(seq, clock)
            calls += 3
            if caching:
                manager.get_common_computed_block_ids([seq])
                calls += 1
            manager.mark_blocks_as_computed(group, 1)
            calls += 1
        for entry in list(running):
            group, seq, remaining = entry
            seq.data.update_num_computed_tokens(seq.get_len() - seq.data.get_num_computed_tokens())
            seq.append_token_id(output_token_id(int(group.request_id[1:]), 0, seq.get_len()))
            entry[2] = remaining - 1
            if entry[2] == 0:
                manager.free(seq)
                calls += 1
                seq.status = SequenceStatus.FINISHED_STOPPED
                running.remove(entry)
    return calls


def replay_throughput(quick: bool) -> dict[str, Any]:
    """Both managers on the replay, and the floor (blockspace/bench/floor.py):
    the same calls served from a recording of the fast manager's answers.

    Each is run on the wall clock and clocked call by call, in turns over a
    few passes (a slow spell of the shared machine then slows all of them
    alike), and the best of each is kept; the short replays (fast, floor)
    run three times a turn."""
    num_requests, max_output = (30, 32) if quick else (100, 128)
    requests = load_requests(num_requests)
    overhead = Clocked.overhead()
    result: dict[str, Any] = {"requests": num_requests, "max_output": max_output, "clock_overhead_us": overhead * 1e6}

    def new_manager(cls: type) -> Any:
        return cls(16, 4096, 1024, enable_caching=True)

    recorder = Recorder(new_manager(implementations()["fast"]))
    num_calls = replay(recorder, requests, max_running=16, max_output=max_output)  # also warms fast up
    # Out of the garbage collector's sight: the requests and the recording
    # (some 20,000 lists) are the bench's objects, and walking them in full
    # collections is no cost of the managers.
    ways: dict[str, Callable[[], Any]] = {
        "reference": lambda: new_manager(implementations()["reference"]),
        "fast": lambda: new_manager(implementations()["fast"]),
        "floor": lambda: Floor(recorder.answers),
    }
    wall = dict.fromkeys(ways, float("inf"))
    inside = dict.fromkeys(ways, float("inf"))
    gc.freeze()
    try:
        for _pass in range(1 if quick else 3):
            for name, make in ways.items():
                for _round in range(1 if quick or name == "reference" else 3):
                    start = time.perf_counter()
                    replay(make(), requests, max_running=16, max_output=max_output)
                    wall[name] = min(wall[name], time.perf_counter() - start)
                    clock = Clocked(make())
                    replay(clock, requests, max_running=16, max_output=max_output)
                    inside[name] = min(inside[name], clock.seconds - num_calls * overhead)
    finally:
        gc.unfreeze()
    for name in ways:
        result[name] = {
            "calls": num_calls,
            "seconds": wall[name],
            "ops_per_s": num_calls / wall[name],
            "manager_seconds": inside[name],
            "manager_us_per_call": inside[name] / num_calls * 1e6,
        }
    return result
