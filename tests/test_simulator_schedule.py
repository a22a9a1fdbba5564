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
        scheduler=SchedulerConfig(
            block_size=16, max_num_seqs=4, max_num_batched_tokens=64, enable_prefix_caching=False
        ),
        step_time=StepTimeModel(step_overhead_ms=1000.0, prefill_token_us=0.0, decode_seq_us=0.0, kv_token_read_ns=0.0),
    )


@pytest.fixture(params=["reference", "fast"])
def manager_class(request):
    return load_manager_class(request.param)


def trace_of(*lines: dict) -> list:
    return parse_lines([json.dumps(line) for line in lines], "test trace")


def logging(manager_class: type, calls: list) -> type:
    """The manager, logging ``(manager, method, request or seq id)`` of allocate, free and swap_in."""

    def logged(name: str, key):
        def call(self, arg, *rest):
            calls.append((self, name, key(arg)))
            return getattr(manager_class, name)(self, arg, *rest)

        return call

    by_group, by_seq = (lambda g: g.request_id), (lambda s: s.seq_id)
    methods = {"allocate": logged("allocate", by_group), "free": logged("free", by_seq)}
    methods["swap_in"] = logged("swap_in", by_group)
    return type(f"Logging{manager_class.__name__}", (manager_class,), methods)


def test_hand_computed_schedule(manager_class):
    trace = parse_lines([json.dumps(line) for line in LINES], "hand trace")

    def after_step(scheduler) -> None:
        scheduler.manager.manager.check_invariants()

    result = run_simulation(trace, manager_class, hand_config(), on_step=after_step)
    assert result.records == EXPECTED
    metrics = result.metrics
    arrival = {r.request_id: r.arrival_s for r in metrics.requests}
    assert {i: t - arrival[i] for i, t in metrics.first_token_s.items()} == {"0": 1.0, "1": 4.0, "2": 2.0, "3": 1.5}
    assert {i: t - arrival[i] for i, t in metrics.finish_s.items()} == {"0": 3.0, "1": 5.0, "2": 2.0, "3": 1.5}
    assert result.metrics.counts.recompute_preemptions == 1
    assert all(seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED for r in result.metrics.requests for seq in r.seqs)
    manager = result.manager
    assert manager.get_num_free_gpu_blocks() == 10


def test_idle_gpu_jumps_to_the_next_arrival():
    lines = [
        {"timestamp": 0, "input_length": 16, "output_length": 1, "hash_ids": [1]},
        {"timestamp": 60_000, "input_length": 16, "output_length": 1, "hash_ids": [2]},
    ]
    trace = parse_lines([json.dumps(line) for line in lines], "two arrivals")
    result = run_simulation(trace, load_manager_class("reference"), hand_config())
    assert [(r.step, r.time_s, r.scheduled) for r in result.records] == [
        (0, 0.0, [("0", 16)]),
        (1, 60.0, [("1", 16)]),
    ]
    assert [result.metrics.finish_s[r.request_id] for r in result.metrics.requests] == [1.0, 61.0]


def test_finished_sequences_are_freed_in_batch_order(manager_class):
    """vLLM frees a finished sequence while it processes the model's output,
    in the order of the scheduled batch (new prefills before decodes), not
    in running-queue order. At t=1, request 1 (a new prefill with one output
    token) is scheduled before request 0 (decoding its last token) and both
    finish: 1 is freed first, so 0's blocks lead the free list and request
    2, admitted next, gets them."""
    trace = trace_of(
        {"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [1]},
        {"timestamp": 500, "input_length": 20, "output_length": 1, "hash_ids": [2]},
        {"timestamp": 2500, "input_length": 20, "output_length": 1, "hash_ids": [3]},
    )
    logged: list = []
    result = run_simulation(trace, logging(manager_class, logged), hand_config())
    manager = result.manager
    calls = [(name, key) for who, name, key in logged if who is manager]  # not the warm-up's manager
    assert result.records[1].scheduled == [("1", 20), ("0", 1)]
    seq_of = {r.request_id: r.seqs[0].seq_id for r in result.metrics.requests}
    frees = [seq_id for name, seq_id in calls if name == "free"]
    assert frees[:2] == [seq_of["1"], seq_of["0"]]
    # Request 0 holds blocks [0, 1], request 1 [2, 3]. Freed 1 then 0, the free list starts
    # 1, 0, 3, 2; request 2 takes [1, 0] and, freed, puts them back: 0, 1, 3, 2. (Freed in
    # running-queue order, 0 then 1, request 2 would have taken [3, 2]: 2, 3, 1, 0.)
    allocated = [key for name, key in calls if name == "allocate"]
    assert allocated == ["0", "1", "2"] and result.records[2].admitted == ["2"]
    assert manager.snapshot()["free"]["GPU"][:4] == [0, 1, 3, 2]


def test_a_swapped_decode_comes_back_with_less_than_a_block_of_budget(manager_class):
    """vLLM does not chunk swapped groups (``_schedule_swapped`` runs without
    chunking): a swapped decode needs one token of budget, even when prefix
    caching would round a running prefill's share down to whole blocks.
    Here request 2's prefill takes 28 of the 40 tokens, and request 1, a
    swapped decode, comes back in the same step with 12 (< 16) left."""
    trace = trace_of(
        {"timestamp": 0, "input_length": 45, "output_length": 13, "hash_ids": [0]},
        {"timestamp": 500, "input_length": 32, "output_length": 9, "hash_ids": [100]},
        {"timestamp": 1500, "input_length": 60, "output_length": 5, "hash_ids": [200]},
    )
    config = SimulationConfig(
        num_gpu_blocks=7,
        num_cpu_blocks=32,
        watermark=0.0,
        scheduler=SchedulerConfig(16, max_num_seqs=4, max_num_batched_tokens=40, preemption_mode="swap"),
        step_time=hand_config().step_time,
    )
    records = run_simulation(trace, manager_class, config).records
    back = [r for r in records if "1" in r.swapped_in]
    assert back and back[-1].swapped_in == ["2", "1"] and back[-1].scheduled == [("2", 28), ("1", 1)]
