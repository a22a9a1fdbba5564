"""``--find max-rate`` (simulator/capacity.py): the search on
its own against a known threshold, and the command on a synthetic trace
whose answer follows from queueing by hand."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from blockspace.simulator.capacity import (
    DEFAULT_TOLERANCE,
    MAX_SCALE,
    MIN_SCALE,
    RatePoint,
    find_max_rate,
    flat_floor,
    format_answer,
    format_answers,
    next_scales,
)
from blockspace.simulator.cli import main as simulate
from blockspace.simulator.fleet_size import ReplicaPoint, find_min_replicas
from blockspace.simulator.fleet_size import format_answer as fleet_answer
from blockspace.simulator.report import significant
from blockspace.simulator.slo import SLO


def probe(scale: float, attainment: float, rate: float = 1.0) -> RatePoint:
    """What ``run_probe`` answers, made up (``rate``: the trace's own)."""
    return RatePoint(scale=scale, attainment=attainment, goodput_requests_per_s=attainment * scale, finished=0,
                     ignored=0, aborted=0, ttft_p90_s=None, tpot_p90_s=None, served_requests_per_s=attainment * scale,
                     saturated=attainment < 0.5, rate_requests_per_s=scale * rate)  # fmt: skip


def fleet_try(replicas: int, attainment: float) -> ReplicaPoint:
    """What ``fleet_size.run_try`` answers, made up."""
    return ReplicaPoint(replicas=replicas, attainment=attainment, goodput_requests_per_s=attainment, finished=1,
                        hit_rate=0.0, ttft_p90_s=1.0, saturated=False)  # fmt: skip


def threshold(limit: float, calls: list[list[float]], rate: float = 1.0):
    """An ``evaluate`` whose attainment is 1 up to rate scale ``limit`` and 0 above."""

    def evaluate(scales: list[float]) -> list[RatePoint]:
        calls.append(list(scales))
        return [probe(s, 1.0 if s <= limit else 0.0, rate) for s in scales]

    return evaluate


@pytest.mark.parametrize(("limit", "width"), [(3.3, 1), (3.3, 4), (0.07, 2), (1.0, 3)])
def test_the_search_closes_in_on_the_threshold_from_below(limit, width):
    calls: list[list[float]] = []
    found = find_max_rate(threshold(limit, calls, 10.0), rate=10.0, target=0.9, width=width)
    best, failing = found.rate_scale, found.lowest_failing_rate_requests_per_s / 10.0
    assert best <= limit < failing and (failing - best) / best <= DEFAULT_TOLERANCE
    assert found.max_rate_requests_per_s == pytest.approx(10.0 * best) and found.converged
    assert all(len(round_) <= width for round_ in calls)  # each round fills the workers, no more
    assert found.runs == len({s for round_ in calls for s in round_}) == len(found.curve)
    assert [p.scale for p in found.curve] == sorted(p.scale for p in found.curve)


def test_a_target_every_rate_meets_is_a_lower_bound():
    """Attainment falls with the rate but stays above the target: the highest rate tried is a lower bound."""

    def evaluate(scales: list[float]) -> list[RatePoint]:
        return [probe(s, 1.0 if s < 100 else 0.95) for s in scales]

    found = find_max_rate(evaluate, rate=1.0, target=0.5, width=3)
    assert found.lowest_failing_rate_requests_per_s is None and found.rate_scale >= MAX_SCALE
    assert not found.no_effect
    assert "every rate tried does, the max is higher" in format_answer(found, SLO(ttft_s=1.0))


@pytest.mark.parametrize("attainment", [0.9355, 0.2])
def test_a_search_whose_rate_has_no_effect_says_so_and_names_no_bound(attainment):
    """Issue #51: a closed loop held attainment at 93.55 % at every rate, and
    the search answered "max rate: 2.458e+04 req/s" with exit 0. The same
    attainment everywhere means the rate changed nothing: no bound is named,
    above the target (a max the search ran into) or below it."""
    found = find_max_rate(lambda scales: [probe(s, attainment, 3.0) for s in scales], rate=3.0, target=0.9, width=2)
    assert found.no_effect and found.max_rate_requests_per_s is None and found.rate_scale is None
    said = format_answer(found, SLO(ttft_s=2.0)).splitlines()[-1]
    assert said.startswith(f"max rate: no bound: {attainment:.1%} of requests meet the SLO at every rate tried")
    assert "has no effect" in said and "e+" not in said
    assert "no effect" in format_answers([dataclasses.replace(found, values={"n": 1})], "max rate")
    assert not find_max_rate(threshold(3.3, []), rate=1.0, target=0.9, width=2).no_effect


def test_min_replicas_with_no_effect_says_so():
    """Replicas that change nothing (every count 20 %, none passing) say so;
    every count passing names 1, a real answer: no fleet is smaller."""
    found = find_min_replicas(lambda counts: [fleet_try(k, 0.2) for k in counts], target=0.9, width=2)
    assert found.no_effect and found.min_replicas is None
    said = fleet_answer(found, SLO(ttft_s=2.0), "kv_aware").splitlines()[-1]
    assert said.startswith("min replicas: no bound: 20.0% of requests meet the SLO at every replica count tried")
    everywhere = find_min_replicas(lambda counts: [fleet_try(k, 1.0) for k in counts], target=0.9, width=2)
    assert everywhere.min_replicas == 1 and not everywhere.no_effect


def test_rates_print_at_four_significant_digits_without_exponents():
    """Issue #51: ``48`` on one line and ``1.229e+04`` on the next."""
    found = find_max_rate(threshold(2000.0, [], 3.0), rate=3.0, target=0.9, width=1)
    said = format_answer(found, SLO(ttft_s=2.0))
    assert not re.search(r"\de[+-]\d", said), said
    assert "max rate: 5,952 req/s (1,984x the trace's 3 req/s)" in said and "6,048 req/s does not" in said
    assert [significant(v) for v in (48.0, 12290.4, 0.0007324, 0.9355, 999.96)] == [
        "48", "12,290", "0.0007324", "0.9355", "1,000"
    ]  # fmt: skip


def test_a_target_no_rate_meets_says_none():
    calls: list[list[float]] = []
    found = find_max_rate(threshold(0.0, calls), rate=1.0, target=0.5, width=2)
    assert found.max_rate_requests_per_s is None and found.rate_scale is None
    assert min(p.scale for p in found.curve) <= MIN_SCALE  # it went down to the floor first


def test_a_flat_floor_says_why_lower_rates_do_not_help():
    """Attainment stuck at 40 % however low the rate: the answer says none,
    at four significant digits (rates far below 0.001 req/s stay apart),
    then why (issue #40: two rows both read 0.001, and no hint)."""

    def evaluate(scales: list[float]) -> list[RatePoint]:
        return [probe(s, 0.4 if s < 1 else 0.1, 3.0) for s in scales]

    found = find_max_rate(evaluate, rate=3.0, target=0.9, width=1)
    said = format_answer(dataclasses.replace(found, requests=2000, arrival_times=224), SLO(ttft_s=2.0)).splitlines()
    rates = [line.split()[0] for line in said[1:-2]]
    assert len(rates) == len(set(rates)) == found.runs and "0.0007324" in rates  # 3 / 4096
    assert said[-2].startswith("max rate: none found: even 0.0007324 req/s (0.0002441x the trace's 3 req/s)")
    assert said[-1].startswith("why: attainment stays at 40.0% from 1.5 req/s down, so lowering the rate no longer")
    assert "(2,000 requests arrive at 224 distinct times)" in said[-1]
    assert flat_floor([probe(1, 0.4), probe(2, 0.3), probe(4, 0.2)]) is None  # still rising as the rate falls


def test_the_next_round_brackets_then_splits():
    assert next_scales({1.0: True}, 2, 0.02) == [2.0, 4.0]  # all passed: up
    assert next_scales({1.0: False}, 2, 0.02) == [0.5, 0.25]  # all failed: down
    assert next_scales({1.0: True, 2.0: False}, 3, 0.02) == [1.25, 1.5, 1.75]  # split the bracket
    assert next_scales({1.0: True, 1.01: False}, 3, 0.02) == []  # closed
    # a pass above the lowest failure is not believed: the bracket is below that failure
    assert next_scales({1.0: True, 2.0: False, 4.0: True}, 1, 0.02) == [1.5]


def queue_argv(tmp_path) -> list[str]:
    """20 requests 100 ms apart (10 req/s), each a 16-token prompt and 4
    output tokens, every step exactly 10 ms."""
    trace = tmp_path / "queue.jsonl"
    lines = [{"timestamp": 100 * i, "input_length": 16, "output_length": 4, "hash_ids": [i]} for i in range(20)]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = ["--trace", str(trace), "--max-num-batched-tokens", "16", "--step-overhead-ms", "10"]
    argv += ["--prefill-token-us", "0", "--decode-seq-us", "0", "--kv-token-read-ns", "0", "--swap-block-us", "0"]
    return argv + [
        "--find",
        "max-rate",
        "--slo",
        "e2e=41ms",
        "--workers",
        "2",
        "--quiet",
        "--out",
        str(tmp_path / "out"),
    ]


def test_the_command_finds_the_rate_queueing_predicts(tmp_path, capsys):
    """20 requests 100 ms apart (10 req/s), one at a time (--max-num-seqs 1),
    each 4 steps of exactly 10 ms (a 16-token prompt, 4 output tokens): 40 ms
    of service. Arrivals 40 ms apart or more never queue, so every request
    meets e2e <= 41 ms; closer, the k-th waits k times the shortfall, and
    fewer than 90 % do once that passes 1 ms for the 18th (k = 17). The max
    rate lies between 25 req/s and 1 / (40 ms - 1/17 ms) = 25.04 req/s."""
    out = tmp_path / "out"
    assert simulate([*queue_argv(tmp_path), "--max-num-seqs", "1"]) == 0
    printed = capsys.readouterr().out
    (found,) = json.loads((out / "capacity.json").read_text())["configurations"]
    assert found["trace_rate_requests_per_s"] == pytest.approx(10.0)
    assert 25.0 * (1 - DEFAULT_TOLERANCE) <= found["max_rate_requests_per_s"] <= 25.04
    assert 25.0 < found["lowest_failing_rate_requests_per_s"] <= 25.0 * (1 + 2 * DEFAULT_TOLERANCE)
    assert found["converged"] and found["runs"] == len(found["curve"]) <= 40
    assert all(p["finished"] == 20 and p["ignored"] == p["aborted"] == 0 for p in found["curve"])
    assert f"max rate: {found['max_rate_requests_per_s']:.4g} req/s" in printed
    assert (out / "capacity.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ([], "--find max-rate needs --slo"),
        (["--slo", "ttft=1s", "--compare", "reference,fast"], "runs one manager"),
        (["--slo", "ttft=1s", "--sweep", "block_size=16,0"], "--sweep"),
        (["--slo", "ttft=1s", "--target", "0"], "--target must be > 0"),
        (["--slo", "ttft=1s", "--target", "100.5"], "--target must be <= 100"),
    ],
)
def test_a_search_that_cannot_run_is_refused_first(tmp_path, capsys, extra, said):
    argv = ["--find", "max-rate", "--max-requests", "5", "--out", str(tmp_path / "out"), *extra]
    assert simulate(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and said in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_a_trace_without_a_rate_is_refused(tmp_path, capsys):
    trace = tmp_path / "burst.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 16, "output_length": 2, "hash_ids": [1]}) + "\n")
    assert simulate(["--trace", str(trace), "--find", "max-rate", "--slo", "e2e=1s", "--out", str(tmp_path)]) == 2
    assert "at least two requests arriving at different times" in capsys.readouterr().err


def test_each_configuration_of_a_sweep_gets_its_answer(tmp_path, capsys):
    """Stretching the trace's arrivals (--time-scale 2: 5 req/s) changes the
    rate scale the answer is found at, not the answer in requests per
    second: the queue still takes 25 req/s."""
    assert simulate([*queue_argv(tmp_path), "--max-num-seqs", "1", "--sweep", "time_scale=1,2"]) == 0
    printed = capsys.readouterr().out
    one, two = json.loads((tmp_path / "out" / "capacity.json").read_text())["configurations"]
    assert one["values"] == {"time_scale": 1.0} and two["values"] == {"time_scale": 2.0}
    assert one["trace_rate_requests_per_s"] == pytest.approx(10.0) and two[
        "trace_rate_requests_per_s"
    ] == pytest.approx(5.0)
    for search in (one, two):
        assert 25.0 * (1 - DEFAULT_TOLERANCE) <= search["max_rate_requests_per_s"] <= 25.04
    assert two["rate_scale"] == pytest.approx(2 * one["rate_scale"], rel=2 * DEFAULT_TOLERANCE)
    assert "max rate per configuration:" in printed and "time_scale=2.0: " in printed
    assert (tmp_path / "out" / "capacity.png").stat().st_size > 0


def test_min_replicas_stops_doubling_once_more_replicas_stop_helping():
    """Issue #53: a fleet that keeps up, and meets the SLO no more often after two doublings, stops
    the search there, which says why, where it doubled to 1,024 before. A saturated fleet (its queue
    grew) is no such sign, and neither is a share of 0: 0 % at 1 and 2 goes on."""
    attainments = {1: 0.0, 2: 0.0, 4: 0.5, 8: 0.83, 16: 0.825, 32: 0.825, 64: 0.83}
    saturated = {1, 2}
    asked = []

    def evaluate(counts):
        asked.append(counts)
        return [dataclasses.replace(fleet_try(k, attainments[k]), saturated=k in saturated) for k in counts]

    found = find_min_replicas(evaluate, target=0.9, width=2)
    assert asked == [[1, 2], [4, 8], [16, 32]] and found.stopped_rising and found.min_replicas is None
    said = fleet_answer(found, SLO(ttft_s=2.0), "round_robin").splitlines()[-1]
    assert "more replicas stopped helping, 82.5% at 32 against 82.5% at 16 and 83.0% at 8, the load kept up" in said
    rising = find_min_replicas(lambda counts: [fleet_try(k, min(0.95, k / 64)) for k in counts], target=0.9, width=2)
    assert rising.min_replicas == 58 and not rising.stopped_rising
    # requests that share steps: none meets it on fewer than 4 replicas, all on 4
    found = find_min_replicas(lambda counts: [fleet_try(k, float(k >= 4)) for k in counts], target=0.9, width=2)
    assert found.min_replicas == 4 and not found.stopped_rising
