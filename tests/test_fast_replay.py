"""The reference and the fast manager in lockstep on a replay of the Mooncake
trace: prompts built from the trace's chunk ids (equal chunk id, equal 512
tokens), served by the same small v0-style scheduler the benchmark uses."""

from __future__ import annotations

from typing import Any

import pytest
from test_fast_lockstep import Twins

from blockspace.bench import load_requests, replay, trace_path

pytestmark = pytest.mark.skipif(not trace_path().exists(), reason="the Mooncake trace sample is not available")


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
