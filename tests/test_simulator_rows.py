"""The scheduler's row path (simulator/row_step.py) makes the
per-call path's decisions, step for step: scheduled groups and chunks,
preemptions, swaps, finish order, and (hashed into every record) each
step's block tables, copy-on-write pairs and swap mappings."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from blockspace.cli import main as blockspace
from blockspace.interfaces import load_manager_class
from blockspace.simulator import SchedulerConfig, Simulation, SimulationConfig, load_trace
from blockspace.simulator.calls import CallPath
from blockspace.simulator.row_step import RowPath, offers_rows
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
    runs, paths = {}, {}
    for step in ("calls", "rows"):
        simulation = Simulation(trace, fast, replace(config, scheduler=replace(config.scheduler, step=step)))
        runs[step], paths[step] = simulation.run(), simulation.scheduler.path
    assert type(paths["calls"]) is CallPath and type(paths["rows"]) is RowPath
    calls, rows = runs["calls"], runs["rows"]
    assert rows.metrics.manager_by_method["append_slots_rows"][1] > 0  # the row path did the decodes
    assert "append_slots_rows" not in calls.metrics.manager_by_method
    assert calls.metrics.manager_calls > rows.metrics.manager_calls
    if name == "samples":  # n=2: two requests of one sequence each (vLLM 0.9.2), decoded through rows too
        first_two = [r.request_id for r in rows.metrics.requests[:2]]
        assert first_two == ["0_parallel_sample_0", "0_parallel_sample_1"]
    assert len(rows.records) == len(calls.records) > 100
    for a, b in zip(calls.records, rows.records):
        assert a == b, f"step {a.step}"
    assert calls.metrics.finish_s == rows.metrics.finish_s
    if name.startswith("tight"):
        assert paths["rows"].num_fallbacks > 0 and rows.metrics.counts.recompute_preemptions > 0
        assert name == "tight-recompute" or rows.metrics.counts.swap_outs > 0
    rows.manager.check_invariants()
    assert rows.manager.get_num_free_gpu_blocks() == calls.manager.get_num_free_gpu_blocks()


def test_the_row_path_is_chosen_by_capability():
    reference, fast = load_manager_class("reference"), load_manager_class("fast")
    assert offers_rows(fast) and not offers_rows(reference)
    kwargs = {"block_size": 16, "num_gpu_blocks": 64, "num_cpu_blocks": 0}
    assert type(Scheduler(reference(**kwargs), SchedulerConfig()).path) is CallPath  # auto: per call
    assert type(Scheduler(fast(**kwargs), SchedulerConfig()).path) is RowPath
    assert type(Scheduler(fast(**kwargs), SchedulerConfig(step="calls")).path) is CallPath
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
