"""The simulator end to end: reference and fast make identical decisions
(same block tables, CoW pairs and swap mappings), n>1 sampling forks and
copies on write, and the command line writes its summary, JSON and plot."""

from __future__ import annotations

import json

import numpy as np
import pytest

from blockspace.interfaces import load_manager_class
from blockspace.simulator import SchedulerConfig, SimulationConfig, load_trace, run_simulation
from blockspace.simulator.cli import main, resolve_manager
from blockspace.simulator.report import first_difference, summarize
from blockspace.workloads import parse_lines


def fast_class():
    return load_manager_class("fast")


def sample_trace():
    """24 small requests (so that many run at once) whose prompts come in
    three shared contents, for n>1 sampling with heavy swapping."""
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


def sample_config(num_gpu_blocks: int, enable_prefix_caching: bool, record_tables: bool = False) -> SimulationConfig:
    return SimulationConfig(
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=200,
        scheduler=SchedulerConfig(
            max_num_batched_tokens=512, enable_prefix_caching=enable_prefix_caching, record_tables=record_tables
        ),
        num_samples=3,
    )


def check_every_step(scheduler) -> None:
    scheduler.manager.manager.check_invariants()


def assert_all_free(result) -> None:
    manager = result.scheduler.manager.manager
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
    assert first_difference(reference.scheduler.records, other.scheduler.records) is None
    assert reference.scheduler.records == other.scheduler.records
    assert all(record.digest != 0 for record in reference.scheduler.records if record.scheduled)
    assert_all_free(other)


@pytest.mark.parametrize("num_gpu_blocks", [40, 60])
@pytest.mark.parametrize("enable_prefix_caching", [True, False], ids=["caching", "no-caching"])
def test_reference_and_fast_decide_identically_with_samples(num_gpu_blocks, enable_prefix_caching):
    fast = fast_class()
    config = sample_config(num_gpu_blocks, enable_prefix_caching, record_tables=True)
    reference = run_simulation(sample_trace(), load_manager_class("reference"), config)
    other = run_simulation(sample_trace(), fast, config, on_step=check_every_step)
    assert first_difference(reference.scheduler.records, other.scheduler.records) is None
    assert reference.scheduler.num_swap_outs > 0 and reference.scheduler.num_copy_on_writes > 0
    assert_all_free(other)


@pytest.mark.parametrize("enable_prefix_caching", [True, False], ids=["caching", "no-caching"])
def test_n_samples_fork_share_copy_on_write_and_swap(enable_prefix_caching):
    num_diverged = 0

    def after_step(scheduler) -> None:
        nonlocal num_diverged
        scheduler.manager.manager.check_invariants()
        for request in scheduler.running:  # forked samples share the prompt, then diverge
            tokens = [seq.get_token_ids() for seq in request.seqs]
            if len(tokens) == 3 and request.seqs[0].get_output_len() > 1:
                assert tokens[0][: request.num_prompt_tokens] == tokens[2][: request.num_prompt_tokens]
                assert tokens[0][request.num_prompt_tokens :] != tokens[2][request.num_prompt_tokens :]
                num_diverged += 1

    config = sample_config(60, enable_prefix_caching)
    result = run_simulation(sample_trace(), load_manager_class("reference"), config, on_step=after_step)
    scheduler = result.scheduler
    finished = [r for r in result.requests if r.finish_s is not None]
    assert len(finished) >= 18 and all(len(r.seqs) == 3 for r in finished)
    assert all(seq.get_output_len() == r.output_length for r in finished for seq in r.seqs)
    assert num_diverged > 0
    assert scheduler.num_copy_on_writes > 0
    assert scheduler.num_swap_outs > 0 and scheduler.num_swap_ins > 0  # groups of samples are swapped, as in vLLM
    assert scheduler.num_recompute_preemptions == 0
    summary = summarize(result)
    assert summary["requests"]["finished"] + summary["requests"]["ignored"] + summary["requests"]["aborted"] == 24
    assert summary["preemption"]["blocks_swapped_out"] == scheduler.num_blocks_swapped_out > 0
    assert_all_free(result)


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
            "reference,fast",
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


def test_the_plot_states_what_ran_and_bins_latency_by_finish_time():
    from blockspace.simulator.plot import latency_over_time, title_of

    config = SimulationConfig(
        num_gpu_blocks=1200, num_cpu_blocks=0, scheduler=SchedulerConfig(enable_prefix_caching=False)
    )
    result = run_simulation(load_trace(None, 30), fast_class(), config)
    title = title_of(result, "the bundled sample")
    assert "FastBlockSpaceManager" in title and "block size 16" in title and "1,200 GPU blocks" in title
    assert "prefix caching off" in title and "30 requests of the bundled sample" in title
    curves = latency_over_time(result, num_bins=4)
    done = [r for r in result.requests if r.finish_s is not None]  # a few prompts exceed 1,200 blocks
    finish = [r.finish_s for r in done]
    quarter = (max(finish) - min(finish)) / 4
    first_bin = [r.finish_s - r.arrival_s for r in done if r.finish_s < min(finish) + quarter]
    assert len(curves["time_s"]) == 4 and curves["time_s"][0] == pytest.approx(min(finish) + quarter / 2)
    assert curves["e2e_p50"][0] == pytest.approx(float(np.percentile(first_bin, 50)))
    assert all(np.isnan(a) or a <= b for a, b in zip(curves["ttft_p50"], curves["ttft_p99"]))
    assert result.startup_s > 0 and summarize(result)["manager_startup_s"] == result.startup_s
