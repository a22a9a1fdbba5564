"""Calling a compiled kernel without the dispatcher's per-call typing.

Numba's dispatcher works out the types of every argument on every call; for
a kernel taking three NamedTuples of arrays that costs more than the kernel
itself (about 10 us against 1 us). The manager always calls a given kernel
with the same argument types (fixed dtypes, Python ints and bools), so after
the first call has compiled (or loaded from the cache) its one overload,
``direct`` calls that overload's entry point straight away.

The price is that nothing types a call any more: once a kernel is bound, a
wrong dtype or a missing argument reaches compiled code, which reads the
memory as the types it was compiled for. Hence two guards:

- ``BLOCKSPACE_KERNEL_DISPATCH=numba`` in the environment (read once, when
  this module is imported) sends every kernel call through Numba's own
  dispatcher: no entry point is taken and no module name is rebound, so
  every call is typed, and a wrong argument is Numba's ``TypingError`` (or
  a fresh compile, as for any compiled function). The answers are the same,
  only slower. ``direct`` (or the variable unset or empty) is the fast path;
  any other value is ``InvalidArgumentError`` at import, not a silent
  default. CI runs fast's tests and the kit's suite on fast both ways.
- The direct path rests on one Numba internal, ``overloads[sig].entry_point``.
  It is taken only on the Numba versions it was tested with (``NUMBA_VERSIONS``,
  the range ``pyproject.toml`` allows; any other warns once, at import), only
  when the attribute is there, and only for a kernel with exactly one overload
  after its first call. Anything else leaves that kernel on the dispatcher:
  slower, never wrong.

Under ``NUMBA_DISABLE_JIT=1`` a kernel is its plain Python function, which
has no overloads: ``direct`` just calls it.
"""

from __future__ import annotations

import functools
import os
import re
import warnings
from collections.abc import Callable
from typing import Any

import numba

from blockspace.errors import InvalidArgumentError

VARIABLE = "BLOCKSPACE_KERNEL_DISPATCH"
MODES = ("direct", "numba")  # the first is the default
# [first tested, first untested) minor versions of Numba: keep in step with numba's range in
# pyproject.toml (tests/test_dispatch.py checks that they agree).
NUMBA_VERSIONS = ((0, 60), (0, 69))


def requested_mode(value: str | None) -> str:
    """The mode an environment value names: case and spaces aside, one of
    ``MODES``; unset or empty is the default. A typo is refused rather than
    taken for the default, since the point of asking for ``numba`` is to
    know that every call is typed."""
    mode = (value or "").strip().lower() or MODES[0]
    if mode not in MODES:
        raise InvalidArgumentError(f"{VARIABLE} must be one of {', '.join(MODES)}, got {value!r}")
    return mode


def version_tuple(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as ``0.68.1`` or ``0.70.0rc1``;
    (0, 0) when it does not start that way (never in the tested range)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def takes_entry_points(mode: str, version: str, disable_jit: bool) -> bool:
    """Whether ``direct`` may bind entry points: the direct mode, compiled
    kernels, and a Numba whose internals it was tested against."""
    lowest, untested = NUMBA_VERSIONS
    return mode == "direct" and not disable_jit and lowest <= version_tuple(version) < untested


MODE = requested_mode(os.environ.get(VARIABLE))
# numba.config's settings are made from the environment when numba loads (hence the ignores: no checker sees them)
ENTRY_POINTS = takes_entry_points(MODE, numba.__version__, bool(numba.config.DISABLE_JIT))  # type: ignore[attr-defined]
if MODE == "direct" and not numba.config.DISABLE_JIT and not ENTRY_POINTS:  # type: ignore[attr-defined]
    warnings.warn(
        f"blockspace: Numba {numba.__version__} is outside the versions its direct kernel calls were tested with"
        f" ({'.'.join(map(str, NUMBA_VERSIONS[0]))} up to, not including,"
        f" {'.'.join(map(str, NUMBA_VERSIONS[1]))}): every kernel is called through Numba's dispatcher"
        f" (the same answers, slower); set {VARIABLE}=numba to ask for that and silence this",
        RuntimeWarning,
        stacklevel=1,  # this module: the importer's frame would be importlib's
    )


class direct:  # noqa: N801 - used like a function
    """``direct(kernel)(*args)`` is ``kernel(*args)``, minus the typing once
    bound. ``rebind``, if set, is called with the entry point once it is
    known (see ``rebind_module``)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.entry: Callable[..., Any] | None = None
        self.rebind: Callable[[Any], None] | None = None
        # Cleared by the first call that returns: whether the kernel can be bound is settled then
        # (its overloads only grow), so an unbindable kernel pays for the question once.
        self.binding = ENTRY_POINTS
        self.__doc__ = kernel.__doc__

    def __call__(self, *args: Any) -> Any:
        if self.entry is not None:
            return self.entry(*args)
        result = self.kernel(*args)
        if self.binding:
            self.binding = False
            self.bind()
        return result

    def bind(self) -> None:
        """Take the entry point of the kernel's one overload, if it has exactly
        one and Numba still offers it there; otherwise stay on the dispatcher."""
        overloads = getattr(self.kernel, "overloads", None)
        if overloads is None or len(overloads) != 1:
            return
        entry = getattr(next(iter(overloads.values())), "entry_point", None)
        if not callable(entry):
            return
        self.entry = entry
        if self.rebind is not None:
            self.rebind(entry)


def rebind_module(namespace: dict[str, Any]) -> None:
    """Let every ``direct`` of a module's namespace replace itself there by
    its entry point once known: a caller that looks the kernel up as
    ``module.name`` then calls compiled code with no Python frame between
    (about 0.15 us a call). Without entry points (``numba`` mode, an
    untested Numba, no JIT) the names stay ``direct`` objects."""
    if not ENTRY_POINTS:
        return
    for name, value in list(namespace.items()):
        if isinstance(value, direct):
            value.rebind = functools.partial(namespace.__setitem__, name)
