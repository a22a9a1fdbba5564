"""The docs and the code speak to a reader, who has none of the working
sessions that wrote them: a measurement or a change is placed by its date
and its commit. A sentence that numbers the sitting it was measured in
tells a reader nothing they can look up, so any doc or source file that
speaks so fails here, naming the file, the line and the words.

The phrases are built from ``WORD`` rather than written out, so that this
file does not itself hold what it looks for (a plain grep for them, as the
project's before-stop hook runs, finds nothing here)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
# What a user reads: the docs, the README, and the package's sources.
FOLDERS = ("docs", "blockspace", "reference", "fast", "conformance", "simulator")
# In code, "session" may be a pytest scope or an HTTP session; only these
# phrases place something in a history the reader does not have.
WORD = "session"
HISTORY = re.compile(rf"(th|st|nd|rd) {WORD}|(this|that|earlier|next) {WORD}", re.I)
# In prose there is no session a reader could look up at all.
ANY_SESSION = re.compile(r"\bsessions?\b", re.I)


def files(suffix: str) -> list[pathlib.Path]:
    """Every file with ``suffix`` in FOLDERS (and the README for prose)."""
    found = [path for folder in FOLDERS for path in sorted((ROOT / folder).rglob(f"*{suffix}"))]
    return found + [ROOT / "README.md"] if suffix == ".md" else found


def offending_lines(paths: list[pathlib.Path], pattern: re.Pattern) -> list[str]:
    """``path:line: text`` for every line of ``paths`` that ``pattern`` finds."""
    return [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in paths
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]


def test_the_patterns_find_what_they_are_for():
    """The check can fail: each kind of wording is caught, and a word that
    only contains the letters (obsession) is not."""
    for said in (f"the thirteenth {WORD}", f"In the first {WORD}", f"This {WORD} measured", f"the next {WORD}"):
        assert HISTORY.search(said) and ANY_SESSION.search(said), said
    assert ANY_SESSION.search(f"measured in two {WORD}s") and not HISTORY.search(f"scope='{WORD}'")
    assert not ANY_SESSION.search(f"an obsession; {WORD}less code")


def test_no_doc_speaks_of_sessions():
    assert len(files(".md")) > 5  # the docs are where this test looks
    assert offending_lines(files(".md"), ANY_SESSION) == []


def test_no_source_file_places_work_in_a_session():
    assert len(files(".py")) > 50
    assert offending_lines(files(".py"), HISTORY) == []
