"""A continuous-batching scheduler that follows vLLM v0's chunked-prefill
policy, as far as the block manager sees it (spec ``semantics.md`` §16).
Its twin is ``compiled/policy.py``, the compiled engine's step; the
Python engine is the readable one, and ``tests/test_compiled_engine.py``
holds the two equal, step for step.

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
managers) can be compared decision by decision. The policy only decides: it
reads no clock and counts nothing (the simulation times the manager it hands
in, and ``metrics.py`` counts from the ``StepOutput`` of each step), and how
the decodes reach the manager is a step path it is given (``calls.py``,
``row_step.py``).

Where vLLM would crash or stall, the simulator does the sensible thing and
says so here: a group that must be swapped out without CPU space is
recomputed (vLLM raises RuntimeError); a prefill that cannot go on even alone on the GPU (its
partial last block needs a free block, watermark 0) is aborted instead of
recomputed forever; a swapped-in prefill longer than ``max_num_batched_tokens``
is chunked like a running one (vLLM, which does not chunk swapped groups,
would wait for it forever).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from blockspace.enums import AllocStatus, SequenceStatus
from blockspace.errors import InvalidConfigError, NoFreeBlocksError
from blockspace.sequence import Sequence
from blockspace.simulator.budget import SchedulingBudget, usable_tokens
from blockspace.simulator.calls import CallPath
from blockspace.simulator.decisions import ScheduledGroup, StepOutput, StepRecord
from blockspace.simulator.request import SimRequest
from blockspace.simulator.row_step import RowPath, offers_rows
from blockspace.simulator.runs import PREEMPTION_MODES, STEP_PATHS, SchedulerConfig


def finishing_first(running_prefills: list[ScheduledGroup]) -> list[SimRequest]:
    """The running prefills in the order they go back to the running queue:
    those whose chunk finishes the prompt this step first, then the rest,
    each in step order. Why: a victim is taken from the queue's end
    (``Scheduler._victim``), so a prefill about to finish is not the next
    one. Twin: ``finishing_first`` in ``compiled/policy.py``."""
    finishing = [g.request.get_num_uncomputed_tokens() == g.token_chunk_size for g in running_prefills]
    return [g.request for g, done in zip(running_prefills, finishing) if done] + [
        g.request for g, done in zip(running_prefills, finishing) if not done
    ]


class Scheduler:
    """FCFS continuous batching over a block manager (see the module doc)."""

    def __init__(self, manager: Any, config: SchedulerConfig) -> None:
        self.config = config
        self.manager = manager
        rows = config.step != "calls" and offers_rows(manager)
        if config.step == "rows" and not rows:
            raise InvalidConfigError("step='rows': the manager offers no row API (blockspace.interfaces.ROW_API)")
        self._tracked: set[int] = set()  # seq ids the computed-blocks tracker holds
        path_class = RowPath if rows else CallPath
        self.path = path_class(manager, config.block_size, config.enable_prefix_caching, self._tracked)
        self.waiting: deque[SimRequest] = deque()
        self.running: deque[SimRequest] = deque()
        self.swapped: deque[SimRequest] = deque()
        self.records: list[StepRecord] = []

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
        if enable_chunking:
            num_uncached = self._chunk(num_uncached, budget)
        return num_uncached, num_cached

    def _chunk(self, num_tokens: int, budget: SchedulingBudget) -> int:
        """``num_tokens`` cut to the remaining budget; with prefix caching to
        whole blocks, so a partial prefill never ends inside a block."""
        config = self.config
        usable = usable_tokens(budget.remaining_token_budget(), config.block_size, config.enable_prefix_caching)
        return min(num_tokens, usable)  # compiled/policy.py: chunk

    # -- one step -----------------------------------------------------------------------------
    def schedule(self, now: float) -> StepOutput:
        """Decide this step's batch at simulated time ``now`` (see module doc)."""
        record = StepRecord(step=len(self.records), time_s=now)
        self.records.append(record)
        budget = SchedulingBudget(self.config.max_num_batched_tokens, self.config.max_num_seqs)
        copies: list[tuple[int, int]] = []
        swap_out: list[tuple[int, int]] = []
        swap_in: list[tuple[int, int]] = []

        running_prefills, running_decodes, preempted, swapped_out = self._schedule_running(
            budget, record, copies, swap_out
        )
        swapped_prefills: list[ScheduledGroup] = []
        swapped_decodes: list[SimRequest] = []
        if not preempted and not swapped_out:
            swapped_prefills, swapped_decodes = self._schedule_swapped(budget, record, copies, swap_in)
        new_prefills = self._schedule_prefills(budget, record)

        self.waiting.extendleft(preempted)
        self.running.extend(swapped_decodes)
        self.running.extend(g.request for g in swapped_prefills)
        self.running.extend(running_decodes)
        self.running.extend(finishing_first(running_prefills))
        self.running.extend(g.request for g in new_prefills)
        self.swapped.extend(swapped_out)

        prefills = new_prefills + running_prefills + swapped_prefills
        decodes = running_decodes + swapped_decodes
        record.scheduled = [(g.request.request_id, g.token_chunk_size) for g in prefills]
        record.scheduled += [(request.request_id, 1) for request in decodes]
        tables = self.path.touch(prefills, decodes, now, self.config.record_tables)
        if self.config.record_tables:
            record.digest = hash((tuple(tables), tuple(copies), tuple(swap_in), tuple(swap_out)))
        return StepOutput(prefills, decodes, record, swap_in, swap_out, copies)

    def _schedule_running(
        self,
        budget: SchedulingBudget,
        record: StepRecord,
        copies: list[tuple[int, int]],
        swap_out: list[tuple[int, int]],
    ) -> tuple[list[ScheduledGroup], list[SimRequest], list[SimRequest], list[SimRequest]]:
        prefills: list[ScheduledGroup] = []
        decodes: list[SimRequest] = []
        preempted: list[SimRequest] = []
        swapped_out: list[SimRequest] = []
        queue = self.running
        while queue:
            run = self.path.take_decodes(queue, budget, copies)
            if run is None:
                break  # the budget is spent
            if run:
                decodes += run
                budget.add_decodes([r.request_id for r in run])
                continue
            request = queue[0]
            num_tokens, _ = self._new_tokens(request, SequenceStatus.RUNNING, budget)
            if num_tokens == 0:
                break  # the budget is spent
            queue.popleft()
            while not self.manager.can_append_slots(request, 0):
                budget.subtract_num_batched_tokens(request.request_id, num_tokens)
                budget.subtract_num_seqs(request.request_id, request.get_max_num_running_seqs())
                victim = self._victim(queue, request)
                if victim is request and request.is_prefill() and not prefills and not decodes:
                    # Alone on the GPU and its prefill still cannot go on: preempting
                    # it would replay this step forever (vLLM livelocks here).
                    self._finish_all(request, SequenceStatus.FINISHED_ABORTED)
                    record.aborted.append(request.request_id)
                    break
                outcome = self._preempt(victim, record, swap_out)
                if outcome == "recompute":
                    preempted.append(victim)
                elif outcome == "swap":
                    swapped_out.append(victim)
                if victim is request:
                    break
            else:
                self._append_slots(request, copies)
                if request.is_prefill():
                    prefills.append(ScheduledGroup(request, num_tokens, num_tokens))
                else:  # one token (num_tokens is 1: a decode is never chunked)
                    decodes.append(request)
                budget.add_num_batched_tokens(request.request_id, num_tokens)
                budget.add_num_seqs(request.request_id, request.get_max_num_running_seqs())
        return prefills, decodes, preempted, swapped_out

    def _schedule_swapped(
        self,
        budget: SchedulingBudget,
        record: StepRecord,
        copies: list[tuple[int, int]],
        swap_in: list[tuple[int, int]],
    ) -> tuple[list[ScheduledGroup], list[SimRequest]]:
        prefills: list[ScheduledGroup] = []
        decodes: list[SimRequest] = []
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
            record.swapped_in.append(request.request_id)
            self._append_slots(request, copies)
            if is_prefill:
                prefills.append(ScheduledGroup(request, num_uncached + num_cached, num_uncached))
            else:
                decodes.append(request)
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
            admitted.append(ScheduledGroup(request, num_uncached + num_cached, num_uncached))
            budget.add_num_batched_tokens(request.request_id, num_uncached, num_cached)
            budget.add_num_seqs(request.request_id, num_new_seqs)
        return admitted

    # -- block traffic of one group -------------------------------------------------------------
    @staticmethod
    def _victim(queue: deque[SimRequest], request: SimRequest) -> SimRequest:
        """Who loses its blocks when ``request`` cannot append: the running
        queue's last (the latest admitted), or ``request`` itself when none is
        left behind it. Twin: ``victim`` in ``compiled/policy.py``."""
        return queue.pop() if queue else request

    def _append_slots(self, request: SimRequest, copies: list[tuple[int, int]]) -> None:
        for seq in request.get_seqs(SequenceStatus.RUNNING):
            copies += self.manager.append_slots(seq, 0)

    def _preempt(self, request: SimRequest, record: StepRecord, swap_out: list[tuple[int, int]]) -> str:
        """Make room by taking ``request`` off the GPU: swapped out in swap
        mode while the CPU has room, else recomputed; returns how. (vLLM swaps
        a group of several running sequences in any mode; a request here has
        one: vLLM 0.9.2 makes n requests of one sequence, ``request.py``.)"""
        if self.config.preemption_mode == "swap" and self._swap_out(request, record, swap_out):
            return "swap"
        seq = request.seq
        seq.status = SequenceStatus.WAITING
        self._free(seq)
        seq.data.reset_state_for_recompute()
        record.preempted.append(request.request_id)
        return "recompute"

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
        return True

    def _finish_all(self, request: SimRequest, status: SequenceStatus, has_blocks: bool = True) -> None:
        """End every unfinished sequence of the group and free its blocks."""
        for seq in request.seqs:
            if not seq.is_finished():
                seq.status = status
                if has_blocks:
                    self._free(seq)

    # -- after the model step ---------------------------------------------------------------------------
    def free_finished(self, finished_seqs: Iterable[Sequence]) -> list[SimRequest]:
        """Free the sequences that finished this step, in the order given, and
        drop the groups that are done (in running-queue order).

        vLLM's engine frees each finished sequence while it processes the
        model's output, group by group in the order of the scheduled batch
        (new prefills, running prefills, swapped-in prefills, running
        decodes, swapped-in decodes); its ``free_finished_seq_groups`` later
        finds nothing left to free. The order matters: freed blocks go to the
        front of the free list, so it decides the ids handed out next."""
        finished = list(finished_seqs)
        for seq in finished:
            self._free(seq)
        if not finished:  # no group can be done: the aborted ones left the queue when they were aborted
            return []
        done: list[SimRequest] = []
        remaining: deque[SimRequest] = deque()
        for request in self.running:
            (done if request.is_finished() else remaining).append(request)
        self.running = remaining
        self.records[-1].finished.extend(r.request_id for r in done)
        return done


__all__ = ["PREEMPTION_MODES", "STEP_PATHS", "Scheduler", "SchedulerConfig"]
