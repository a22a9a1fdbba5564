"""docs/conformance.md reads as a guide, not a lab notebook (issue #40, item 15).

It opens with what a user runs and how to read the output, short enough to
read in ten minutes, then the reference; the history of its measurements
lives in dated records under docs/measurements/, each opening with its date
and the commit it measured. A reader never had the "sessions" the figures
were measured in, so no doc speaks of them. The reference's lists of
options, profiles and scopes are checked against the code, so a new one
cannot go undocumented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from blockspace.conformance.scope import SCOPES
from blockspace.kit_options import PROFILES, build_parser

DOCS = Path(__file__).resolve().parents[1] / "docs"
GUIDE = DOCS / "conformance.md"
USING_IT_MOST_LINES = 250  # about ten minutes of reading
OTHER_DOCS = ("reliability.md", "vllm-parity.md", "gpu.md")
MEASUREMENTS = DOCS / "measurements"
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")  # a short hash, letters and digits


def guide() -> str:
    return GUIDE.read_text(encoding="utf-8")


def headings(text: str) -> list[tuple[int, int, str]]:
    """Each heading outside code blocks (a ``# comment`` in a bash block is
    none) as (line index, level, title)."""
    found, fenced = [], False
    for index, line in enumerate(text.splitlines()):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"(#+) (.+)$", line)):
            found.append((index, len(match.group(1)), match.group(2)))
    return found


def section(text: str, title: str) -> str:
    """The body of the section ``title``, up to the next heading of its
    level or above."""
    lines = text.splitlines()
    marks = headings(text)
    start, level = next((index, level) for index, level, name in marks if name == title)
    end = next((index for index, other, _ in marks if index > start and other <= level), len(lines))
    return "\n".join(lines[start + 1 : end])


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but hyphens
    and underscores dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def records() -> list[Path]:
    """The measurement records the guide links to."""
    names = re.findall(r"\]\(measurements/([^)#]+\.md)\)", guide())
    return [MEASUREMENTS / name for name in dict.fromkeys(names)]


def every_record() -> list[Path]:
    """Every dated record under docs/measurements/, the guide's and the other guides'."""
    return sorted(MEASUREMENTS.glob("*.md"))


def test_the_guide_opens_with_using_it_then_the_reference():
    text = guide()
    assert [name for _, level, name in headings(text) if level == 2] == ["Using it", "Reference", "Measurement records"]
    using_it = section(text, "Using it")
    assert len(using_it.splitlines()) <= USING_IT_MOST_LINES
    words = " ".join(using_it.split())
    assert "blockspace conformance --impl fast --against reference" in words
    assert "0 when everything passed or was skipped, 1 when a check failed, 2 for bad arguments" in words


def test_every_link_inside_the_guide_names_one_of_its_headings():
    text = guide()
    anchors = {slug(name) for _, _, name in headings(text)}
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert links, "the guide links its own sections"
    assert [link for link in links if link not in anchors] == []


def test_the_guide_links_dated_records_that_exist():
    found = records()
    assert len(found) >= 5
    assert [path.name for path in found if not path.is_file()] == []
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md", path.name) for path in found)


@pytest.mark.parametrize("record", every_record(), ids=lambda path: path.name)
def test_each_record_opens_with_its_date_and_the_commit_it_measured(record):
    title, opening = record.read_text(encoding="utf-8").split("\n\n")[:2]  # its title and first paragraph
    date = record.name[:10]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", date) and title.startswith(f"# {date}"), title
    assert opening.startswith(f"- **Date:** {date}") and COMMIT.search(opening), opening


@pytest.mark.parametrize(
    "doc",
    [GUIDE, *(DOCS / name for name in OTHER_DOCS), *every_record()],
    ids=lambda path: path.name,
)
def test_no_doc_speaks_of_sessions(doc):
    text = doc.read_text(encoding="utf-8")
    said = [line for line in text.splitlines() if re.search(r"\bsessions?\b", line, re.I)]
    assert said == [], f"{doc.name}: give a date and a commit instead"


def test_the_options_table_lists_every_option_of_the_command():
    table = section(guide(), "Options")
    documented = set(re.findall(r"^\| `(--[a-z-]+)", table, re.M))
    options = {s for action in build_parser()._actions for s in action.option_strings if s.startswith("--")}
    assert options - {"--help"} == documented


def test_the_profiles_table_lists_every_profile():
    table = section(guide(), "The profiles")
    assert re.findall(r"^\| `([a-z]+)` \|", table, re.M) == list(PROFILES)


def test_every_scope_is_documented_with_its_settings_and_its_figures():
    proved = section(guide(), "What is proved")
    block = re.search(r"```\n(.*?)```", proved, re.S).group(1)
    settings = dict(line.split(None, 1) for line in block.splitlines())
    assert settings == {name: scope.describe() for name, scope in SCOPES.items()}
    rows = re.findall(r"^\| `([a-z_]+)` \| [\d,]+ \|", proved, re.M)
    assert rows == list(SCOPES)
