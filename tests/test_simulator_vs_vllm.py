"""scripts/simulator_vs_vllm.py: the simulator's decisions are vLLM 0.9.2's
real Scheduler's, step for step, block tables included.

Runs only where vLLM 0.9.2 imports (a venv set up by hand, see docs/performance.md).
"""

from __future__ import annotations

import json
import runpy
import sys
from collections import deque
from pathlib import Path

import pytest

NEEDS = "needs vLLM 0.9.2 (a venv set up by hand, see docs/performance.md)"
vllm = pytest.importorskip("vllm", reason=NEEDS)
if getattr(vllm, "__version__", None) != "0.9.2":
    pytest.skip(f"{NEEDS}; this is vLLM {getattr(vllm, '__version__', '?')}", allow_module_level=True)
pytest.importorskip("vllm.core.scheduler", reason=NEEDS)

from blockspace.simulator.scheduler import Scheduler  # noqa: E402

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "simulator_vs_vllm.py"


def compare(*argv: str) -> int:
    sys.argv = [str(SCRIPT), *argv]
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    except SystemExit as done:
        return int(done.code or 0)
    return 0


@pytest.mark.parametrize("caching", ["on", "off"])
def test_the_simulator_decides_as_vllms_scheduler(caching, capsys):
    assert compare("--requests", "60", "--caching", caching) == 0
    assert "every decision and block table identical (both engines)" in capsys.readouterr().out


@pytest.mark.parametrize("caching", ["on", "off"])
def test_parallel_sampling_decides_as_vllms_scheduler(caching, capsys):
    """n=3: vLLM's ``ParallelSampleSequenceGroup.add_request`` makes three
    groups of one sequence per request; the simulator makes the same, with the
    same ids, order and sequence ids (block tables are compared by them)."""
    assert compare("--requests", "40", "--n", "3", "--caching", caching) == 0
    out = capsys.readouterr().out
    assert "40 requests, n=3" in out and "every decision and block table identical (both engines)" in out


def test_parallel_sampling_with_swapping_decides_as_vllm(tmp_path, capsys):
    """24 small requests in three shared prompts, n=3, 60 GPU blocks: the
    samples are swapped out and in many times."""
    trace = tmp_path / "small.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 100 * i, "input_length": 100 + 37 * (i % 7),
                                         "output_length": 30 + 11 * (i % 5), "hash_ids": [i % 3]}) + "\n"
                             for i in range(24)))  # fmt: skip
    argv = ("--trace", str(trace), "--requests", "24", "--n", "3", "--caching", "off", "--preemption-mode", "swap")
    assert compare(*argv, "--num-gpu-blocks", "60", "--num-cpu-blocks", "200", "--max-num-batched-tokens", "512") == 0
    out = capsys.readouterr().out
    assert "swap preemption" in out and "identical" in out
    assert int(out.split(" preemptions")[0].rsplit(" ", 1)[-1].replace(",", "")) > 10, out


def test_samples_queued_in_another_order_depart_from_vllm(monkeypatch, capsys):
    """The check sees the order of the samples: queued last to first, the
    simulator's decisions part from vLLM's."""
    from blockspace.simulator.simulation import Simulation

    arrive = Simulation._arrive
    monkeypatch.setattr(Simulation, "_arrive", lambda self, entry: arrive(self, entry)[::-1])
    assert compare("--requests", "10", "--n", "2", "--caching", "off") == 1
    assert "differ" in capsys.readouterr().out


def test_freeing_in_running_queue_order_departs_from_vllm(monkeypatch, capsys, tmp_path):
    """The check can fail: with the simulator's old free order (running-queue
    order), the block tables part from vLLM's once a prefill with one output
    token finishes in the same step as an older request (the three requests
    of tests/test_simulator_schedule.py's free-order test)."""
    trace = tmp_path / "three.jsonl"
    lines = [(0, 20, 2, 1), (500, 20, 1, 2), (2500, 20, 1, 3)]
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": o, "hash_ids": [h]}) + "\n"
                             for t, n, o, h in lines))  # fmt: skip
    argv = ("--trace", str(trace), "--requests", "3", "--caching", "off", "--num-gpu-blocks", "10", "--step-ms", "1000")
    assert compare(*argv) == 0
    assert "identical" in capsys.readouterr().out

    def old_free_finished(self, finished_seqs):
        pending = {seq.seq_id for seq in finished_seqs}
        done, remaining = [], deque()
        for request in self.running:
            for seq in request.seqs:
                if seq.seq_id in pending:
                    self._free(seq)
            (done if request.is_finished() else remaining).append(request)
        self.running = remaining
        self.records[-1].finished.extend(r.request_id for r in done)
        return done

    monkeypatch.setattr(Scheduler, "free_finished", old_free_finished)
    assert compare(*argv) == 1
    assert "block tables differ" in capsys.readouterr().out
