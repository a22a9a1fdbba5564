"""The scheduler's row path (blockspace/simulator/row_step.py) makes the
per-call path's decisions, step for step: scheduled groups and chunks,
preemptions, swaps, finish order, and (hashed into every record) each
step's block tables, copy-on-write pairs and swap mappings."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from blockspace.cli import main as blockspace
from blockspace.interfaces import load_manager_class
from blockspace.simulator import SchedulerConfig, SimulationConfig, load_trace, run_simulation
from blockspace.simulator.row_step import offers_rows
from blockspace.simulator.scheduler import Scheduler

CONFIGS = {
    "caching": SimulationConfig(1500, 64, scheduler=SchedulerConfig(max_num_seqs=32, record_tables=True)),
    "plain": SimulationConfig(1500, 64, scheduler=SchedulerConfig(enable_prefix_caching=False, record_tables=True)),
    "tight-recompute": SimulationConfig(2400, 0, watermark=0.0, scheduler=SchedulerConfig(record_tables=True)),
    "tight-swap": SimulationConfig(
        2400, 400, watermark=0.0, scheduler=SchedulerConfig(preemption_mode="swap", record_tables=True)
    ),
    "samples": SimulationConfig(2000, 200, num_samples=2, scheduler=SchedulerConfig(record_tables=True)),
    "block-32": SimulationConfig(
        800, 64, scheduler=SchedulerConfig(block_size=32, max_num_batched_tokens=512, record_tables=True)
    ),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_row_path_makes_the_per_call_decisions(name):
    config = CONFIGS[name]
    trace = load_trace(None, 30 if name == "samples" else 60)
    fast = load_manager_class("fast")
    runs = {}
    for step in ("calls", "rows"):
        runs[step] = run_simulation(trace, fast, replace(config, scheduler=replace(config.scheduler, step=step)))
    calls, rows = runs["calls"].scheduler, runs["rows"].scheduler
    assert calls.row_step is None and rows.row_step is not None
    assert rows.row_step.num_batched > 0  # the row path did the decodes
    if name == "samples":  # n=2: two requests of one sequence each (vLLM 0.9.2), decoded through rows too
        assert [r.request_id for r in runs["rows"].requests[:2]] == ["0_parallel_sample_0", "0_parallel_sample_1"]
    assert len(rows.records) == len(calls.records) > 100
    for a, b in zip(calls.records, rows.records):
        assert a == b, f"step {a.step}"
    assert [r.finish_s for r in runs["calls"].requests] == [r.finish_s for r in runs["rows"].requests]
    if name.startswith("tight"):
        assert rows.row_step.num_fallbacks > 0 and rows.num_recompute_preemptions > 0
        assert name == "tight-recompute" or rows.num_swap_outs > 0
    manager = rows.manager.manager
    manager.check_invariants()
    assert manager.get_num_free_gpu_blocks() == calls.manager.manager.get_num_free_gpu_blocks()


def test_the_row_path_is_chosen_by_capability():
    reference, fast = load_manager_class("reference"), load_manager_class("fast")
    assert offers_rows(fast) and not offers_rows(reference)
    kwargs = {"block_size": 16, "num_gpu_blocks": 64, "num_cpu_blocks": 0}
    assert Scheduler(reference(**kwargs), SchedulerConfig()).row_step is None  # auto: per call
    assert Scheduler(fast(**kwargs), SchedulerConfig()).row_step is not None
    assert Scheduler(fast(**kwargs), SchedulerConfig(step="calls")).row_step is None
    with pytest.raises(ValueError, match="offers no row API"):
        Scheduler(reference(**kwargs), SchedulerConfig(step="rows"))


def test_compare_runs_the_two_paths_of_one_manager(tmp_path, capsys):
    argv = ["simulate", "--compare", "fast@calls,fast@rows", "--max-requests", "40", "--num-gpu-blocks", "900",
            "--out", str(tmp_path), "--quiet", "--no-plot"]  # fmt: skip
    assert blockspace(argv) == 0
    assert "identical" in capsys.readouterr().out
    assert blockspace(["simulate", "--compare", "reference@rows,fast", "--out", str(tmp_path)]) == 2
    assert "offers no row API" in capsys.readouterr().err
    assert blockspace(["simulate", "--compare", "fast@fastest,fast", "--out", str(tmp_path)]) == 2
    assert "after @" in capsys.readouterr().err


def test_the_way_against_way_bench_runs_and_writes_its_figures(tmp_path, capsys):
    from blockspace.bench.simulator import main as bench

    path = tmp_path / "ways.json"
    assert (
        bench(["--max-requests", "6", "--rounds", "1", "--ways", "reference,fast@calls,fast@rows", "--json", str(path)])
        == 0
    )
    printed = capsys.readouterr().out
    assert "| reference |" in printed and "| fast@rows |" in printed and "1.00x" in printed
    ways = json.loads(path.read_text())["ways"]
    assert set(ways) == {"reference", "fast@calls", "fast@rows"}
    assert ways["fast@rows"]["calls"] < ways["fast@calls"]["calls"] == ways["reference"]["calls"]
    assert bench(["--rounds", "0"]) == 2
