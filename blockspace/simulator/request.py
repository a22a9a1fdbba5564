"""A request as the simulated scheduler keeps it: a ``SequenceGroup`` of one
sequence of the shared ``blockspace.sequence`` types, plus what the model
needs besides (its trace request and sample, output length and
arrival; the times the model reaches are kept by ``metrics.py``).

As in vLLM 0.9.2's engine, a trace request with ``n`` > 1 samples is ``n``
such groups (``ParallelSampleSequenceGroup.add_request``): sample ``i`` is
request ``{index}_parallel_sample_{i}``, one sequence sampling ``n=1``; with
``n`` == 1 the request id is ``{index}``. Its generated count is
``get_output_len()``, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Callable

from blockspace.sequence import Sequence, SequenceGroup
from blockspace.workloads import output_token_id


def request_id_of(index: int, sample: int, num_samples: int) -> str:
    """The id vLLM's engine gives sample ``sample`` of trace request ``index``."""
    return str(index) if num_samples == 1 else f"{index}_parallel_sample_{sample}"


class SimRequest(SequenceGroup):
    """One sample of one trace request (one sequence)."""

    def __init__(
        self,
        index: int,
        prompt: list[int] | Callable[[], list[int]],
        num_prompt_tokens: int,
        output_length: int,
        arrival_s: float,
        seq_id: int,
        sample: int = 0,
        num_samples: int = 1,
    ) -> None:
        request_id = request_id_of(index, sample, num_samples)
        super().__init__(request_id, [Sequence(seq_id, prompt)], arrival_time=arrival_s)
        self.index = index  # the trace request
        self.sample = sample  # which of its n samples
        self.output_length = output_length
        self.arrival_s = arrival_s
        self.num_prompt_tokens = num_prompt_tokens

    def get_max_num_running_seqs(self) -> int:
        """Sequences this group may run at once for the rest of its life: its unfinished ones."""
        return sum(1 for seq in self.seqs if not seq.is_finished())

    # -- the model's side ----------------------------------------------------------
    def next_token(self, seq: Sequence) -> int:
        """The token this sample generates next (deterministic, distinct per sample)."""
        return output_token_id(self.index, self.sample, seq.get_output_len())

    def release_tokens(self) -> None:
        """The request is done: drop its token lists (they can be large)."""
        for seq in self.seqs:
            seq.data.release()

    def __repr__(self) -> str:
        return f"SimRequest({self.request_id!r}, seqs={self.seqs!r})"


__all__ = ["SimRequest", "request_id_of"]
