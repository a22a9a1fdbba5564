"""The simulator's manager timer (simulator/timed.py) times every
call a scheduler makes, and its declarations for type checkers say the same."""

from __future__ import annotations

import pytest

from blockspace.interfaces import ROW_API, BlockSpaceManager, load_manager_class
from blockspace.simulator.timed import TIMED_METHODS, TimedManager


def test_the_declarations_are_the_timed_methods():
    declared = [name for name in TimedManager.__annotations__ if not name.startswith("_")]
    assert sorted(declared) == sorted(TIMED_METHODS)


def test_every_interface_call_but_the_cache_reset_is_timed():
    interface = set(BlockSpaceManager.__abstractmethods__) - {"reset_prefix_cache"}  # no scheduler step calls it
    assert interface <= set(TIMED_METHODS)
    assert set(TIMED_METHODS) - interface == {"remove_seq_from_computed_blocks_tracker"}


@pytest.mark.parametrize("name", ["reference", "fast"])
def test_a_timed_call_answers_as_the_manager_and_counts(name):
    manager = load_manager_class(name)(block_size=16, num_gpu_blocks=8, num_cpu_blocks=4, watermark=0.0)
    timed = TimedManager(manager)
    assert timed.get_num_free_gpu_blocks() == manager.get_num_free_gpu_blocks() == 8
    assert timed.num_calls == 1 and timed.seconds > 0
    assert timed.take_seconds() > 0 and timed.seconds == 0.0
    offered = [row for row in ROW_API if callable(getattr(manager, row, None))]
    assert [row for row in ROW_API if hasattr(timed, row)] == offered


def test_the_manager_time_of_a_run_is_split_by_method():
    from blockspace.simulator import SimulationConfig, load_trace, run_simulation
    from blockspace.simulator.summary import summarize

    result = run_simulation(load_trace(None, 20), load_manager_class("fast"), SimulationConfig(4000, 100))
    metrics = result.metrics
    by_method = metrics.manager_by_method
    assert set(by_method) <= set(TIMED_METHODS) | set(ROW_API) and "append_slots_rows" in by_method
    assert sum(calls for _, calls in by_method.values()) == metrics.manager_calls
    assert sum(seconds for seconds, _ in by_method.values()) == pytest.approx(sum(metrics.timeline.manager_s))
    listed = summarize(result).manager_time.by_method
    assert list(listed) == sorted(by_method, key=lambda name: -by_method[name][0])  # the busiest first
