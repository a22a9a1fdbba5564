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

from blockspace.enums import SequenceStatus
from blockspace.sequence import Sequence, SequenceGroup
from blockspace.workloads import output_token_id


def request_id_of(index: int, sample: int, num_samples: int) -> str:
    """The id vLLM's engine gives sample ``sample`` of trace request ``index``."""
    return str(index) if num_samples == 1 else f"{index}_parallel_sample_{sample}"


class SimRequest(SequenceGroup):
    """One sample of one trace request (one sequence).

    Why the overrides below: the scheduler and the model ask a group these
    questions for every running request at every step, and for a group of
    one sequence each answer is a read of that sequence (``seq``); the
    general ``SequenceGroup`` loops over its sequences to give the same."""

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
        self.seq = self.seqs[0]  # its one sequence (never more: vLLM 0.9.2 makes n requests, never forks)
        self.index = index  # the trace request
        self.sample = sample  # which of its n samples
        self.output_length = output_length
        self.arrival_s = arrival_s
        self.num_prompt_tokens = num_prompt_tokens

    def get_max_num_running_seqs(self) -> int:
        """Sequences this group may run at once for the rest of its life: its unfinished ones."""
        return 0 if self.seq.is_finished() else 1

    def get_seqs(self, status: SequenceStatus | None = None) -> list[Sequence]:
        seq = self.seq
        return [seq] if status is None or seq.status == status else []

    def is_finished(self) -> bool:
        return self.seq.is_finished()

    def is_prefill(self) -> bool:
        return self.seq.data.is_prefill()

    def get_num_uncomputed_tokens(self) -> int:
        seq = self.seq
        return 0 if seq.is_finished() else seq.data.get_num_uncomputed_tokens()

    def update_num_computed_tokens(self, num_new_computed_tokens: int) -> None:
        if not self.seq.is_finished():
            self.seq.data.update_num_computed_tokens(num_new_computed_tokens)

    # -- the model's side ----------------------------------------------------------
    def sample_next(self) -> bool:
        """The model's side of a step that ends the prompt or decodes: the
        sequence takes its next token (deterministic, distinct per sample);
        True when it has all it wanted."""
        seq = self.seq
        seq.append_token_id(output_token_id(self.index, self.sample, seq.get_output_len()))
        return seq.get_output_len() >= self.output_length

    def release_tokens(self) -> None:
        """The request is done: drop its token lists (they can be large)."""
        for seq in self.seqs:
            seq.data.release()

    def __repr__(self) -> str:
        return f"SimRequest({self.request_id!r}, seqs={self.seqs!r})"


def decode_step(requests: list[SimRequest]) -> tuple[list[Sequence], int]:
    """The model's side of a step for its decodes (one sequence each, every
    prompt token computed): each computes its pending token and samples the
    next, as ``update_num_computed_tokens(1)`` then ``sample_next`` would.
    Returns the sequences that now have all they wanted, in order, and the
    context the step read (the tokens each sequence held before it).

    Why in one function: the simulator decodes ~40 requests a step, and the
    per-request calls cost more than the model's arithmetic. No first-token
    time is noted: a decoding request sampled its first token when its
    prompt's last chunk ran."""
    finished: list[Sequence] = []
    num_context_tokens = 0
    for request in requests:
        seq = request.seq
        data = seq.data
        num_context_tokens += data.get_len()
        num_output = data.append_decoded(output_token_id(request.index, request.sample, data.get_output_len()))
        if num_output >= request.output_length:
            finished.append(seq)
    return finished, num_context_tokens


__all__ = ["SimRequest", "decode_step", "request_id_of"]
