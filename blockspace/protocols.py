"""What a block manager reads of a sequence and of a sequence group, as types (spec §2).

The managers are duck-typed over vLLM's ``Sequence`` and ``SequenceGroup``: a
scheduler hands them vLLM's own objects, ours (``blockspace.sequence``) or any
others that have the few members below, and no manager imports vLLM. These
protocols name exactly those members, so that a type checker holds both sides
to them: a manager reads nothing else, and a caller passes objects that have them.

Why protocols and not base classes: they are structural (``typing.Protocol``).
A class satisfies one by having its members, never by inheriting from it, so
vLLM's classes satisfy them unchanged, and so do test doubles. The attributes
are declared as read-only properties, which a plain attribute, a property or a
narrower type all satisfy. They are not ``runtime_checkable``: nothing checks
them with ``isinstance``; the managers check what they read themselves, with
their own errors (``blockspace/validation.py``).

What is read but is not here, on purpose:

- ``status`` of a sequence: the group's own ``get_seqs(status=)`` reads it,
  never a manager. For the same reason ``get_seqs`` takes ``status`` as
  ``Any``: the managers pass our ``SequenceStatus`` members, which equal
  vLLM's by value (both are ``IntEnum``), but vLLM's signature names its own
  enum, which a checker could not match with ours.
- ``cache_salt`` of a sequence or a group, and ``inputs["cache_salt"]`` of a
  sequence: optional, looked up with ``getattr`` (``validation.cache_salt``,
  ``validation.group_salt``); vLLM's v0 objects have none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class SequenceDataLike(Protocol):
    """``Sequence.data``: only the count of tokens the model has computed
    (read by ``append_slots`` to drop blocks out of a sliding window)."""

    def get_num_computed_tokens(self) -> int: ...


class SequenceLike(Protocol):
    """A sequence as a manager reads it: vLLM's ``Sequence``, ours, or any
    object with these members."""

    @property
    def seq_id(self) -> int:
        """The key of the sequence's block table."""
        ...

    @property
    def data(self) -> SequenceDataLike: ...

    def get_token_ids(self) -> list[int]:
        """Prompt and generated tokens, in order."""
        ...

    def extra_hash(self) -> int | None:
        """What keys the prefix cache beside the tokens (adapters): ``None`` for none."""
        ...

    def is_prefill(self) -> bool:
        """Read by the computed-blocks tracker (``get_num_cached_tokens``)."""
        ...


class SequenceGroupLike(Protocol):
    """A request as a manager reads it: vLLM's ``SequenceGroup``, ours, or
    any object with these members."""

    @property
    def request_id(self) -> str:
        """The key of the group's cross-attention block table."""
        ...

    def get_seqs(self, status: Any = None) -> Sequence[SequenceLike]:
        """The group's sequences whose status equals ``status`` (every one
        for ``None``), in group order."""
        ...

    def is_encoder_decoder(self) -> bool: ...

    def get_encoder_seq(self) -> SequenceLike | None: ...


__all__ = ["SequenceDataLike", "SequenceGroupLike", "SequenceLike"]
