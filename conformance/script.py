"""The call log: every step of a conformance run as a line of Python.

Changes to the world (new sequences, tokens, statuses) are *executed from
their own source line* (``do``), so the log cannot drift from what was done;
manager calls are logged as ``lock.call("name", args...)`` lines. ``render``
turns the log into a script that rebuilds the managers and replays every
step: a failure found by Hypothesis (after shrinking) prints the shortest
sequence of calls as a snippet anyone can paste and run.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

HEADER = """\
from blockspace import Device, Sequence, SequenceGroup, SequenceStatus
from blockspace.conformance import Lockstep
"""


def class_path(impl: Any) -> str:
    """How ``load_manager_class`` finds an implementation again."""
    if isinstance(impl, str):
        return impl
    return f"{impl.__module__}:{impl.__qualname__}"


class Script:
    """A runnable log of one conformance run."""

    def __init__(self, impls: Mapping[str, Any] | None = None, config: Mapping[str, Any] | None = None) -> None:
        self.namespace: dict[str, Any] = {}
        exec(HEADER, self.namespace)
        self.lines: list[str] = []
        self.impls = dict(impls or {})
        self.config = dict(config or {})

    # -- world changes ---------------------------------------------------------
    def do(self, code: str) -> Any:
        """Execute one statement in the script's namespace and log it."""
        exec(code, self.namespace)
        self.lines.append(code)

    def get(self, name: str) -> Any:
        return self.namespace[name]

    # -- manager calls ---------------------------------------------------------
    def call_line(self, method: str, args: tuple, kwargs: Mapping[str, Any]) -> str:
        parts = [repr(method)] + [self.render_value(a) for a in args]
        parts += [f"{k}={self.render_value(v)}" for k, v in kwargs.items()]
        return f"lock.call({', '.join(parts)})"

    def add(self, line: str, comment: str = "") -> None:
        if comment:
            comment = comment if len(comment) < 100 else comment[:97] + "..."
            line = f"{line}  # {comment}"
        self.lines.append(line)

    @property
    def num_calls(self) -> int:
        return sum(1 for line in self.lines if line.startswith("lock.call("))

    def render_value(self, value: Any) -> str:
        """Source text for an argument: a name from the namespace for world
        objects, a literal for data."""
        for name, known in self.namespace.items():
            if known is value and not name.startswith("__") and not isinstance(value, (int, float, str, type(None))):
                return name
        if isinstance(value, list):
            return "[" + ", ".join(self.render_value(v) for v in value) + "]"
        if isinstance(value, tuple):
            inner = ", ".join(self.render_value(v) for v in value)
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        if isinstance(value, enum.Enum):
            return f"{type(value).__name__}.{value.name}"
        return repr(value)

    # -- output -----------------------------------------------------------------
    def render(self) -> str:
        impls = ", ".join(f"{name!r}: {class_path(impl)!r}" for name, impl in self.impls.items())
        config = ", ".join(f"{k}={v!r}" for k, v in self.config.items())
        build = f"lock = Lockstep.build({{{impls}}}, {config})" if config else f"lock = Lockstep.build({{{impls}}})"
        return HEADER + build + "\n" + "\n".join(self.lines) + "\n"
