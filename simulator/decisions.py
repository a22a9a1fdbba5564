"""What the policy decides at a step, as data: the batch, the decision
record two runs are compared by, and the block traffic for the worker.

Why its own module: the policy writes these, and the simulation, the
metrics and the comparison read them; none of those readers needs the
policy itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blockspace.simulator.request import SimRequest


@dataclass(slots=True)
class ScheduledGroup:
    """A prefill in this step's batch: ``token_chunk_size`` tokens advance
    (cached ones included), ``num_uncached_tokens`` of them are computed.
    A decode needs no such record: it always advances by its one token."""

    request: SimRequest
    token_chunk_size: int
    num_uncached_tokens: int


@dataclass
class StepRecord:
    """Every scheduling decision of one step, by request id."""

    step: int
    time_s: float
    scheduled: list[tuple[str, int]] = field(default_factory=list)  # (request, token_chunk_size), batch order
    admitted: list[str] = field(default_factory=list)
    later: list[str] = field(default_factory=list)  # the waiting/swapped head that got LATER
    ignored: list[str] = field(default_factory=list)  # NEVER: cannot fit the GPU
    preempted: list[str] = field(default_factory=list)  # by recompute
    swapped_out: list[str] = field(default_factory=list)
    swapped_in: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    digest: int = 0  # hash of block tables, CoW pairs, swap mappings (record_tables)


@dataclass
class StepOutput:
    """What the model runs this step, and the block traffic the worker does.

    The batch is ``prefills`` then ``decodes``, vLLM's order: new, running,
    then swapped-in prefills; running, then swapped-in decodes. The first
    ``len(record.admitted)`` prefills are the new ones, in the order they
    were admitted. Why the decodes are bare requests: a step holds ~40 of
    them, each advancing by one token, and the model takes them as a batch
    (``request.decode_step``)."""

    prefills: list[ScheduledGroup]
    decodes: list[SimRequest]
    record: StepRecord
    blocks_to_swap_in: list[tuple[int, int]]
    blocks_to_swap_out: list[tuple[int, int]]
    blocks_to_copy: list[tuple[int, int]]


__all__ = ["ScheduledGroup", "StepOutput", "StepRecord"]
