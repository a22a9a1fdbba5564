"""Issue 2's acceptance test: the first 200 Mooncake requests replayed
through the scheduler call protocol of spec §16 with the reference manager.

The GPU pool (1,040 blocks of 16 tokens, watermark 0) is small enough that
admission waits (LATER), running requests are preempted, idle cached blocks
are evicted and the largest prompts are rejected (NEVER); output lengths are
capped at 48 tokens to keep the run short. ``check_invariants()`` runs after
every scheduler step, and at the end every block is free again.
"""

from __future__ import annotations

import pytest

from blockspace.interfaces import load_manager_class
from blockspace.simulator import SchedulerConfig, SimulationConfig, load_trace, run_simulation
from blockspace.simulator.gpu import StepTimeModel

NUM_REQUESTS = 200


def first_requests(num_requests: int = NUM_REQUESTS):
    """The first requests of the trace ``BLOCKSPACE_TRACE`` names, else of
    the bundled sample (the same first lines of the conversation trace)."""
    return load_trace(None, num_requests)


class EvictionWatch:
    """Sees evictions through snapshots: a block idle in the cache at one
    look and uncached at a later one has been evicted (nothing else drops
    a cached block's content; reset is never called here)."""

    def __init__(self) -> None:
        self.idle_before: list[int] = []
        self.num_evicted = 0

    def look(self, manager) -> None:
        snapshot = manager.snapshot()
        self.num_evicted += sum(1 for block in self.idle_before if not snapshot["blocks"][block][1])
        self.idle_before = snapshot["evictable"]["GPU"]


def replay(enable_prefix_caching: bool, preemption_mode: str = "recompute"):
    config = SimulationConfig(
        num_gpu_blocks=1040,
        num_cpu_blocks=4000,
        watermark=0.0,
        scheduler=SchedulerConfig(
            block_size=16,
            max_num_batched_tokens=8192,
            enable_prefix_caching=enable_prefix_caching,
            preemption_mode=preemption_mode,
        ),
        step_time=StepTimeModel(),
        max_output_len=48,
    )
    watch = EvictionWatch()

    def after_step(scheduler) -> None:
        manager = scheduler.manager.manager
        manager.check_invariants()
        if enable_prefix_caching and len(scheduler.records) % 25 == 0:
            watch.look(manager)

    result = run_simulation(first_requests(), load_manager_class("reference"), config, on_step=after_step)
    return result, watch


def assert_all_blocks_free(result) -> None:
    manager = result.manager
    manager.check_invariants()
    assert manager.get_num_free_gpu_blocks() == result.config.num_gpu_blocks
    assert manager.get_num_free_cpu_blocks() == result.config.num_cpu_blocks
    assert manager.snapshot()["tables"] == {}


def assert_every_request_accounted(result) -> None:
    records = result.records
    finished = [r for record in records for r in record.finished]
    ignored = [r for record in records for r in record.ignored]
    aborted = [r for record in records for r in record.aborted]
    assert len(result.metrics.requests) == NUM_REQUESTS
    assert sorted(finished + ignored + aborted, key=int) == [str(i) for i in range(NUM_REQUESTS)]
    for request in result.metrics.requests:
        if request.request_id in result.metrics.finish_s:
            assert all(seq.get_output_len() == request.output_length for seq in request.seqs)


@pytest.mark.parametrize("enable_prefix_caching", [True, False], ids=["caching", "no-caching"])
def test_replay_first_200_requests(enable_prefix_caching):
    result, watch = replay(enable_prefix_caching)
    records = result.records
    assert any(record.later for record in records), "admission never had to wait (LATER)"
    assert any(record.preempted for record in records), "no running request was ever preempted"
    assert any(record.ignored for record in records), "no prompt was too large for the pool (NEVER)"
    if enable_prefix_caching:
        assert watch.num_evicted > 0, "no idle cached block was ever evicted"
        assert result.metrics.counts.cached_tokens_admitted > 0
    assert_every_request_accounted(result)
    assert_all_blocks_free(result)


def test_replay_first_200_requests_with_swapping():
    result, watch = replay(True, preemption_mode="swap")
    counts = result.metrics.counts
    assert counts.swap_outs > 0 and counts.swap_ins > 0
    assert counts.blocks_swapped_out > 0
    assert watch.num_evicted > 0
    assert_every_request_accounted(result)
    assert_all_blocks_free(result)
