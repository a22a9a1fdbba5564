"""Calling a compiled kernel without the dispatcher's per-call typing.

Numba's dispatcher works out the types of every argument on every call; for
a kernel taking three NamedTuples of arrays that costs more than the kernel
itself (about 10 us against 1 us). The manager always calls a given kernel
with the same argument types (fixed dtypes, Python ints and bools), so after
the first call has compiled (or loaded from the cache) its one overload,
``direct`` calls that overload's entry point straight away. A kernel with
more than one overload, or run as plain Python under ``NUMBA_DISABLE_JIT=1``,
keeps going through the dispatcher.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


class direct:  # noqa: N801 - used like a function
    """``direct(kernel)(*args)`` is ``kernel(*args)``, minus the typing.
    ``rebind``, if set, is called with the entry point once it is known (see
    ``rebind_module``)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.entry = None
        self.rebind: Callable[[Any], None] | None = None
        self.__doc__ = kernel.__doc__

    def __call__(self, *args: Any) -> Any:
        if self.entry is not None:
            return self.entry(*args)
        result = self.kernel(*args)
        overloads = getattr(self.kernel, "overloads", None)
        if overloads is not None and len(overloads) == 1:
            self.entry = next(iter(overloads.values())).entry_point
            if self.rebind is not None:
                self.rebind(self.entry)
        return result


def rebind_module(namespace: dict[str, Any]) -> None:
    """Let every ``direct`` of a module's namespace replace itself there by
    its entry point once known: a caller that looks the kernel up as
    ``module.name`` then calls compiled code with no Python frame between
    (about 0.15 us a call)."""
    for name, value in list(namespace.items()):
        if isinstance(value, direct):
            value.rebind = functools.partial(namespace.__setitem__, name)
