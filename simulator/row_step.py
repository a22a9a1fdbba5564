"""The decode part of a step through the manager's row API, when it offers one.

Why: a decoding sequence costs the per-call path four manager calls a step
(``can_append_slots``, ``append_slots``, ``get_block_table``,
``access_all_blocks_in_seq``), each a microsecond or more of Python. The fast
manager's row API (``fast/row_api.py``) does each of them for a whole batch in
one call on table rows and lengths. This is the worked example of driving
it from a scheduler, and the simulator's default where the manager offers
it (detected by its methods, ``offers_rows``, not by its class). It is a
step path (``calls.py``): the policy calls it at the same two points as the
per-call path and never asks which one it holds.

What is batched: a *run*, the longest stretch at the head of the running
queue of groups with one sequence that is decoding (the common case; groups
of several samples, prefills and everything else take the per-call path, in
queue order, so block ids are handed out in the same order).

Why the decisions are those of the per-call path, exactly:

* Budget: a decode takes one token; the per-call loop stops at the first
  group whose (block-aligned, with prefix caching) remaining budget is 0, so
  the run is cut where that would happen, and the loop stops there too.
* Room: ``can_append_slots_rows`` with the whole run as one group asks
  whether the run's appends, together, fit the free blocks. If they do,
  every group's own check would pass in turn (an append never takes more
  blocks than ``can_append_slots`` counts for it), so no one is preempted and
  ``append_slots_rows`` does the appends in queue order, giving the same
  blocks and copy-on-write pairs. If they do not fit (``fits`` is False),
  someone will be preempted: the rest of this step's running queue goes
  through the per-call path, which preempts exactly as vLLM would.
* Access times: ``access_all_blocks_rows`` for every row of the step's
  runs at once (the order of these writes does not matter). Block tables:
  vLLM's scheduler hands the model runner references to the tables, and
  here the rows are those references; ``block_table_array`` builds them
  only when the run records tables (``--compare``), which checks its
  answers against the per-call path's at every step.
  ``mark_blocks_as_computed`` takes no arguments that matter, so the step
  calls it once instead of once per group.
* ``get_common_computed_block_ids`` (prefix caching): its side effect, keying
  each sequence's new full blocks in the computed-blocks tracker, is the
  same in any order, and the per-call path ignores its answer, so
  ``num_computed_blocks_rows`` does it for every row of the step's runs in
  one call (the answer, how many leading blocks of each table are computed,
  is what a model runner would take).

The sequence objects stay the source of truth: the rows come from
``rows_of`` at each step (a row stays the same while its sequence lives) and
the lengths and token ids from the sequences, so nothing has to be kept in
step by hand.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from blockspace.enums import SequenceStatus
from blockspace.interfaces import offers_rows
from blockspace.simulator.budget import SchedulingBudget, least_usable
from blockspace.simulator.calls import CallPath, Tables
from blockspace.simulator.decisions import ScheduledGroup
from blockspace.simulator.request import SimRequest

TABLE_END = -1  # pads the rows of block_table_array: a row's ids are its entries before it


def is_single_decode(request: SimRequest) -> bool:
    """One sequence, decoding."""
    seqs = request.seqs
    return len(seqs) == 1 and seqs[0].status == SequenceStatus.RUNNING and not seqs[0].is_prefill()


class RowPath(CallPath):
    """One step's runs of single decodes, scheduled and touched through rows."""

    def __init__(self, manager: Any, block_size: int, enable_caching: bool, tracked: set[int]) -> None:
        super().__init__(manager, block_size, enable_caching, tracked)
        self.threshold = least_usable(block_size, enable_caching)  # the least budget giving a decode its token
        self.runs: list[tuple[np.ndarray, list[Any], list[list[int]] | None]] = []  # (rows, sequences, token lists)
        self.requests: set[str] = set()
        self.usable = True  # False once a run did not fit: the rest of the step goes per call
        self.num_fallbacks = 0  # runs that did not fit, over the whole run (the tests see the fallback taken)

    def take_decodes(
        self, queue: deque[SimRequest], budget: SchedulingBudget, copies: list[tuple[int, int]]
    ) -> list[SimRequest] | None:
        """Schedule the run at the head of ``queue``: the requests taken off
        it ([] if there is no run, or it did not fit: then the per-call path
        takes over for the rest of the step), or None when the budget is
        spent."""
        if not self.usable or not is_single_decode(queue[0]):
            return []
        room = budget.remaining_token_budget() - self.threshold + 1
        if room <= 0:
            return None
        run: list[SimRequest] = []
        for request in queue:
            if len(run) == room or not is_single_decode(request):
                break
            run.append(request)
        seqs = [request.seqs[0] for request in run]
        manager = self.manager
        rows = manager.rows_of(seqs)
        tokens = [seq.get_token_ids() for seq in seqs] if self.caching else None
        lengths = np.fromiter(
            map(len, tokens) if tokens is not None else (seq.get_len() for seq in seqs), np.int64, len(seqs)
        )  # a sequence's length is its token list's
        if not manager.can_append_slots_rows(rows, lengths, 0, np.array([len(rows)]))[0]:
            self.usable = False
            self.num_fallbacks += 1
            return []
        pairs = manager.append_slots_rows(rows, lengths, 0, token_ids=tokens)
        copies += [tuple(pair) for pair in pairs.tolist()]
        for _ in run:
            queue.popleft()
        self.runs.append((rows, seqs, tokens))
        self.requests.update(request.request_id for request in run)
        return run

    def touch(
        self, prefills: list[ScheduledGroup], decodes: list[SimRequest], now: float, record_tables: bool
    ) -> Tables:
        """The decodes of the step's runs in one call each (access times,
        computed blocks; with ``record_tables`` their block tables, as each
        sequence's block ids), every other group per call; then one
        ``mark_blocks_as_computed`` for the step. Without ``record_tables``
        no table is built: vLLM's scheduler only hands the model runner
        references to the tables, and the rows are those references here (a
        model runner would take ``block_tables(rows)`` or a device table kept
        by deltas)."""
        run_tables = self._touch_runs(now, record_tables)
        tables: Tables = []
        for group in prefills:
            self.touch_group(group.request, now, record_tables, tables)
        in_runs = self.requests
        for request in decodes:
            if request.request_id not in in_runs:
                self.touch_group(request, now, record_tables, tables)
            elif record_tables:
                seq_id = request.seq.seq_id
                tables.append((seq_id, run_tables[seq_id]))
        if self.caching:  # computed blocks: counted for the whole run
            self.tracked.update(seq.seq_id for _, seqs, _ in self.runs for seq in seqs)
        if prefills:  # the calls would follow one another, and take nothing that matters: one does it all
            self.manager.mark_blocks_as_computed(prefills[0].request, prefills[0].token_chunk_size)
        elif decodes:
            self.manager.mark_blocks_as_computed(decodes[0], 1)
        self.runs, self.requests, self.usable = [], set(), True
        return tables

    def _touch_runs(self, now: float, record_tables: bool) -> dict[int, tuple[int, ...]]:
        if not self.runs:
            return {}
        if len(self.runs) == 1:
            rows, _, tokens = self.runs[0]
        else:
            rows = np.concatenate([rows for rows, _, _ in self.runs])
            tokens = None
            if self.caching:  # then every run has its token lists
                tokens = [ids for _, _, run_tokens in self.runs if run_tokens is not None for ids in run_tokens]
        self.manager.access_all_blocks_rows(rows, now)
        if self.caching:
            self.manager.num_computed_blocks_rows(rows, tokens)
        if not record_tables:
            return {}
        tables = self.manager.block_table_array(rows, TABLE_END)
        seqs = [seq for _, run, _ in self.runs for seq in run]
        return {seq.seq_id: tuple(b for b in row if b != TABLE_END) for seq, row in zip(seqs, tables.tolist())}


__all__ = ["RowPath", "is_single_decode", "offers_rows"]
