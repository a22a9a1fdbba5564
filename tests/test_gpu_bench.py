"""``blockspace gpu-bench`` runs anywhere: without a GPU it says so and runs
a tiny CPU-only version, exit status 0, with the JSON it promises."""

from __future__ import annotations

import json

from blockspace.cli import main as blockspace
from blockspace.fast.device_table import gpu_available


def test_gpu_bench_runs_and_writes_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert blockspace(["gpu-bench", "--seqs", "16", "--steps", "5", "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(path.read_text())
    assert report["mode"] == ("gpu" if gpu_available() else "cpu-only")
    if not gpu_available():
        assert "NO CUDA GPU" in printed and report["environment"]["gpu"] is None
    tables = report["tables"]
    assert tables["num_seqs"] == 16 and tables["slots_equal"] and tables["table_equal"]
    assert tables["ours_latency_us_median"] > 0 and tables["vllm_v0_latency_us_median"] > 0
    for row in report["copies"]:
        for move in ("copy", "swap_out", "swap_in"):
            if move in row:
                assert row[move]["kernel_correct"] and row[move]["kernel_ms"] > 0
