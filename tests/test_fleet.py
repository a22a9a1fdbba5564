"""A fleet of replicas behind a router (``fleet.py``, ``routers.py``): known
answers, and the two engines alike."""

from __future__ import annotations

import dataclasses
import json

import pytest

from blockspace.errors import InvalidArgumentError, InvalidConfigError
from blockspace.interfaces import load_manager_class
from blockspace.simulator.cli import main as simulate
from blockspace.simulator.engines import replay, resolve
from blockspace.simulator.fleet_size import next_counts
from blockspace.simulator.report import summarize
from blockspace.simulator.scheduler import SchedulerConfig
from blockspace.simulator.simulation import SimulationConfig, SimulationResult
from blockspace.simulator.step_model import StepTimeModel
from blockspace.workloads import TraceRequest, gamma_arrivals, load_trace, prefix_groups

FAST = load_manager_class("fast")
EXACT_STEPS = StepTimeModel(
    step_overhead_ms=10.0, prefill_token_us=0.0, decode_seq_us=0.0, kv_token_read_ns=0.0, swap_block_us=0.0
)  # fmt: skip: every step exactly 10 ms
TIMELINE = ("time_s", "step_s", "kv_used_blocks", "num_running", "num_waiting", "num_swapped", "hit_rate",
            "num_batched_tokens")  # fmt: skip


def config(
    replicas: int = 1, router: str = "round_robin", engine: str = "python", num_gpu_blocks: int = 1_500
) -> SimulationConfig:
    """A pool small enough to queue, preempt and ignore on the bundled sample's first requests."""
    return SimulationConfig(num_gpu_blocks, 200, scheduler=SchedulerConfig(max_num_seqs=16), engine=engine,
                            replicas=replicas, router=router)  # fmt: skip


def interleaved(trace: list[TraceRequest], copies: int) -> list[TraceRequest]:
    """``copies`` copies of ``trace``, request by request: copy ``c`` of
    request ``i`` is request ``copies * i + c``, at the same time."""
    return [dataclasses.replace(entry, index=copies * entry.index + c) for entry in trace for c in range(copies)]


def per_request(result: SimulationResult) -> list[tuple]:
    """Each request's times and counts, in trace order (its id and tokens left out)."""
    return [(r["arrival_s"], r["admitted_s"], r["first_token_s"], r["finish_s"], r["cached_tokens"],
             r["preemptions"], r["output_tokens"]) for r in result.metrics.request_records()]  # fmt: skip


def test_two_replicas_under_round_robin_each_replay_the_single_run_exactly():
    """Two identical replicas, round robin, fed two interleaved copies of a
    trace: each replica makes the single replica's run, step for step and
    request for request. The fleet runs on one clock (the Python engine),
    so this holds its timing to the single replay's: a request added while
    a replica runs joins where the single replay would have taken it."""
    trace = load_trace(None, 60)
    alone = replay(trace, FAST, config())
    assert alone.metrics.counts.recompute_preemptions > 0  # the pool is tight enough to matter
    fleet = replay(interleaved(trace, 2), FAST, config(replicas=2))
    assert fleet.assignment == [0, 1] * len(trace)
    for replica in fleet.replicas:
        for column in TIMELINE:
            assert getattr(replica.metrics.timeline, column) == getattr(alone.metrics.timeline, column), column
        assert per_request(replica) == per_request(alone)
        assert replica.metrics.counts == alone.metrics.counts
    records = fleet.metrics.request_records()
    assert [r["replica"] for r in records] == [0, 1] * len(trace)
    summary = summarize(fleet)
    assert summary["requests"]["arrived"] == 2 * len(trace)
    assert summary["fleet"]["requests_per_replica"] == [len(trace)] * 2


@pytest.mark.parametrize("router", ["least_loaded", "kv_aware"])
def test_a_router_that_reads_the_replicas_spreads_the_load(router):
    """Under a burst, a router reading load or cache sends requests to every replica."""
    fleet = replay(load_trace(None, 80), FAST, config(replicas=3, router=router))
    assert sorted(set(fleet.assignment)) == [0, 1, 2]
    assert sum(summarize(fleet)["fleet"]["requests_per_replica"]) == 80


def test_round_robin_gives_the_same_figures_on_both_engines():
    """Round robin reads no replica, so the compiled engine replays each
    replica apart; the Python engine replays them on one clock."""
    trace = load_trace(None, 60)
    python = summarize(replay(trace, FAST, config(replicas=3)))
    compiled = summarize(replay(trace, FAST, config(replicas=3, engine="compiled")))
    dropped = ("engine", "manager_time", "wall_s", "manager_startup_s", "fleet")
    assert {k: v for k, v in python.items() if k not in dropped} == {
        k: v for k, v in compiled.items() if k not in dropped
    }
    for each_python, each_compiled in zip(python["fleet"]["each"], compiled["fleet"]["each"], strict=True):
        assert each_python["ttft_s"] == each_compiled["ttft_s"] and each_python["kv_cache"] == each_compiled["kv_cache"]


def hit_share(trace: list[TraceRequest], router: str) -> float:
    fleet = replay(trace, FAST, config(replicas=4, router=router, num_gpu_blocks=2_000))
    return summarize(fleet)["prefix_cache"]["prefill_tokens_from_cache"]


def test_kv_aware_finds_more_of_the_prefix_cache_and_nothing_when_nothing_is_shared():
    """Eight groups of prompts sharing three quarters of their chunks, four
    replicas: round robin spreads each group over all four, so each replica
    computes each prefix; kv_aware sends a group where its prefix is. With
    no shared prefix no router finds anything in the cache."""
    shared = gamma_arrivals(prefix_groups(240, 2_048, 8, 0.75, 8, seed=1), 20.0, seed=1)
    kv, rr = hit_share(shared, "kv_aware"), hit_share(shared, "round_robin")
    assert kv > rr > 0
    alone = gamma_arrivals(prefix_groups(240, 2_048, 8, 0.0, 8, seed=1), 20.0, seed=1)
    assert hit_share(alone, "kv_aware") == hit_share(alone, "round_robin") == 0.0


def test_a_fleet_is_checked_before_it_runs():
    with pytest.raises(InvalidConfigError, match="replicas"):
        config(replicas=0)
    with pytest.raises(InvalidConfigError, match="router"):
        config(router="random")
    with pytest.raises(InvalidArgumentError, match="compiled engine replays a fleet only"):
        resolve("compiled", FAST, "auto", reads_replicas=True)
    assert resolve("auto", FAST, "auto", reads_replicas=True) == "python"


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--router", "kv_aware"], "--router goes with --replicas"),
        (["--replicas", "2", "--router-weight", "2"], "--router-weight goes with --router kv_aware"),
        (["--replicas", "2", "--router", "least_loaded", "--engine", "compiled"], "compiled engine replays a fleet"),
        (["--replicas", "0"], "--replicas must be >= 1"),
    ],
)
def test_the_command_refuses_a_fleet_option_where_it_changes_nothing(tmp_path, capsys, extra, said):
    assert simulate(["--max-requests", "4", "--no-plot", "--quiet", "--out", str(tmp_path / "out"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and said in err and not (tmp_path / "out").exists()


def test_the_command_prints_each_replica(tmp_path, capsys):
    argv = ["--max-requests", "30", "--replicas", "2", "--router", "kv_aware", "--no-plot", "--quiet"]
    assert simulate([*argv, "--out", str(tmp_path / "out"), "--requests-out", str(tmp_path / "r.jsonl")]) == 0
    printed = capsys.readouterr().out.splitlines()
    at = printed.index("fleet: 2 replicas, router kv_aware (weight 1); the figures above are the fleet's (KV usage: "
                       "per replica, the fullest one's peak)")  # fmt: skip
    assert printed[at + 1].split()[:2] == ["replica", "requests"]
    assert [line.split()[0] for line in printed[at + 2 : at + 4]] == ["0", "1"]
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert len(records) == 30 and {record["replica"] for record in records} == {0, 1}


# -- --find min-replicas ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("tried", "width", "expected"),
    [
        ({1: False, 2: False}, 2, [4, 8]),  # nothing passes: double
        ({4: False, 8: True}, 2, [5, 7]),  # between the highest failing count and the lowest passing one
        ({5: False, 7: False, 8: True}, 2, []),  # adjacent: found
        ({1: True}, 3, []),  # one replica is enough
        ({512: False, 1024: False}, 2, []),  # past the limit: none found
    ],
)
def test_the_search_brackets_then_narrows(tried, width, expected):
    assert next_counts(tried, width) == expected


@pytest.mark.parametrize("router", ["round_robin", "least_loaded"])
def test_the_fewest_replicas_for_a_burst_is_what_queueing_says(tmp_path, capsys, router):
    """20 requests at once, one at a time per replica, each 40 ms (4 steps of
    exactly 10 ms): with k replicas the j-th request in a replica's queue
    ends at (j + 1) x 40 ms, so e2e <= 41 ms holds for k of them per
    replica, and 90 % of 20 needs k >= 18."""
    trace = tmp_path / "burst.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 0, "input_length": 16, "output_length": 4, "hash_ids": [i]})
                             + "\n" for i in range(20)))  # fmt: skip
    argv = ["--trace", str(trace), "--max-num-seqs", "1", "--max-num-batched-tokens", "16", "--step-overhead-ms", "10",
            "--prefill-token-us", "0", "--decode-seq-us", "0", "--kv-token-read-ns", "0", "--swap-block-us", "0",
            "--find", "min-replicas", "--slo", "e2e=41ms", "--router", router, "--workers", "2", "--quiet",
            "--out", str(tmp_path / "out")]  # fmt: skip
    assert simulate(argv) == 0
    (found,) = json.loads((tmp_path / "out" / "capacity.json").read_text())["configurations"]
    assert found["min_replicas"] == 18 and found["router"] == router
    by_count = {point["replicas"]: point["attainment"] for point in found["curve"]}
    assert by_count[17] < 0.9 <= by_count[18]
    assert all(attainment == pytest.approx(min(k, 20) / 20) for k, attainment in by_count.items())
    assert f"min replicas: 18 under {router}" in capsys.readouterr().out
    assert (tmp_path / "out" / "capacity.png").stat().st_size > 0


def test_the_replica_count_is_not_given_to_a_search_of_it(tmp_path, capsys):
    argv = ["--find", "min-replicas", "--slo", "ttft=2s", "--replicas", "2", "--out", str(tmp_path / "out")]
    assert simulate(argv) == 2
    assert "--replicas cannot go with --find min-replicas" in capsys.readouterr().err


# -- --max-concurrency: a closed loop ------------------------------------------------------------
def test_one_request_in_flight_is_sent_when_the_last_is_done(tmp_path):
    """20 requests at once, at most one in flight, each served in exactly
    40 ms: the k-th is sent at k x 40 ms, when the one before it ends, and
    none waits (e2e exactly 40 ms)."""
    trace = [TraceRequest(i, 0.0, 16, 4, (i,)) for i in range(20)]
    exact = SimulationConfig(1_000, 0, scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16),
                             step_time=EXACT_STEPS, max_concurrency=1)  # fmt: skip
    records = replay(trace, FAST, exact).metrics.request_records()
    assert [r["arrival_s"] for r in records] == pytest.approx([0.04 * k for k in range(20)])
    assert [r["e2e_s"] for r in records] == pytest.approx([0.04] * 20)


@pytest.mark.parametrize("replicas", [1, 3])
def test_never_more_requests_in_flight_than_the_limit(replicas):
    limit = 8
    roomy = config(replicas, "least_loaded", num_gpu_blocks=20_000)  # every request finishes
    result = replay(load_trace(None, 100), FAST, dataclasses.replace(roomy, max_concurrency=limit))
    records = result.metrics.request_records()
    assert all(r["status"] == "finished" for r in records)
    events = sorted([(r["arrival_s"], 1) for r in records] + [(r["finish_s"], -1) for r in records])
    in_flight = [0]
    for _, change in events:  # a request done at the moment another is sent is out first (-1 sorts first)
        in_flight.append(in_flight[-1] + change)
    assert max(in_flight) == limit


def test_a_closed_loop_runs_on_the_python_engine():
    assert resolve("auto", FAST, "auto", reads_replicas=SimulationConfig(10, 0, max_concurrency=2).reads_replicas) \
        == "python"  # fmt: skip
    with pytest.raises(InvalidConfigError, match="python engine"):
        SimulationConfig(10, 0, max_concurrency=2, engine="compiled")
