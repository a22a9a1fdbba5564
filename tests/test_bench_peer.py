"""``python -m blockspace.bench.peer``: bad options refused before anything
is timed, a real tiny run's table, the mocker's absence said once, and a
failed replay as exit 1; each through ``main``, the command's entry."""

from __future__ import annotations

import json
import re
import sys

import pytest

from blockspace.bench import peer


def one_error_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


@pytest.fixture
def nothing_timed(monkeypatch):
    """A refused option must be refused before any replay runs."""

    def refuse_to_run(*args, **kwargs):
        raise AssertionError("timed before the options were checked")

    monkeypatch.setattr(peer, "measure", refuse_to_run)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--requests", "10,abc"], "'abc' is neither a whole number nor 'all'"),
        (["--requests", "0"], "--requests: 0 must be >= 1"),
        (["--requests", "201"], "--requests 201: the trace the bundled mooncake_sample.jsonl holds 200 requests"),
        (["--rounds", "0"], "--rounds must be >= 1, got 0"),
        (["--rounds", "two"], "--rounds: invalid int value: 'two'"),
        (["--nosuch"], "unrecognized arguments: --nosuch"),
        (["--replicas", "0"], "--replicas must be >= 1, got 0"),
        (["--router", "kv_aware"], "--router goes with --replicas above 1"),
        (["--router", "least_loaded", "--replicas", "2"], "invalid choice: 'least_loaded'"),
    ],
)
def test_a_bad_option_exits_2_with_one_error_line(monkeypatch, capsys, nothing_timed, argv, said):
    monkeypatch.delenv("BLOCKSPACE_TRACE", raising=False)
    assert peer.main(argv) == 2
    captured = capsys.readouterr()
    assert said in one_error_line(captured.err) and captured.out == ""


def test_a_missing_trace_is_refused(tmp_path, capsys, nothing_timed):
    assert peer.main(["--trace", str(tmp_path / "nosuch.jsonl"), "--requests", "5"]) == 2
    assert "cannot read trace" in one_error_line(capsys.readouterr().err)


def test_a_bad_trace_line_is_refused(tmp_path, capsys, nothing_timed):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}\nnot json\n')
    assert peer.main(["--trace", str(trace), "--requests", "1"]) == 2
    assert "line 2: not valid JSON" in one_error_line(capsys.readouterr().err)


def test_an_unwritable_out_is_refused_first(tmp_path, capsys, nothing_timed):
    assert peer.main(["--out", str(tmp_path)]) == 2  # a folder
    assert "is a folder" in one_error_line(capsys.readouterr().err)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # the trace is missing too: --out is checked first, so it is what is said
    argv = ["--out", str(blocker / "peer.md"), "--trace", str(tmp_path / "nosuch.jsonl")]
    assert peer.main(argv) == 2
    assert "is not a folder" in one_error_line(capsys.readouterr().err)


ROW = re.compile(
    r"^\| 20 \| (?P<mocker>[-0-9.]+) \| (?P<mocker_command>[-0-9.]+) \| (?P<replay>[0-9.]+) \| (?P<command>[0-9.]+) "
    r"\| (?P<ratio>\S+) \| (?P<commands>\S+) \| (?P<python>[-0-9.]+) \| (?P<python_ratio>\S+) \| (?P<floor>[0-9.]+) "
    r"\| (?P<floor_ratio>\S+) \|$",
    re.M,
)


def test_a_tiny_run_prints_the_table_and_writes_it(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("BLOCKSPACE_TRACE", raising=False)
    out = tmp_path / "peer.md"
    assert peer.main(["--requests", "20", "--rounds", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.read_text() == printed
    row = ROW.search(printed)
    assert row, printed
    replay, command, python = float(row["replay"]), float(row["command"]), float(row["python"])
    assert 0 < replay < command  # the replay is part of the command's wall time
    assert 0 < float(row["floor"]) < python  # making the prompts' tokens is part of the Python engine's replay
    if peer.mocker_installed():
        mocker = float(row["mocker"])
        assert mocker > 0, printed
        for engine_s, ratio in ((replay, row["ratio"]), (python, row["python_ratio"])):
            assert re.fullmatch(r"[0-9]+\.[0-9]{2}x", ratio), printed
            assert float(ratio[:-1]) == pytest.approx(engine_s / mocker, rel=0.1, abs=0.01)  # the table's rounding
        assert row["floor_ratio"].endswith("x")
        commands = float(row["commands"][:-1])
        assert commands == pytest.approx(command / float(row["mocker_command"]), rel=0.1, abs=0.01)
        assert "not installed" not in printed
    else:
        assert row["mocker"] == row["ratio"] == row["python_ratio"] == row["floor_ratio"] == row["commands"] == "-"
        assert printed.count("the mocker is not installed") == 1


def test_without_the_mocker_ours_is_timed_alone_and_said_once(monkeypatch, capsys):
    monkeypatch.delenv("BLOCKSPACE_TRACE", raising=False)
    monkeypatch.setattr(peer, "mocker_installed", lambda: False)
    assert peer.main(["--requests", "5", "--rounds", "1", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["mocker"] is False and peer.INSTALL in figures["note"]
    (row,) = figures["rows"]
    assert row["requests"] == 5 and "mocker" not in row and "ratios" not in row and "floor_ratio" not in row
    assert 0 < row["token_floor_s"] < row["python"]["replay_s"]
    for engine in peer.ENGINES:
        assert row[engine]["finished"] == 5 and row[engine]["replay_s"] > 0


def test_a_failed_replay_exits_1(monkeypatch, capsys):
    monkeypatch.delenv("BLOCKSPACE_TRACE", raising=False)
    monkeypatch.setattr(sys, "executable", "false")  # every subprocess exits 1 at once
    assert peer.main(["--requests", "5", "--rounds", "1"]) == 1
    err = capsys.readouterr().err  # the progress lines, then the error
    assert "Traceback" not in err and err.count("error: ") == 1
    assert err.splitlines()[-1] == "error: blockspace simulate exited 1: (nothing on stderr)"


def test_a_fleet_is_timed_on_the_compiled_engine_against_the_mockers_workers(monkeypatch, capsys):
    """Issue #54: ``--replicas 2 --router kv_aware`` runs ours with that fleet and the mocker with 2
    workers behind its KV router; the Python engine is left out (a fleet takes it minutes)."""
    monkeypatch.delenv("BLOCKSPACE_TRACE", raising=False)
    assert peer.main(["--requests", "20", "--rounds", "1", "--replicas", "2", "--router", "kv_aware", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    (row,) = figures["rows"]
    assert figures["replicas"] == 2 and figures["router"] == "kv_aware" and "python" not in row
    assert "token_floor_s" not in row and "floor_ratio" not in row  # it bounds the Python engine only
    assert row["compiled"]["finished"] == 20 and 0 < row["compiled"]["replay_s"] < row["compiled"]["command_s"]
    if peer.mocker_installed():
        assert row["mocker"]["finished"] == 20 and set(row["ratios"]) == {"compiled"}
