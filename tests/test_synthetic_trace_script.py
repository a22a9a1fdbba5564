"""``scripts/synthetic_trace.py``: a synthetic workload written as a trace
file reads back as the very requests ``workloads.synthetic`` makes (arrivals
to the millisecond, a trace's unit), and a bad argument writes nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from blockspace.workloads import load_trace, synthetic

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "synthetic_trace.py"


def test_the_trace_written_is_the_synthetic_workload(tmp_path):
    out = tmp_path / "synthetic.jsonl"
    argv = [sys.executable, str(SCRIPT), str(out), "--requests", "60", "--input-len", "4096", "--output-len", "256",
            "--input-len-std", "1024", "--output-len-std", "64", "--shared-prefix-ratio", "0.5", "--prefix-groups",
            "2", "--turns", "3", "--turn-gap", "30", "--rate", "2", "--seed", "1"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    made = synthetic(60, input_len=4096, output_len=256, input_len_std=1024.0, output_len_std=64.0,
                     shared_prefix_ratio=0.5, prefix_groups=2, turns=3, turn_gap=30.0, rate=2.0, seed=1)  # fmt: skip
    read = load_trace(out)
    assert [(e.input_length, e.output_length, e.hash_ids) for e in read] == [
        (e.input_length, e.output_length, e.hash_ids) for e in made
    ]
    assert [e.arrival_s for e in read] == [round(e.arrival_s * 1000) / 1000 for e in made]


def test_a_bad_argument_says_error_and_writes_nothing(tmp_path):
    out = tmp_path / "synthetic.jsonl"
    done = subprocess.run([sys.executable, str(SCRIPT), str(out), "--requests", "0"], capture_output=True, text=True,
                          check=False)  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith("error: ") and "Traceback" not in done.stderr
    assert not out.exists()


def test_ctrl_c_exits_130_with_no_traceback_and_no_file(tmp_path):
    """Ctrl-C while the modules load, and while the requests are made: exit
    130 at once, nothing said but the shell's, no file (800,000 requests take
    seconds, so each signal lands before the write)."""
    out = tmp_path / "synthetic.jsonl"
    argv = [sys.executable, str(SCRIPT), str(out), "--requests", "800000", "--input-len", "256", "--turns", "4"]
    for delay in (0.15, 1.5):
        child = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
        time.sleep(delay)
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=30)
        assert child.returncode == 130, (delay, stderr[-500:])
        assert "Traceback" not in stderr
        assert not out.exists()
