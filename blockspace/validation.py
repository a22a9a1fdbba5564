"""Argument checks shared by every implementation, so that each raises the
same error with the same message for the same bad input."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from typing import Any

from blockspace.enums import SequenceStatus
from blockspace.errors import (
    InvalidArgumentError,
    InvalidConfigError,
    NoWaitingSequenceError,
    SaltMismatchError,
    TrackerError,
    UnsupportedError,
)

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


def check_token_ids(seq: Any, tokens: Any, start: int = 0) -> None:
    """Every token id from ``start`` on is an int in ``0..MAX_TOKEN_ID``."""
    for position in range(start, len(tokens)):
        token = tokens[position]
        if not _is_int(token) or not 0 <= token <= MAX_TOKEN_ID:
            raise InvalidArgumentError(
                f"sequence {seq.seq_id}: token id {token!r} at position {position} is not an int in 0..{MAX_TOKEN_ID}"
            )


def token_ids(seq: Any, start: int = 0) -> list[int]:
    """The sequence's token ids, those from ``start`` on checked."""
    tokens = seq.get_token_ids()
    check_token_ids(seq, tokens, start)
    return tokens


def _checked_salt(salt: Any, where: str) -> Any:
    if salt is not None and not isinstance(salt, (str, bytes, int)):
        raise InvalidArgumentError(f"{where}: cache_salt must be a str, bytes or int, got {salt!r}")
    return salt


def cache_salt(seq: Any) -> Any:
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


def group_salt(seq_group: Any, counted: Callable[[int], bool] = lambda seq_id: False) -> Any:
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
    salts = {group} if group is not None else set()
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


def not_tracked(seq_id: int) -> TrackerError:
    """The error for removing a sequence the computed-blocks tracker does not hold."""
    return TrackerError(f"sequence {seq_id} is not in the computed-blocks tracker (query it first)")


def waiting_seqs(seq_group: Any) -> list[Any]:
    """The group's WAITING sequences; a group with none cannot be admitted."""
    waiting = seq_group.get_seqs(status=SequenceStatus.WAITING)
    if not waiting:
        raise NoWaitingSequenceError(f"group {seq_group.request_id!r} has no WAITING sequence")
    return waiting


def check_encoder_decoder(seq_group: Any, sliding_window: int | None, enable_caching: bool) -> None:
    """vLLM v0 supports neither a sliding window nor prefix caching for
    encoder-decoder requests (its own messages)."""
    if not seq_group.is_encoder_decoder():
        return
    if sliding_window is not None:
        raise UnsupportedError("Sliding window attention for encoder/decoder models is not currently supported.")
    if enable_caching:
        raise UnsupportedError("Prefix caching for encoder/decoder models is not currently supported.")
