"""``blockspace bench --markdown`` keeps the hand-written sections above its marker."""

from blockspace.bench.report import REPORT_MARKER, kept_preamble


def test_the_report_keeps_what_stands_above_its_marker(tmp_path):
    target = tmp_path / "performance.md"
    assert kept_preamble(target) == ""  # no file yet: the report alone
    target.write_text("# Performance\n\nhand-written figures\n\n" + REPORT_MARKER + "\n\nold report\n")
    kept = kept_preamble(target)
    assert kept.startswith("# Performance\n\nhand-written figures") and REPORT_MARKER in kept
    assert "old report" not in kept
    target.write_text("a file without the marker\n")
    assert kept_preamble(target) == ""
