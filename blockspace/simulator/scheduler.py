"""A continuous-batching scheduler that follows vLLM v0's chunked-prefill
policy, as far as the block manager sees it (spec ``semantics.md`` §16).

It holds any ``BlockSpaceManager`` and drives it exactly as vLLM 0.9.2's
``Scheduler._schedule_chunked_prefill`` does, one step at a time:

1. **Running groups first** (FCFS): each gets its next chunk of the token
   budget (one token per decoding sequence; prefill chunks are cut to the
   remaining budget, to whole blocks with prefix caching) if
   ``can_append_slots`` holds; otherwise the newest running group is
   preempted (by recompute, or by swap for groups with several sequences or
   when asked) until it does, or the group preempts itself.
2. **Swapped groups** come back (``can_swap_in`` -> ``swap_in``) if nobody
   was preempted this step.
3. **Waiting groups** are admitted in FCFS order: (caching)
   ``get_num_cached_tokens``, then ``can_allocate``: OK -> ``allocate``;
   LATER -> stop (head-of-line blocking); NEVER -> the request is ignored.
   A group not admitted leaves the computed-blocks tracker.
4. For every scheduled sequence: ``get_block_table``,
   ``access_all_blocks_in_seq(now)``, (caching)
   ``get_common_computed_block_ids``; then ``mark_blocks_as_computed``.

Every decision is written to a ``StepRecord`` so that two runs (two
managers) can be compared decision by decision.

Where vLLM would crash or stall, the simulator does the sensible thing and
says so here: a group that must be swapped out without CPU space is
recomputed if it has one sequence and aborted otherwise (vLLM raises
RuntimeError); a prefill that cannot go on even alone on the GPU (its
partial last block needs a free block, watermark 0) is aborted instead of
recomputed forever; a swapped-in prefill longer than ``max_num_batched_tokens``
is chunked like a running one (vLLM, which does not chunk swapped groups,
would wait for it forever).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from blockspace.enums import AllocStatus, SequenceStatus
from blockspace.errors import InvalidConfigError, NoFreeBlocksError
from blockspace.sequence import Sequence
from blockspace.simulator.request import SimRequest
from blockspace.simulator.row_step import RowStep, is_single_decode, offers_rows
from blockspace.simulator.timed import TimedManager

PREEMPTION_MODES = ("recompute", "swap")
STEP_PATHS = ("auto", "calls", "rows")  # auto: the row API where the manager offers it (row_step.py)


@dataclass(frozen=True)
class SchedulerConfig:
    """vLLM's scheduler knobs (names as in vLLM's ``SchedulerConfig``)."""

    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    preemption_mode: str = "recompute"
    record_tables: bool = False  # hash block tables, CoW pairs and swap mappings into each StepRecord
    step: str = "auto"  # how decodes reach the manager: STEP_PATHS

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidConfigError(f"{name} must be a positive int, got {value!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise InvalidConfigError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}), as vLLM requires"
            )
        if self.enable_prefix_caching and self.max_num_batched_tokens < self.block_size:
            raise InvalidConfigError("with prefix caching, max_num_batched_tokens must hold at least one block")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise InvalidConfigError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}")
        if self.step not in STEP_PATHS:
            raise InvalidConfigError(f"step must be one of {STEP_PATHS}, got {self.step!r}")


class SchedulingBudget:
    """Tokens and sequences of one step; each request counts once (vLLM's
    ``SchedulingBudget``)."""

    def __init__(self, token_budget: int, max_num_seqs: int) -> None:
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.num_batched_tokens = 0
        self.num_cached_tokens = 0
        self.num_curr_seqs = 0
        self._token_requests: set[str] = set()
        self._seq_requests: set[str] = set()

    def can_schedule(self, num_new_tokens: int, num_new_seqs: int) -> bool:
        return (
            self.num_batched_tokens + num_new_tokens <= self.token_budget
            and self.num_curr_seqs + num_new_seqs <= self.max_num_seqs
        )

    def remaining_token_budget(self) -> int:
        return self.token_budget - self.num_batched_tokens

    def add_num_batched_tokens(self, request_id: str, num_tokens: int, num_cached_tokens: int = 0) -> None:
        if request_id not in self._token_requests:
            self._token_requests.add(request_id)
            self.num_batched_tokens += num_tokens
            self.num_cached_tokens += num_cached_tokens

    def subtract_num_batched_tokens(self, request_id: str, num_tokens: int) -> None:
        if request_id in self._token_requests:
            self._token_requests.remove(request_id)
            self.num_batched_tokens -= num_tokens

    def add_num_seqs(self, request_id: str, num_seqs: int) -> None:
        if request_id not in self._seq_requests:
            self._seq_requests.add(request_id)
            self.num_curr_seqs += num_seqs

    def add_decodes(self, request_ids: list[str]) -> None:
        """One token and one sequence for each request (a run of single decodes)."""
        for request_id in request_ids:
            self.add_num_batched_tokens(request_id, 1)
            self.add_num_seqs(request_id, 1)

    def subtract_num_seqs(self, request_id: str, num_seqs: int) -> None:
        if request_id in self._seq_requests:
            self._seq_requests.remove(request_id)
            self.num_curr_seqs -= num_seqs


@dataclass
class ScheduledGroup:
    """A group in this step's batch: ``token_chunk_size`` tokens advance
    (cached ones included), ``num_uncached_tokens`` of them are computed."""

    request: SimRequest
    token_chunk_size: int
    num_uncached_tokens: int
    is_prefill: bool


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
    """What the model runs this step, and the block traffic the worker does."""

    scheduled: list[ScheduledGroup]
    record: StepRecord
    blocks_to_swap_in: list[tuple[int, int]]
    blocks_to_swap_out: list[tuple[int, int]]
    blocks_to_copy: list[tuple[int, int]]

    @property
    def num_prefill_tokens(self) -> int:
        return sum(group.num_uncached_tokens for group in self.scheduled if group.is_prefill)

    @property
    def decode_seqs(self) -> list[Sequence]:
        return [
            seq
            for group in self.scheduled
            if not group.is_prefill
            for seq in group.request.get_seqs(SequenceStatus.RUNNING)
        ]


class Scheduler:
    """FCFS continuous batching over a block manager (see the module doc)."""

    def __init__(self, manager: Any, config: SchedulerConfig) -> None:
        self.config = config
        self.manager = manager if isinstance(manager, TimedManager) else TimedManager(manager)
        rows = config.step != "calls" and offers_rows(self.manager.manager)
        if config.step == "rows" and not rows:
            raise InvalidConfigError(f"step='rows': {type(self.manager.manager).__name__} offers no row API")
        self.row_step = RowStep(self.manager, config.block_size, config.enable_prefix_caching) if rows else None
        self.waiting: deque[SimRequest] = deque()
        self.running: deque[SimRequest] = deque()
        self.swapped: deque[SimRequest] = deque()
        self.records: list[StepRecord] = []
        self._tracked: set[int] = set()  # seq ids the computed-blocks tracker holds
        # running totals for the report
        self.num_recompute_preemptions = 0
        self.num_swap_outs = 0
        self.num_swap_ins = 0
        self.num_blocks_swapped_out = 0
        self.num_blocks_swapped_in = 0
        self.num_copy_on_writes = 0
        self.num_ignored = 0
        self.num_aborted = 0
        self.num_prefill_tokens_admitted = 0
        self.num_cached_tokens_admitted = 0

    # -- queues ---------------------------------------------------------------------------
    def add_request(self, request: SimRequest) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    # -- tracker bookkeeping: remove only what the tracker holds ----------------------------
    def _num_cached_tokens(self, seq: Sequence) -> int:
        self._tracked.add(seq.seq_id)
        return self.manager.get_num_cached_tokens(seq)

    def _untrack(self, request: SimRequest, status: SequenceStatus) -> None:
        for seq in request.get_seqs(status):
            if seq.seq_id in self._tracked:
                self._tracked.discard(seq.seq_id)
                self.manager.remove_seq_from_computed_blocks_tracker(seq)

    def _free(self, seq: Sequence) -> None:
        self._tracked.discard(seq.seq_id)
        self.manager.free(seq)

    # -- token counts (vLLM's _get_num_new_uncached_and_cached_tokens) --------------------
    def _new_tokens(
        self, request: SimRequest, status: SequenceStatus, budget: SchedulingBudget, enable_chunking: bool = True
    ) -> tuple[int, int]:
        """(uncached, cached) new tokens of the group's ``status`` sequences;
        with ``enable_chunking`` a single sequence is cut to the remaining
        budget (to whole blocks with prefix caching)."""
        num_uncached = num_cached = 0
        seqs = request.get_seqs(status)
        for seq in seqs:
            if not seq.is_prefill():
                num_uncached += 1
                continue
            num_computed = seq.data.get_num_computed_tokens()
            num_new = seq.get_len() - num_computed
            if not self.config.enable_prefix_caching:
                num_uncached += num_new
                continue
            num_cached_new = max(0, self._num_cached_tokens(seq) - num_computed)
            num_uncached += num_new - num_cached_new
            num_cached += num_cached_new
        if num_uncached == 0 and num_cached > 0:
            num_uncached, num_cached = 1, num_cached - 1  # a full hit still computes its last token
        if len(seqs) == 1 and enable_chunking:
            num_uncached = self._chunk(num_uncached, budget)
        elif len(seqs) > 1 and num_uncached > budget.remaining_token_budget():
            num_uncached = 0  # several decoding samples do not fit: wait (vLLM would overrun the budget)
        return num_uncached, num_cached

    def _chunk(self, num_tokens: int, budget: SchedulingBudget) -> int:
        """``num_tokens`` cut to the remaining budget; with prefix caching to
        whole blocks, so a partial prefill never ends inside a block."""
        remaining = budget.remaining_token_budget()
        if self.config.enable_prefix_caching:
            remaining = remaining // self.config.block_size * self.config.block_size
        return min(num_tokens, remaining)

    # -- one step -----------------------------------------------------------------------------
    def schedule(self, now: float) -> StepOutput:
        """Decide this step's batch at simulated time ``now`` (see module doc)."""
        record = StepRecord(step=len(self.records), time_s=now)
        self.records.append(record)
        budget = SchedulingBudget(self.config.max_num_batched_tokens, self.config.max_num_seqs)
        if self.row_step is not None:
            self.row_step.start_step()
        copies: list[tuple[int, int]] = []
        swap_out: list[tuple[int, int]] = []
        swap_in: list[tuple[int, int]] = []

        running_prefills, running_decodes, preempted, swapped_out = self._schedule_running(
            budget, record, copies, swap_out
        )
        swapped_prefills: list[ScheduledGroup] = []
        swapped_decodes: list[ScheduledGroup] = []
        if not preempted and not swapped_out:
            swapped_prefills, swapped_decodes = self._schedule_swapped(budget, record, copies, swap_in)
        new_prefills = self._schedule_prefills(budget, record)

        self.waiting.extendleft(preempted)
        self.running.extend(g.request for g in swapped_decodes)
        self.running.extend(g.request for g in swapped_prefills)
        self.running.extend(g.request for g in running_decodes)
        # prefills that finish this step go first, so they are not the next victims
        finishing = [g.request.get_num_uncomputed_tokens() == g.token_chunk_size for g in running_prefills]
        self.running.extend(g.request for g, done in zip(running_prefills, finishing) if done)
        self.running.extend(g.request for g, done in zip(running_prefills, finishing) if not done)
        self.running.extend(g.request for g in new_prefills)
        self.swapped.extend(swapped_out)

        scheduled = new_prefills + running_prefills + swapped_prefills + running_decodes + swapped_decodes
        record.scheduled = [(g.request.request_id, g.token_chunk_size) for g in scheduled]
        self.num_copy_on_writes += len(copies)
        tables = self._touch_scheduled(scheduled, now)
        if self.row_step is not None:  # the calls would follow one another: one does it all
            if scheduled:
                self.manager.mark_blocks_as_computed(scheduled[0].request, scheduled[0].token_chunk_size)
        else:
            for group in scheduled:
                self.manager.mark_blocks_as_computed(group.request, group.token_chunk_size)
        if self.config.record_tables:
            record.digest = hash((tuple(tables), tuple(copies), tuple(swap_in), tuple(swap_out)))
        return StepOutput(scheduled, record, swap_in, swap_out, copies)

    def _touch_scheduled(self, scheduled: list[ScheduledGroup], now: float) -> list[tuple[int, tuple[int, ...]]]:
        """vLLM's per-sequence metadata pass: tables, access time, computed ids
        (for the groups of row runs, tables and access times in one call each)."""
        record = self.config.record_tables
        batched: set[str] = set()
        run_tables: dict[int, tuple[int, ...]] = {}
        if self.row_step is not None:
            batched = self.row_step.requests
            run_tables = self.row_step.touch(now, record)
        tables = []
        for group in scheduled:
            seqs = group.request.get_seqs(SequenceStatus.RUNNING)
            if group.request.request_id in batched:
                if record:
                    tables.append((seqs[0].seq_id, run_tables[seqs[0].seq_id]))
                if self.config.enable_prefix_caching:  # computed blocks: counted for the whole run
                    self._tracked.add(seqs[0].seq_id)
                continue
            for seq in seqs:
                table = self.manager.get_block_table(seq)
                if record:
                    tables.append((seq.seq_id, tuple(table or ())))  # the placeholder manager has none
                self.manager.access_all_blocks_in_seq(seq, now)
            if self.config.enable_prefix_caching:
                self._tracked.update(seq.seq_id for seq in seqs)
                self.manager.get_common_computed_block_ids(seqs)
        return tables

    def _schedule_running(
        self,
        budget: SchedulingBudget,
        record: StepRecord,
        copies: list[tuple[int, int]],
        swap_out: list[tuple[int, int]],
    ) -> tuple[list[ScheduledGroup], list[ScheduledGroup], list[SimRequest], list[SimRequest]]:
        prefills: list[ScheduledGroup] = []
        decodes: list[ScheduledGroup] = []
        preempted: list[SimRequest] = []
        swapped_out: list[SimRequest] = []
        queue = self.running
        row_step = self.row_step
        while queue:
            request = queue[0]
            if row_step is not None and row_step.usable and is_single_decode(request):
                run = row_step.schedule_run(queue, budget, copies)
                if run is None:
                    break  # the budget is spent
                if run:
                    decodes += [ScheduledGroup(r, 1, 1, False) for r in run]
                    budget.add_decodes([r.request_id for r in run])
                    continue
            num_tokens, _ = self._new_tokens(request, SequenceStatus.RUNNING, budget)
            if num_tokens == 0:
                break  # the budget is spent
            queue.popleft()
            while not self.manager.can_append_slots(request, 0):
                budget.subtract_num_batched_tokens(request.request_id, num_tokens)
                budget.subtract_num_seqs(request.request_id, request.get_max_num_running_seqs())
                victim = queue.pop() if queue else request
                if victim is request and request.is_prefill() and not prefills and not decodes:
                    # Alone on the GPU and its prefill still cannot go on: preempting
                    # it would replay this step forever (vLLM livelocks here).
                    self._finish_all(request, SequenceStatus.FINISHED_ABORTED)
                    record.aborted.append(request.request_id)
                    self.num_aborted += 1
                    break
                outcome = self._preempt(victim, record, swap_out)
                if outcome == "recompute":
                    preempted.append(victim)
                elif outcome == "swap":
                    swapped_out.append(victim)
                if victim is request:
                    break
            else:
                is_prefill = request.is_prefill()
                self._append_slots(request, copies)
                group = ScheduledGroup(request, num_tokens if is_prefill else 1, num_tokens, is_prefill)
                (prefills if is_prefill else decodes).append(group)
                budget.add_num_batched_tokens(request.request_id, num_tokens)
                budget.add_num_seqs(request.request_id, request.get_max_num_running_seqs())
        return prefills, decodes, preempted, swapped_out

    def _schedule_swapped(
        self,
        budget: SchedulingBudget,
        record: StepRecord,
        copies: list[tuple[int, int]],
        swap_in: list[tuple[int, int]],
    ) -> tuple[list[ScheduledGroup], list[ScheduledGroup]]:
        prefills: list[ScheduledGroup] = []
        decodes: list[ScheduledGroup] = []
        queue = self.swapped
        while queue:
            request = queue[0]
            is_prefill = request.is_prefill()
            status = self.manager.can_swap_in(request, 0)
            if status == AllocStatus.LATER:
                record.later.append(request.request_id)
                break
            if status == AllocStatus.NEVER:
                queue.popleft()
                self._finish_all(request, SequenceStatus.FINISHED_IGNORED)
                record.ignored.append(request.request_id)
                self.num_ignored += 1
                continue
            num_new_seqs = request.get_max_num_running_seqs()
            # vLLM does not chunk swapped groups: a decode comes back with its one token even
            # when less than a block of budget is left. A prefill longer than a whole step's
            # budget would wait for ever there; it is chunked like a running one instead.
            num_uncached, num_cached = self._new_tokens(request, SequenceStatus.SWAPPED, budget, enable_chunking=False)
            if is_prefill and num_uncached > self.config.max_num_batched_tokens:
                num_uncached = self._chunk(num_uncached, budget)
            if num_uncached == 0 or not budget.can_schedule(num_uncached, num_new_seqs):
                self._untrack(request, SequenceStatus.SWAPPED)
                break
            try:
                mapping = self.manager.swap_in(request)
            except NoFreeBlocksError:  # the estimate said yes, the exact count says no: wait
                record.later.append(request.request_id)
                break
            queue.popleft()
            for seq in request.get_seqs(SequenceStatus.SWAPPED):
                seq.status = SequenceStatus.RUNNING
            swap_in += mapping
            self.num_swap_ins += 1
            self.num_blocks_swapped_in += len(mapping)
            record.swapped_in.append(request.request_id)
            self._append_slots(request, copies)
            if is_prefill:
                prefills.append(ScheduledGroup(request, num_uncached + num_cached, num_uncached, True))
            else:
                decodes.append(ScheduledGroup(request, 1, num_uncached, False))
            budget.add_num_batched_tokens(request.request_id, num_uncached, num_cached)
            budget.add_num_seqs(request.request_id, num_new_seqs)
        return prefills, decodes

    def _schedule_prefills(self, budget: SchedulingBudget, record: StepRecord) -> list[ScheduledGroup]:
        admitted: list[ScheduledGroup] = []
        if budget.remaining_token_budget() == 0:
            return admitted
        queue = self.waiting
        while queue:
            request = queue[0]
            num_uncached, num_cached = self._new_tokens(request, SequenceStatus.WAITING, budget)
            status = self.manager.can_allocate(request, 0)
            if status == AllocStatus.LATER:
                record.later.append(request.request_id)
                self._untrack(request, SequenceStatus.WAITING)
                break
            if status == AllocStatus.NEVER:
                queue.popleft()
                self._untrack(request, SequenceStatus.WAITING)
                self._finish_all(request, SequenceStatus.FINISHED_IGNORED, has_blocks=False)
                record.ignored.append(request.request_id)
                self.num_ignored += 1
                continue
            num_new_seqs = request.get_max_num_running_seqs()
            if (
                budget.num_batched_tokens >= self.config.max_num_batched_tokens
                or num_uncached == 0
                or not budget.can_schedule(num_uncached, num_new_seqs)
            ):
                self._untrack(request, SequenceStatus.WAITING)
                break
            queue.popleft()
            self.manager.allocate(request)
            for seq in request.get_seqs(SequenceStatus.WAITING):
                seq.status = SequenceStatus.RUNNING
            record.admitted.append(request.request_id)
            self.num_prefill_tokens_admitted += request.seqs[0].get_len()
            self.num_cached_tokens_admitted += num_cached
            admitted.append(ScheduledGroup(request, num_uncached + num_cached, num_uncached, True))
            budget.add_num_batched_tokens(request.request_id, num_uncached, num_cached)
            budget.add_num_seqs(request.request_id, num_new_seqs)
        return admitted

    # -- block traffic of one group -------------------------------------------------------------
    def _append_slots(self, request: SimRequest, copies: list[tuple[int, int]]) -> None:
        for seq in request.get_seqs(SequenceStatus.RUNNING):
            copies += self.manager.append_slots(seq, 0)

    def _preempt(self, request: SimRequest, record: StepRecord, swap_out: list[tuple[int, int]]) -> str:
        """Make room by taking ``request`` off the GPU; returns how."""
        wants_swap = self.config.preemption_mode == "swap" or request.get_max_num_running_seqs() > 1
        if wants_swap and self._swap_out(request, record, swap_out):
            return "swap"
        running = request.get_seqs(SequenceStatus.RUNNING)
        if len(running) == 1:
            seq = running[0]
            seq.status = SequenceStatus.WAITING
            self._free(seq)
            seq.data.reset_state_for_recompute()
            record.preempted.append(request.request_id)
            self.num_recompute_preemptions += 1
            return "recompute"
        self._finish_all(request, SequenceStatus.FINISHED_ABORTED)  # several samples, no swap space
        record.aborted.append(request.request_id)
        self.num_aborted += 1
        return "abort"

    def _swap_out(self, request: SimRequest, record: StepRecord, swap_out: list[tuple[int, int]]) -> bool:
        if not self.manager.can_swap_out(request):
            return False
        try:
            mapping = self.manager.swap_out(request)
        except NoFreeBlocksError:  # spec §14.6: the estimate can be too optimistic
            return False
        for seq in request.get_seqs(SequenceStatus.RUNNING):
            seq.status = SequenceStatus.SWAPPED
        swap_out += mapping
        record.swapped_out.append(request.request_id)
        self.num_swap_outs += 1
        self.num_blocks_swapped_out += len(mapping)
        return True

    def _finish_all(self, request: SimRequest, status: SequenceStatus, has_blocks: bool = True) -> None:
        """End every unfinished sequence of the group and free its blocks."""
        for seq in request.seqs:
            if not seq.is_finished():
                seq.status = status
                if has_blocks:
                    self._free(seq)

    # -- after the model step ---------------------------------------------------------------------------
    def fork_seq(self, parent: Sequence, child: Sequence) -> None:
        """A new sample shares the parent's blocks; the tracker learns it at once
        (spec §16: query every sequence before it can be freed)."""
        self.manager.fork(parent, child)
        if self.config.enable_prefix_caching:
            self._num_cached_tokens(child)

    def free_finished(self, finished_seqs: Iterable[Sequence]) -> list[SimRequest]:
        """Free the sequences that finished this step, in the order given, and
        drop the groups that are done (in running-queue order).

        vLLM's engine frees each finished sequence while it processes the
        model's output, group by group in the order of the scheduled batch
        (new prefills, running prefills, swapped-in prefills, running
        decodes, swapped-in decodes); its ``free_finished_seq_groups`` later
        finds nothing left to free. The order matters: freed blocks go to the
        front of the free list, so it decides the ids handed out next."""
        for seq in finished_seqs:
            self._free(seq)
        done: list[SimRequest] = []
        remaining: deque[SimRequest] = deque()
        for request in self.running:
            (done if request.is_finished() else remaining).append(request)
        self.running = remaining
        self.records[-1].finished.extend(r.request_id for r in done)
        return done


__all__ = [
    "PREEMPTION_MODES",
    "STEP_PATHS",
    "ScheduledGroup",
    "Scheduler",
    "SchedulerConfig",
    "SchedulingBudget",
    "StepOutput",
    "StepRecord",
]
