"""A KV-aware router that sees the caches late (``--router-lag``;
``fleet.py``): the issue's known answers, on both engines."""

from __future__ import annotations

import dataclasses

import pytest

from blockspace.errors import InvalidConfigError
from blockspace.interfaces import load_manager_class
from blockspace.simulator.engines import replay
from blockspace.simulator.scheduler import SchedulerConfig
from blockspace.simulator.simulation import SimulationConfig, SimulationResult
from blockspace.workloads import TraceRequest, synthetic

FAST = load_manager_class("fast")
ENGINES = ("python", "compiled")


def config(engine: str, **fields) -> SimulationConfig:
    return SimulationConfig(3_000, 0, scheduler=SchedulerConfig(max_num_seqs=8), engine=engine, replicas=3,
                            router="kv_aware", max_output_len=16, **fields)  # fmt: skip


def requests() -> list[TraceRequest]:
    """Conversations in 6 prefix groups, 8 a second, 2 turns 1.5 s apart: the
    router gains by sending a group to the replica that holds its prefix."""
    return synthetic(60, input_len=1500, output_len=16, input_len_std=200, shared_prefix_ratio=0.7,
                     prefix_groups=6, turns=2, turn_gap=1.5, rate=8.0, seed=2)  # fmt: skip


def records(result: SimulationResult) -> list[dict]:
    return result.metrics.request_records()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_lag_of_zero_is_the_router_that_reads_the_caches(engine):
    """Lag 0 takes its view through the lagging path (a look at every replica
    before each arrival, kept for it), and routes as the live probe does."""
    trace = requests()
    live = replay(trace, FAST, config(engine))
    lagged = replay(trace, FAST, config(engine, router_lag_s=0.0))
    assert lagged.assignment == live.assignment and records(lagged) == records(live)
    assert len(set(live.assignment)) == 3


@pytest.mark.parametrize("engine", ENGINES)
def test_a_lag_longer_than_the_run_routes_as_if_every_cache_were_empty(engine):
    """An empty cache lacks every prompt block on every replica, so the cost
    is the load alone: kv_aware with weight 0."""
    trace = requests()
    blind = replay(trace, FAST, config(engine, router_lag_s=1e6))
    by_load = replay(trace, FAST, config(engine, router_weight=0.0))
    assert blind.assignment == by_load.assignment and records(blind) == records(by_load)
    seeing = replay(trace, FAST, config(engine))
    assert seeing.metrics.final_hit_rate > blind.metrics.final_hit_rate  # seeing the caches pays here


def test_a_lag_past_the_turn_gap_loses_the_hits_of_the_first_turns():
    """At a lag past the 1.5 s between turns, a conversation's second turn is
    routed before the router sees its first turn's blocks: fewer hits; and
    fewer still when it sees nothing. (Below the gap the rate is not
    monotone in the lag: 43.1 % at 0 and 0.5 s, 43.2 % at 1 s on these.)"""
    trace = requests()
    at_zero, past_gap, blind = (replay(trace, FAST, config("compiled", router_lag_s=lag)).metrics.final_hit_rate
                                for lag in (0.0, 2.0, 1e6))  # fmt: skip
    assert at_zero > past_gap > blind


def test_a_lag_is_kv_awares_and_not_negative():
    with pytest.raises(InvalidConfigError, match="router_lag_s"):
        dataclasses.replace(config("python"), router="least_loaded", router_lag_s=0.1)
    with pytest.raises(InvalidConfigError, match="router_lag_s"):
        config("python", router_lag_s=-1.0)
