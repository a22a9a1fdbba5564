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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numba import njit

KERNELS: list[Any] = []  # every borrowing kernel, for the test of the rules
OPTIONS: dict[str, Any] = {"cache": True, "_nrt": False}  # _nrt: Numba's CPU target option, not in its stubs


def borrowing(function: Callable[..., Any]) -> Any:
    """``njit(cache=True)`` without reference counts, for a kernel that keeps the rules above."""
    kernel = njit(**OPTIONS)(function)
    KERNELS.append(kernel)
    return kernel


__all__ = ["KERNELS", "borrowing"]
