"""Replicas that go down (``--fail``, ``--spare``; ``simulator/failures.py``,
``fleet.py``): the issue's known answers, on both engines, and the rules
the docs state (retries from the original arrival, a cold cache on return,
requests held while no replica is up)."""

from __future__ import annotations

import json

import pytest

from blockspace.errors import InvalidArgumentError, InvalidConfigError
from blockspace.interfaces import load_manager_class
from blockspace.simulator.cli import main as simulate
from blockspace.simulator.engines import replay
from blockspace.simulator.failures import Outage, Rolling, busiest_window, outages_of, parse_fail
from blockspace.simulator.scheduler import SchedulerConfig
from blockspace.simulator.simulation import SimulationConfig, SimulationResult
from blockspace.simulator.slo import parse_slo
from blockspace.simulator.step_model import StepTimeModel
from blockspace.simulator.summary import summarize
from blockspace.workloads import TraceRequest, synthetic

FAST = load_manager_class("fast")
ENGINES = ("python", "compiled")
STEPS_OF_10_MS = StepTimeModel(
    step_overhead_ms=10.0, prefill_token_us=0.0, decode_seq_us=0.0, kv_token_read_ns=0.0, swap_block_us=0.0
)  # fmt: skip


def config(engine: str, replicas: int, router: str = "round_robin", *failures: str, **fields) -> SimulationConfig:
    return SimulationConfig(2_000, 0, scheduler=SchedulerConfig(max_num_seqs=8), engine=engine, replicas=replicas,
                            router=router, max_output_len=24, failures=tuple(map(parse_fail, failures)),
                            **fields)  # fmt: skip


def requests(count: int = 40, rate: float = 20.0) -> list[TraceRequest]:
    """Prompts of about 300 tokens in groups that share a prefix, ``rate`` a second."""
    return synthetic(count, input_len=300, output_len=24, input_len_std=60, rate=rate, seed=3,
                     shared_prefix_ratio=0.5, prefix_groups=4)  # fmt: skip


def records(result: SimulationResult) -> list[dict]:
    """Each request's record less its id (``--requests-out``'s), in trace order."""
    return [{k: v for k, v in r.items() if k != "replica"} for r in result.metrics.request_records()]


# -- the values of --fail -------------------------------------------------------------------
def test_the_two_forms_of_fail_and_what_they_refuse():
    assert parse_fail("1@60+30") == Outage(1, 60.0, 90.0)
    assert parse_fail(" 2 @ 5 ") == Outage(2, 5.0, None)
    assert parse_fail("rolling@0/120/60") == Rolling(0.0, 120.0, 60.0)
    assert outages_of((Rolling(10.0, 100.0, 30.0),), 3) == [Outage(0, 10, 40), Outage(1, 110, 140), Outage(2, 210, 240)]
    for bad in ("1@", "x@3", "1@3+0", "rolling@1/2", "-1@3", "1@3+-2"):
        with pytest.raises(InvalidArgumentError, match="--fail"):
            parse_fail(bad)
    with pytest.raises(InvalidArgumentError, match="2 replica"):
        outages_of((Outage(2, 1.0),), 2)
    with pytest.raises(InvalidArgumentError, match="while down"):
        outages_of((Outage(0, 1.0, 5.0), Outage(0, 4.0, 6.0)), 2)
    with pytest.raises(InvalidArgumentError, match="for good"):
        outages_of((Outage(0, 1.0), Outage(1, 2.0)), 2)
    assert outages_of((Outage(0, 1.0, 5.0), Outage(0, 5.0, 6.0)), 1)  # back, then down again at once
    with pytest.raises(InvalidConfigError, match="n above 1"):
        config("python", 2, "round_robin", "0@1+1", num_samples=2)
    with pytest.raises(InvalidConfigError, match="closed loop"):
        config("python", 2, "round_robin", "0@1+1", max_concurrency=3)


def test_the_busiest_window_is_where_the_most_tokens_arrive():
    trace = [TraceRequest(i, at, size, 10, (i,)) for i, (at, size) in
             enumerate([(0, 100), (1, 100), (5, 400), (6, 10), (9, 500), (10, 500)])]  # fmt: skip
    assert busiest_window(trace, 2.0) == (9.0, 11.0)  # 1,020 tokens arrive from 9 s on; 430 from 5 s, 220 from 0 s
    assert busiest_window(trace, 1.0) == (9.0, 10.0)  # 510 from 9 s, 510 from 10 s: the earliest of the most
    assert busiest_window(trace, 100.0) == (0.0, 100.0)


# -- the known answers ----------------------------------------------------------------
@pytest.mark.parametrize("engine", ENGINES)
def test_a_failure_at_t_with_no_traffic_after_t_changes_nothing_before_t(engine):
    trace = requests()
    t = round(trace[-1].arrival_s, 2) + 0.01  # every request has arrived; some run on
    plain = replay(trace, FAST, config(engine, 3, "kv_aware", step_time=STEPS_OF_10_MS))
    failed = replay(trace, FAST, config(engine, 3, "kv_aware", f"1@{t}", step_time=STEPS_OF_10_MS))
    assert failed.failures is not None and failed.failures.affected  # it had work to lose
    done_before = [r for r in records(plain) if r["finish_s"] is not None and r["finish_s"] < t]
    assert done_before and done_before == [r for r in records(failed) if r["finish_s"] is not None
                                           and r["finish_s"] < t]  # fmt: skip
    for column in ("time_s", "step_s", "kv_used_blocks", "num_running", "num_waiting", "hit_rate"):
        before = [v for v, at in zip(getattr(plain.metrics.timeline, column), plain.metrics.timeline.time_s) if at < t]
        after = [v for v, at in zip(getattr(failed.metrics.timeline, column), failed.metrics.timeline.time_s)
                 if at < t]  # fmt: skip
        assert before == after, column
    assert records(plain) != records(failed)  # and after t it did change


@pytest.mark.parametrize("router", ["round_robin", "least_loaded", "kv_aware"])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_replica_down_for_the_whole_run_equals_a_fleet_of_one_fewer(engine, router):
    trace = requests()
    smaller = replay(trace, FAST, config(engine, 2, router))
    failed = replay(trace, FAST, config(engine, 3, router, "0@0"))
    assert records(failed) == records(smaller)
    assert failed.metrics.counts == smaller.metrics.counts
    assert failed.metrics.final_hit_rate == smaller.metrics.final_hit_rate
    assert [k - 1 for k in failed.assignment] == smaller.assignment  # replicas 1 and 2 are the smaller fleet's 0 and 1
    assert failed.failures is not None and not failed.failures.affected


@pytest.mark.parametrize("engine", ENGINES)
def test_a_retried_request_counts_from_its_arrival_and_its_first_token_ever(engine):
    """Round robin over 2 replicas; replica 0 fails for good at 1.0 s: its
    unfinished requests finish on replica 1, their records keep their
    arrival, and one that had its first token on replica 0 keeps that one."""
    trace = requests()
    plain = replay(trace, FAST, config(engine, 2, "round_robin", step_time=STEPS_OF_10_MS))
    failed = replay(trace, FAST, config(engine, 2, "round_robin", "0@1", step_time=STEPS_OF_10_MS))
    lost = failed.failures.affected
    assert lost and failed.failures.retries == len(lost)
    assert all(failed.assignment[i] == 1 for i in lost)  # finished on the replica that stayed
    before = {r["trace_index"]: r for r in plain.metrics.request_records()}
    after = {r["trace_index"]: r for r in failed.metrics.request_records()}
    arrivals = {entry.index: entry.arrival_s for entry in trace}
    started = [i for i in lost if before[i]["first_token_s"] < 1.0]  # had a token on replica 0 before it failed
    assert started
    for i in lost:
        assert after[i]["status"] == "finished" and after[i]["arrival_s"] == arrivals[i]
        assert after[i]["finish_s"] > 1.0 and after[i]["admitted_s"] >= 1.0  # its last admission, after the retry
        assert after[i]["e2e_s"] == after[i]["finish_s"] - arrivals[i]
    for i in started:
        assert after[i]["first_token_s"] == before[i]["first_token_s"]  # the first token ever received
    summary = summarize(failed, parse_slo("e2e=100s"))
    assert summary.requests.arrived == len(trace) and summary.requests.finished == len(trace)
    assert summary.failures is not None and summary.failures.outages == ["0@1"]
    assert summary.failures.arrived_during + summary.failures.slo_outside.of == len(trace)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_replica_comes_back_with_a_cold_cache(engine):
    """The same prompt twice on one replica: the second finds it cached,
    unless the replica failed and came back between them."""
    prompt = tuple(range(8))
    trace = [TraceRequest(0, 0.0, 4000, 4, prompt), TraceRequest(1, 10.0, 4000, 4, prompt)]
    warm = replay(trace, FAST, config(engine, 1))
    cold = replay(trace, FAST, config(engine, 1, "round_robin", "0@5+1"))
    assert warm.metrics.cached_tokens.get("1", 0) > 0
    assert cold.metrics.cached_tokens.get("1", 0) == 0
    assert not cold.failures.affected  # the first was done when it failed


@pytest.mark.parametrize("engine", ENGINES)
def test_requests_wait_at_the_router_while_every_replica_is_down(engine):
    trace = [TraceRequest(i, float(i), 600, 4, (100 + i, 200 + i)) for i in range(6)]
    result = replay(trace, FAST, config(engine, 1, "round_robin", "0@1.5+2"))  # down from 1.5 s to 3.5 s
    by_index = {r["trace_index"]: r for r in result.metrics.request_records()}
    for i in (2, 3):  # arrived while it was down
        assert by_index[i]["arrival_s"] == float(i) and by_index[i]["admitted_s"] >= 3.5
    assert by_index[4]["admitted_s"] < 4.5 and by_index[1]["admitted_s"] < 1.5
    assert summarize(result).failures.arrived_during == 2


@pytest.mark.parametrize("engine", ENGINES)
def test_a_rolling_restart_takes_each_replica_down_in_turn(engine):
    trace = requests(60, rate=10.0)  # 6 s
    result = replay(trace, FAST, config(engine, 3, "least_loaded", "rolling@0.5/2/1"))
    assert [str(o) for o in result.failures.outages] == ["0@0.5+1", "1@2.5+1", "2@4.5+1"]
    assert summarize(result).requests.finished == len(trace)
    for outage in result.failures.outages:  # nothing sent to a replica while it is down
        sent = [entry for entry in trace if result.assignment[entry.index] == outage.replica]
        assert not [e for e in sent if outage.start_s <= e.arrival_s < outage.end_s and e.index not in
                    result.failures.original_arrival_s]  # fmt: skip


# -- --find min-replicas --spare ----------------------------------------------------------------
SPARE_SLO = "ttft=30ms"


def answer(tmp_path, *extra: str) -> int:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 10 * i, "input_length": 300 + 7 * i, "output_length": 8,
                                         "hash_ids": [i]}) + "\n" for i in range(30)))  # fmt: skip
    out = tmp_path / ("out" + "-".join(extra))
    argv = ["--trace", str(trace), "--manager", "reference", "--find", "min-replicas", "--slo",
            SPARE_SLO, "--workers", "1", "--no-plot", "--quiet", "--out", str(out)]  # fmt: skip
    assert simulate([*argv, *extra]) == 0
    (search,) = json.loads((out / "capacity.json").read_text())["configurations"]
    return search["min_replicas"]


def test_one_spare_down_for_the_whole_trace_needs_exactly_one_replica_more(tmp_path):
    """K replicas down over a window longer than the trace: a fleet of n is
    one of n - K (the known answer above), so the search answers K more."""
    fewest = answer(tmp_path)
    assert fewest > 1  # the traffic needs a fleet
    assert answer(tmp_path, "--spare", "1", "--spare-window", "1e6") == fewest + 1
    assert fewest <= answer(tmp_path, "--spare", "1", "--spare-window", "1") <= fewest + 1
