"""A one-line notice on stderr while the fast manager's kernels compile.

Why: the fast manager's Numba kernels (``@njit(cache=True)``) compile the
first time they are called on a machine, about 20 s in all (40 s with the
simulator's compiled engine, which compiles with them: ``numba_cache.py``
stamps both with the same files), and a command silent for that long looks hung. Numba keeps them in its on-disk cache
afterwards, and the next runs load them in a fraction of a second.

How a cold cache is told apart, at no cost: Numba broadcasts the event
``numba:compile`` only when it compiles, that is when its cache had nothing
for the kernel (a hit loads it without the event). The first such compile of
a kernel of ``blockspace.fast`` prints the notice, once a process; a warm
cache, or a run that never builds the fast manager (``--manager
reference``), prints nothing. It comes when the compiling starts, wherever
the command builds its first fast manager (``blockspace simulate`` inside
its simulator, ``blockspace conformance`` in its first check), with no
knowledge of either.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from numba.core import event as numba_event

NOTICE = "compiling the fast manager's kernels (first run on this machine, up to a minute)"
KERNELS = "blockspace.fast"  # the package whose kernels the notice is about


class CompileNotice(numba_event.Listener):
    """Says ``NOTICE`` at the first compile of a kernel of ``package``, then nothing."""

    def __init__(self, stream: TextIO | None = None, package: str = KERNELS) -> None:
        self.stream = stream
        self.package = package
        self.said = False

    def on_start(self, event: Any) -> None:
        if self.said:
            return
        module = getattr(getattr(event.data["dispatcher"], "py_func", None), "__module__", None) or ""
        if module == self.package or module.startswith(self.package + "."):
            self.said = True
            print(NOTICE, file=self.stream or sys.stderr, flush=True)  # sys.stderr now: a test may have replaced it

    def on_end(self, event: Any) -> None:
        """Nothing: the notice is said as the compiling starts."""


_watching: CompileNotice | None = None


def watch() -> CompileNotice:
    """Listen for the first compile of a fast kernel in this process (once:
    the command may run many times in one process, as the tests do)."""
    global _watching
    if _watching is None:
        _watching = CompileNotice()
        numba_event.register("numba:compile", _watching)
    return _watching
