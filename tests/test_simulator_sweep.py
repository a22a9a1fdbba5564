"""``blockspace simulate --sweep``: values parsed and every configuration
checked before any run, runs in worker processes (or Ray's pool) with the
same figures as single runs, and the summary, CSV, per-run JSON and plot."""

from __future__ import annotations

import csv
import json
import sys
import types
from dataclasses import replace
from multiprocessing.pool import ThreadPool

import pytest

from blockspace.cli import main as blockspace
from blockspace.errors import InvalidArgumentError
from blockspace.interfaces import load_manager_class
from blockspace.simulator import executor
from blockspace.simulator.cli import build_parser, simulation_config
from blockspace.simulator.engines import replay, resolve
from blockspace.simulator.slo import parse_slo
from blockspace.simulator.summary import summarize
from blockspace.simulator.sweep import configurations, parse_sweeps
from blockspace.workloads import load_trace

SMALL = ["--max-requests", "12", "--max-output-len", "16"]


def test_values_are_parsed_as_the_option_parses_them():
    parser = build_parser()
    sweeps = parse_sweeps(
        ["num-gpu-blocks=512,1024", "enable_prefix_caching=on,off", "preemption_mode=swap", "watermark=0,0.05"], parser
    )
    assert sweeps == [
        ("num_gpu_blocks", [512, 1024]),
        ("enable_prefix_caching", [True, False]),
        ("preemption_mode", ["swap"]),
        ("watermark", [0.0, 0.05]),
    ]
    assert len(configurations(sweeps)) == 8 and configurations(sweeps)[1] == {
        "num_gpu_blocks": 512, "enable_prefix_caching": True, "preemption_mode": "swap", "watermark": 0.05,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("num_gpu_blockz=1,2", "no option 'num_gpu_blockz'"),
        ("num_gpu_blocks=1,x", "'x' is not a valid value"),
        ("num_gpu_blocks=", "expected KEY=V1,V2"),
        ("preemption_mode=swap,later", "'later' is not a valid value"),
        ("enable_prefix_caching=maybe", "'maybe' is not a valid value"),
        ("block_size=16,16", "appears twice"),
        ("trace=a.jsonl,b.jsonl", "trace cannot be swept: a sweep replays one trace"),
        # issue #40: options a run does not read were sweepable, and silently changed nothing
        ("slo=ttft=2s,ttft=5s", "slo cannot be swept: it judges the runs"),
        ("find=max-rate", "find cannot be swept"),
        ("target=50,90", "target cannot be swept"),
        ("requests_out=a.jsonl,b.jsonl", "requests_out cannot be swept"),
    ],
)
def test_a_bad_sweep_is_refused_naming_it(spec, message):
    with pytest.raises(InvalidArgumentError, match=message):
        parse_sweeps([spec], build_parser())


def test_the_error_lists_only_what_can_be_swept():
    with pytest.raises(InvalidArgumentError) as refused:
        parse_sweeps(["foo=1,2"], build_parser())
    listed = set(str(refused.value).partition("(options: ")[2].rstrip(")").split(", "))
    assert {"num_gpu_blocks", "step_model", "max_requests"} <= listed
    assert not listed & {"find", "requests_out", "slo", "target", "trace", "out", "workers"}


@pytest.mark.parametrize(
    ("specs", "given", "message"),
    [
        (["block_size=16,32"], {"block_size"}, "block_size is swept and given as --block-size"),
        (["kv_memory_gib=1,2"], {"num_gpu_blocks"}, "kv_memory_gib and --num-gpu-blocks cannot go together"),
        (["num_cpu_blocks=1,2", "swap_space_gib=1,2"], set(), "swap_space_gib and --num-cpu-blocks"),
    ],
)
def test_a_swept_key_that_another_option_overrides_is_refused(specs, given, message):
    with pytest.raises(InvalidArgumentError, match=message):
        parse_sweeps(specs, build_parser(), given=frozenset(given))


@pytest.mark.parametrize(
    "argv",
    [
        ["--sweep", "num_gpu_blocks=64,0"],  # the second configuration is out of range
        ["--sweep", "max_num_batched_tokens=2048,8", "--max-num-seqs", "16"],  # fewer tokens than sequences
        ["--sweep", "block_size=16,32", "--compare", "reference,fast"],
        ["--sweep", "block_size=16", "--workers", "0"],
        ["--sweep", "block_size=16", "--manager", "fastt"],
    ],
)
def test_a_bad_configuration_stops_the_sweep_before_any_run(argv, tmp_path, capsys):
    assert blockspace(["simulate", *SMALL, "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert not (tmp_path / "sweep").exists()


def single_run(num_gpu_blocks: int, caching: bool, slo: str | None = None) -> dict:
    """The summary of one run, as the sweep's JSON holds it."""
    args = build_parser().parse_args(
        [*SMALL, "--num-gpu-blocks", str(num_gpu_blocks)] + ([] if caching else ["--no-enable-prefix-caching"])
    )
    fast = load_manager_class("fast")
    config = replace(simulation_config(args, record_tables=False), engine=resolve(args.engine, fast, args.step))
    result = replay(load_trace(None, 12), fast, config)
    return summarize(result, None if slo is None else parse_slo(slo)).to_json()


def test_a_sweep_in_worker_processes_gives_the_figures_of_single_runs(tmp_path, capsys):
    argv = ["simulate", *SMALL, "--out", str(tmp_path), "--workers", "2"]
    argv += ["--sweep", "num_gpu_blocks=600,4000", "--sweep", "enable_prefix_caching=on,off"]
    assert blockspace(argv) == 0
    document = json.loads((tmp_path / "sweep.json").read_text())
    assert [run["values"] for run in document["runs"]] == [
        {"num_gpu_blocks": 600, "enable_prefix_caching": True},
        {"num_gpu_blocks": 600, "enable_prefix_caching": False},
        {"num_gpu_blocks": 4000, "enable_prefix_caching": True},
        {"num_gpu_blocks": 4000, "enable_prefix_caching": False},
    ]
    volatile = ("manager_time", "manager_startup_s", "wall_s")
    for run in document["runs"]:
        alone = single_run(run["values"]["num_gpu_blocks"], run["values"]["enable_prefix_caching"])
        assert {k: v for k, v in run["summary"].items() if k not in volatile} == {
            k: v for k, v in alone.items() if k not in volatile
        }
    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    headlines = {"finished", "ignored", "ttft_p99_s", "e2e_p50_s", "hit_rate_pct", "preemptions", "peak_kv_use_pct"}
    assert len(rows) == 4 and headlines <= set(rows[0])
    assert "slo_attainment_pct" not in rows[0]  # no --slo, no SLO columns
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == [f"run-{k}.json" for k in range(4)]
    assert (tmp_path / "sweep.png").stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "4 runs" in printed and "2 worker(s)" in printed and printed.count("/4]") == 4


def test_the_ray_executor_uses_rays_pool(tmp_path, monkeypatch, capsys):
    """With Ray installed, its ``Pool`` runs the sweep (here a stand-in with
    Ray's interface: a thread pool); without it, one error line."""
    for name in ("ray", "ray.util", "ray.util.multiprocessing"):  # Ray absent, even where a test imported it
        monkeypatch.setitem(sys.modules, name, None)
    argv = ["simulate", *SMALL, "--no-plot", "--out", str(tmp_path), "--executor", "ray", "--sweep", "block_size=16,32"]
    assert blockspace(argv) == 2 and "pip install 'blockspace[ray]'" in capsys.readouterr().err
    used = []

    class Pool(ThreadPool):
        def __init__(self, processes: int, initializer: object = None) -> None:
            used.append(processes)
            assert initializer is executor.mark_pool_worker  # Ray's workers run their fleets a replica at a time
            super().__init__(processes)  # not run here: these threads share this process's flag

    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: True  # joined already: the pool is all the sweep asks of it
    ray.util = types.ModuleType("ray.util")
    ray.util.multiprocessing = types.ModuleType("ray.util.multiprocessing")
    ray.util.multiprocessing.Pool = Pool
    for name, module in (("ray", ray), ("ray.util", ray.util), ("ray.util.multiprocessing", ray.util.multiprocessing)):
        monkeypatch.setitem(sys.modules, name, module)
    assert blockspace([*argv, "--workers", "2"]) == 0
    assert used == [2] and len(json.loads((tmp_path / "sweep.json").read_text())["runs"]) == 2


def test_the_trace_options_can_be_swept_too(tmp_path, capsys):
    """``max_requests`` and ``time_scale`` change each run's requests (one
    load per value), and each run has the figures of a single run."""
    argv = ["simulate", "--max-output-len", "8", "--quiet", "--no-plot", "--out", str(tmp_path), "--workers", "1"]
    assert blockspace([*argv, "--sweep", "max_requests=4,40", "--sweep", "time_scale=1,3"]) == 0
    runs = json.loads((tmp_path / "sweep.json").read_text())["runs"]
    assert [r["summary"]["requests"]["arrived"] for r in runs] == [4, 4, 40, 40]
    ttft = [r["summary"]["ttft_s"]["mean"] for r in runs if r["values"]["max_requests"] == 40]
    assert ttft[1] < ttft[0]  # arrivals three times as far apart: less time queueing
    assert "runs of 4-40 requests" in capsys.readouterr().out


def test_the_table_and_csv_count_the_requests_each_run_did_not_serve(tmp_path, capsys):
    """Latencies are over finished requests, so a pool too small for some
    prompts (600 blocks: 6 of the 12 are ignored) looks faster than a large
    one; the counts, the attainment and the goodput (over every request)
    sit beside them, with the figures of single runs."""
    slo = "ttft=1.5s,tpot=200ms"
    argv = ["simulate", *SMALL, "--quiet", "--no-plot", "--out", str(tmp_path), "--workers", "1", "--slo", slo]
    assert blockspace([*argv, "--sweep", "num_gpu_blocks=600,4000"]) == 0
    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    first = ["num_gpu_blocks", "finished", "ignored", "aborted", "saturated", "slo_attainment_pct", "goodput_req_per_s"]
    assert list(rows[0])[:7] == first, list(rows[0])
    for row in rows:
        alone = single_run(int(row["num_gpu_blocks"]), caching=True, slo=slo)
        assert [int(row[k]) for k in ("finished", "ignored", "aborted")] == [
            alone["requests"][k] for k in ("finished", "ignored", "aborted")
        ]
        assert float(row["slo_attainment_pct"]) == pytest.approx(100 * alone["slo"]["attainment"])
        assert float(row["goodput_req_per_s"]) == pytest.approx(alone["slo"]["goodput_requests_per_s"])
    small, large = rows
    assert (small["finished"], small["ignored"], large["finished"], large["ignored"]) == ("6", "6", "11", "1")
    assert float(small["ttft_p50_s"]) < float(large["ttft_p50_s"])  # the bias the counts expose
    assert 0 < float(small["slo_attainment_pct"]) < float(large["slo_attainment_pct"]) < 100
    printed = capsys.readouterr().out.splitlines()
    header = next(line for line in printed if line.startswith("num_gpu_blocks"))
    assert header.split()[:7] == first
    assert any("over each run's finished requests" in line for line in printed)
    assert any(line.startswith(f"SLO {slo}: attainment over all") for line in printed)
