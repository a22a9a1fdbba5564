"""Shortening a failing repro by deleting its lines (delta debugging).

Why: Hypothesis shrinks a state machine's run by replaying it, every step
followed by the invariant checks and observations, hundreds of times; with
a time budget it may stop at a run of dozens of calls. The repro it prints
is a script (``script.py``) that reproduces a disagreement on its own, and
running a script is cheap: so the kit then deletes chunks of lines, halving
the chunk when nothing more can go, and keeps every deletion after which the
script still fails the same way (the same first line of the ``Divergence``).
Finally each remaining call's comment is written anew from what the
yardstick answered in the shortened run.
"""

from __future__ import annotations

import time

from blockspace.conformance.lockstep import REPRO_HEADING, Divergence

CALL = "lock.call("
BUILD = "lock = Lockstep.build("


def divergence_of(source: str) -> Divergence | None:
    """The ``Divergence`` the script raises, or None when it runs through or
    fails in any other way."""
    try:
        exec(compile(source, "<repro>", "exec"), {})
    except Divergence as failure:
        return failure
    except Exception:  # noqa: BLE001 - a deletion that broke the script (a name it needs is gone)
        return None
    return None


def failure_of(source: str) -> str | None:
    """The first line of the ``Divergence`` the script raises, or None."""
    failure = divergence_of(source)
    return None if failure is None else str(failure).splitlines()[0]


def _split(source: str) -> tuple[list[str], list[str]]:
    """(the imports and the managers' build, the steps after it)."""
    lines = source.rstrip("\n").split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(BUILD)) + 1
    return lines[:start], lines[start:]


def _strip(line: str) -> str:
    return line.split("  # ", 1)[0] if line.startswith(CALL) else line


def _join(head: list[str], body: list[str]) -> str:
    return "\n".join(head + body) + "\n"


def reduce(source: str, seconds: float) -> str:
    """``source`` with as many lines deleted as ``seconds`` allow, failing as
    before (unchanged if it does not fail)."""
    if BUILD not in source:  # not a lockstep's log (a long run's repro is one call of the run itself)
        return source
    target = failure_of(source)
    if target is None:
        return source
    head, body = _split(source)
    body = [_strip(line) for line in body]
    deadline = time.perf_counter() + seconds
    chunk = max(1, len(body) // 2)
    while time.perf_counter() < deadline:
        index, deleted = len(body) - chunk, False
        while index >= 0 and time.perf_counter() < deadline:  # from the end: later lines depend on earlier ones
            candidate = body[:index] + body[index + chunk :]
            if failure_of(_join(head, candidate)) == target:
                body, deleted = candidate, True
            index -= chunk
        if chunk == 1 and not deleted:
            break
        chunk = max(1, chunk // 2) if not deleted else chunk
    try:
        return _join(head, commented(head, body))
    except Exception:  # noqa: BLE001 - a script whose lines do not run one by one: keep it uncommented
        return _join(head, body)


def shorten(failure: Divergence, seconds: float) -> tuple[str, str]:
    """A failure's message and repro, the repro shortened for at most
    ``seconds`` (none: as it is) and the message then that of the shortened
    run, so that it shows the values the repro gives. Where the repro does
    not fail without the observation calls (the bug hides in one), the one
    with them (``full_repro``) is shortened instead."""
    message, _, repro = str(failure).partition(REPRO_HEADING)
    if seconds <= 0:
        return message, repro
    if failure.full_repro and failure_of(repro) is None:
        repro = failure.full_repro
    repro = reduce(repro, seconds)
    shortened = divergence_of(repro)
    if shortened is not None:
        message = str(shortened).partition(REPRO_HEADING)[0]
    return message, repro


def commented(head: list[str], body: list[str]) -> list[str]:
    """The steps, each call commented with the yardstick's answer in this run."""
    namespace: dict = {}
    exec(compile("\n".join(head), "<repro>", "exec"), namespace)
    lock = namespace["lock"]
    first = next(iter(lock.managers))
    lines = []
    for line in body:
        if not line.startswith(CALL):
            exec(compile(line, "<repro>", "exec"), namespace)
            lines.append(line)
            continue
        try:
            outcome = eval(compile(line, "<repro>", "eval"), namespace)
        except Divergence:
            lines.append(f"{line}  # the managers disagree here")
            break
        comment = f"{first} {outcome.describe()}"
        lines.append(f"{line}  # {comment if len(comment) < 100 else comment[:97] + '...'}")
    return lines
