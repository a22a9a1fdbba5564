"""Commands that never lie (issue #24): every option of ``blockspace
simulate``, ``soak``, ``bench``, ``gpu-bench``, ``gpu-profile`` and ``conformance``, given a bad
value, is one ``error:`` line naming it, exit status 2, no traceback, before any work and
with nothing written. The options are read off the parsers: a numeric option
must have a range in its module's ``RANGES`` (its bad values are derived from
it), a switch or a choice gets derived bad values, and any other option needs
a case in ``BAD`` below, so an option added without one fails here.

And the soak tells the truth about what it found: exit status 1 for a failed
replay or a leak, and only this run's figures in its JSON."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import blockspace.bench.cli as bench
import blockspace.bench.gpu as gpu_bench
import blockspace.bench.kernel_floor as bench_kernel_floor
import blockspace.bench.kit as bench_kit
import blockspace.bench.simulator as bench_simulator
import blockspace.conformance.cli as conformance
import blockspace.profile.cli as gpu_profile
import blockspace.simulator.capacity as capacity
import blockspace.simulator.cli as simulate
import blockspace.simulator.sweep as sweep
import blockspace.soak.cli as soak
from blockspace.reference import ReferenceBlockSpaceManager
from blockspace.validation import Range, option_name

COMMANDS = {
    "simulate": simulate,
    "soak": soak,
    "bench": bench,
    "gpu-bench": gpu_bench,
    "gpu-profile": gpu_profile,
    "conformance": conformance,
    "bench.simulator": bench_simulator,  # python -m blockspace.bench.simulator
    "bench.kit": bench_kit,  # python -m blockspace.bench.kit
    "bench.kernel_floor": bench_kernel_floor,  # python -m blockspace.bench.kernel_floor
}
BASE = {"conformance": ["--impl", "fast"]}  # a command's required options, before each case (a case may override them)

# The options that are neither numbers, switches nor choices: (option, argv) cases, run in a folder
# holding the files of ``workspace``. The option is the one the error must name.
BAD: dict[str, dict[str, list[list[str]]]] = {
    "simulate": {
        "trace": [
            ["--trace", "missing.jsonl"],
            ["--trace", "empty.jsonl"],
            ["--trace", "garbage.jsonl"],
            ["--trace", "adir"],
        ],
        "manager": [
            ["--manager", "nosuch"],
            ["--manager", "json:JSONDecoder"],
            ["--manager", "nosuch.module:Manager"],
            ["--manager", "blockspace.interfaces:BlockSpaceManager"],
            ["--manager", "json:dumps"],
        ],
        "compare": [
            ["--compare", "fast"],
            ["--compare", "fast,nosuch"],
            ["--compare", "fast,json:JSONDecoder"],
            ["--compare", "fast@fastest,fast"],
            ["--compare", "reference@rows,fast"],
        ],
        "step": [["--step", "rows", "--manager", "reference"]],
        "step_model": [
            ["--step-model", "missing.json"],
            ["--step-model", "adir"],
            ["--step-model", "garbage.jsonl"],
            ["--step-model", "small.jsonl", "--prefill-token-us", "1"],
            ["--sweep", "step_model=missing.json"],
        ],
        "gpu": [
            ["--gpu", "H900"],
            ["--gpu", "A100-80GB-SXM", "--dtype", "fp8"],
            ["--gpu", "L40S", "--model", "llama-3.1-405b"],
            ["--sweep", "gpu=H100-SXM,H9"],
        ],
        "model": [
            ["--model", "gpt-9"],
            ["--model", "adir"],
            ["--model", "garbage.jsonl"],
            ["--model", "llama-3.1-8b", "--tensor-parallel", "3"],
            ["--sweep", "model=llama-3.1-8b,gpt-9"],
        ],
        "gpu_cost": [
            ["--gpu-cost", "x"],
            ["--gpu-cost", "-1"],
            ["--gpu-cost", "inf"],
            ["--gpu-cost", "H9=3"],
            ["--gpu-cost", "H200=2,H200=3"],
            ["--gpu-cost", "3,H200=2"],
            ["--gpu-cost", "H100-SXM=3"],  # by name, and no --gpu
            ["--gpu-cost", "H100-SXM=3", "--gpu", "H200"],
            ["--gpu-cost", "H100-SXM=3", "--sweep", "gpu=H100-SXM,H200"],
            ["--find", "min-cost", "--slo", "ttft=1s"],
        ],
        "seeds": [
            ["--seeds", "2", "--request-rate", "5"],  # no --find
            ["--find", "max-rate", "--slo", "ttft=1s", "--seeds", "2"],  # the trace's own arrivals
        ],
        "find": [
            ["--find", "min-cost", "--slo", "ttft=1s", "--gpu-cost", "3", "--gpu", "L40S", "--model", "llama-3.1-405b"],
            ["--find", "min-cost", "--slo", "ttft=1s", "--gpu-cost", "3", "--replicas", "2"],
        ],
        "slo": [
            ["--slo", "ttft=2"],
            ["--slo", "ttft=2s,ttft=1s"],
            ["--slo", "latency=2s"],
            ["--slo", "tpot=0ms"],
            ["--slo", ","],
        ],
        "requests_out": [
            ["--requests-out", "r.jsonl", "--sweep", "block_size=16,32"],
            ["--requests-out", "r.jsonl", "--find", "max-rate", "--slo", "ttft=1s"],
            ["--requests-out", "adir"],
            ["--requests-out", "afile/r.jsonl"],
            ["--requests-out", "/proc/nope/r.jsonl"],
        ],
        "router": [  # one replica leaves a router no choice (issue #51)
            ["--replicas", "1", "--router", "kv_aware"],
            ["--sweep", "router=round_robin,kv_aware"],
        ],
        "router_weight": [["--replicas", "1", "--router", "kv_aware", "--router-weight", "2"]],
        "prefill_replicas": [
            ["--prefill-replicas", "-1"],
            ["--prefill-replicas", "2", "--replicas", "2"],
            ["--prefill-replicas", "1", "--replicas", "3", "--fail", "0@1+1"],
            ["--prefill-replicas", "1", "--replicas", "3", "--n", "2"],
            ["--prefill-replicas", "1", "--replicas", "3", "--router", "kv_aware", "--router-lag", "5"],
        ],
        "decode_replicas": [
            ["--decode-replicas", "0", "--prefill-replicas", "1"],
            ["--decode-replicas", "2"],
            ["--decode-replicas", "2", "--prefill-replicas", "1", "--replicas", "3"],
            ["--decode-replicas", "2", "--prefill-replicas", "1", "--find", "min-replicas", "--slo", "ttft=1s"],
        ],
        "kv_link_gbps": [
            ["--kv-link-gbps", "0", "--prefill-replicas", "1", "--replicas", "2"],
            ["--kv-link-gbps", "100"],
        ],
        "address": [
            ["--address", "auto", "--sweep", "block_size=16,32"],  # without --executor ray
            ["--executor", "ray", "--address", "127.0.0.1:1", "--sweep", "block_size=16,32"],  # nothing answers
        ],
        "router_lag": [
            ["--router-lag", "-1", "--replicas", "2", "--router", "kv_aware"],
            ["--router-lag", "50", "--replicas", "2"],  # round robin reads no cache
            ["--router-lag", "50", "--replicas", "1", "--router", "kv_aware"],
            ["--router-lag", "50", "--replicas", "2", "--router", "kv_aware", "--max-concurrency", "4"],
        ],
        "max_concurrency": [  # a closed loop makes the rate a max-rate search scales irrelevant (issue #51)
            ["--find", "max-rate", "--slo", "ttft=1s", "--max-concurrency", "8"],
            ["--find", "max-rate", "--slo", "ttft=1s", "--sweep", "max_concurrency=4,8"],
        ],
        "fail": [  # issue #55
            ["--fail", "x"],
            ["--fail", "1@"],
            ["--fail", "rolling@1/2"],
            ["--fail", "0@5+0"],
            ["--fail", "2@5", "--replicas", "2"],
            ["--fail", "2@5", "--replicas", "2", "--find", "max-rate", "--slo", "ttft=1s"],
            ["--fail", "0@1+5", "--fail", "0@2", "--replicas", "2"],
            ["--fail", "0@1"],  # the only replica down for good
            ["--fail", "0@1+5", "--n", "2"],
            ["--fail", "0@1+5", "--max-concurrency", "2"],
            ["--fail", "0@1+5", "--find", "min-replicas", "--slo", "ttft=1s"],
            ["--fail", "rolling@0/1/1", "--find", "min-replicas", "--slo", "ttft=1s", "--spare", "1"],
        ],
        "scale_users": [
            ["--scale-users", "0"],
            ["--scale-users", "2", "--request-rate", "3"],
            ["--scale-users", "2", "--workload", "synthetic"],
            ["--scale-users", "1e9"],  # more fresh chunk ids than there are
        ],
        "spare": [
            ["--spare", "0", "--find", "min-replicas", "--slo", "ttft=1s"],
            ["--spare", "1"],
            ["--spare", "1", "--find", "max-rate", "--slo", "ttft=1s"],
        ],
        "spare_window": [
            ["--spare-window", "0", "--spare", "1", "--find", "min-replicas", "--slo", "ttft=1s"],
            ["--spare-window", "60", "--find", "min-replicas", "--slo", "ttft=1s"],
        ],
        "num_gpu_blocks": [["--num-gpu-blocks", "8", "--kv-memory-gib", "1"]],
        "kv_memory_gib": [["--kv-memory-gib", "1e-9"]],
        "out": [
            ["--out", "afile"],
            ["--out", "afile/sub"],
            ["--out", "/proc/nope"],
            ["--out", "clash"],
            ["--sweep", "block_size=16", "--out", "afile"],
            ["--sweep", "block_size=16", "--out", "sweepclash"],
        ],
        "sweep": [
            ["--sweep", "watermark=0.01,5"],
            ["--sweep", "block_size=16,0"],
            ["--sweep", "nosuch=1"],
            ["--sweep", "block_size"],
            ["--sweep", "max_num_batched_tokens=2048,8", "--max-num-seqs", "16"],
            ["--sweep", "block_size=16,32", "--compare", "reference,fast"],
        ],
    },
    "soak": {
        "impl": [
            ["--impl", "nosuch"],
            ["--impl", "json:JSONDecoder"],
            ["--impl", "blockspace.interfaces:BlockSpaceManager"],
            ["--impl", "nosuch", "--ops", "0", "--trace", "small.jsonl"],  # no operations read it: refused
        ],
        "ops": [["--ops", "0"]],
        "trace": [["--trace", "/nonexistent"], ["--trace", "empty.jsonl"], ["--trace", "garbage.jsonl", "--ops", "0"]],
        "compare": [
            ["--compare", "fast,nosuch", "--trace", "small.jsonl"],
            ["--compare", "fast", "--trace", "small.jsonl"],
        ],
        "out": [["--out", "afile", "--trace", "small.jsonl"], ["--out", "/proc/nope", "--trace", "small.jsonl"]],
        "json": [
            ["--json", "/proc/nope/r.json"],
            ["--json", "adir"],
            ["--json", "afile/r.json"],
            ["--json", "out/soak/simulation.json", "--trace", "small.jsonl"],  # the replay's own file
            ["--json", "new", "--out", "new", "--trace", "small.jsonl"],
        ],
    },
    "bench": {
        "json": [["--json", "/proc/nope/b.json"], ["--json", "adir"], ["--json", "same", "--markdown", "same"]],
        "markdown": [["--markdown", "/proc/nope/b.md"], ["--markdown", "adir"], ["--markdown", "binary.md"]],
    },
    "gpu-bench": {
        "json": [["--json", "/proc/nope/g.json"], ["--json", "adir"]],
    },
    "gpu-profile": {
        "out": [["--out", "/proc/nope/p.json"], ["--out", "adir"], ["--out", "afile/p.json"]],
    },
    "conformance": {
        "impl": [
            ["--impl", "nosuch"],
            ["--impl", "json:JSONDecoder"],
            ["--impl", "blockspace.interfaces:BlockSpaceManager"],
        ],
        "against": [["--against", "nosuch"], ["--against", "json:dumps"]],
        "json": [["--json", "/proc/nope/c.json"], ["--json", "adir"], ["--json", "afile/c.json"]],
        "only": [["--only", "nosuch"]],
        "scope": [
            ["--scope", "nosuch"],
            ["--scope", "plain", "--scope", "plain"],  # explored twice
            ["--scope", "plain", "--only", "machine"],  # its check left out
            ["--scope", "sliding_window", "--without", "sliding_window"],  # its check skipped
        ],
        "scope_set": [
            ["--scope", "default", "--scope-set", "nosuch=1"],
            ["--scope-set", "num_gpu_blocks=0"],
            ["--only", "machine", "--scope-set", "max_depth=2"],  # no explorer runs
        ],
        # An option that no check of the run reads (issue #40): each was run, and ignored, before.
        "examples": [["--profile", "exhaustive", "--examples", "3"], ["--only", "sweep", "--examples", "3"]],
        "shrink_budget": [["--only", "explore", "--scope", "plain", "--shrink-budget", "5"]],
        "workers": [["--workers", "2"], ["--profile", "symbolic", "--workers", "2"]],
        "executor": [["--only", "machine[plain]", "--executor", "ray"]],  # no explorer runs
        "address": [
            ["--profile", "exhaustive", "--only", "explore", "--scope", "default", "--address", "auto"],  # no ray
            [
                "--profile",
                "exhaustive",
                "--only",
                "explore",
                "--scope",
                "default",
                "--executor",
                "ray",
                "--address",
                "127.0.0.1:1",
            ],  # nothing answers there
        ],  # fmt: skip
        "fail_fast": [
            ["--only", "machine[plain]", "--fail-fast"],
            ["--profile", "exhaustive", "--only", "explore", "--scope", "default", "--fail-fast"],
        ],
        "budget": [["--budget", "60"], ["--budget", "0"], ["--profile", "full", "--budget", "60"]],
        "without": [
            ["--profile", "exhaustive", "--only", "explore", "--scope", "default", "--without", "caching"],  # all
            ["--only", "machine[plain]", "--without", "caching"],  # it skips nothing
            ["--only", "machine[caching]", "--only", "sweep[salts]", "--without", "caching"],
        ],
    },
    "bench.simulator": {
        "trace": [["--trace", "missing.jsonl"], ["--trace", "garbage.jsonl"]],
        "ways": [["--ways", "fast,nosuch"], ["--ways", "reference@rows"], ["--ways", "fast@fastest"], ["--ways", ","]],
        "json": [["--json", "adir"], ["--json", "/proc/nope/s.json"]],
    },
    "bench.kernel_floor": {
        "trace": [["--trace", "missing.jsonl"], ["--trace", "empty.jsonl"], ["--trace", "garbage.jsonl"]],
        "json": [["--json", "adir"], ["--json", "/proc/nope/k.json"]],
    },
    "bench.kit": {
        "correct": [["--correct", "nosuch"], ["--correct", "json:dumps"]],
        "json": [["--json", "adir"], ["--json", "afile/k.json"]],
    },
}

SMALL_TRACE = '{"timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [1]}\n'


def options(module) -> dict[str, argparse.Action]:
    """The options of a command's parser, by destination (``--help`` left out)."""
    return {a.dest: a for a in module.build_parser()._actions if a.option_strings and a.dest != "help"}


def derived(module) -> dict[str, list[list[str]]]:
    """Bad values read off the parser and the module's ``RANGES``: a value for
    a switch, an unknown choice, text for a number, and each bound broken."""
    ranges: dict[str, Range] = getattr(module, "RANGES", {})
    cases: dict[str, list[list[str]]] = {}
    for dest, action in options(module).items():
        flag = action.option_strings[0]
        if action.nargs == 0:
            cases[dest] = [[f"{flag}=1"]]
        elif action.choices is not None:
            cases[dest] = [[flag, "nosuch"]]
        elif action.type in (int, float) and dest in ranges:
            allowed = ranges[dest]
            values = ["x"] + (["nan", "inf"] if action.type is float else [])
            if allowed.least is not None:
                values.append(str(action.type(allowed.least) - (1 if action.type is int else 0.5)))
            values += [str(action.type(bound)) for bound in (allowed.above, allowed.below) if bound is not None]
            cases[dest] = [[flag, value] for value in values]
    return cases


def cases() -> list:
    found = []
    for command, module in COMMANDS.items():
        for source in (derived(module), BAD[command]):
            for dest, argvs in source.items():
                found += [pytest.param(command, dest, [*BASE.get(command, []), *argv], id=f"{command}:{' '.join(argv)}")
                          for argv in argvs]  # fmt: skip
    return found


def tree(root: Path) -> dict[str, bytes | None]:
    """Every file and folder under ``root``, with the files' contents."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A folder to run in, with the inputs the cases name and the outputs of
    an earlier run, which no refused command may touch."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BLOCKSPACE_TRACE", raising=False)
    (tmp_path / "small.jsonl").write_text(SMALL_TRACE)
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "garbage.jsonl").write_text("garbage\n")
    (tmp_path / "afile").write_text("a file, not a folder\n")
    (tmp_path / "adir").mkdir()
    (tmp_path / "binary.md").write_bytes(b"\xff\xfe\x00 not text")
    (tmp_path / "clash" / "simulation.json").mkdir(parents=True)  # where simulate's JSON would go: a folder
    (tmp_path / "sweepclash" / "sweep" / "run-0.json").mkdir(parents=True)
    for stale in ("out/simulation.json", "out/soak/simulation.json"):
        (tmp_path / stale).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / stale).write_text('{"stale": true}')
    return tmp_path


@pytest.fixture
def no_work(monkeypatch):
    """Whatever starts a command's work fails the test: the checks come first."""

    def work(*args, **kwargs):
        raise AssertionError("the work started before every option was checked")

    monkeypatch.setattr(simulate, "execute", work)
    monkeypatch.setattr(sweep, "map_unordered", work)  # a sweep's runs
    monkeypatch.setattr(capacity, "find_max_rate", work)  # --find max-rate's search
    monkeypatch.setattr(soak, "soak_ops", work)
    monkeypatch.setattr(bench, "machine", work)
    monkeypatch.setattr(gpu_bench, "gpu_available", work)
    monkeypatch.setattr(gpu_profile, "profile", work)
    monkeypatch.setattr(conformance, "run_with_progress", work)
    monkeypatch.setattr(bench_simulator, "measure", work)
    monkeypatch.setattr(bench_kit, "time_to_report", work)
    monkeypatch.setattr(bench_kernel_floor, "measure", work)


@pytest.mark.parametrize(("command", "dest", "argv"), cases())
def test_a_bad_value_is_one_error_line_and_nothing_else(workspace, no_work, capsys, command, dest, argv):
    before, address = tree(workspace), os.environ.get("RAY_ADDRESS")
    assert COMMANDS[command].main(argv) == 2
    assert os.environ.get("RAY_ADDRESS") == address  # a refused --address is not kept for later commands
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert option_name(dest) in captured.err, captured.err  # the option that holds the bad value
    assert tree(workspace) == before  # nothing written, nothing overwritten


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_option_has_a_bad_value_case(command):
    module = COMMANDS[command]
    ranges = getattr(module, "RANGES", {})
    covered = set(derived(module)) | set(BAD[command])
    assert set(options(module)) <= covered, f"options without a bad-value case: {set(options(module)) - covered}"
    assert set(ranges) <= set(options(module)), "a range for an option that does not exist"
    numeric = {dest for dest, action in options(module).items() if action.type in (int, float)}
    assert numeric <= set(ranges), f"numeric options without a range: {numeric - set(ranges)}"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_shows_every_default_and_no_markup(command, capsys):
    module = COMMANDS[command]
    parser = module.build_parser()
    formatter = parser.formatter_class(parser.prog)
    for dest, action in options(module).items():
        assert "default" in formatter._get_help_string(action), f"--help of {dest} does not show its default"
    try:  # argparse's --help exits; a command may catch that and return the status
        status = module.main(["--help"])
    except SystemExit as stop:
        status = stop.code
    assert status == 0
    text = capsys.readouterr().out
    prog = f"python -m blockspace.{command}" if "." in command else f"blockspace {command}"  # a tool, or a command
    assert "``" not in text and prog in text


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--watermark", "2"],
        ["soak", "--ops", "-5"],
        ["bench", "--json", "/proc/nope/b.json"],
        ["gpu-bench", "--seqs", "0"],
        ["gpu-profile", "--layers-to-time", "0"],
    ],
)
def test_the_installed_command_says_one_line(tmp_path, argv):
    """Through the ``blockspace`` entry point in a fresh process, as a user runs it."""
    done = subprocess.run([sys.executable, "-m", "blockspace", *argv], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert list(tmp_path.iterdir()) == []


# -- the soak's findings -------------------------------------------------------------------------------------
def test_a_diverging_replay_fails_the_soak_and_reports_only_this_run(workspace, capsys):
    """Three requests one after another: a manager reusing the least recently
    freed block gives the second request other blocks than the reference."""
    trace = workspace / "three.jsonl"
    trace.write_text("".join(SMALL_TRACE.replace('"timestamp": 0', f'"timestamp": {t}') for t in (0, 10_000, 20_000)))
    (workspace / "r.json").write_text('{"stale": true}')
    argv = ["--ops", "0", "--trace", str(trace), "--compare", "reference,blockspace.conformance.broken:FifoFreeList",
            "--json", "r.json"]  # fmt: skip
    assert soak.main(argv) == 1
    captured = capsys.readouterr()
    assert (
        "DECISIONS DIFFER" in captured.out
        and "trace replay with reference," in captured.out
        and "FAILED" in captured.out
    )
    report = json.loads((workspace / "r.json").read_text())
    assert report["passed"] is False and "stale" not in report
    assert report["trace"]["exit_code"] == 1 and report["trace"]["figures"]["identical_decisions"] is False
    written = json.loads((workspace / "out" / "soak" / "simulation.json").read_text())
    assert "stale" not in written and written["identical_decisions"] is False  # this run's, not the earlier one


def test_an_agreeing_replay_and_clean_operations_pass(workspace, capsys, monkeypatch):
    monkeypatch.setattr(soak, "PROGRESS_EVERY_S", 0.0)
    argv = ["--impl", "reference", "--ops", "2000", "--trace", "small.jsonl", "--compare", "reference,reference",
            "--json", "r.json"]  # fmt: skip
    assert soak.main(argv) == 0
    captured = capsys.readouterr()
    assert "0 leaked blocks" in captured.out and "identical decisions" in captured.out
    assert "soak: " in captured.err and " operations, " in captured.err  # progress, on stderr
    report = json.loads((workspace / "r.json").read_text())
    assert report["passed"] is True and report["ops"]["failure"] is None and report["ops"]["num_ops"] >= 2000


class Leaky(ReferenceBlockSpaceManager):
    """Forgets to free every fifth sequence."""

    def free(self, seq) -> None:
        if seq.seq_id % 5 != 4:
            super().free(seq)


class Raising(ReferenceBlockSpaceManager):
    """Breaks on its 500th call of ``get_block_table``."""

    calls = 0

    def get_block_table(self, seq):
        Raising.calls += 1
        if Raising.calls == 500:
            raise RuntimeError("broken on purpose")
        return super().get_block_table(seq)


@pytest.mark.parametrize(("cls", "found"), [(Leaky, "blocks still in use after the walk of seed"),
                                             (Raising, "RuntimeError: broken on purpose")])  # fmt: skip
def test_a_leak_or_a_raising_manager_is_a_failure_not_a_traceback(cls, found):
    ops = soak.soak_ops(cls, 100_000, 1000)
    assert found in ops["failure"] and ops["num_ops"] < 100_000  # it stopped there
    assert found in soak.describe_ops(ops) and "FAILED" in soak.describe_ops(ops)


def test_a_failing_operations_part_makes_the_soak_exit_1(workspace, capsys, monkeypatch):
    monkeypatch.setattr(soak, "load_manager", lambda spec, option: Leaky)
    assert soak.main(["--ops", "100000", "--json", "r.json"]) == 1
    assert "FAILED" in capsys.readouterr().out
    report = json.loads((workspace / "r.json").read_text())
    assert report["passed"] is False and "blocks still in use" in report["ops"]["failure"]
