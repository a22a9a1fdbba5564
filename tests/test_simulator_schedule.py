"""A four-request trace whose schedule is worked out by hand.

Block size 16, 10 GPU blocks, watermark 0, no prefix caching, a budget of
64 tokens per step, and steps of exactly 1 s (no per-token cost), so every
decision and time below follows from the policy in scheduler.py:

request  arrives  prompt  output  blocks
0        0.0 s      40      3       3
1        0.0 s     100      2       7
2        0.0 s      50      1       4
3        2.5 s      20      1       2

step 0 (t=0): 0 is admitted with all 40 tokens; 1 gets the 24 left of the
  budget (7 blocks: the pool is now full); 2 hears LATER.
step 1 (t=1): 0 decodes, but its last block is partial and no block is free
  (vLLM's estimate counts it), so the newest running request, 1, is
  preempted by recompute; 2 now fits and is admitted (50 tokens) and
  finishes at once (output 1).
step 2 (t=2): 0 decodes; 1 is admitted again from token 0 (63 tokens left
  in the budget); 0 finishes (3 tokens).
step 3 (t=3): 3 has arrived; 1 takes its last 37 prompt tokens, 3 its 20
  (2 of the 3 free blocks); 3 finishes (output 1), 1 has its first token.
step 4 (t=4): 1 decodes its second token and finishes at t=5.
"""

from __future__ import annotations

import json

import pytest

from blockspace.enums import SequenceStatus
from blockspace.interfaces import load_manager_class
from blockspace.simulator import SchedulerConfig, SimulationConfig, StepRecord, run_simulation
from blockspace.simulator.gpu import StepTimeModel
from blockspace.workloads import parse_lines

LINES = [
    {"timestamp": 0, "input_length": 40, "output_length": 3, "hash_ids": [1]},
    {"timestamp": 0, "input_length": 100, "output_length": 2, "hash_ids": [2]},
    {"timestamp": 0, "input_length": 50, "output_length": 1, "hash_ids": [4]},
    {"timestamp": 2500, "input_length": 20, "output_length": 1, "hash_ids": [3]},
]

EXPECTED = [
    StepRecord(0, 0.0, scheduled=[("0", 40), ("1", 24)], admitted=["0", "1"], later=["2"]),
    StepRecord(1, 1.0, scheduled=[("2", 50), ("0", 1)], admitted=["2"], preempted=["1"], finished=["2"]),
    StepRecord(2, 2.0, scheduled=[("1", 63), ("0", 1)], admitted=["1"], finished=["0"]),
    StepRecord(3, 3.0, scheduled=[("3", 20), ("1", 37)], admitted=["3"], finished=["3"]),
    StepRecord(4, 4.0, scheduled=[("1", 1)], finished=["1"]),
]


def hand_config() -> SimulationConfig:
    return SimulationConfig(
        num_gpu_blocks=10,
        num_cpu_blocks=0,
        watermark=0.0,
        scheduler=SchedulerConfig(block_size=16, max_num_seqs=4, max_num_batched_tokens=64, enable_prefix_caching=False),
        step_time=StepTimeModel(step_overhead_ms=1000.0, prefill_token_us=0.0, decode_seq_us=0.0, kv_token_read_ns=0.0),
    )


@pytest.fixture(params=["reference", "fast"])
def manager_class(request):
    try:
        return load_manager_class(request.param)
    except (ImportError, AttributeError):
        pytest.skip(f"the {request.param} manager is not available")


def test_hand_computed_schedule(manager_class):
    trace = parse_lines([json.dumps(line) for line in LINES], "hand trace")

    def after_step(scheduler) -> None:
        scheduler.manager.manager.check_invariants()

    result = run_simulation(trace, manager_class, hand_config(), on_step=after_step)
    assert result.scheduler.records == EXPECTED
    by_id = {r.request_id: r for r in result.requests}
    assert {i: r.first_token_s - r.arrival_s for i, r in by_id.items()} == {"0": 1.0, "1": 4.0, "2": 2.0, "3": 1.5}
    assert {i: r.finish_s - r.arrival_s for i, r in by_id.items()} == {"0": 3.0, "1": 5.0, "2": 2.0, "3": 1.5}
    assert result.scheduler.num_recompute_preemptions == 1
    assert all(seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED for r in result.requests for seq in r.seqs)
    manager = result.scheduler.manager.manager
    assert manager.get_num_free_gpu_blocks() == 10


def test_idle_gpu_jumps_to_the_next_arrival():
    lines = [
        {"timestamp": 0, "input_length": 16, "output_length": 1, "hash_ids": [1]},
        {"timestamp": 60_000, "input_length": 16, "output_length": 1, "hash_ids": [2]},
    ]
    trace = parse_lines([json.dumps(line) for line in lines], "two arrivals")
    result = run_simulation(trace, load_manager_class("reference"), hand_config())
    assert [(r.step, r.time_s, r.scheduled) for r in result.scheduler.records] == [
        (0, 0.0, [("0", 16)]),
        (1, 60.0, [("1", 16)]),
    ]
    assert [r.finish_s for r in result.requests] == [1.0, 61.0]
