"""The kit catches deliberately broken managers, each with a short repro
that runs on its own."""

import pytest

from blockspace.conformance import Divergence
from blockspace.conformance.broken import FifoFreeList, WatermarkOffByOne
from blockspace.conformance.runner import PROFILES, run_machine

MAX_REPRO_CALLS = 8


@pytest.mark.parametrize(
    "broken",
    [FifoFreeList, pytest.param(WatermarkOffByOne, marks=pytest.mark.slow)],  # its shrink takes ~2 minutes
    ids=lambda cls: cls.__name__,
)
def test_broken_manager_is_caught_with_a_short_repro(broken):
    result = run_machine(
        {"reference": "reference", "broken": broken}, "plain", PROFILES["quick"], max_examples=200, stateful_step_count=20
    )
    assert result.status == "failed"
    repro = result.detail.split("Repro (runnable):\n", 1)[1]
    num_calls = sum(1 for line in repro.splitlines() if line.startswith("lock.call("))
    assert 1 <= num_calls <= MAX_REPRO_CALLS, repro
    with pytest.raises(Divergence):
        exec(compile(repro, "<repro>", "exec"), {})


def test_reference_against_itself_passes():
    result = run_machine({"reference": "reference", "again": "reference"}, "plain", PROFILES["quick"], max_examples=20)
    assert result.status == "passed", result.detail
    assert result.examples >= 20
