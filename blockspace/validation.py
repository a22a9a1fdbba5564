"""Argument checks shared by every implementation, so that each raises the
same error with the same message for the same bad input."""

from __future__ import annotations

import functools
import json
import math
import numbers
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from blockspace.enums import SequenceStatus
from blockspace.errors import (
    InvalidArgumentError,
    InvalidConfigError,
    NoWaitingSequenceError,
    SaltMismatchError,
    TrackerError,
    UnknownSequenceError,
    UnsupportedError,
)
from blockspace.saved_state import SavedState, config_of

if TYPE_CHECKING:
    from blockspace.protocols import SequenceGroupLike, SequenceLike

    Salt: TypeAlias = str | bytes | int | None  # a request's prefix-cache salt (None: no salt)

MAX_TOKEN_ID = 2**31 - 1  # token ids are stored as int32 by the fast manager


def _is_int(value: Any) -> bool:
    """An integer that is no bool (a plain ``int`` answers first: the ABC check costs more)."""
    return type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool))


def check_config(
    block_size: Any,
    num_gpu_blocks: Any,
    num_cpu_blocks: Any,
    watermark: Any,
    sliding_window: Any,
    enable_caching: Any,
) -> None:
    """Constructor arguments: positive block size and GPU pool, non-negative
    CPU pool, watermark >= 0, sliding window None or >= 0."""
    if not _is_int(block_size) or block_size <= 0:
        raise InvalidConfigError(f"block_size must be a positive int, got {block_size!r}")
    if not _is_int(num_gpu_blocks) or num_gpu_blocks <= 0:
        raise InvalidConfigError(f"num_gpu_blocks must be a positive int, got {num_gpu_blocks!r}")
    if not _is_int(num_cpu_blocks) or num_cpu_blocks < 0:
        raise InvalidConfigError(f"num_cpu_blocks must be a non-negative int, got {num_cpu_blocks!r}")
    if not isinstance(watermark, (int, float)) or isinstance(watermark, bool) or not watermark >= 0.0:
        raise InvalidConfigError(f"watermark must be >= 0.0, got {watermark!r}")
    if sliding_window is not None and (not _is_int(sliding_window) or sliding_window < 0):
        raise InvalidConfigError(f"sliding_window must be None or a non-negative int, got {sliding_window!r}")
    if sliding_window is not None and enable_caching:
        raise UnsupportedError("prefix caching with a sliding window is not supported (vLLM's engine rejects it too)")


def check_lookahead(num_lookahead_slots: Any) -> None:
    if not _is_int(num_lookahead_slots) or num_lookahead_slots < 0:
        raise InvalidArgumentError(f"num_lookahead_slots must be a non-negative int, got {num_lookahead_slots!r}")


def check_token_ids(seq: SequenceLike, tokens: Any, start: int = 0) -> None:
    """Every token id from ``start`` on is an int in ``0..MAX_TOKEN_ID``."""
    for position in range(start, len(tokens)):
        token = tokens[position]
        if not _is_int(token) or not 0 <= token <= MAX_TOKEN_ID:
            raise InvalidArgumentError(
                f"sequence {seq.seq_id}: token id {token!r} at position {position} is not an int in 0..{MAX_TOKEN_ID}"
            )


def token_ids(seq: SequenceLike, start: int = 0) -> list[int]:
    """The sequence's token ids, those from ``start`` on checked."""
    tokens = seq.get_token_ids()
    check_token_ids(seq, tokens, start)
    return tokens


def _checked_salt(salt: object, where: str) -> Salt:
    if salt is not None and not isinstance(salt, (str, bytes, int)):
        raise InvalidArgumentError(f"{where}: cache_salt must be a str, bytes or int, got {salt!r}")
    return salt


def cache_salt(seq: SequenceLike) -> Salt:
    """The tenant's prefix-cache salt of a sequence (``None``: no salt): its
    ``cache_salt`` attribute (ours reads through to its group), else the
    ``cache_salt`` of its ``inputs``, where vLLM keeps a request's prompt
    and salt for every sequence of it.

    Requests with different salts never share a cached block; the same salt
    shares as usual. vLLM's v0 sequences have no salt, hence the default.
    """
    salt = getattr(seq, "cache_salt", None)
    if salt is None:
        inputs = getattr(seq, "inputs", None)
        if isinstance(inputs, Mapping):
            salt = inputs.get("cache_salt")
    return _checked_salt(salt, f"sequence {seq.seq_id}")


def group_salt(seq_group: SequenceGroupLike, counted: Callable[[int], bool] = lambda seq_id: False) -> Salt:
    """The salt of a whole request: the group's ``cache_salt`` attribute
    and each sequence's (``cache_salt``) must agree; a sequence without one
    takes the group's. Anything else (two salts, or a salted and an unsalted
    sequence in an unsalted group) is refused with ``SaltMismatchError``:
    the sequences share one block table, so one salt must key it, and
    ``get_num_cached_tokens`` of each must count what that table will hit.

    For the same reason a salt only the group carries is refused for a
    sequence whose cached tokens were already ``counted`` (the manager's
    tracker holds it): the count was made without the salt (a vLLM
    ``Sequence`` has no link to its group), so ``allocate`` could not honour
    it. vLLM keeps the salt in every sequence's ``inputs``, where it is
    seen from the first call."""
    group = _checked_salt(getattr(seq_group, "cache_salt", None), f"group {seq_group.request_id!r}")
    salts: set[Salt] = {group} if group is not None else set()
    for seq in seq_group.get_seqs():
        own = cache_salt(seq)
        salts.add(group if own is None else own)
        if own is None and group is not None and counted(seq.seq_id):
            raise SaltMismatchError(
                f"group {seq_group.request_id!r}: the cached tokens of sequence {seq.seq_id} were counted without"
                " the group's cache salt (the sequence does not carry it); put the salt in every sequence's"
                " inputs['cache_salt'], as vLLM does"
            )
    if len(salts) > 1:
        found = ", ".join(sorted(repr(salt) for salt in salts))
        raise SaltMismatchError(f"group {seq_group.request_id!r}: its sequences carry different cache salts ({found})")
    return next(iter(salts), None)


def shrunk_tokens(seq_id: int, num_tokens: int, num_keyed_tokens: int) -> TrackerError:
    """The error for a sequence whose token list is shorter than what the
    computed-blocks tracker already keyed of it (token lists only grow)."""
    return TrackerError(
        f"sequence {seq_id} has {num_tokens} tokens, fewer than the {num_keyed_tokens} the tracker already keyed"
    )


def unknown_sequence(seq_id: int) -> UnknownSequenceError:
    """The error of a call naming a sequence without a block table."""
    return UnknownSequenceError(f"sequence {seq_id} has no block table")


def not_tracked(seq_id: int) -> TrackerError:
    """The error for removing a sequence the computed-blocks tracker does not hold."""
    return TrackerError(f"sequence {seq_id} is not in the computed-blocks tracker (query it first)")


def check_saved(saved: Any, implementation: str, manager: Any) -> None:
    """``restore_state``'s argument: a ``SavedState`` of this implementation
    and of this manager's configuration (refused before any change)."""
    if not isinstance(saved, SavedState):
        raise InvalidArgumentError(f"restore_state() takes what save_state() returned, not {type(saved).__name__}")
    if saved.implementation != implementation:
        raise InvalidArgumentError(
            f"a state saved by the {saved.implementation} manager cannot be restored into the {implementation} one"
        )
    if saved.config != config_of(manager):
        raise InvalidArgumentError(
            f"a state saved with the configuration {saved.config} cannot be restored into one of {config_of(manager)}"
        )


def waiting_seqs(seq_group: SequenceGroupLike) -> Sequence[SequenceLike]:
    """The group's WAITING sequences; a group with none cannot be admitted."""
    waiting = seq_group.get_seqs(status=SequenceStatus.WAITING)
    if not waiting:
        raise NoWaitingSequenceError(f"group {seq_group.request_id!r} has no WAITING sequence")
    return waiting


def check_encoder_decoder(seq_group: SequenceGroupLike, sliding_window: int | None, enable_caching: bool) -> None:
    """vLLM v0 supports neither a sliding window nor prefix caching for
    encoder-decoder requests (its own messages)."""
    if not seq_group.is_encoder_decoder():
        return
    if sliding_window is not None:
        raise UnsupportedError("Sliding window attention for encoder/decoder models is not currently supported.")
    if enable_caching:
        raise UnsupportedError("Prefix caching for encoder/decoder models is not currently supported.")


# -- the commands' options --------------------------------------------------------------
# Every ``blockspace`` command checks all its options, its managers and its output paths
# before any work, with the messages below: a bad value is one ``error: ...`` line naming
# the option, and exit status 2 (``refuse``). Kept here, beside the managers' own checks,
# so that no command words a check of its own; argparse is imported only when a command
# builds its parser, not by the managers, which import this module too.


def refuse(error: BaseException | str, status: int = 2) -> int:
    """Say ``error`` as the one ``error:`` line on stderr; the exit status to return."""
    print(f"error: {error}", file=sys.stderr)
    return status


def plain(text: str) -> str:
    """Docstring text as --help shows it: no reST literal marks."""
    return text.replace("``", "")


@functools.cache
def _parser_classes() -> tuple[type, type]:
    """(parser, help formatter), made at the first call: see above."""
    import argparse

    class Formatter(argparse.ArgumentDefaultsHelpFormatter):
        """Every option's default in its help, unless the help says it in words."""

        def _get_help_string(self, action: argparse.Action) -> str | None:
            if action.help and "default" in action.help:
                return action.help
            return super()._get_help_string(action)

    class Parser(argparse.ArgumentParser):
        """argparse's parser, whose errors are raised (the command says them in one
        line and exits 2) instead of printed under the usage, and whose help is plain."""

        def error(self, message: str) -> Any:
            raise InvalidArgumentError(message)

        def format_help(self) -> str:
            return plain(super().format_help())

    return Parser, Formatter


def command_parser(prog: str, doc: str) -> Any:
    """The argparse parser of a command: its description the first paragraph of
    ``doc``, every default shown in --help, a bad option raised as
    ``InvalidArgumentError`` (so ``parser.parse_args`` goes inside the
    command's ``try``)."""
    parser, formatter = _parser_classes()
    return parser(prog=prog, description=plain(doc.strip().split("\n\n")[0]), formatter_class=formatter)


def given_options(parser: Any, argv: Sequence[str]) -> frozenset[str]:
    """The destinations of the options ``argv`` names, whatever their values.

    A default is no choice of the user's: an option that a mode ignores is
    refused only when it was written on the command line, even if its value
    equals the default. ``argv`` is parsed again with every default taken
    away, so only what was written lands in the namespace."""
    import argparse
    import copy

    bare = copy.deepcopy(parser)
    for action in bare._actions:
        action.default = argparse.SUPPRESS
    return frozenset(vars(bare.parse_args(list(argv))))


# An option that only some modes read (a mode: an option such as --sweep or --trace, in force when
# set): {option: (the modes, why)}, by argparse destination. NEEDS: read only beside one of them;
# APART: never beside any of them.
ModeTable: TypeAlias = Mapping[str, tuple[tuple[str, ...], str]]


def check_mode_options(given: Iterable[str], modes: Iterable[str], needs: ModeTable, apart: ModeTable) -> None:
    """No option of ``given`` (those written on the command line, see
    ``given_options``) is where the ``modes`` in force do not read it.

    Such an option would change nothing, and the run would answer another
    question than the one asked with exit status 0; so it is refused, naming
    the option, the mode and why. Every command words it the same way."""
    active = set(modes)
    for dest in sorted(given):
        wanted, why = needs.get(dest, ((), ""))
        if wanted and not active & set(wanted):
            raise InvalidArgumentError(f"{option_name(dest)} goes with {' or '.join(map(option_name, wanted))}: {why}")
        excluded, why = apart.get(dest, ((), ""))
        for mode in excluded:
            if mode in active:
                raise InvalidArgumentError(f"{option_name(dest)} cannot go with {option_name(mode)}: {why}")


def check_distinct_outputs(files: Mapping[str, Path], folders: Mapping[str, Path] = {}) -> None:
    """The files one command writes (``{what: path}``) are distinct, and none
    stands where another output needs a folder (one of ``folders``, or the
    folder above another file): a second write would replace the first, and
    a file cannot also be a folder. Checked before the work, like every
    other path."""
    resolved = {what: Path(path).absolute().resolve() for what, path in {**folders, **files}.items()}
    for what in files:
        for other, other_path in resolved.items():
            if other != what and resolved[what] == other_path:
                raise InvalidArgumentError(f"{what} {files[what]} is also where {other} goes")
            if resolved[what] in other_path.parents:
                raise InvalidArgumentError(f"{what} {files[what]} must be a folder for {other}")


def option_name(dest: str) -> str:
    """The option an argparse destination comes from: ``block_size`` -> ``--block-size``."""
    return "--" + dest.replace("_", "-")


@dataclass(frozen=True)
class Range:
    """Where a numeric option's values make sense: ``>= least``, ``> above``,
    ``< below``, ``<= most`` (each optional); a real number must also be
    finite (an infinite time or size is no configuration, and NaN fails
    every bound)."""

    least: float | None = None
    above: float | None = None
    below: float | None = None
    most: float | None = None

    def check(self, option: str, value: Any) -> None:
        """``InvalidArgumentError`` naming ``option`` and the first bound ``value`` breaks."""
        for bound, holds, words in (
            (self.least, lambda v, b: v >= b, ">="),
            (self.above, lambda v, b: v > b, ">"),
            (self.below, lambda v, b: v < b, "<"),
            (self.most, lambda v, b: v <= b, "<="),
        ):
            if bound is not None and not holds(value, bound):
                raise InvalidArgumentError(f"{option} must be {words} {bound:g}, got {value}")
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidArgumentError(f"{option} must be a finite number, got {value}")


def check_ranges(args: Any, ranges: Mapping[str, Range]) -> None:
    """Every option of ``ranges`` (by argparse destination) that has a value in its range."""
    for dest, allowed in ranges.items():
        value = getattr(args, dest)
        if value is not None:
            allowed.check(option_name(dest), value)


def check_output_dir(path: str | Path, option: str, files: Iterable[str] = ()) -> None:
    """``path`` is a folder this process can write in, or one it can create,
    and none of ``files`` in it is a folder: checked before a command's work,
    so that hours of it are not lost to a typo in where the results go."""
    path = Path(path)
    _check_writable(path, option, path)
    for name in files:
        if (path / name).is_dir():
            raise InvalidArgumentError(f"{option} {path}: {path / name} is a folder")


def check_output_file(path: str | Path, option: str) -> None:
    """``path`` is a file this process can write, or create (see ``check_output_dir``)."""
    path = Path(path)
    if path.is_dir():
        raise InvalidArgumentError(f"{option} {path}: is a folder")
    if path.exists() and not os.access(path, os.W_OK):
        raise InvalidArgumentError(f"{option} {path}: cannot write it (permission denied)")
    _check_writable(path.absolute().parent, option, path)


def write_output(path: str | Path, text: str) -> None:
    """Write a checked output file (``check_output_file``), making its
    missing folders: the check accepted them as makeable. Whole or not at
    all (``outputs.write_text``)."""
    from blockspace.outputs import write_text

    write_text(path, text)


def _check_writable(folder: Path, option: str, named: Path) -> None:
    """``folder`` exists and takes a new file, or its nearest existing parent
    does (it will be made); ``named`` is the option's value, for the message.
    A file is made and removed to find out: permission bits say nothing to
    root, nor about /proc or a read-only mount."""
    existing = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise InvalidArgumentError(f"{option} {named}: {existing} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise InvalidArgumentError(f"{option} {named}: cannot write in {existing} ({error.strerror})") from None


SMALL_CONFIG = {"block_size": 16, "num_gpu_blocks": 8, "num_cpu_blocks": 4}  # what a manager must construct with


def load_manager(spec: str, option: str) -> type:
    """The manager class ``spec`` names (``fast``, ``package.module:Class``),
    checked to be one before anything runs: a class with every method of the
    v0 interface that constructs with a small configuration. Anything else is
    ``InvalidArgumentError`` naming ``option``, not a failure deep in a run."""
    from blockspace.interfaces import BlockSpaceManager, load_manager_class

    try:
        cls = load_manager_class(spec)
    except ValueError as error:  # neither a known name nor module:Class
        raise InvalidArgumentError(f"{option}: {error}") from None
    except Exception as error:  # the module's own code runs on import: anything may come out
        raise InvalidArgumentError(f"{option}: cannot load manager {spec!r}: {type(error).__name__}: {error}") from None
    if not isinstance(cls, type):
        raise InvalidArgumentError(f"{option}: {spec!r} is not a class")
    methods = BlockSpaceManager.__abstractmethods__
    missing = sorted(name for name in methods if not callable(getattr(cls, name, None)))
    if missing:
        named = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        raise InvalidArgumentError(
            f"{option}: {spec!r} is not a block manager: it lacks {len(missing)} of the {len(methods)} methods"
            f" of the v0 interface ({named})"
        )
    try:
        cls(**SMALL_CONFIG)
    except Exception as error:
        config = ", ".join(f"{k}={v}" for k, v in SMALL_CONFIG.items())
        raise InvalidArgumentError(
            f"{option}: {spec!r} does not construct as a block manager ({config}): {type(error).__name__}: {error}"
        ) from None
    return cls


# -- JSON files a command reads -----------------------------------------------------------
# A file given to a command (a step-time model, say) is checked whole before any work, and
# each message starts with the file's name, so that it reads well after the option that
# named the file: "--step-model: profile.json: missing key 'decode_seq_us'".


def read_json_object(path: str | Path, holds: str) -> dict[str, Any]:
    """The JSON object the file at ``path`` holds (``holds`` says what it should
    hold, for the message); ``InvalidArgumentError`` naming the file when it is
    missing, unreadable, not UTF-8 text, not JSON, or JSON but not an object."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidArgumentError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InvalidArgumentError(f"{path}: is a folder, not a file") from None
    except OSError as error:
        raise InvalidArgumentError(f"{path}: cannot read it ({error.strerror})") from None
    except UnicodeDecodeError:
        raise InvalidArgumentError(f"{path}: is not UTF-8 text") from None
    try:
        found = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidArgumentError(
            f"{path}: is not JSON ({error.msg} at line {error.lineno}, column {error.colno})"
        ) from None
    if not isinstance(found, dict):
        raise InvalidArgumentError(f"{path}: holds a JSON {_json_kind(found)}, not an object of {holds}")
    return found


def _json_kind(value: Any) -> str:
    """What JSON calls the type of a parsed value."""
    kinds = ((bool, "boolean"), (str, "string"), (list, "array"), (dict, "object"), (type(None), "null"))
    return next((name for cls, name in kinds if isinstance(value, cls)), "number")


def check_keys(found: Mapping[str, Any], required: Sequence[str], optional: Sequence[str], where: str) -> None:
    """``found`` has every key of ``required`` and no key outside ``required``
    and ``optional``; one ``InvalidArgumentError`` names every unknown and every
    missing key (a misspelt key is usually both), ``where`` first."""
    unknown = [key for key in found if key not in required and key not in optional]
    missing = [key for key in required if key not in found]
    said = []
    if unknown:
        known = ", ".join([*required, *optional])
        said.append(f"unknown {_keys(unknown)} (known: {known})")
    if missing:
        said.append(f"missing {_keys(missing)}")
    if said:
        raise InvalidArgumentError(f"{where}: " + "; ".join(said))


def _keys(names: Sequence[str]) -> str:
    return ("key " if len(names) == 1 else "keys ") + ", ".join(repr(name) for name in names)


def check_number(value: Any, name: str, allowed: Range) -> float:
    """``value`` as a float, when it is a real number (neither a bool nor text),
    finite and in ``allowed``; else ``InvalidArgumentError`` naming ``name``."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be a number, got {json.dumps(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        number = math.inf
    if not math.isfinite(number):
        raise InvalidArgumentError(f"{name} must be a finite number, got {value}")
    allowed.check(name, value)
    return number
