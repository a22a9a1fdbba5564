"""Small builders shared by the tests."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

from blockspace import Sequence, SequenceGroup, SequenceStatus


def seq(seq_id: int, tokens, *, lora: int = 0) -> Sequence:
    return Sequence(seq_id, list(tokens), lora_int_id=lora)


def group(request_id: str, *seqs: Sequence, encoder: Sequence | None = None) -> SequenceGroup:
    return SequenceGroup(request_id, list(seqs), encoder)


def run(*seqs: Sequence) -> None:
    for s in seqs:
        s.status = SequenceStatus.RUNNING


def grow(s: Sequence, *tokens: int) -> None:
    for t in tokens:
        s.append_token_id(t)


def decode_step(s: Sequence, token: int) -> None:
    """One decode step as the scheduler sees it: everything before the new
    token is computed, the new token is not."""
    s.data.update_num_computed_tokens(s.get_len() - s.data.get_num_computed_tokens())
    s.append_token_id(token)


def pytest_in_subprocess(*files: Path, **env: str) -> subprocess.CompletedProcess:
    """pytest on ``files`` in a fresh process with ``env`` added (Numba reads
    NUMBA_DISABLE_JIT and NUMBA_ENABLE_CUDASIM once, at import)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *map(str, files)],
        cwd=Path(__file__).resolve().parents[1],
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=600,
    )


def trace_lines(count: int) -> str:
    """A small Mooncake trace as JSONL: ``count`` requests one second apart,
    prompts of 40, 70, 100... tokens sharing their one chunk, 4 to 6 tokens out."""
    return "".join(
        json.dumps({"timestamp": 1000 * i, "input_length": 40 + 30 * i, "output_length": 4 + i % 3,
                    "hash_ids": [0]}) + "\n"
        for i in range(count)
    )  # fmt: skip


PAIR = {"reference": "reference", "fast": "fast"}


@functools.cache
def explored(scope: str):
    """The explorer's report on the scope named ``scope``, fast against the
    reference on two workers, made once a session: several tests ask about
    the same exhausted scope (the default one takes a minute without the JIT)."""
    from blockspace.conformance.explore import explore
    from blockspace.conformance.scope import SCOPES

    return explore(PAIR, SCOPES[scope], workers=2)


def jit_or(count: int, without_jit: int) -> int:
    """``count``, or the smaller ``without_jit`` where the njit kernels run as
    Python (``NUMBA_DISABLE_JIT=1``: CI's second pass, a hundred times
    slower). That pass is for the bounds of every index, which the smaller
    case reaches as the larger does; the larger runs compiled in the first."""
    from numba import config

    return without_jit if config.DISABLE_JIT else count


def processes() -> list[tuple[int, int, str]]:
    """(pid, parent pid, whole command line) of every process, read from
    Linux's ``/proc`` (``ps`` cuts long command lines, a raylet's)."""
    rows = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():  # self, thread-self, and what is not a process
            continue
        try:
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = (entry / "stat").read_text().rpartition(")")[2].split()[1]
        except (OSError, IndexError):  # gone meanwhile
            continue
        rows.append((int(entry.name), int(ppid), args))
    return rows
