"""Arrivals at a chosen rate (``workloads.gamma_arrivals``, ``--request-rate``
and ``--burstiness``), a known queueing answer, and saturation said plainly
(``summary.load_of``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from blockspace.errors import InvalidArgumentError
from blockspace.interfaces import load_manager_class
from blockspace.simulator.cli import main as simulate
from blockspace.simulator.engines import replay
from blockspace.simulator.scheduler import SchedulerConfig
from blockspace.simulator.simulation import SimulationConfig
from blockspace.simulator.step_model import StepTimeModel
from blockspace.simulator.summary import summarize
from blockspace.workloads import TraceRequest, gamma_arrivals

SIGMAS = 5  # a seeded draw outside this many standard errors of its expectation fails the test


def requests(n: int, input_length: int = 16, output_length: int = 4) -> list[TraceRequest]:
    """``n`` requests one second apart, each its own prompt (no shared prefix)."""
    return [TraceRequest(i, float(i), input_length, output_length, (i,)) for i in range(n)]


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gaps_have_the_rate_and_the_spread_of_their_gamma(burstiness):
    """Gamma gaps of shape B and mean 1/R: their mean is 1/R within its
    standard error (1/R)/sqrt(n B), and their coefficient of variation
    1/sqrt(B) (1 for Poisson arrivals)."""
    n, rate = 50_000, 8.0
    retimed = gamma_arrivals(requests(n), rate, burstiness, seed=3)
    gaps = np.diff([r.arrival_s for r in retimed])
    assert retimed[0].arrival_s == 0.0 and (gaps >= 0).all()
    assert abs(gaps.mean() - 1 / rate) <= SIGMAS * (1 / rate) / np.sqrt(n * burstiness)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.05)


def test_the_requests_keep_their_order_prompts_and_outputs_and_the_seed_decides():
    trace = requests(50)
    retimed = gamma_arrivals(trace, 2.0, seed=1)
    assert [(r.index, r.input_length, r.output_length, r.hash_ids) for r in retimed] == [
        (r.index, r.input_length, r.output_length, r.hash_ids) for r in trace
    ]
    assert retimed == gamma_arrivals(trace, 2.0, seed=1)
    assert retimed != gamma_arrivals(trace, 2.0, seed=2)


@pytest.mark.parametrize(("rate", "burstiness", "said"), [(0.0, 1.0, "request rate"), (1.0, -1.0, "burstiness")])
def test_a_rate_or_shape_out_of_range_is_refused(rate, burstiness, said):
    with pytest.raises(InvalidArgumentError, match=said):
        gamma_arrivals(requests(3), rate, burstiness)


# -- a known answer: M/D/1 ------------------------------------------------------------------
SERVICE_S = 0.04  # a 16-token prompt and 4 output tokens, one at a time: 4 steps of exactly 10 ms
EXACT_STEPS = StepTimeModel(step_overhead_ms=10.0, prefill_token_us=0.0, decode_seq_us=0.0, kv_token_read_ns=0.0,
                            swap_block_us=0.0)  # fmt: skip
ONE_AT_A_TIME = SimulationConfig(1_000, 0, scheduler=SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=16,
                                 enable_prefix_caching=False), step_time=EXACT_STEPS)  # fmt: skip


@pytest.mark.parametrize("load", [0.3, 0.6])
def test_one_request_at_a_time_under_poisson_arrivals_waits_as_md1_says(load):
    """One replica, Poisson arrivals at rate lambda, one request at a time
    (``max_num_seqs=1``), each served in exactly D = 40 ms: an M/D/1 queue,
    whose mean wait is lambda D^2 / (2 (1 - lambda D)) (Pollaczek-Khinchine).
    The wait of each request is its end-to-end time less D. The run's mean
    must lie within 5 standard errors of the formula, the standard error
    estimated from the run itself by batch means (40 batches of 250
    requests: a busy period lasts D / (1 - rho), a few requests, so batch
    means are nearly independent); and that error must be small (below 8 %
    of the answer), so the test can tell."""
    rate = load / SERVICE_S
    trace = gamma_arrivals(requests(10_000), rate, 1.0, seed=7)
    result = replay(trace, load_manager_class("fast"), ONE_AT_A_TIME)
    outcomes = result.metrics.outcomes()
    assert all(o.status == "finished" for o in outcomes)
    waits = np.array([o.e2e_s for o in outcomes]) - SERVICE_S
    assert waits.min() == pytest.approx(0.0, abs=1e-9)  # the first request, and any that finds the queue empty
    expected = rate * SERVICE_S**2 / (2 * (1 - load))
    batch_means = waits.reshape(40, -1).mean(axis=1)
    error = batch_means.std(ddof=1) / np.sqrt(len(batch_means))
    assert error < 0.08 * expected
    assert abs(waits.mean() - expected) <= SIGMAS * error, (waits.mean(), expected, error)


# -- saturation --------------------------------------------------------------------------------
def test_a_run_is_called_saturated_when_the_queue_grows_and_not_when_it_keeps_up():
    """At rho = 2 the queue grows by about half the arrivals; at rho = 0.3 it stays short."""
    over = summarize(replay(gamma_arrivals(requests(400), 2 / SERVICE_S, seed=1), load_manager_class("fast"),
                            ONE_AT_A_TIME)).load  # fmt: skip
    under = summarize(replay(gamma_arrivals(requests(400), 0.3 / SERVICE_S, seed=1), load_manager_class("fast"),
                             ONE_AT_A_TIME)).load  # fmt: skip
    assert over.saturated and not under.saturated
    assert over.served_requests_per_s == pytest.approx(1 / SERVICE_S, rel=0.02)
    assert over.waiting_at_last_arrival > 150 and over.peak_waiting >= over.waiting_at_last_arrival
    assert under.offered_requests_per_s == pytest.approx(0.3 / SERVICE_S, rel=0.15)
    assert under.waiting_at_last_arrival <= 5


def test_the_command_says_saturated_in_one_line(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    lines = [{"timestamp": 0, "input_length": 16, "output_length": 4, "hash_ids": [i]} for i in range(100)]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = ["--trace", str(trace), "--max-num-seqs", "1", "--no-plot", "--quiet", "--out", str(tmp_path / "out")]
    assert simulate([*argv, "--request-rate", "100"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("load")]
    assert "SATURATED" in line and "req/s offered" in line and "waiting when the last arrived" in line
    assert simulate([*argv, "--request-rate", "0.5"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("load")]
    assert "SATURATED" not in line
