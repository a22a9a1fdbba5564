"""A fleet of replicas behind a router (``fleet.py``, ``routers.py``): known
answers, and the two engines alike."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import numba
import pytest

from blockspace.errors import InvalidConfigError
from blockspace.interfaces import load_manager_class
from blockspace.simulator.cli import main as simulate
from blockspace.simulator.engines import replay
from blockspace.simulator.failures import Outage, Rolling
from blockspace.simulator.fleet_size import next_counts
from blockspace.simulator.scheduler import SchedulerConfig
from blockspace.simulator.simulation import SimulationConfig, SimulationResult, SimulationStalledError
from blockspace.simulator.step_model import StepTimeModel
from blockspace.simulator.summary import summarize
from blockspace.workloads import TraceRequest, gamma_arrivals, load_trace, synthetic
from helpers import jit_or

FAST = load_manager_class("fast")
EXACT_STEPS = StepTimeModel(
    step_overhead_ms=10.0, prefill_token_us=0.0, decode_seq_us=0.0, kv_token_read_ns=0.0, swap_block_us=0.0
)  # fmt: skip: every step exactly 10 ms
TIMELINE = ("time_s", "step_s", "kv_used_blocks", "num_running", "num_waiting", "num_swapped", "hit_rate",
            "num_batched_tokens", "prefill_tokens_admitted")  # fmt: skip


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
    assert summary.requests.arrived == 2 * len(trace)
    assert summary.fleet is not None and summary.fleet.requests_per_replica == [len(trace)] * 2


@pytest.mark.parametrize("router", ["least_loaded", "kv_aware"])
def test_a_router_that_reads_the_replicas_spreads_the_load(router):
    """Under a burst, a router reading load or cache sends requests to every replica."""
    fleet = replay(load_trace(None, 80), FAST, config(replicas=3, router=router))
    assert sorted(set(fleet.assignment)) == [0, 1, 2]
    assert sum(summarize(fleet).fleet.requests_per_replica) == 80


FLEETS = {  # name: (requests of the bundled sample, or 0: small ones; SimulationConfig's fields): small, since
    # CI runs them uncompiled too
    "round robin": (30, {"replicas": 3}),
    "least loaded": (40, {"replicas": 3, "router": "least_loaded"}),
    "kv aware": (40, {"replicas": 3, "router": "kv_aware"}),
    "kv aware, by the cache alone": (40, {"replicas": 2, "router": "kv_aware", "router_weight": 1e9}),
    "a closed loop, one replica": (30, {"max_concurrency": 4}),
    "a closed loop of kv aware replicas": (40, {"replicas": 3, "router": "kv_aware", "max_concurrency": 8}),
    "swapping replicas, n = 2": (0, {"replicas": 2, "router": "least_loaded", "num_samples": 2, "num_gpu_blocks": 40,
                                     "scheduler": SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=512,
                                                                  preemption_mode="swap")}),
    "a replica down and back, kv aware": (40, {"replicas": 3, "router": "kv_aware",
                                               "failures": (Outage(2, 3.3, 6.5),)}),
    "kv aware, seeing the caches 0.3 s late": (40, {"replicas": 3, "router": "kv_aware", "router_lag_s": 0.3}),
    "prefill and decode apart, kv aware": (40, {"replicas": 3, "prefill_replicas": 1, "router": "kv_aware",
                                                "kv_block_bytes": 2**21, "kv_link_gbps": 100.0}),
    "a rolling restart, round robin": (40, {"replicas": 3, "failures": (Rolling(0.02, 3.0, 2.0),)}),
    "no prefix caching": (30, {"replicas": 2, "router": "kv_aware",
                               "scheduler": SchedulerConfig(max_num_seqs=16, enable_prefix_caching=False)}),
}  # fmt: skip


def small_requests() -> list[TraceRequest]:
    """40 prompts of about 150 tokens at 20 a second: tens of blocks make a replica swap."""
    return synthetic(40, input_len=150, output_len=40, input_len_std=40, rate=20.0, seed=1)


def both_engines(num_requests: int, fields: dict) -> tuple[SimulationResult, SimulationResult]:
    base = dataclasses.replace(config(), max_output_len=32, **fields)  # short outputs: fewer steps, uncompiled
    recorded = dataclasses.replace(base, scheduler=dataclasses.replace(base.scheduler, record_tables=True))
    trace = load_trace(None, num_requests) if num_requests else small_requests()
    return replay(trace, FAST, recorded), replay(trace, FAST, dataclasses.replace(recorded, engine="compiled"))


@pytest.mark.parametrize("name", FLEETS)
def test_a_fleet_gives_the_same_decisions_and_figures_on_both_engines(name):
    """The compiled engine runs a fleet on one clock too (``CompiledReplica``):
    the same routing, every replica's decisions step for step, and the same
    figures, request by request."""
    python, compiled = both_engines(*FLEETS[name])
    assert python.assignment == compiled.assignment
    assert python.records == compiled.records
    assert per_request(python) == per_request(compiled)
    assert python.metrics.counts == compiled.metrics.counts
    assert python.metrics.final_hit_rate == compiled.metrics.final_hit_rate
    for column in TIMELINE:
        assert getattr(python.metrics.timeline, column) == getattr(compiled.metrics.timeline, column), column
    dropped = ("engine", "manager_time", "wall_s", "manager_startup_s")
    for each_python, each_compiled in zip(summarize(python).to_json()["fleet"]["each"] if python.replicas else [],
                                          summarize(compiled).to_json()["fleet"]["each"] if compiled.replicas else [],
                                          strict=True):  # fmt: skip
        assert {k: v for k, v in each_python.items() if k not in dropped} == {
            k: v for k, v in each_compiled.items() if k not in dropped
        }
    if "kv aware" in name:
        assert len(set(python.assignment)) > 1 and python.metrics.final_hit_rate > 0  # the router had a cache to read
    if "down" in name or "rolling" in name:  # some requests were lost and sent again
        assert python.failures.affected and python.failures.affected == compiled.failures.affected
    if "swapping" in name:
        assert python.metrics.counts.swap_outs > 0
    if "closed loop" in name:  # some requests were held back
        arrivals = [entry.arrival_s for entry in load_trace(None, FLEETS[name][0])]  # closed loops: the sample
        assert [r["arrival_s"] for r in python.metrics.request_records()] != arrivals


def test_a_replica_that_stalls_waits_for_its_next_request_on_both_engines():
    """Swap mode with a pool too tight for its swapped groups to come back:
    on one clock (a closed loop that holds nothing back) the replica stalls,
    waits for the next arrival, a short request that it runs, then stalls
    again; at the end both engines give up with the same words."""
    stuck = SimulationConfig(400, 2_048, scheduler=SchedulerConfig(preemption_mode="swap"), num_samples=3,
                             max_concurrency=1_000)  # fmt: skip
    trace = load_trace(None, 15)
    late = TraceRequest(15, trace[-1].arrival_s + 1_000.0, 32, 4, (1_000_000,))
    said = []
    for engine in ("python", "compiled"):
        with pytest.raises(SimulationStalledError) as stalled:
            replay([*trace, late], FAST, dataclasses.replace(stuck, engine=engine))
        said.append(str(stalled.value))
    with pytest.raises(SimulationStalledError) as alone:
        replay(trace, FAST, dataclasses.replace(stuck, max_concurrency=None))
    step_of = [int(words.split(":")[0].removeprefix("step ")) for words in (*said, str(alone.value))]
    assert said[0] == said[1] and step_of[0] > step_of[2]  # the late request's steps came before the last stall


def hit_share(trace: list[TraceRequest], router: str) -> float:
    fleet = replay(trace, FAST, config(replicas=4, router=router, num_gpu_blocks=2_000))
    return summarize(fleet).prefix_cache.prefill_tokens_from_cache


def groups(shared_prefix_ratio: float) -> list[TraceRequest]:
    """240 prompts of 2,048 tokens in 8 prefix groups (workloads.synthetic)."""
    return synthetic(240, input_len=2_048, output_len=8, shared_prefix_ratio=shared_prefix_ratio, prefix_groups=8,
                     seed=1)  # fmt: skip


def test_kv_aware_finds_more_of_the_prefix_cache_and_nothing_when_nothing_is_shared():
    """Eight groups of prompts sharing three quarters of their chunks, four
    replicas: round robin spreads each group over all four, so each replica
    computes each prefix; kv_aware sends a group where its prefix is. With
    no shared prefix no router finds anything in the cache."""
    shared = gamma_arrivals(groups(0.75), 20.0, seed=1)
    kv, rr = hit_share(shared, "kv_aware"), hit_share(shared, "round_robin")
    assert kv > rr > 0
    alone = gamma_arrivals(groups(0.0), 20.0, seed=1)
    assert hit_share(alone, "kv_aware") == hit_share(alone, "round_robin") == 0.0


def test_a_fleet_is_checked_before_it_runs():
    with pytest.raises(InvalidConfigError, match="replicas"):
        config(replicas=0)
    with pytest.raises(InvalidConfigError, match="router"):
        config(router="random")


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--router", "kv_aware"], "--router goes with --replicas"),
        (["--replicas", "2", "--router-weight", "2"], "--router-weight goes with --router kv_aware"),
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
@pytest.mark.parametrize("engine", ["python", "compiled"])
def test_one_request_in_flight_is_sent_when_the_last_is_done(engine):
    """20 requests at once, at most one in flight, each served in exactly
    40 ms: the k-th is sent at k x 40 ms, when the one before it ends, and
    none waits (e2e exactly 40 ms)."""
    trace = [TraceRequest(i, 0.0, 16, 4, (i,)) for i in range(20)]
    exact = SimulationConfig(1_000, 0, scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16),
                             step_time=EXACT_STEPS, max_concurrency=1, engine=engine)  # fmt: skip
    records = replay(trace, FAST, exact).metrics.request_records()
    assert [r["arrival_s"] for r in records] == pytest.approx([0.04 * k for k in range(20)])
    assert [r["e2e_s"] for r in records] == pytest.approx([0.04] * 20)


@pytest.mark.parametrize("engine", ["python", "compiled"])
@pytest.mark.parametrize("replicas", [1, 3])
def test_never_more_requests_in_flight_than_the_limit(replicas, engine):
    limit = 8
    roomy = config(replicas, "least_loaded", engine, num_gpu_blocks=20_000)  # every request finishes
    result = replay(load_trace(None, 100), FAST, dataclasses.replace(roomy, max_concurrency=limit))
    records = result.metrics.request_records()
    assert all(r["status"] == "finished" for r in records)
    events = sorted([(r["arrival_s"], 1) for r in records] + [(r["finish_s"], -1) for r in records])
    in_flight = [0]
    for _, change in events:  # a request done at the moment another is sent is out first (-1 sorts first)
        in_flight.append(in_flight[-1] + change)
    assert max(in_flight) == limit


# -- the benchmark of the target (a fleet within 1.3x of one replica) ---------------------------
def test_the_fleet_benchmark_times_each_router_against_one_replica_and_checks_the_target():
    """``scripts/fleet_vs_one.py`` on a small trace: a row of four figures
    (median and spread) for the router, exit 0 under a target it meets and
    1, naming the router, under one it cannot."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "fleet_vs_one.py"

    def bench(target: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), "--requests", "20", "--replicas", "2", "--runs", "1",
                               "--target", target, "kv_aware"], capture_output=True, text=True)  # fmt: skip

    met, missed = bench("100"), bench("0.01")
    assert met.returncode == 0, met.stderr
    row = next(line for line in met.stdout.splitlines() if line.startswith("kv_aware"))
    assert len(re.findall(r"\d+\.\d\d \(\d+\.\d\d to \d+\.\d\d\)", row)) == 4
    assert met.stdout.rstrip().endswith("every router within 100.0x by the median wall ratio")
    assert missed.returncode == 1 and missed.stdout.rstrip().endswith("over 0.01x by the median wall ratio: kv_aware")


def test_the_fleet_benchmark_times_a_fleet_against_a_smaller_one():
    """``scripts/fleet_vs_one.py --against K``: B is the fleet of K replicas
    under the same router (issue #51's target: 256 replicas against 4
    under ``round_robin``; here 4 against 2 on a small trace): the header
    names both sizes, the row has its four figures; a K not below
    ``--replicas`` is refused, exit 2. The ratio itself is a benchmark's
    figure (docs/measurements/2026-12-06-replica-memory.md), not asserted."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "fleet_vs_one.py"

    def bench(*sizes: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), "--requests", "20", *sizes, "--runs", "1",
                               "--target", "100", "round_robin"], capture_output=True, text=True)  # fmt: skip

    timed, refused = bench("--replicas", "4", "--against", "2"), bench("--replicas", "2", "--against", "2")
    assert timed.returncode == 0, timed.stderr
    header, columns = timed.stdout.splitlines()[:2]
    assert header == "4 replicas against 2, 20 requests, 1 pairs in turns"
    assert columns.split()[1:7] == ["4", "wall", "s", "2", "wall", "s"]
    row = next(line for line in timed.stdout.splitlines() if line.startswith("round_robin"))
    assert len(re.findall(r"\d+\.\d\d \(\d+\.\d\d to \d+\.\d\d\)", row)) == 4
    assert refused.returncode == 2 and "--against 2: from 1 to fewer than --replicas (2)" in refused.stderr


def test_a_fleet_replayed_apart_is_the_same_one_replica_at_a_time_and_one_a_core(monkeypatch):
    """Issue #54: under a router that reads no replica, the compiled engine replays the replicas on
    threads, one a core (the loop lets go of the GIL); in a pool's worker, one at a time. The
    decisions and figures are the same either way, request by request."""
    from blockspace.simulator import executor

    base = dataclasses.replace(config(4, engine="compiled"), scheduler=SchedulerConfig(max_num_seqs=16,
                               record_tables=True))  # fmt: skip
    trace = load_trace(None, jit_or(120, 8))
    monkeypatch.setattr(executor, "IN_POOL", True)
    assert executor.threads_for(4) == 1
    alone = replay(trace, FAST, base)
    monkeypatch.setattr(executor, "IN_POOL", False)
    monkeypatch.setattr(executor.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert executor.threads_for(4) == 2 and executor.threads_for(1) == 1
    threaded = replay(trace, FAST, base)
    assert alone.assignment == threaded.assignment and alone.records == threaded.records
    assert per_request(alone) == per_request(threaded) and alone.metrics.counts == threaded.metrics.counts


@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="without the JIT the loop is Python: its 2,000 steps take seconds")
def test_ctrl_c_ends_a_fleet_replayed_on_threads_at_once(monkeypatch):
    """Ctrl-C reaches the main thread, which waits on the replicas' threads: they end at their loop's
    next return (every 2,000 steps at most), and the replay raises KeyboardInterrupt, in well under
    the 2 s every command has (tests/test_interrupts.py)."""
    import os
    import signal
    import threading
    import time

    from blockspace.simulator.compiled import engine

    started = threading.Event()
    advance = engine.Run.advance

    def noted(self, *args, **kwargs):
        if kwargs.get("stop") is not None:  # a replica's advance, not a warm-up's
            started.set()
        return advance(self, *args, **kwargs)

    monkeypatch.setattr(engine.Run, "advance", noted)
    engine.warm_up(FAST, config(engine="compiled"))
    share = [TraceRequest(i, 0.01 * i, 64, 2_000, (i,)) for i in range(4_000)]  # seconds of steps
    sent = []

    def ctrl_c():
        started.wait(60)
        time.sleep(0.1)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    # What an interactive process has, whatever the runner's parent left: Python's own handler, SIGINT unblocked
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    threading.Thread(target=ctrl_c, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.replay_apart([share, share], FAST, config(engine="compiled", num_gpu_blocks=8_000), threads=2)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        signal.signal(signal.SIGINT, previous)
    assert sent and time.monotonic() - sent[0] < 1.0


def test_a_fleet_on_one_clock_advances_its_halves_on_two_cores_to_the_same_decisions(monkeypatch):
    """Issue #54: on one clock (a router that reads the replicas), the compiled engine runs half the
    replicas on a helper thread between two arrivals (``fleet.TwoCores``); the routing, decisions
    and figures are those of one thread, request by request."""
    from blockspace.simulator import executor

    base = dataclasses.replace(config(3, "kv_aware", engine="compiled"), scheduler=SchedulerConfig(
        max_num_seqs=16, record_tables=True))  # fmt: skip
    trace = load_trace(None, jit_or(120, 8))
    monkeypatch.setattr(executor, "IN_POOL", True)
    alone = replay(trace, FAST, base)
    monkeypatch.setattr(executor, "IN_POOL", False)
    monkeypatch.setattr(executor.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    halves = replay(trace, FAST, base)
    assert len(set(alone.assignment)) > 1 and alone.assignment == halves.assignment
    assert alone.records == halves.records and per_request(alone) == per_request(halves)


def test_a_replica_that_fails_on_the_helper_thread_fails_the_fleet():
    from blockspace.simulator.fleet import TwoCores

    class Broken:
        def advance(self, until: float) -> None:
            raise SimulationStalledError(f"stuck before {until}")

    class Fine:
        def advance(self, until: float) -> None:
            pass

    with TwoCores([Fine(), Broken()]) as cores, pytest.raises(SimulationStalledError, match="stuck before 2.0"):
        cores.advance(2.0)
