"""Kernels that borrow their arrays: compiled without Numba's reference counts.

Why: a compiled function counts a reference up and down (a call to
``NRT_incref`` and one to ``NRT_decref``, each an atomic add) for every array
it binds: each argument, and each field it reads off a handle. A pool handle
holds twenty arrays, so a small kernel taking it paid forty calls, more than
its own work; in a replay of the conversation trace those calls took about a
quarter of the time (docs/measurements/2026-12-06-borrowing-kernels.md).

A kernel that allocates nothing and returns no array needs none of them: its
caller holds a reference to every array for the length of the call.
``borrowing`` compiles such a kernel with Numba's runtime off (``_nrt=False``,
an option of Numba's CPU target, in the versions ``fast/dispatch.py`` allows).

Two rules keep that safe, and both are checked:

- it allocates nothing: without the runtime the compiler refuses to;
- it returns no array, nor a tuple holding one, since its caller would give
  back a reference it was never given. ``tests/test_borrowing.py`` reads the
  return type of every compiled signature of every kernel listed here.

Inlined helpers (``inline="always"``) are compiled into their caller, so they
keep ``njit``: they borrow wherever their caller does.

Every other kernel is ``counting``: ``njit(cache=True)`` with the runtime on,
stated. Why stated: a kernel that does not state it takes the setting of the
first caller Numba compiles it for, and keeps that copy for every later
caller. Compiled first inside a borrowing kernel, a kernel that returns one of
its arrays would then count no reference for a caller that counts them, and
one that reads a handle would not compile at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numba import njit

KERNELS: list[Any] = []  # every borrowing kernel, for the test of the rules
OPTIONS: dict[str, Any] = {"cache": True, "_nrt": False}  # _nrt: Numba's CPU target option, not in its stubs
COUNTING: dict[str, Any] = {"cache": True, "_nrt": True}


def borrowing(function: Callable[..., Any] | None = None, *, nogil: bool = False) -> Any:
    """``njit(cache=True)`` without reference counts, for a kernel that keeps the rules above
    (``nogil``: as ``njit``'s, for a kernel that threads run side by side)."""
    if function is None:
        return lambda function: borrowing(function, nogil=nogil)
    kernel = njit(nogil=nogil, **OPTIONS)(function)
    KERNELS.append(kernel)
    return kernel


def counting(function: Callable[..., Any]) -> Any:
    """``njit(cache=True)`` with reference counts, whoever calls it first (see above)."""
    return njit(**COUNTING)(function)


__all__ = ["KERNELS", "borrowing", "counting"]
