"""The pytest base class on our own managers: reference against itself
and the fast manager against the reference."""

import pytest

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


@pytest.mark.slow
def test_full_profile_fast_against_reference(tmp_path):
    """``blockspace conformance --impl fast --profile full`` (tens of minutes)."""
    from blockspace.conformance.cli import main

    assert main(["--impl", "fast", "--profile", "full", "--json", str(tmp_path / "full.json")]) == 0
