"""The kernels also run as plain Python (``NUMBA_DISABLE_JIT=1``) and agree
with the reference there too: a short lockstep walk in a fresh process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import pytest_in_subprocess

WALK = """
import test_fast_lockstep as t
for name in {names!r}:
    m = t.walk(t.CONFIGS[name], seed=3, num_steps={num_steps})
    print(name, len(m.log))
"""


@pytest.mark.parametrize("names", [("plain-bs4", "caching-bs4"), ("window-bs4", "encoder-decoder-bs4", "caching-bs1")])
def test_lockstep_without_jit(names):
    tests = Path(__file__).parent
    env = dict(
        os.environ, NUMBA_DISABLE_JIT="1", PYTHONPATH=os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])
    )
    done = subprocess.run(
        [sys.executable, "-c", WALK.format(names=names, num_steps=25)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.split("\n")
    assert [line.split()[0] for line in lines if line] == list(names)
    assert all(int(line.split()[1]) > 50 for line in lines if line)


def test_row_steps_and_parked_rows_without_jit():
    tests = Path(__file__).parent
    done = pytest_in_subprocess(tests / "test_fast_rows.py", tests / "test_fast_tracker.py", NUMBA_DISABLE_JIT="1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout and "failed" not in done.stdout
