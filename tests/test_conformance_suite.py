"""The pytest base class on our own managers: reference against itself
and the fast manager against the reference."""

import os
import subprocess
import sys

import pytest

from blockspace.conformance.scope import SCOPES
from blockspace.conformance.suite import ManagerConformance


class TestReferenceAgainstItself(ManagerConformance):
    """The invariants on the reference (the comparison itself is trivial)."""

    impl = "reference"
    max_examples = 30


class TestFast(ManagerConformance):
    impl = "fast"


class TestReferenceWithoutSnapshot(ManagerConformance):
    """Invariants from return values alone, and no caching (capability flags)."""

    impl = "reference"
    supports_snapshot = False
    supports_caching = False
    max_examples = 25

    def test_trace_replay(self):
        pytest.skip("covered by TestReferenceAgainstItself")


def test_base_class_is_not_collected():
    assert ManagerConformance.__test__ is False
    assert TestReferenceAgainstItself.__test__ is True


MINE = """\
from blockspace.conformance.suite import ManagerConformance
class TestMine(ManagerConformance):
    impl = "reference"
    exhaustive_scopes = ("default", "swap")
"""


def pytest_on_mine(tmp_path, *options: str) -> subprocess.CompletedProcess:
    """pytest in a process of its own, on a ``ManagerConformance`` class that explores two scopes."""
    (tmp_path / "test_mine.py").write_text(MINE)
    run = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path / "test_mine.py"), *options]
    return subprocess.run(run, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=""), timeout=600)


def exhaustive_ids(ran: subprocess.CompletedProcess) -> list[str]:
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return sorted(line.partition("test_exhaustive[")[2].rstrip("]") for line in ran.stdout.splitlines()
                  if "test_exhaustive[" in line)  # fmt: skip


def test_exhaustive_is_made_for_the_scopes_a_class_explores_and_no_other(tmp_path):
    """Not one test for each scope, all but two skipped (63 skips in every
    run of this file): the others are made only when asked for by hand."""
    assert exhaustive_ids(pytest_on_mine(tmp_path, "--collect-only")) == ["default", "swap"]
    assert exhaustive_ids(pytest_on_mine(tmp_path, "--collect-only", "--blockspace-scopes", "plain")) == ["plain"]
    every = exhaustive_ids(pytest_on_mine(tmp_path, "--collect-only", "--blockspace-scopes", "all"))
    assert every == sorted(SCOPES) and len(every) > 2


def test_a_scope_named_by_hand_that_does_not_exist_fails_its_test(tmp_path):
    ran = pytest_on_mine(tmp_path, "-k", "test_exhaustive", "--blockspace-scopes", "default,nonesuch", "-rf")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "1 failed, 1 passed" in ran.stdout, ran.stdout
    assert "TestMine: unknown scope 'nonesuch' (known: default, plain," in ran.stdout
    empty = pytest_on_mine(tmp_path, "--collect-only", "--blockspace-scopes", " , ")
    assert empty.returncode == 4 and "--blockspace-scopes: name at least one scope, or all" in empty.stderr


@pytest.mark.slow
def test_full_profile_fast_against_reference(tmp_path):
    """``blockspace conformance --impl fast --profile full`` (tens of minutes)."""
    from blockspace.conformance.cli import main

    assert main(["--impl", "fast", "--profile", "full", "--json", str(tmp_path / "full.json")]) == 0
