"""A trace request as the simulated scheduler keeps it: a ``SequenceGroup``
of the shared ``blockspace.sequence`` types, plus what the scheduler and
the report need besides (samples wanted, output length, arrival, first-token
and finish times).

Its samples are plain ``blockspace.sequence.Sequence`` objects: sample ``k``
has sequence id ``first_seq_id + k``, and its generated count is
``get_output_len()``, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Callable

from blockspace.sequence import Sequence, SequenceGroup
from blockspace.workloads import output_token_id


class SimRequest(SequenceGroup):
    """The samples of one trace request and its timing."""

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
        super().__init__(str(index), [Sequence(first_seq_id, prompt)], arrival_time=arrival_s)
        self.index = index
        self.first_seq_id = first_seq_id
        self.num_samples = num_samples
        self.output_length = output_length
        self.arrival_s = arrival_s
        self.num_prompt_tokens = num_prompt_tokens
        self.first_token_s: float | None = None
        self.finish_s: float | None = None

    def get_max_num_running_seqs(self) -> int:
        """Sequences this group may run at once for the rest of its life:
        ``n`` until the samples are forked, then the unfinished ones."""
        if len(self.seqs) < self.num_samples and not self.is_finished():
            return self.num_samples
        return sum(1 for seq in self.seqs if not seq.is_finished())

    # -- the model's side ----------------------------------------------------------
    def next_token(self, seq: Sequence) -> int:
        """The token this sample generates next (deterministic)."""
        return output_token_id(self.index, seq.seq_id - self.first_seq_id, seq.get_output_len())

    def add_sample(self, parent: Sequence, sample: int) -> Sequence:
        """Sample ``sample``, forked from ``parent`` (same tokens, same state)."""
        child = parent.fork(self.first_seq_id + sample)
        self.add(child)
        return child

    def release_tokens(self) -> None:
        """The request is done: drop its token lists (they can be large)."""
        for seq in self.seqs:
            seq.data.release()

    def __repr__(self) -> str:
        return f"SimRequest({self.request_id!r}, seqs={self.seqs!r})"


__all__ = ["SimRequest"]
