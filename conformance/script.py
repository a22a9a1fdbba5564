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

from blockspace.enums import SequenceStatus
from blockspace.sequence import Sequence, SequenceGroup

HEADER = """\
from blockspace import Device, Sequence, SequenceGroup, SequenceStatus
from blockspace.conformance import Lockstep
from blockspace.conformance.invariants import World
from blockspace.conformance.script import restore
"""


QUIET = "\0"  # marks a logged observation (see Script.add)


def restore(
    seq: Sequence, tokens: list[int], status: SequenceStatus, computed: int, output: int, decoding: bool
) -> None:
    """Set a sequence's tokens, status and progress (a repro's copy of a
    sequence made outside the script catches up with the original)."""
    seq.data._token_ids, seq.data._make_tokens = list(tokens), None
    seq.data._num_computed_tokens, seq.data._num_output_tokens, seq.data._is_decoding = computed, output, decoding
    seq.status = status


def _state(value: Any) -> tuple:
    """What a repro must rebuild of one of our own sequences or groups."""
    if isinstance(value, Sequence):
        data = value.data
        return (tuple(value.get_token_ids()), value.status, data._num_computed_tokens, data._num_output_tokens,
                data._is_decoding)  # fmt: skip
    return (tuple(id(seq) for seq in value.seqs), value.cache_salt)


def class_path(impl: Any) -> str:
    """How ``load_manager_class`` finds an implementation again."""
    if isinstance(impl, str):
        return impl
    return f"{impl.__module__}:{impl.__qualname__}"


def impls_source(impls: Mapping[str, Any]) -> str:
    """The ``{name: "module:Class"}`` literal a repro builds its managers from."""
    return "{" + ", ".join(f"{name!r}: {class_path(impl)!r}" for name, impl in impls.items()) + "}"


class Script:
    """A runnable log of one conformance run."""

    def __init__(self, impls: Mapping[str, Any] | None = None, config: Mapping[str, Any] | None = None) -> None:
        self.namespace: dict[str, Any] = {}
        exec(HEADER, self.namespace)
        self.lines: list[str] = []
        self.impls = dict(impls or {})
        self.config = dict(config or {})
        self.outside: dict[int, tuple[str, Any, tuple]] = {}  # id -> (name, object, state last written)

    # -- world changes ---------------------------------------------------------
    def do(self, code: str) -> Any:
        """Execute one statement in the script's namespace and log it."""
        exec(code, self.namespace)
        self.lines.append(code)

    def get(self, name: str) -> Any:
        return self.namespace[name]

    # -- manager calls ---------------------------------------------------------
    def call_line(self, method: str, args: tuple, kwargs: Mapping[str, Any]) -> str:
        self.catch_up()
        parts = [repr(method)] + [self.render_value(a) for a in args]
        parts += [f"{k}={self.render_value(v)}" for k, v in kwargs.items()]
        return f"lock.call({', '.join(parts)})"

    def add(self, line: str, comment: str = "", quiet: bool = False) -> None:
        """Log a call; a ``quiet`` one (an observation) only in ``render(quiet=True)``."""
        if comment:
            comment = comment if len(comment) < 100 else comment[:97] + "..."
            line = f"{line}  # {comment}"
        self.lines.append(QUIET + line if quiet else line)

    @property
    def num_calls(self) -> int:
        return sum(1 for line in self.lines if line.startswith("lock.call("))

    # -- objects made outside the script --------------------------------------------
    def adopt(self, value: Sequence | SequenceGroup) -> str:
        """A name for one of our own sequences or groups that the script did
        not make (a ``Lockstep`` driven by hand): a line that rebuilds it
        now, and later ``catch_up`` lines when it changes."""
        if isinstance(value, Sequence):
            options = "".join(
                f", {key}={getattr(value, key)!r}"
                for key in ("lora_int_id", "prompt_adapter_id")
                if getattr(value, key)
            )
            if value._cache_salt is not None:
                options += f", cache_salt={value._cache_salt!r}"
            code = f"Sequence({value.seq_id!r}{options})"
        else:  # its sequences first: they get their names before it does
            seqs = ", ".join(self.render_value(seq) for seq in value.seqs)
            encoder = f", {self.render_value(value.encoder_seq)}" if value.encoder_seq is not None else ""
            code = f"SequenceGroup({value.request_id!r}, [{seqs}]{encoder})"
        name = f"o{len(self.outside) + 1}"
        self.lines.append(f"{name} = {code}")
        self.namespace[name] = value
        built = () if isinstance(value, Sequence) else (tuple(id(seq) for seq in value.seqs), None)
        self.outside[id(value)] = (name, value, built)
        self._write_state(id(value))
        return name

    def _write_state(self, key: int) -> None:
        name, value, written = self.outside[key]
        state = _state(value)
        if state == written:
            return
        if isinstance(value, Sequence):
            tokens, status, computed, output, decoding = state
            self.lines.append(
                f"restore({name}, {list(tokens)!r}, SequenceStatus.{status.name}, {computed}, {output}, {decoding})"
            )
        else:
            seqs = ", ".join(self.render_value(seq) for seq in value.seqs)
            self.lines.append(f"{name}.seqs[:] = [{seqs}]; {name}.cache_salt = {value.cache_salt!r}")
        self.outside[key] = (name, value, state)

    def catch_up(self) -> None:
        """Lines that bring the repro's copies of outside objects to their state now."""
        for key in list(self.outside):
            self._write_state(key)

    def render_value(self, value: Any) -> str:
        """Source text for an argument: a name from the namespace for world
        objects, a literal for data."""
        for name, known in self.namespace.items():
            if known is value and not name.startswith("__") and not isinstance(value, (int, float, str, type(None))):
                return name
        if isinstance(value, (Sequence, SequenceGroup)):
            return self.adopt(value)
        if isinstance(value, list):
            return "[" + ", ".join(self.render_value(v) for v in value) + "]"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{self.render_value(k)}: {self.render_value(v)}" for k, v in value.items()) + "}"
        if isinstance(value, tuple):
            inner = ", ".join(self.render_value(v) for v in value)
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        if isinstance(value, enum.Enum):
            return f"{type(value).__name__}.{value.name}"
        return repr(value)

    # -- output -----------------------------------------------------------------
    def render(self, quiet: bool = False) -> str:
        """The runnable script; with ``quiet`` the observations too (a buggy
        manager's answer may depend on them, when the short form does not
        fail on its own)."""
        impls = impls_source(self.impls)
        config = ", ".join(f"{k}={v!r}" for k, v in self.config.items())
        build = f"lock = Lockstep.build({impls}, {config})" if config else f"lock = Lockstep.build({impls})"
        lines = [line.removeprefix(QUIET) for line in self.lines if quiet or not line.startswith(QUIET)]
        return HEADER + build + "\n" + "\n".join(lines) + "\n"
