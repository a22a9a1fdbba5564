"""Output files written whole or not at all.

A command can stop while it writes: Ctrl-C, a full disk, a worker process
ended by its pool. A file written in place is then half there, and reads
as a result (a JSON report cut mid-way, a CSV missing its last rows, a
PNG that will not open) or hides the complete one of an earlier run. So
every output is written to a temporary name in its own folder and renamed
onto its name once complete (``os.replace``: atomic within a file system,
which one folder is). A reader sees the old file or the new one, never
part of one.

The temporary name is hidden (a leading dot), names the process, and
keeps the file's suffix (matplotlib picks a figure's format from it):
``.sweep.partial-4711.png`` for ``sweep.png``. A writer stopped by an
exception removes its own; one killed outright (a worker ended by
``Pool.terminate``) cannot, and whoever ended it removes what it left
(``remove_partials``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PARTIAL = ".partial-"  # in every temporary name, and in no output's own


def partial_path(path: Path) -> Path:
    """The temporary name ``path`` is written under, beside it."""
    return path.with_name(f".{path.stem}{PARTIAL}{os.getpid()}{path.suffix}")


@contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A temporary path to write ``path``'s content to; renamed onto
    ``path`` when the block ends, removed if it raises (Ctrl-C too).
    The folder must exist (see ``write_text``)."""
    path = Path(path)
    partial = partial_path(path)
    try:
        yield partial
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` whole (``replacing``), making its missing
    folders: a command checks its output paths before its work
    (``validation.check_output_file``), and accepts folders it can make."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as partial:
        partial.write_text(text, encoding="utf-8")


def remove_partials(folder: str | Path) -> None:
    """Remove the temporary files that writers killed outright left in
    ``folder`` (see the module doc)."""
    for left in Path(folder).glob(f".*{PARTIAL}*"):
        left.unlink(missing_ok=True)


__all__ = ["PARTIAL", "partial_path", "remove_partials", "replacing", "write_text"]
