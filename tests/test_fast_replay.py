"""The reference and the fast manager in lockstep on a replay of the Mooncake
trace: prompts built from the trace's chunk ids (equal chunk id, equal 512
tokens), served by the same small v0-style scheduler the benchmark uses."""

from __future__ import annotations

from typing import Any

import pytest
from test_fast_lockstep import Twins

from blockspace.bench.replay import load_requests, replay


class AsManager:
    """Twins behind a manager's interface: every method call is a lockstep call."""

    def __init__(self, twins: Twins) -> None:
        self.twins = twins

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.twins(name, *args)


@pytest.mark.parametrize(
    "caching, num_gpu_blocks",
    [(True, 2048), (True, 700), (False, 1500)],
    ids=["caching", "caching-tight", "plain"],
)
def test_mooncake_replay_lockstep(caching, num_gpu_blocks):
    requests = load_requests(100)
    assert len(requests) == 100 and len(requests[0][0]) == 6758
    twins = Twins(16, num_gpu_blocks, 256, enable_caching=caching, snapshot_every=97, check_every=499)
    num_calls = replay(AsManager(twins), requests, max_running=8, max_output=6, caching=caching)
    assert num_calls == len(twins.log) - 1 > 1000
    twins.compare_snapshots()
    twins.fast.check_invariants()
    if caching:
        rates = [twins("get_prefix_cache_hit_rate", "GPU")]
        assert 0.0 < rates[0] < 1.0  # the trace's shared prefixes hit


@pytest.mark.slow
def test_mooncake_replay_lockstep_long():
    requests = load_requests(200)
    twins = Twins(16, 3000, 512, enable_caching=True, snapshot_every=50, check_every=1000)
    replay(AsManager(twins), requests, max_running=16, max_output=64)


def test_floor_serves_the_recorded_replay():
    """The bench's floor (blockspace/bench/floor.py) sees the very calls the
    fast manager saw, answers each as recorded (table answers as they were
    kept, copy-on-write pairs in fresh lists), and uses up the recording exactly."""
    from blockspace.bench.floor import Floor, Recorder
    from blockspace.block_ids import BlockIds
    from blockspace.fast import FastBlockSpaceManager

    requests = load_requests(12)
    recorder = Recorder(FastBlockSpaceManager(16, 700, 64, enable_caching=True))
    num_calls = replay(recorder, requests, max_running=4, max_output=8)
    served = Recorder(Floor(recorder.answers))
    assert replay(served, requests, max_running=4, max_output=8) == num_calls
    assert served.answers == recorder.answers
    pairs = [(a, b) for a, b in zip(served.answers, recorder.answers) if isinstance(a, list)]
    assert all(a is b for a, b in pairs if isinstance(b, BlockIds)) and any(isinstance(b, BlockIds) for _, b in pairs)
    assert all(a is not b for a, b in pairs if not isinstance(b, BlockIds))
    with pytest.raises(StopIteration):
        served.get_num_free_gpu_blocks()


@pytest.mark.bench
def test_bench_quick_writes_its_report(tmp_path):
    from blockspace.bench.cli import main

    report = tmp_path / "performance.md"
    assert main(["--quick", "--markdown", str(report), "--json", str(tmp_path / "bench.json")]) == 0
    assert "floor" in report.read_text()
