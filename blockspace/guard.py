"""Detecting concurrent use of a manager (the contract: one scheduler thread).

A block manager is a single-threaded data structure, like vLLM's: every
method reads and writes shared state without locks. Calling it from two
threads at once corrupts it silently. ``guard_concurrency`` wraps every
public method of a manager class with a busy flag: a call that starts while
another call on the same manager is still running (another thread, or a
callback re-entering the manager) raises ``ConcurrentUseError`` instead.

The flag costs one attribute test and two stores per call, about 0.1 us in
CPython, so it is opt-in: set ``BLOCKSPACE_CHECK_THREADS=1`` in the
environment before blockspace is imported (tests and debugging), and the
hot path of production schedulers is untouched. It is a best-effort check
(the test and set are not one atomic step), which is enough to turn silent
corruption into an error in practice.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any, TypeVar

from blockspace.errors import BlockSpaceError

T = TypeVar("T", bound=type)

ENABLED = os.environ.get("BLOCKSPACE_CHECK_THREADS", "") not in ("", "0")
BUSY = "_blockspace_busy"  # the flag's attribute (a manager's saved state leaves it out)


class ConcurrentUseError(BlockSpaceError, RuntimeError):
    """A manager method was called while another call on it was running."""


def _guarded(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.__dict__.get(BUSY):
            raise ConcurrentUseError(
                f"{type(self).__name__}.{method.__name__} called while another call is running: "
                "a block manager must be driven by one scheduler thread"
            )
        self._blockspace_busy = True  # BUSY, stored directly: this runs around every call
        try:
            return method(self, *args, **kwargs)
        finally:
            self._blockspace_busy = False

    call.guarded = True  # type: ignore[attr-defined]
    return call


def guard_concurrency(cls: T, enabled: bool = ENABLED) -> T:
    """Class decorator: wrap the public methods when checking is enabled."""
    if not enabled:
        return cls
    for name in dir(cls):
        member = inspect.getattr_static(cls, name)
        if not name.startswith("_") and inspect.isfunction(member) and not getattr(member, "guarded", False):
            setattr(cls, name, _guarded(member))
    return cls
