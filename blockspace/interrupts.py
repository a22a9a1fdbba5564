"""Ctrl-C: the command alone hears it, ends its workers, keeps what
finished, says one line and exits 130.

A terminal sends SIGINT to every process of its foreground group: the
command and its worker processes alike. A worker that hears it dies with
a traceback of its own, and a pool whose worker died mid-run waits for
that run forever (``pool.join()``: sweeps and searches hung so). So a
pool's workers are made with SIGINT blocked (``worker_pool``): the signal
mask is inherited through fork and kept through exec, so a forked or a
spawned worker never sees the signal, from its first instruction on, and
the command ends them itself (``Pool.terminate``: SIGTERM, at once). While
they are made the command holds SIGINT back (``sigint_held``): one sent
meanwhile is acted on the moment they are, not lost, and does not cut the
pool's making half-way (a worker started and never told its work dies
with a traceback of its own).

What a command finished before Ctrl-C it keeps (a sweep's finished runs,
a search's tried points), marked incomplete, and it raises ``Interrupted``
saying where; the ``blockspace`` entry point (``cli.py``) catches every
``KeyboardInterrupt``, says ``interrupted: ...`` on stderr in one line, no
traceback, and exits with ``INTERRUPTED``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# The exit status of a command that Ctrl-C stopped: 128 + SIGINT, as a shell reports a
# command that the signal ended, so scripts tell it from a failure (1) or a bad option (2).
INTERRUPTED = 130


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, after the command kept what had finished: ``kept`` says
    what and where, for the one line; ``partial`` is a search's answer so
    far (its tried points, in a ``RateAnswer`` or ``ReplicaAnswer`` of
    ``simulator/capacity.py``, ``fleet_size.py``), for the command to write."""

    def __init__(self, kept: str = "", partial: Any = None) -> None:
        super().__init__(kept)
        self.kept = kept
        self.partial = partial


def say_interrupted(stop: KeyboardInterrupt) -> int:
    """The one line for Ctrl-C on stderr; the exit status to return."""
    kept = stop.kept if isinstance(stop, Interrupted) and stop.kept else "stopped by Ctrl-C"
    print(f"interrupted: {kept}", file=sys.stderr, flush=True)
    return INTERRUPTED


def raised_by_ctrl_c(error: BaseException) -> bool:
    """Whether ``error`` stands for a Ctrl-C: CPython reports a
    ``KeyboardInterrupt`` that reached compiled code in a call back into
    Python (Numba's cache loading) as a ``SystemError`` caused by it."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def incomplete_line(answer: str, runs: int) -> str:
    """What a search stopped by Ctrl-C says in place of its answer, under
    the table of the ``runs`` points it tried."""
    return f"{answer}: incomplete: Ctrl-C stopped the search after {runs:,} finished run(s), before its answer"


@contextmanager
def sigint_held() -> Iterator[None]:
    """SIGINT held back while the block runs, then given to the handler it
    had: a worker process or thread started meanwhile never sees it, and
    the block is never cut half-way by ``KeyboardInterrupt``.

    Two things hold it. The signal is blocked in this thread, and the
    processes and threads it starts inherit the mask (through fork and
    exec). And the process's Python handler only notes it: the kernel
    gives a signal blocked here to any other thread that does not block
    it (a BLAS library's, started with numpy), whose handler would then
    raise ``KeyboardInterrupt`` here all the same. One noted is sent again
    (``raise_signal``) once the handler is back, so it is acted on the
    moment the block ends: whatever the block made must by then be where
    the caller's cleanup finds it (``worker_pool``). In a thread other than
    the main one, or without signal masks (Windows), nothing is held."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # one that came is noted here
    finally:
        signal.signal(signal.SIGINT, previous)
    if came:
        signal.raise_signal(signal.SIGINT)


@contextmanager
def worker_pool(make: Callable[[], Any]) -> Iterator[Any]:
    """The pool ``make()`` returns (a ``multiprocessing`` pool, or one with
    its interface: Ray's), made with SIGINT held so that its workers never
    see it (see the module doc); closed and joined when the block ends,
    terminated if it raises (Ctrl-C among the rest): the runs still going
    are not wanted, and joining would wait for them.

    Python's resource tracker, a process that a spawned pool's first lock
    starts, is started first: starting it, ``multiprocessing`` blocks and
    then unblocks SIGINT (to keep the tracker deaf), and that would undo
    the hold for the workers made after it."""
    if os.name == "posix":
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    pool = None
    try:
        with sigint_held():
            pool = make()
        yield pool
    except BaseException:
        if pool is not None:
            pool.terminate()
        raise
    pool.close()
    pool.join()


__all__ = [
    "INTERRUPTED",
    "Interrupted",
    "incomplete_line",
    "raised_by_ctrl_c",
    "say_interrupted",
    "sigint_held",
    "worker_pool",
]
