"""Ctrl-C (blockspace/interrupts.py): every command ends within 2 s of one
SIGINT sent to its whole process group, as a terminal sends it, with one
``interrupted:`` line, exit status 130 and no traceback; a sweep or a
search keeps the runs that finished, marked incomplete; no file is left
half-written (blockspace/outputs.py).

Each command runs in a process group of its own (``start_new_session``), gets
its work going, and is interrupted once a line or its worker processes
show the work has started. The runs use the reference manager on the
Python engine: no compiled code, so the tests time the same with Numba's
JIT off. The requests are small, so the command reaches its marker in
seconds; the runs it is stopped in are long, so it cannot finish first.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from blockspace.interrupts import INTERRUPTED
from blockspace.outputs import PARTIAL, replacing, write_text
from helpers import processes

WITHIN_S = 2.0  # from the signal to the exit
MARKER_S = 300.0  # the most a command may take to show its work started (a busy CI machine, no JIT)
REPLAY = ["--manager", "reference", "--engine", "python", "--num-gpu-blocks", "4096", "--no-plot"]


@dataclass
class Stopped:
    status: int
    seconds: float  # from the signal to the exit
    out: str
    err: str


def workers_of(pid: int) -> list[int]:
    """The worker processes of ``pid``: its children (Linux's /proc) but
    Python's resource tracker, which a spawned pool starts beside them."""
    return [child for child, parent, args in processes() if parent == pid and "resource_tracker" not in args]


def heard() -> None:
    """SIGINT as a terminal's command has it. A shell without job control
    (a script's ``cmd &``, as CI's lanes run) starts its background commands
    with SIGINT ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt(argv: list[str], marker: str | None = None, workers: int = 0) -> Stopped:
    """Run ``blockspace ARGV`` in a new process group; once a line of its output
    matches ``marker`` (and it has ``workers`` child processes), send SIGINT
    to that group and time the exit."""
    process = subprocess.Popen(
        [sys.executable, "-m", "blockspace", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),  # each line as printed: the marker shows when it happens
        preexec_fn=heard,
    )
    out: list[str] = []
    err: list[str] = []
    seen = threading.Event()
    if marker is None:
        seen.set()

    def read_out() -> None:
        for line in process.stdout or ():
            out.append(line)
            if marker is not None and re.search(marker, line):
                seen.set()

    def read_err() -> None:
        err.extend(process.stderr or ())

    readers = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True)]
    for reader in readers:
        reader.start()
    try:
        deadline = time.monotonic() + MARKER_S
        while not (seen.is_set() and len(workers_of(process.pid)) >= workers):
            assert process.poll() is None, f"ended before it was interrupted:\n{''.join(out)}{''.join(err)}"
            assert time.monotonic() < deadline, f"no sign of work after {MARKER_S:.0f} s:\n{''.join(out)}"
            time.sleep(0.02)
        os.killpg(process.pid, signal.SIGINT)
        sent = time.monotonic()
        try:
            status = process.wait(timeout=30)
        finally:
            seconds = time.monotonic() - sent
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    for reader in readers:
        reader.join(timeout=5)
    return Stopped(status, seconds, "".join(out), "".join(err))


def assert_stopped_cleanly(stopped: Stopped, tmp_path: Path) -> str:
    """Exit 130 within ``WITHIN_S``, one ``interrupted:`` line on stderr and
    nothing else, no temporary file left; returns that line."""
    assert stopped.status == INTERRUPTED, stopped.err
    assert stopped.seconds < WITHIN_S, f"{stopped.seconds:.2f} s from SIGINT to exit"
    assert "Traceback" not in stopped.err
    lines = stopped.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted: "), stopped.err
    assert not [path for path in tmp_path.rglob("*") if PARTIAL in path.name]
    return lines[0]


def trace(tmp_path: Path, count: int) -> Path:
    """``count`` requests 10 ms apart, 64 tokens in and 32 out, each its own prefix."""
    path = tmp_path / "trace.jsonl"
    lines = [{"timestamp": 10 * i, "input_length": 64, "output_length": 32, "hash_ids": [i]} for i in range(count)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_single_run_stops_at_once_without_a_traceback(tmp_path):
    out = tmp_path / "out"
    argv = ["simulate", "--trace", str(trace(tmp_path, 5000)), *REPLAY, "--out", str(out)]
    stopped = interrupt(argv, r"^replaying ")
    assert assert_stopped_cleanly(stopped, tmp_path) == "interrupted: stopped by Ctrl-C"
    assert not (out / "simulation.json").exists()  # the run did not finish: nothing to write


def test_a_sweep_keeps_its_finished_runs_marked_incomplete(tmp_path):
    """Three runs on two workers: 10 requests, then 4,000 and 3,999 that
    cannot finish before the signal, sent once the first is done."""
    out = tmp_path / "out"
    argv = ["simulate", "--trace", str(trace(tmp_path, 4000)), *REPLAY, "--out", str(out)]
    stopped = interrupt([*argv, "--sweep", "max_requests=10,4000,3999", "--workers", "2"], r"^\[1/3\] ")
    said = assert_stopped_cleanly(stopped, tmp_path)
    assert said.startswith("interrupted: 1 of 3 runs finished, kept in ") and "marked incomplete" in said
    assert "incomplete: Ctrl-C stopped the sweep after 1 of 3 runs" in stopped.out
    figures = json.loads((out / "sweep.json").read_text())
    assert figures["complete"] is False
    assert [run["values"] for run in figures["runs"]] == [{"max_requests": 10}]
    with open(out / "sweep.csv", newline="") as handle:
        assert [row["max_requests"] for row in csv.DictReader(handle)] == ["10"]
    assert sorted(path.name for path in (out / "sweep").iterdir()) == ["run-0.json"]
    assert not (out / "sweep.png").exists()


@pytest.mark.parametrize(
    "search, argv, answer, workers",
    [
        ("max-rate", ["--max-requests", "200"], "max rate", 0),
        ("min-replicas", ["--max-requests", "1000", "--time-scale", "0.05"], "min replicas", 2),
    ],
)
def test_a_search_keeps_the_points_it_tried_marked_incomplete(tmp_path, search, argv, answer, workers):
    """Stopped in its second round, a search writes capacity.json with its
    first round's points, marked incomplete, and names no answer. The
    signal comes as the round's workers are made (max-rate), or once they
    run (min-replicas: where pool.join() waited for ever)."""
    out = tmp_path / "out"
    command = ["simulate", "--trace", str(trace(tmp_path, 1000)), *REPLAY, *argv, "--out", str(out)]
    stopped = interrupt([*command, "--find", search, "--slo", "ttft=50ms", "--workers", "2"], r"^  tried ", workers)
    said = assert_stopped_cleanly(stopped, tmp_path)
    assert re.fullmatch(rf"interrupted: \d+ finished run\(s\) kept in {re.escape(str(out))}/capacity\.json, "
                        "marked incomplete", said)  # fmt: skip
    assert f"{answer}: incomplete: Ctrl-C stopped the search after" in stopped.out
    figures = json.loads((out / "capacity.json").read_text())
    (found,) = figures["configurations"]
    assert figures["complete"] is False and found["complete"] is False
    assert found["runs"] == len(found["curve"]) >= 2  # the first round's two points at least
    assert not (out / "capacity.png").exists()


def test_the_conformance_command_stops_its_explorer_workers(tmp_path):
    """Interrupted while the explorer's two worker processes expand a layer."""
    report = tmp_path / "report.json"
    argv = ["conformance", "--impl", "reference", "--against", "reference", "--scope", "default",
            "--only", "explore", "--workers", "2", "--json", str(report)]  # fmt: skip
    stopped = interrupt(argv, workers=2)
    assert assert_stopped_cleanly(stopped, tmp_path) == "interrupted: stopped by Ctrl-C"
    assert not report.exists()  # the report of a run that did not end is not written


def test_an_output_is_written_whole_or_not_at_all(tmp_path):
    """A writer that stops half-way leaves the earlier file as it was and no temporary file."""
    path = tmp_path / "figures.json"
    write_text(path, "earlier\n")
    with pytest.raises(KeyboardInterrupt), replacing(path) as partial:
        partial.write_text("half of")
        raise KeyboardInterrupt
    assert path.read_text() == "earlier\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figures.json"]
    write_text(path, "later\n")
    assert path.read_text() == "later\n" and sorted(p.name for p in tmp_path.iterdir()) == ["figures.json"]


# Writes that are not a command's output: a mutant's copy of the package in its own
# work folder (restored after), and the peer benchmark's trace in a temporary folder.
SCRATCH = {("conformance/mutation.py", 3), ("blockspace/bench/peer.py", 1)}


def test_every_commands_output_is_written_through_outputs():
    """A file a command is asked to write goes through ``outputs.write_text``
    or ``outputs.replacing``: an ``open(..., "w")``, ``json.dump`` or
    ``.write_text`` elsewhere could leave half a file at Ctrl-C (the soak
    and mutation commands did, 2026-12-06)."""
    root = Path(__file__).resolve().parent.parent
    bare = re.compile(r"""open\([^)]*["'][wa]b?["']|json\.dump\(|\.write_text\(|\.savefig\((?!partial)""")
    found = set()
    for folder in ("blockspace", "conformance", "fast", "reference", "simulator"):
        for path in sorted((root / folder).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            if name == "blockspace/outputs.py":
                continue
            lines = [line for line in path.read_text().splitlines() if bare.search(line) and "partial" not in line]
            if lines:
                found.add((name, len(lines)))
    assert found == SCRATCH


def test_a_ctrl_c_that_compiled_code_reports_as_a_system_error_is_a_ctrl_c(monkeypatch, tmp_path, capsys):
    """Ctrl-C while Numba's compiled code calls back into Python (its cache loading) reaches the
    command as a SystemError caused by the KeyboardInterrupt: it ends the run with 130, not as a
    failed run with 1."""
    from blockspace.cli import main
    from blockspace.interrupts import raised_by_ctrl_c
    from blockspace.simulator import cli as simulate

    def interrupted(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as stop:
            raise SystemError("<function _numba_unpickle> returned a result with an exception set") from stop

    assert not raised_by_ctrl_c(SystemError("no cause"))
    monkeypatch.setattr(simulate, "_run", interrupted)
    assert main(["simulate", "--max-requests", "2", "--no-plot", "--quiet", "--out", str(tmp_path / "out")]) == 130
    assert capsys.readouterr().err.startswith("interrupted: ")
    assert not (tmp_path / "out").exists()
