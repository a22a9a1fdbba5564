"""The sequence types: the members a block manager reads, and the few a scheduler reads.

A block manager sees a request only through a handful of members (spec §2):
``Sequence.seq_id``, ``get_token_ids()``, ``extra_hash()``,
``data.get_num_computed_tokens()``, ``is_prefill()``, ``status``, and
``SequenceGroup.get_seqs(status=)``, ``is_encoder_decoder()``,
``get_encoder_seq()``, ``request_id``. The managers read nothing else, so
vLLM's own ``Sequence``/``SequenceGroup`` objects work with them unchanged;
these classes exist for users, tests and tools that do not want vLLM. The
simulator's requests are ``SequenceGroup``s of them too, so they also carry
what vLLM's scheduler reads (``is_prefill()``, ``get_num_uncomputed_tokens()``,
``update_num_computed_tokens()``, ``get_output_len()``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from blockspace.enums import SequenceStatus

if TYPE_CHECKING:
    from blockspace.protocols import SequenceGroupLike, SequenceLike

_next_seq_id = itertools.count()


class SequenceData:
    """Token ids of one sequence, how many of them the model has computed, and
    its stage. As in vLLM, the stage turns to decode once every token has been
    computed and stays there when sampled tokens are appended (they are not
    computed yet, but the sequence is not prefilling); only recompute
    preemption sends it back to prefill.

    The prompt may be given as a function that makes it: a simulator queues
    thousands of requests with prompts of ~12k tokens, so a prompt is built
    only when first read, and dropped (``release``) once the request is done.
    """

    def __init__(self, token_ids: Iterable[int] | Callable[[], list[int]] = ()) -> None:
        self._make_tokens: Callable[[], list[int]] | None = token_ids if callable(token_ids) else None
        self._token_ids: list[int] | None = None if callable(token_ids) else list(token_ids)
        self._num_output_tokens = 0
        self._num_computed_tokens = 0
        self._is_decoding = False

    def get_token_ids(self) -> list[int]:
        if self._token_ids is None:
            make = self._make_tokens
            assert make is not None  # no token list yet: only a maker of one
            self._token_ids, self._make_tokens = make(), None
        return self._token_ids

    def get_len(self) -> int:
        return len(self.get_token_ids())

    def get_output_len(self) -> int:
        """Tokens appended after the prompt (generated ones)."""
        return self._num_output_tokens

    def append_token_id(self, token_id: int) -> None:
        self.get_token_ids().append(token_id)
        self._num_output_tokens += 1

    def append_decoded(self, token_id: int) -> int:
        """A decode step's model side in one call: the pending token is now
        computed and ``token_id`` is appended; returns the new output length.
        The same as ``update_num_computed_tokens(1)`` then ``append_token_id``
        for a decoding sequence, in one call: why, a simulator decodes ~40
        sequences a step."""
        assert self._is_decoding and self._token_ids is not None
        self._num_computed_tokens += 1
        self._token_ids.append(token_id)
        self._num_output_tokens += 1
        return self._num_output_tokens

    def release(self) -> None:
        """Forget the token ids (the sequence is done; its counts stay)."""
        self._token_ids, self._make_tokens = [], None

    def get_num_computed_tokens(self) -> int:
        return self._num_computed_tokens

    def get_num_uncomputed_tokens(self) -> int:
        return len(self.get_token_ids()) - self._num_computed_tokens

    def update_num_computed_tokens(self, num_new_computed_tokens: int) -> None:
        self._num_computed_tokens += num_new_computed_tokens
        if self.get_num_uncomputed_tokens() == 0:
            self._is_decoding = True

    def reset_state_for_recompute(self) -> None:
        """Recompute preemption: everything is prefill again."""
        self._num_computed_tokens = 0
        self._is_decoding = False

    def is_prefill(self) -> bool:
        return not self._is_decoding


class Sequence:
    """One generated sequence: its id, tokens, status and adapter ids."""

    def __init__(
        self,
        seq_id: int,
        token_ids: Iterable[int] | Callable[[], list[int]] = (),
        *,
        lora_int_id: int = 0,
        prompt_adapter_id: int = 0,
        status: SequenceStatus = SequenceStatus.WAITING,
        cache_salt: str | None = None,
    ) -> None:
        self.seq_id = seq_id
        self.data = SequenceData(token_ids)
        self.lora_int_id = lora_int_id
        self.prompt_adapter_id = prompt_adapter_id
        self.status = status
        self.cache_salt = cache_salt  # tenant isolation of the prefix cache (not in vLLM v0)
        self.group: SequenceGroup | None = None  # set by the group that holds it

    @property
    def cache_salt(self) -> str | None:
        """The request's prefix-cache salt: the sequence's own, else its
        group's. Why both: a serving engine keeps the salt on the request
        (the group), but ``get_num_cached_tokens`` sees only the sequence."""
        if self._cache_salt is None and self.group is not None:
            return self.group.cache_salt
        return self._cache_salt

    @cache_salt.setter
    def cache_salt(self, salt: str | None) -> None:
        self._cache_salt = salt

    def get_token_ids(self) -> list[int]:
        return self.data.get_token_ids()

    def get_len(self) -> int:
        return self.data.get_len()

    def get_output_len(self) -> int:
        return self.data.get_output_len()

    def append_token_id(self, token_id: int) -> None:
        self.data.append_token_id(token_id)

    def extra_hash(self) -> int | None:
        """What keeps adapters apart in the prefix cache (vLLM 0.9.2): None
        without adapters, else a hash of ``(prompt_adapter_id, lora_int_id)``."""
        if self.prompt_adapter_id == 0 and self.lora_int_id == 0:
            return None
        return hash((self.prompt_adapter_id, self.lora_int_id))

    def is_prefill(self) -> bool:
        return self.data.is_prefill()

    def is_finished(self) -> bool:
        return SequenceStatus.is_finished(self.status)

    def fork(self, new_seq_id: int) -> Sequence:
        """A copy with a new id (what beam search and n>1 sampling do)."""
        child = Sequence(
            new_seq_id,
            self.get_token_ids(),
            lora_int_id=self.lora_int_id,
            prompt_adapter_id=self.prompt_adapter_id,
            status=self.status,
            cache_salt=self.cache_salt,
        )
        child.data._num_output_tokens = self.data._num_output_tokens
        child.data._num_computed_tokens = self.data._num_computed_tokens
        child.data._is_decoding = self.data._is_decoding
        return child

    def __repr__(self) -> str:
        return f"Sequence(seq_id={self.seq_id}, len={self.get_len()}, status={self.status.name})"


class SequenceGroup:
    """The sequences generated from one prompt (n>1 sampling, beam search),
    plus the encoder sequence of an encoder-decoder request."""

    def __init__(
        self,
        request_id: str,
        seqs: Iterable[Sequence],
        encoder_seq: Sequence | None = None,
        arrival_time: float = 0.0,
    ) -> None:
        self.request_id = request_id
        self.seqs: list[Sequence] = list(seqs)
        self.encoder_seq = encoder_seq
        self.arrival_time = arrival_time
        self.cache_salt: str | None = None  # the request's salt; its sequences see it (Sequence.cache_salt)
        for seq in self.seqs + ([encoder_seq] if encoder_seq is not None else []):
            seq.group = self

    @classmethod
    def from_prompt(
        cls,
        request_id: str,
        prompt_token_ids: Iterable[int],
        *,
        n: int = 1,
        lora_int_id: int = 0,
        encoder_prompt: Iterable[int] | None = None,
        first_seq_id: int | None = None,
        arrival_time: float = 0.0,
        cache_salt: str | None = None,
    ) -> SequenceGroup:
        """A WAITING group of ``n`` sequences with the same prompt; sequence
        ids are consecutive from ``first_seq_id`` (default: a process-wide
        counter), the encoder sequence (if any) takes the next one. A
        ``cache_salt`` keeps the request's prefix-cache blocks apart from
        every request with another salt (tenant isolation)."""
        if n < 1:
            raise ValueError(f"a sequence group needs n >= 1 sequences, got n={n}")
        prompt = list(prompt_token_ids)
        if first_seq_id is None:
            ids = [next(_next_seq_id) for _ in range(n + 1)]
        else:
            ids = [first_seq_id + i for i in range(n + 1)]
        seqs = [Sequence(ids[i], prompt, lora_int_id=lora_int_id, cache_salt=cache_salt) for i in range(n)]
        encoder = None
        if encoder_prompt is not None:
            encoder = Sequence(ids[n], encoder_prompt, lora_int_id=lora_int_id, cache_salt=cache_salt)
        group = cls(request_id, seqs, encoder, arrival_time)
        group.cache_salt = cache_salt
        return group

    def get_seqs(self, status: SequenceStatus | None = None) -> list[Sequence]:
        if status is None:
            return list(self.seqs)
        return [seq for seq in self.seqs if seq.status == status]

    def add(self, seq: Sequence) -> None:
        self.seqs.append(seq)
        seq.group = self

    def is_encoder_decoder(self) -> bool:
        return self.encoder_seq is not None

    def get_encoder_seq(self) -> Sequence | None:
        return self.encoder_seq

    def is_finished(self) -> bool:
        return all(seq.is_finished() for seq in self.seqs)

    # -- what a scheduler reads (as vLLM's SequenceGroup) ------------------------------
    def is_prefill(self) -> bool:
        return self.seqs[0].is_prefill()

    def get_num_uncomputed_tokens(self) -> int:
        return sum(seq.data.get_num_uncomputed_tokens() for seq in self.seqs if not seq.is_finished())

    def update_num_computed_tokens(self, num_new_computed_tokens: int) -> None:
        """The model computed this many more tokens of every unfinished sequence."""
        for seq in self.seqs:
            if not seq.is_finished():
                seq.data.update_num_computed_tokens(num_new_computed_tokens)

    def __repr__(self) -> str:
        return f"SequenceGroup(request_id={self.request_id!r}, seqs={self.seqs!r})"


if TYPE_CHECKING:  # mypy checks, and Python never runs, that these are what a manager reads

    def _read_by_a_manager(seq: Sequence, group: SequenceGroup) -> tuple[SequenceLike, SequenceGroupLike]:
        return seq, group


__all__ = ["Sequence", "SequenceData", "SequenceGroup", "SequenceStatus"]
