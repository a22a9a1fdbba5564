"""Numba's on-disk cache kept fresh across the package's compiled files.

Why: Numba stamps a function's cached machine code with its own source
file's modification time and size, and with nothing else. A compiled
function calling one in another file (the compiled engine's loop calls
fast's kernels; fast's table kernels call the pool's) keeps its cached
code, the callee's old code linked into it, after only the callee's file
changed: stale machine code, and no error. Here every cached function of
the compiled parts (``fast/``, ``simulator/compiled/``, and
the Python engine's rules the compiled one compiles: ``ROOTS``) is
stamped with the stamps of all their files together, so a change to any of
them compiles each function afresh, once.

How: Numba picks a cache locator per function from a list of locator
classes; ``install`` puts one in front that takes the functions of those
files, lets Numba's own locators decide where their cache goes (as they
would have: ``NUMBA_CACHE_DIR``, next to the source, or the user's cache),
and answers the joint stamp. It relies on one Numba internal
(``CacheImpl._locator_classes``, ``_CacheImpl`` before Numba 0.61, present
in the versions ``fast/dispatch.py`` allows); without it nothing changes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

ROOTS = (
    Path(__file__).resolve().parent.parent / "fast",
    Path(__file__).resolve().parent.parent / "simulator" / "compiled",
    Path(__file__).resolve().parent.parent / "simulator" / "budget.py",  # a Python rule the compiled engine compiles
    Path(__file__).resolve().parent.parent / "simulator" / "metrics.py",  # the counts the compiled loop keeps
    Path(__file__).resolve().parent.parent / "simulator" / "clock.py",  # the step time, a rule both engines call
)


def joint_stamp(roots: tuple[Path, ...] = ROOTS) -> str:
    """One stamp for every ``.py`` file of ``roots`` (a folder's, or a file):
    their names, times and sizes."""
    digest = hashlib.sha256()
    for root in roots:
        for path in [root] if root.suffix == ".py" else sorted(root.glob("*.py")):
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_mtime_ns}:{stat.st_size};".encode())
    return digest.hexdigest()


def install() -> None:
    """Put the joint stamp in front of Numba's locators (once per process)."""
    try:
        from numba.core import caching
    except ImportError:  # no Numba: nothing is cached
        return
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)  # the name moved in 0.6x
    base = getattr(caching, "_CacheLocator", None)
    classes = getattr(impl, "_locator_classes", None)
    if base is None or not isinstance(classes, list):  # another Numba: its own stamps, as before
        return
    if any(getattr(c, "JOINT", False) for c in classes):
        return
    fallbacks = list(classes)
    roots = tuple(str(root) for root in ROOTS)
    stamp = joint_stamp()

    class JointStampLocator(base):  # type: ignore[misc, valid-type]  # Numba's class, found at run time
        """Numba's own locator for the function, with the joint stamp."""

        JOINT = True

        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def ensure_cache_path(self) -> None:
            self._inner.ensure_cache_path()

        def get_cache_path(self) -> str:
            return str(self._inner.get_cache_path())

        def get_source_stamp(self) -> Any:
            return (self._inner.get_source_stamp(), stamp)

        def get_disambiguator(self) -> str:
            return str(self._inner.get_disambiguator())

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> JointStampLocator | None:
            if not str(Path(py_file).resolve()).startswith(roots):
                return None
            for fallback in fallbacks:
                inner = fallback.from_function(py_func, py_file)
                if inner is not None:
                    return cls(inner)
            return None

    classes.insert(0, JointStampLocator)


__all__ = ["ROOTS", "install", "joint_stamp"]
