"""The conformance report a person reads (issue #24): one bug met by many
checks is one repro and the list of checks, sweep repros are shortened,
nothing is cut where the output is not a terminal, and wrong arguments
(an output path that cannot be written, a class that is no manager) are
refused before anything runs."""

from __future__ import annotations

import json

import pytest

from blockspace.conformance import Divergence
from blockspace.conformance.check import REPRO, failure_signature
from blockspace.conformance.cli import PIPED_WIDTH, main, print_summary
from blockspace.conformance.sweeps import sweep_check
from blockspace.reference import ReferenceBlockSpaceManager

MAX_REPORT_LINES = 60  # for a bug that one call shows


class OffByOneFreeCount(ReferenceBlockSpaceManager):
    """Says one free GPU block fewer than it has: one call shows it."""

    def get_num_free_gpu_blocks(self):
        return super().get_num_free_gpu_blocks() - 1


BROKEN = f"{__name__}:OffByOneFreeCount"


def calls_in(detail: str) -> list[str]:
    return [line for line in detail.partition(REPRO)[2].splitlines() if line.startswith("lock.")]


def test_a_one_call_bug_is_reported_in_at_most_60_lines(tmp_path, capsys):
    """``blockspace conformance --impl <broken> --against reference``, the
    quick profile: the bug is met by many checks (13 when this was written),
    and reported once."""
    report_path = tmp_path / "report.json"
    assert main(["--impl", BROKEN, "--against", "reference", "--json", str(report_path)]) == 1
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).splitlines()
    assert len(lines) <= MAX_REPORT_LINES, "\n".join(lines)
    checks = json.loads(report_path.read_text())["checks"]
    failed = [c for c in checks if c["status"] == "failed"]
    shown = [c for c in failed if "same_failure_as" not in c]
    assert len(failed) >= 5 and len(shown) == 1, [(c["name"], c["detail"].splitlines()[:2]) for c in failed]
    assert all(c["same_failure_as"] == shown[0]["name"] for c in failed if c is not shown[0])
    assert f"the same failure in {len(failed) - 1} more check(s)" in captured.out
    assert captured.out.count("Repro (runnable)") == 2  # as its check ended, and in the summary
    assert len(calls_in(shown[0]["detail"])) == 1


def test_the_signature_leaves_out_the_place_and_the_numbers():
    machine = "get_num_free_gpu_blocks disagrees:\n  reference returned 5\n  broken returned 4\n  (value: 5 != 4)"
    sweep = (
        "in shared_writes(2, True) with 3 GPU and 0 CPU blocks: get_num_free_gpu_blocks disagrees:\n"
        "  reference returned 12\n  broken returned 11\n  (value: 12 != 11)"
    )
    long_run = (
        "at step 10: get_num_free_gpu_blocks disagrees:\n  reference returned 0\n  broken returned -1\n"
        "  (value: 0 != -1)"
    )
    assert failure_signature(machine) == failure_signature(sweep) == failure_signature(long_run + "\n\n" + REPRO + "x")
    assert failure_signature("state differs after free (a vs b):\n    free['GPU']: [0, 1] != [1, 0, 2]") == (
        failure_signature("state differs after free (a vs b):\n    free['GPU']: [3, 4, 5] != [5]")
    )
    assert failure_signature(machine) != failure_signature(machine.replace("free_gpu", "free_cpu"))
    assert failure_signature(machine) != failure_signature(machine.replace("returned 4", "raised ValueError: no"))


def test_answers_of_other_lengths_that_differ_alike_are_one_failure():
    """A swap of two pairs and one of three, each reversed: the call and its
    first difference are the same, the answers whole are not (issue #51)."""
    two = "swap_out disagrees:\n  a returned [(0, 3), (1, 4)]\n  b returned [(1, 4), (0, 3)]\n  (value[0][0]: 0 != 1)"
    three = (
        "in swap_shared(3) with 4 GPU and 3 CPU blocks: swap_out disagrees:\n  a returned [(0, 5), (1, 6), (2, 7)]\n"
        "  b returned [(2, 7), (1, 6), (0, 5)]\n  (value[0][0]: 0 != 2)"
    )
    shorter = (
        "swap_out disagrees:\n  a returned [(0, 3), (1, 4)]\n  b returned [(0, 3)]\n"
        "  (value: length 2 != 1 ([(0, 3), (1, 4)] vs [(0, 3)]))"
    )
    assert failure_signature(two) == failure_signature(three) != failure_signature(shorter)
    assert failure_signature(shorter) == failure_signature(shorter.replace("(1, 4)", "(1, 4), (2, 5)"))


def test_one_bug_met_by_checks_of_other_repros_is_reported_once_under_the_shortest(tmp_path, capsys):
    """A manager whose swaps come in reverse order, met by sweeps and by the
    trace replays, each with a repro of its own length: before, a repro for
    each length of the swap (issue #51: three repros, one of 250 lines);
    now one failure, shown with the shortest repro, naming the others."""
    report_path = tmp_path / "report.json"
    argv = ["--impl", "blockspace.conformance.broken:ReversedSwapOrder", "--only", "sweep", "--only", "trace"]
    assert main([*argv, "--json", str(report_path)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    failed = [c for c in json.loads(report_path.read_text())["checks"] if c["status"] == "failed"]
    (shown,) = [c for c in failed if "same_failure_as" not in c]
    others = [c for c in failed if c is not shown]
    assert len({c["name"].partition("[")[0] for c in failed}) == 2 and others, [c["name"] for c in failed]
    assert all(c["same_failure_as"] == shown["name"] for c in others)
    assert all(len(calls_in(shown["detail"])) <= len(calls_in(c["detail"])) for c in others)
    assert f"the same failure in {len(others)} more check(s): {', '.join(c['name'] for c in others)}" in out


class MiscountsAtOnce(OffByOneFreeCount):
    """The same bug, as the explorer meets it: in the first state, at move 0."""


@pytest.mark.parametrize("fail_fast", [True, False], ids=["fail-fast", "to-the-end"])
def test_after_a_failure_the_situations_are_not_measured(tmp_path, capsys, fail_fast):
    """A search that stops at its first failure (at move 0 here) reached
    none of its situations: listing them all as not reached read as a
    coverage gap (issue #51). The report says they were not measured, why,
    and lists none."""
    report_path = tmp_path / "report.json"
    argv = ["--impl", f"{__name__}:MiscountsAtOnce", "--only", "explore", "--scope", "default",
            "--scope", "plain_single", "--workers", "1", "--json", str(report_path)]  # fmt: skip
    assert main(argv + ["--fail-fast"] * fail_fast) == 1
    out = " ".join(capsys.readouterr().out.split())
    report = json.loads(report_path.read_text())
    assert len(report["checks"]) == (1 if fail_fast else 2)
    why = "the run stopped at the first failure" if fail_fast else "explore[default] stopped at its first failure"
    assert report["situations"] == {"registered": report["situations"]["registered"], "measured": False,
                                    "not_measured": why}  # fmt: skip
    assert f"situations of the spec: not measured: {why}" in out and "not reached" not in out


def test_a_sweep_repro_is_shortened_to_the_calls_the_failure_needs():
    result = sweep_check(
        {"reference": "reference", "broken": OffByOneFreeCount}, {}, "sweep[shared_writes_plain]"
    ).run()
    assert result.status == "failed"
    first = result.detail.splitlines()[0]
    assert first.startswith("in shared_writes(2, False) with ") and first.endswith(
        "get_num_free_gpu_blocks disagrees:"
    ), first
    assert calls_in(result.detail) == ["lock.call('get_num_free_gpu_blocks')  # the managers disagree here"]
    with pytest.raises(Divergence, match="get_num_free_gpu_blocks disagrees"):
        exec(compile(result.detail.partition(REPRO)[2], "<repro>", "exec"), {})


def words(text: str) -> str:
    """``text`` with every run of spaces and line breaks as one space: what a wrapped text still holds."""
    return " ".join(text.split())


def test_output_that_is_not_a_terminal_is_not_cut(capsys):
    """A note longer than the width wraps inside its column: every word kept, in order."""
    name, note = "machine[sliding_window_and_a_long_name]", "a note " * 30
    check = {"name": name, "status": "skipped", "examples": 0, "seconds": 0.0, "detail": note.strip()}
    totals = {"checks": 1, "failed": 0, "skipped": 1, "examples": 0, "seconds": 0.0}
    print_summary({"impl": "fast", "against": "reference", "profile": "quick", "checks": [check], "totals": totals})
    out = capsys.readouterr().out
    assert name in out and "…" not in out
    assert words(f"{name} skipped 0 0.0 {note}") in words(out)  # the note's lines follow its row's first
    assert max(len(line) for line in out.splitlines()) <= PIPED_WIDTH


def test_an_explorer_theorem_piped_is_wrapped_to_100_columns(tmp_path, capsys):
    """``blockspace conformance --scope default ... > file``: the theorem, with
    its scope's settings, used to be one table row of ~700 columns and again
    one line below the table; now every line fits ``PIPED_WIDTH``."""
    report_path = tmp_path / "report.json"
    argv = ["--impl", "fast", "--scope", "default", "--scope-set", "max_depth=3", "--only", "explore", "--workers", "1"]
    assert main([*argv, "--json", str(report_path)]) == 0
    out = capsys.readouterr().out
    (check,) = json.loads(report_path.read_text())["checks"]
    assert len(check["theorem"]) > 2 * PIPED_WIDTH  # long enough to need wrapping
    assert max(len(line) for line in out.splitlines()) <= PIPED_WIDTH, out
    assert words(f"explore[default]: {check['theorem']}") in words(out)  # wrapped whole, below the table
    (row,) = [line for line in out.splitlines() if line.lstrip().startswith("explore[default] ")]
    assert row.split()[1:] == ["passed", str(check["examples"]), f"{check['seconds']:.1f}", "not", "exhausted;",
                               "its", "theorem", "below"]  # fmt: skip


def test_the_json_path_is_checked_before_anything_runs(capsys):
    assert main(["--impl", "reference", "--json", "/proc/nope/x.json"]) == 2
    captured = capsys.readouterr()
    assert (
        captured.out == ""
        and captured.err.startswith("error: --json /proc/nope/x.json")
        and captured.err.count("\n") == 1
    )


def test_the_json_report_may_go_to_a_folder_still_to_be_made(tmp_path, capsys):
    report_path = tmp_path / "new" / "report.json"
    assert main(["--impl", "reference", "--only", "machine[plain]", "--examples", "2", "--json", str(report_path)]) == 0
    assert json.loads(report_path.read_text())["passed"] is True


@pytest.mark.parametrize("option", ["--impl", "--against"])
@pytest.mark.parametrize(
    ("spec", "words"), [("json:JSONDecoder", "is not a block manager"), ("json:dumps", "is not a class")]
)
def test_a_class_that_is_no_manager_is_refused_before_anything_runs(capsys, option, spec, words):
    argv = {"--impl": "reference", option: spec}
    assert main([arg for pair in argv.items() for arg in pair]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"error: {option}: {spec!r} {words}") and "Traceback" not in captured.err
