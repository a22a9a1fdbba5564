"""How a step's decisions reach the manager, one call per sequence: vLLM's
own way, and the path every manager takes.

The policy (``scheduler.py``) calls a step path at two points and never
asks which one it holds:

* ``take_decodes`` at the head of the running queue: a path that can
  schedule a run of decodes in one go does so; this one never does, and
  the policy takes each group in turn.
* ``touch`` once the batch is decided: vLLM's per-sequence metadata pass
  (``get_block_table``, ``access_all_blocks_in_seq``, with prefix caching
  ``get_common_computed_block_ids``), then ``mark_blocks_as_computed``.

The row path (``row_step.py``) overrides both for the fast manager's row
API and falls back on this one for every group it does not batch.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from blockspace.enums import SequenceStatus
from blockspace.simulator.budget import SchedulingBudget
from blockspace.simulator.decisions import ScheduledGroup
from blockspace.simulator.request import SimRequest

Tables = list[tuple[int, tuple[int, ...]]]  # (seq id, block ids), for the decision digest


class CallPath:
    """Every sequence through the v0 interface, one call at a time."""

    def __init__(self, manager: Any, block_size: int, enable_caching: bool, tracked: set[int]) -> None:
        self.manager = manager
        self.caching = enable_caching
        self.tracked = tracked  # seq ids the computed-blocks tracker holds (the policy's set)

    def take_decodes(
        self, queue: deque[SimRequest], budget: SchedulingBudget, copies: list[tuple[int, int]]
    ) -> list[SimRequest] | None:
        """Decodes at the head of ``queue`` scheduled at once and taken off
        it; [] when the policy should take the head itself, None when the
        budget is spent. One call at a time: always []."""
        return []

    def touch(
        self, prefills: list[ScheduledGroup], decodes: list[SimRequest], now: float, record_tables: bool
    ) -> Tables:
        """The metadata pass over the batch (prefills, then decodes), then
        the computed marks; the block tables when ``record_tables``."""
        tables: Tables = []
        for group in prefills:
            self.touch_group(group.request, now, record_tables, tables)
        for request in decodes:
            self.touch_group(request, now, record_tables, tables)
        mark = self.manager.mark_blocks_as_computed
        for group in prefills:
            mark(group.request, group.token_chunk_size)
        for request in decodes:
            mark(request, 1)
        return tables

    def touch_group(self, request: SimRequest, now: float, record_tables: bool, tables: Tables) -> None:
        seqs = request.get_seqs(SequenceStatus.RUNNING)
        for seq in seqs:
            table = self.manager.get_block_table(seq)
            if record_tables:
                tables.append((seq.seq_id, tuple(table or ())))  # the placeholder manager has none
            self.manager.access_all_blocks_in_seq(seq, now)
        if self.caching:
            self.tracked.update(seq.seq_id for seq in seqs)
            self.manager.get_common_computed_block_ids(seqs)


__all__ = ["CallPath", "Tables"]
