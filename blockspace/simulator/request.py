"""Requests as the simulated scheduler keeps them: vLLM v0's sequence and
sequence-group state, limited to what the scheduler and a manager read.

The shared ``blockspace.sequence`` types call a sequence "in prefill" while
it has uncomputed tokens. vLLM's scheduler works with a *stage* instead: a
sequence enters decode when its prompt is fully computed and stays there
when the sampled token is appended (that token is uncomputed until the next
step). Managers read ``is_prefill()`` (the computed-blocks tracker freezes
its count during prefill), so the simulator needs vLLM's meaning; hence
these small classes.
"""

from __future__ import annotations

from collections.abc import Callable

from blockspace.enums import SequenceStatus
from blockspace.simulator.tokens import output_token_id


class SimSequenceData:
    """Token ids, how many are computed, and the prefill/decode stage.

    The prompt may be given as a function that makes it: a long trace queues
    thousands of requests with ~12k-token prompts, so a prompt is only built
    when the scheduler first looks at it, and dropped (``release``) once the
    request is done.
    """

    def __init__(self, token_ids: list[int] | Callable[[], list[int]]) -> None:
        self._token_ids: list[int] | None = None if callable(token_ids) else token_ids
        self._make_tokens = token_ids if callable(token_ids) else None
        self._num_computed_tokens = 0
        self._in_prefill = True

    def get_token_ids(self) -> list[int]:
        if self._token_ids is None:
            self._token_ids = self._make_tokens()
            self._make_tokens = None
        return self._token_ids

    def release(self) -> None:
        """Forget the tokens (the sequence is done)."""
        self._token_ids, self._make_tokens = [], None

    def get_len(self) -> int:
        return len(self.get_token_ids())

    def get_num_computed_tokens(self) -> int:
        return self._num_computed_tokens

    def get_num_uncomputed_tokens(self) -> int:
        return len(self.get_token_ids()) - self._num_computed_tokens

    def append_token_id(self, token_id: int) -> None:
        self._token_ids.append(token_id)

    def in_prefill(self) -> bool:
        return self._in_prefill

    def update_num_computed_tokens(self, num_new_computed_tokens: int) -> None:
        """The model computed this many more tokens; once none is left, the
        sequence is in decode (as vLLM's ``SequenceData`` does)."""
        self._num_computed_tokens += num_new_computed_tokens
        assert self._num_computed_tokens <= len(self._token_ids), "computed more tokens than the sequence holds"
        if self._num_computed_tokens == len(self._token_ids):
            self._in_prefill = False

    def reset_state_for_recompute(self) -> None:
        """Recompute preemption: prompt and generated tokens are prefill again."""
        self._num_computed_tokens = 0
        self._in_prefill = True

    def copy(self) -> SimSequenceData:
        data = SimSequenceData(list(self.get_token_ids()))
        data._num_computed_tokens = self._num_computed_tokens
        data._in_prefill = self._in_prefill
        return data


class SimSequence:
    """One sample of a request: its tokens, status, and generated count."""

    def __init__(self, seq_id: int, data: SimSequenceData, sample: int, num_generated: int = 0) -> None:
        self.seq_id = seq_id
        self.data = data
        self.sample = sample
        self.num_generated = num_generated
        self.status = SequenceStatus.WAITING

    def get_token_ids(self) -> list[int]:
        return self.data.get_token_ids()

    def get_len(self) -> int:
        return self.data.get_len()

    def extra_hash(self) -> int | None:
        return None  # no LoRA or prompt adapters in a trace replay

    def is_prefill(self) -> bool:
        return self.data.in_prefill()

    def is_finished(self) -> bool:
        return SequenceStatus.is_finished(self.status)

    def __repr__(self) -> str:
        return f"SimSequence(seq_id={self.seq_id}, len={self.get_len()}, status={self.status.name})"


class SimRequest:
    """A sequence group: the samples of one trace request, plus what the
    report needs (arrival, first-token and finish times)."""

    def __init__(
        self,
        index: int,
        prompt: list[int] | Callable[[], list[int]],
        num_prompt_tokens: int,
        num_samples: int,
        output_length: int,
        arrival_s: float,
        first_seq_id: int,
    ) -> None:
        self.index = index
        self.request_id = str(index)
        self.num_samples = num_samples
        self.output_length = output_length
        self.arrival_s = arrival_s
        self.num_prompt_tokens = num_prompt_tokens
        self.seqs = [SimSequence(first_seq_id, SimSequenceData(prompt), sample=0)]
        self.first_token_s: float | None = None
        self.finish_s: float | None = None

    # -- what managers read --------------------------------------------------------
    def get_seqs(self, status: SequenceStatus | None = None) -> list[SimSequence]:
        if status is None:
            return list(self.seqs)
        return [seq for seq in self.seqs if seq.status == status]

    def is_encoder_decoder(self) -> bool:
        return False

    def get_encoder_seq(self) -> None:
        return None

    # -- what the scheduler reads --------------------------------------------------
    def is_prefill(self) -> bool:
        return self.seqs[0].is_prefill()

    def is_finished(self) -> bool:
        return all(seq.is_finished() for seq in self.seqs)

    def get_max_num_running_seqs(self) -> int:
        """Sequences this group may run at once for the rest of its life:
        ``n`` until the samples are forked, then the unfinished ones."""
        if len(self.seqs) < self.num_samples and not self.is_finished():
            return self.num_samples
        return sum(1 for seq in self.seqs if not seq.is_finished())

    def get_num_uncomputed_tokens(self) -> int:
        return sum(seq.data.get_num_uncomputed_tokens() for seq in self.seqs if not seq.is_finished())

    def update_num_computed_tokens(self, num_new_computed_tokens: int) -> None:
        for seq in self.seqs:
            if not seq.is_finished():
                seq.data.update_num_computed_tokens(num_new_computed_tokens)

    # -- the model's side ----------------------------------------------------------
    def next_token(self, seq: SimSequence) -> int:
        """The token this sample generates next (deterministic)."""
        return output_token_id(self.index, seq.sample, seq.num_generated)

    def add_sample(self, parent: SimSequence, seq_id: int, sample: int) -> SimSequence:
        """A new sample forked from ``parent`` (same tokens, same state)."""
        child = SimSequence(seq_id, parent.data.copy(), sample, parent.num_generated)
        child.status = parent.status
        self.seqs.append(child)
        return child

    def release_tokens(self) -> None:
        """The request is done: drop its token lists (they can be large)."""
        for seq in self.seqs:
            seq.data.release()

    def __repr__(self) -> str:
        return f"SimRequest({self.request_id!r}, seqs={self.seqs!r})"


__all__ = ["SimRequest", "SimSequence", "SimSequenceData"]
