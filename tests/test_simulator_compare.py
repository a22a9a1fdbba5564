"""The simulator end to end: reference and fast make identical decisions
(same block tables, CoW pairs and swap mappings), n>1 sampling is n
requests of one sequence sharing the prompt through the prefix cache (as in
vLLM 0.9.2), and the command line writes its summary, JSON and plot."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from blockspace.interfaces import load_manager_class
from blockspace.simulator import SchedulerConfig, SimulationConfig, load_trace, run_simulation
from blockspace.simulator.cli import main, resolve_manager
from blockspace.simulator.report import first_difference
from blockspace.simulator.summary import RequestCounts, summarize
from blockspace.workloads import parse_lines


def fast_class():
    return load_manager_class("fast")


def sample_trace():
    """24 small requests (so that many run at once) whose prompts come in
    three shared contents, for n>1 sampling with heavy preemption."""
    lines = [
        json.dumps(
            {
                "timestamp": 100 * i,
                "input_length": 100 + 37 * (i % 7),
                "output_length": 30 + 11 * (i % 5),
                "hash_ids": [i % 3],
            }
        )
        for i in range(24)
    ]
    return parse_lines(lines, "samples trace")


def sample_config(
    num_gpu_blocks: int,
    enable_prefix_caching: bool,
    record_tables: bool = False,
    preemption_mode: str = "recompute",
    num_samples: int = 3,
) -> SimulationConfig:
    return SimulationConfig(
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=200,
        scheduler=SchedulerConfig(
            max_num_batched_tokens=512,
            enable_prefix_caching=enable_prefix_caching,
            record_tables=record_tables,
            preemption_mode=preemption_mode,
        ),
        num_samples=num_samples,
    )


def check_every_step(scheduler) -> None:
    scheduler.manager.manager.check_invariants()


def assert_all_free(result) -> None:
    manager = result.manager
    manager.check_invariants()
    assert manager.get_num_free_gpu_blocks() == result.config.num_gpu_blocks
    assert manager.get_num_free_cpu_blocks() == result.config.num_cpu_blocks


@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_reference_and_fast_decide_identically_on_mooncake(preemption_mode):
    fast = fast_class()
    trace = load_trace(None, 40)
    config = SimulationConfig(
        num_gpu_blocks=1040,
        num_cpu_blocks=3000,
        watermark=0.0,
        scheduler=SchedulerConfig(max_num_batched_tokens=4096, preemption_mode=preemption_mode, record_tables=True),
        max_output_len=32,
    )
    reference = run_simulation(trace, load_manager_class("reference"), config)
    other = run_simulation(trace, fast, config, on_step=check_every_step)
    assert first_difference(reference.records, other.records) is None
    assert reference.records == other.records
    assert all(record.digest != 0 for record in reference.records if record.scheduled)
    assert_all_free(other)


@pytest.mark.parametrize("num_gpu_blocks, preemption_mode", [(40, "recompute"), (60, "swap")])
@pytest.mark.parametrize("enable_prefix_caching", [True, False], ids=["caching", "no-caching"])
def test_reference_and_fast_decide_identically_with_samples(num_gpu_blocks, preemption_mode, enable_prefix_caching):
    fast = fast_class()
    config = sample_config(num_gpu_blocks, enable_prefix_caching, record_tables=True, preemption_mode=preemption_mode)
    reference = run_simulation(sample_trace(), load_manager_class("reference"), config)
    other = run_simulation(sample_trace(), fast, config, on_step=check_every_step)
    assert first_difference(reference.records, other.records) is None
    preempted = sum(len(record.preempted) + len(record.swapped_out) for record in reference.records)
    assert preempted > 0 and len(reference.metrics.requests) == 72
    assert_all_free(other)


@pytest.mark.parametrize("enable_prefix_caching", [True, False], ids=["caching", "no-caching"])
def test_n_samples_are_n_requests_of_one_sequence(enable_prefix_caching):
    """As vLLM 0.9.2's engine adds a request with n=3
    (``ParallelSampleSequenceGroup.add_request``): three requests of one
    sequence, ids ``{index}_parallel_sample_{i}``, queued together in order;
    same prompt, different outputs; never a fork."""
    num_diverged = 0
    seen: dict[str, list[int]] = {}

    def after_step(scheduler) -> None:
        nonlocal num_diverged
        scheduler.manager.manager.check_invariants()
        running = {request.request_id: request for request in scheduler.running}
        for request in running.values():
            assert len(request.seqs) == 1
            other = running.get(f"{request.index}_parallel_sample_2")
            if request.sample == 0 and other is not None and min(request.seqs[0].get_output_len(),
                                                                  other.seqs[0].get_output_len()) > 1:  # fmt: skip
                mine, theirs = request.seqs[0].get_token_ids(), other.seqs[0].get_token_ids()
                assert mine[: request.num_prompt_tokens] == theirs[: request.num_prompt_tokens]
                assert mine[request.num_prompt_tokens :] != theirs[request.num_prompt_tokens :]
                num_diverged += 1
        for request in scheduler.waiting:
            seen.setdefault(request.request_id, [request.seqs[0].seq_id])

    config = sample_config(60, enable_prefix_caching)
    result = run_simulation(sample_trace(), load_manager_class("reference"), config, on_step=after_step)
    metrics = result.metrics
    assert [r.request_id for r in result.metrics.requests[:4]] == [
        "0_parallel_sample_0",
        "0_parallel_sample_1",
        "0_parallel_sample_2",
        "1_parallel_sample_0",
    ]
    assert [r.seqs[0].seq_id for r in result.metrics.requests] == list(range(72))  # the engine's counter
    assert [(r.index, r.sample) for r in result.metrics.requests] == [(i, k) for i in range(24) for k in range(3)]
    assert all(len(r.seqs) == 1 and r.request_id in metrics.finish_s for r in result.metrics.requests)
    assert all(r.seqs[0].get_output_len() == r.output_length for r in result.metrics.requests)
    assert num_diverged > 0
    records = result.records
    assert not any(record.swapped_out for record in records)  # groups of one sequence: preempted by recompute
    assert any(record.preempted for record in records)
    summary = summarize(result)  # per trace request: the earliest first token, the last finish
    assert summary.requests == RequestCounts(arrived=24, finished=24, ignored=0, aborted=0)
    by_index = [result.metrics.requests[3 * i : 3 * i + 3] for i in range(24)]
    e2e = [max(metrics.finish_s[r.request_id] for r in samples) - samples[0].arrival_s for samples in by_index]
    ttft = [min(metrics.first_token_s[r.request_id] for r in samples) - samples[0].arrival_s for samples in by_index]
    assert summary.e2e_latency_s.mean == pytest.approx(float(np.mean(e2e)))
    assert summary.ttft_s.mean == pytest.approx(float(np.mean(ttft)))
    assert_all_free(result)


def test_n_samples_share_the_prompt_through_the_prefix_cache():
    """n=3 on the same trace: the samples after the first find the prompt's
    full blocks in the cache, so the hit rate is much higher than with n=1."""
    trace = load_trace(None, 40)
    rates = {}
    for n in (1, 3):
        config = SimulationConfig(num_gpu_blocks=20000, num_cpu_blocks=0, num_samples=n, max_output_len=16)
        result = run_simulation(trace, fast_class(), config)
        assert summarize(result).requests.finished == 40 and len(result.metrics.requests) == 40 * n
        rates[n] = result.metrics.final_hit_rate
    assert rates[3] > rates[1] + 0.4, rates


def test_cli_compare_agrees_with_samples(tmp_path, capsys):
    argv = ["--compare", "reference,fast", "--n", "3", "--max-requests", "20", "--max-output-len", "20"]
    status = main([*argv, "--num-gpu-blocks", "600", "--out", str(tmp_path), "--quiet", "--no-plot"])
    assert status == 0 and "identical" in capsys.readouterr().out
    document = json.loads((tmp_path / "simulation.json").read_text())
    assert document["identical_decisions"] is True and document["runs"][0]["requests"]["arrived"] == 20


def test_the_wall_time_row_says_what_it_holds(tmp_path, capsys):
    """A compared run records every step's tables, and its wall-time row
    says so; a run alone says it is the replay alone (issue #40: the
    compared row claimed to be the replay alone, and fast looked slower)."""
    argv = ["--max-requests", "10", "--out", str(tmp_path), "--quiet", "--no-plot"]
    assert main([*argv, "--compare", "reference,fast"]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if re.match(r"\s*wall time\s\s", line)]
    assert row.count("recorded for --compare: slower than a run alone") == 2 and "replay alone" not in row
    assert main(argv) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if re.match(r"\s*wall time\s\s", line)]
    assert "(the replay alone" in row and "recorded" not in row


def test_cli_writes_summary_json_and_plot(tmp_path, capsys):
    out = tmp_path / "out"
    status = main(
        ["--manager", "reference", "--max-requests", "25", "--max-output-len", "20", "--out", str(out), "--quiet"]
    )
    printed = capsys.readouterr().out
    assert status == 0
    assert (
        "requests finished" in printed
        and "TTFT p50/p90/p99" in printed
        and "wall time in the manager / step" in printed
    )
    assert "(the replay alone: start-up, loading and reporting left out)" in printed  # what the wall time holds
    assert str(out / "simulation.png") in printed and str(out / "simulation.json") in printed
    assert "time split: scheduler and model " in printed and ", reporting " in printed
    assert (out / "simulation.png").stat().st_size > 10_000
    document = json.loads((out / "simulation.json").read_text())
    run = document["runs"][0]
    assert run["requests"]["finished"] == 25
    assert run["kv_cache"]["num_gpu_blocks"] == 49152  # 96 GiB / 2 MiB per block
    assert run["ttft_s"]["p50"] <= run["ttft_s"]["p90"] <= run["ttft_s"]["p99"]
    assert len(document["timeline"]["time_s"]) == run["steps"]


def test_cli_compare_asserts_identical_decisions(tmp_path, capsys):
    fast_class()
    status = main(
        [
            "--compare",
            "reference,fast@rows",
            "--max-requests",
            "20",
            "--max-output-len",
            "20",
            "--num-gpu-blocks",
            "1200",
            "--out",
            str(tmp_path),
            "--quiet",
            "--no-plot",
        ]
    )
    printed = capsys.readouterr().out
    assert status == 0
    assert "identical" in printed and "wall time inside the manager" in printed
    assert json.loads((tmp_path / "simulation.json").read_text())["identical_decisions"] is True


def test_cli_reports_a_bad_trace_with_its_line(tmp_path, capsys):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n{"timestamp": 1}\n')
    status = main(["--trace", str(trace), "--manager", "reference", "--out", str(tmp_path), "--quiet"])
    assert status == 2
    assert f"{trace}: line 2: missing field 'input_length'" in capsys.readouterr().err


def test_manager_names_resolve():
    assert resolve_manager("reference").__name__ == "ReferenceBlockSpaceManager"
    assert resolve_manager("fast").__name__ == "FastBlockSpaceManager"
    assert resolve_manager("blockspace.reference:ReferenceBlockSpaceManager").__name__ == "ReferenceBlockSpaceManager"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--block-size", "0"], "--block-size must be >= 1, got 0"),
        (["--dtype-bytes", "0"], "--dtype-bytes must be >= 1, got 0"),
        (["--num-gpu-blocks", "-4"], "--num-gpu-blocks must be >= 1, got -4"),
        (["--max-requests", "0"], "--max-requests must be >= 1, got 0"),
        (["--n", "0"], "--n must be >= 1, got 0"),
        (["--time-scale", "0"], "--time-scale must be > 0, got 0.0"),
        (["--kv-memory-gib", "nan"], "--kv-memory-gib must be > 0, got nan"),
        (["--watermark", "-0.5"], "--watermark must be >= 0, got -0.5"),
        (["--manager", "fastt"], "--manager: Unknown version 'fastt'"),
        (["--compare", "fast,nosuch.module:Manager"], "cannot load manager 'nosuch.module:Manager'"),
    ],
)
def test_bad_arguments_are_one_error_line_before_any_work(tmp_path, capsys, argv, message):
    assert main([*argv, "--out", str(tmp_path / "out"), "--quiet"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and message in captured.err and captured.err.count("\n") == 1
    assert "replaying" not in captured.out and not (tmp_path / "out").exists()  # nothing ran, nothing written


def test_a_degenerate_run_warns(tmp_path, capsys):
    """A run where every request is ignored warns (an empty trace is an error:
    ``tests/test_cli_arguments.py``)."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]}\n')
    argv = ["--trace", str(trace), "--num-gpu-blocks", "8", "--out", str(tmp_path), "--quiet", "--no-plot"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: FastBlockSpaceManager: no request finished (1 ignored"), err


def test_the_warm_up_is_reported_apart():
    """The fast manager's start-up (compiling or loading its kernels) is
    measured before the replay and kept out of the manager-time figures.
    (What the plot states is checked in tests/test_simulator_plot.py.)"""
    config = SimulationConfig(
        num_gpu_blocks=1200, num_cpu_blocks=0, scheduler=SchedulerConfig(enable_prefix_caching=False)
    )
    result = run_simulation(load_trace(None, 30), fast_class(), config)
    assert result.metrics.startup_s > 0 and summarize(result).manager_startup_s == result.metrics.startup_s
