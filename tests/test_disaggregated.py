"""Prefill and decode on separate replicas (``--prefill-replicas``;
``simulator/disaggregated.py``): the issue's known answers, on both engines."""

from __future__ import annotations

import json
import math

import pytest

from blockspace.errors import InvalidConfigError
from blockspace.interfaces import load_manager_class
from blockspace.simulator.cli import main as simulate
from blockspace.simulator.disaggregated import transfer_seconds
from blockspace.simulator.engines import replay
from blockspace.simulator.failures import parse_fail
from blockspace.simulator.scheduler import SchedulerConfig
from blockspace.simulator.simulation import SimulationConfig, SimulationResult
from blockspace.simulator.slo import parse_slo
from blockspace.simulator.step_model import StepTimeModel
from blockspace.simulator.summary import summarize
from blockspace.workloads import TraceRequest, chunks_for, load_trace, synthetic

FAST = load_manager_class("fast")
ENGINES = ("python", "compiled")
BLOCK_BYTES = 2 * 32 * 8 * 128 * 2 * 16  # a 16-token block of an 8B model: K and V, 32 layers, 8 heads of 128, 2 bytes


def config(engine: str, replicas: int = 2, prefill: int = 1, link: float = math.inf, **fields) -> SimulationConfig:
    fields = {"kv_block_bytes": BLOCK_BYTES, **fields}
    return SimulationConfig(2_000, 0, scheduler=SchedulerConfig(max_num_seqs=8), engine=engine, replicas=replicas,
                            prefill_replicas=prefill, kv_link_gbps=link, step_time=StepTimeModel(),
                            **fields)  # fmt: skip


def alone() -> list[TraceRequest]:
    """Requests 10 s apart: each is served alone."""
    lengths = [700 + 150 * i for i in range(5)]
    return [TraceRequest(i, 10.0 * i, n, 5 + i, tuple(range(10 * i, 10 * i + chunks_for(n)))) for i, n in
            enumerate(lengths)]  # fmt: skip


def by_index(result: SimulationResult) -> dict[int, dict]:
    return {r["trace_index"]: r for r in result.metrics.request_records()}


@pytest.mark.parametrize("engine", ENGINES)
def test_an_infinite_link_and_one_request_at_a_time(engine):
    """TTFT is the prefill replica's prefill step, and the decode replica's
    decode steps are an aggregated replica's, step for step; its prompt step
    costs only the step's fixed cost (no prompt compute)."""
    trace = alone()
    aggregated = replay(trace, FAST, config(engine, replicas=1, prefill=0))
    apart = replay(trace, FAST, config(engine))
    one, two = by_index(aggregated), by_index(apart)
    for i in range(len(trace)):
        assert two[i]["ttft_s"] == one[i]["ttft_s"] > 0
        assert two[i]["output_tokens"] == one[i]["output_tokens"] == trace[i].output_length
    decode_replica = apart.replicas[1].metrics.timeline
    decodes = [s for s, n in zip(aggregated.metrics.timeline.step_s, aggregated.metrics.timeline.num_batched_tokens)
               if n == 1]  # fmt: skip
    assert decodes == [s for s, n in zip(decode_replica.step_s, decode_replica.num_batched_tokens) if n == 1]
    prompt_steps = [s for s, n in zip(decode_replica.step_s, decode_replica.num_batched_tokens) if n > 1]
    assert prompt_steps == [StepTimeModel().step_overhead_ms / 1000] * len(trace)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_first_token_waits_for_the_transfer(engine):
    trace = alone()
    fast_link = by_index(replay(trace, FAST, config(engine)))
    slow = replay(trace, FAST, config(engine, link=10.0))
    for i, record in by_index(slow).items():
        moved = transfer_seconds(slow.config, trace[i].input_length)
        assert moved == -(-trace[i].input_length // 16) * BLOCK_BYTES * 8 / 10e9
        assert record["first_token_s"] == pytest.approx(fast_link[i]["first_token_s"] + moved, abs=1e-12)
    summary = summarize(slow)
    assert summary.disaggregation.transfer_s.count == len(trace)
    assert summary.disaggregation.gigabytes_moved == pytest.approx(
        sum(-(-e.input_length // 16) for e in trace) * BLOCK_BYTES / 1e9
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_each_pool_does_its_half(engine):
    """Under load: the prefill replicas compute the prompts, the decode
    replicas the outputs; each pool's busy share and hit rate are reported."""
    trace = synthetic(60, input_len=2000, output_len=40, input_len_std=300, shared_prefix_ratio=0.5,
                      prefix_groups=3, rate=10.0, seed=4)  # fmt: skip
    result = replay(trace, FAST, config(engine, replicas=3, prefill=1, link=100.0, router="kv_aware"))
    prefill, decode = result.replicas[0], result.replicas[1:]
    assert prefill.metrics.counts.prefill_tokens_admitted > 0
    assert all(len(r.metrics.requests) for r in decode)  # both decode replicas got work
    summary = summarize(result)
    split = summary.disaggregation
    assert split.prefill.replicas == 1 and split.decode.replicas == 2
    assert 0 < split.prefill.utilisation <= 1 and 0 < split.decode.utilisation <= 1
    assert summary.requests.finished == len(trace)
    assert summary.prefix_cache.gpu_block_hit_rate == split.prefill.hit_rate > 0


def test_a_split_leaves_a_decode_replica_and_models_no_failure():
    with pytest.raises(InvalidConfigError, match="decode replica"):
        config("python", replicas=2, prefill=2)
    with pytest.raises(InvalidConfigError, match="failures"):
        config("python", failures=(parse_fail("0@1+1"),))
    with pytest.raises(InvalidConfigError, match="kv_block_bytes"):
        config("python", kv_block_bytes=0)


def test_the_fewest_prefill_replicas_in_front_of_the_decode_ones_given(tmp_path, capsys):
    """``--find min-replicas --decode-replicas 1`` counts the prefill
    replicas: at its answer P, P : 1 keeps the SLO and P - 1 : 1 does not."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 10 * i, "input_length": 300 + 7 * i, "output_length": 8,
                                         "hash_ids": [i]}) + "\n" for i in range(30)))  # fmt: skip
    slo = "ttft=60ms"
    argv = ["--trace", str(trace), "--manager", "reference", "--find", "min-replicas", "--decode-replicas", "1",
            "--slo", slo, "--workers", "1", "--no-plot", "--quiet", "--out", str(tmp_path / "out")]  # fmt: skip
    assert simulate(argv) == 0
    assert "the fewest prefill replicas in front of 1 decode" in capsys.readouterr().out
    (search,) = json.loads((tmp_path / "out" / "capacity.json").read_text())["configurations"]
    fewest = search["min_replicas"]
    assert fewest > 1

    def met(prefill: int) -> float:
        config = SimulationConfig(49_152, 2_048, replicas=prefill + 1, prefill_replicas=prefill,
                                  kv_block_bytes=BLOCK_BYTES)  # the command's defaults  # fmt: skip
        result = replay(load_trace(str(trace)), load_manager_class("reference"), config)
        return summarize(result, parse_slo(slo)).slo.attainment

    assert met(fewest) >= 0.9 > met(fewest - 1)
