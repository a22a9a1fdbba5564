"""``python -m blockspace.bench.kernel_floor``: the time inside fast's
kernels during a replay, kernel by kernel, with the kernels put back after."""

from __future__ import annotations

import json

from blockspace.bench.kernel_floor import main
from blockspace.fast import kernels
from blockspace.interfaces import load_manager_class
from blockspace.simulator import SimulationConfig, load_trace, run_simulation


def test_it_times_the_kernels_of_the_same_replay_and_puts_them_back(tmp_path, capsys):
    plain = run_simulation(load_trace(None, 20), load_manager_class("fast"), SimulationConfig(49_152, 2_048))
    before = dict(vars(kernels))  # after a replay: each name bound to its compiled entry point (fast/dispatch.py)
    path = tmp_path / "floor.json"
    assert main(["--max-requests", "20", "--json", str(path)]) == 0
    figures = json.loads(path.read_text())
    assert "inside the kernels" in capsys.readouterr().out
    assert figures["steps"] == len(plain.records) and figures["requests"] == 20
    called = figures["kernels"]
    assert {"allocate", "append_batch", "num_cached_tokens", "free_table"} <= set(called)
    assert called["allocate"]["calls"] >= 20 and called["free_table"]["calls"] >= 20  # the warm-up's calls too
    assert 0 < figures["kernels_s"] < figures["replay_s"]
    assert {name: value for name, value in vars(kernels).items() if name in before} == before  # put back
