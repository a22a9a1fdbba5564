"""Which row of the table store holds which table, and each table's block
ids as one read-only list per change (and each sequence's last access time).

Why rows: every table lives in one row of the 2-D store
(``fast/table.py``); a sequence keeps its row from ``allocate`` (or
``fork``) to ``free``, so a scheduler may hold rows instead of sequences
(``fast/row_api.py``). Freed rows are reused last-freed first. ``live`` marks
the rows of sequence tables, for the array-level step's checks.

Why answers: a scheduler asks for every running sequence's table at every
step, and the table changes about once in ``block_size`` steps. So the
answer is a ``BlockIds`` (a read-only list, ``blockspace/block_ids.py``)
built when the table changes and handed out as it is until the next change:
``block_ids`` is one dictionary look-up. Every kernel write of a block id
lowers the row's ``changed_from`` to that entry; whoever ran such a kernel
calls ``refresh``, which rebuilds the answers of the changed rows from
their previous answers: the ids up to ``changed_from`` are copied (sharing
their int objects) and only the entries after it converted, so a decode
step that adds a block converts one id, not the whole table. A batch
(``refresh_rows``) only sets the old answers aside; the rebuild waits until
an answer is asked for.

Why access times here: ``access_all_blocks_in_seq`` runs for every
sequence at every step, and only ``free`` reads the time (it stamps the
table's blocks with it), so it is kept in a dictionary and written into
the table store only when the table is freed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from blockspace.block_ids import EMPTY, BlockIds, common_prefix, rebuilt
from blockspace.fast import kernels
from blockspace.fast import table as T
from blockspace.fast.saving import SavedFields
from blockspace.fast.store import Store
from blockspace.protocols import SequenceLike
from blockspace.validation import unknown_sequence

_FEW = 8  # entries read one by one below this; converted as an array slice above


class TableRows(SavedFields):
    """Sequence and cross-table rows, and the block-id answers."""

    SAVED = ("of_seq", "of_cross", "seq_of_row", "free_rows", "num_used", "live", "seen", "stamp", "answers", "stale",
             "prefixes", "cross_answers", "access_times")  # fmt: skip

    def __init__(self, store: Store) -> None:
        self.store = store
        num_rows = store.tables.blocks.shape[0]
        self.of_seq: dict[int, int] = {}  # seq_id -> row
        self.of_cross: dict[str, int] = {}  # request_id -> row
        self.seq_of_row: list[int] = [-1] * num_rows
        self.free_rows: list[int] = []
        self.num_used = 0  # rows ever used
        self.live = np.zeros(num_rows, np.bool_)  # row -> holds a sequence's table
        self.seen = np.zeros(num_rows, np.int64)  # row -> last batch stamp (the duplicate check)
        self.stamp = 0
        self.answers: dict[int, BlockIds] = {}  # seq_id -> its table, while unchanged
        self.stale: dict[int, BlockIds] = {}  # seq_id -> its answer before a batch changed it (refresh_rows)
        self.prefixes: dict[int, tuple[BlockIds, BlockIds]] = {}  # seq_id -> (table answer, cached prefix)
        self.cross_answers: dict[str, BlockIds] = {}  # a cross table never changes until freed
        self.access_times: dict[int, float | None] = {}  # seq_id -> last access_all_blocks_in_seq time

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._answers_again()

    def restore(self, saved: tuple) -> None:
        super().restore(saved)
        self._answers_again()  # ``saved`` may have been pickled (the explorer's frontier)

    def _answers_again(self) -> None:
        """After pickling or ``copy.deepcopy``, the kept answers are
        ``BlockIds`` again: a ``BlockIds`` pickles as a plain list (for
        whoever holds one), but the manager hands these out as they are.
        In place, and one answer for one list: the manager holds ``answers``
        itself too, and ``prefixes`` tells a kept answer by identity."""
        made: dict[int, BlockIds] = {}

        def answer(ids: list[int]) -> BlockIds:
            if type(ids) is BlockIds:
                return ids
            if id(ids) not in made:
                made[id(ids)] = BlockIds(ids) if ids else EMPTY
            return made[id(ids)]

        every: tuple[dict[Any, BlockIds], ...] = (self.answers, self.stale, self.cross_answers)  # seq or request ids
        for kept in every:
            for key, ids in kept.items():
                kept[key] = answer(ids)
        for key, (ids, prefix) in self.prefixes.items():
            self.prefixes[key] = (answer(ids), answer(prefix))

    # -- rows -----------------------------------------------------------------------
    def require(self, seq: SequenceLike) -> int:
        """The sequence's row; ``UnknownSequenceError`` if it has no table
        (every call that names a sequence asks here first)."""
        row = self.of_seq.get(seq.seq_id)
        if row is None:
            raise unknown_sequence(seq.seq_id)
        return row

    def check_batch(self, rows: np.ndarray, seq_lens: np.ndarray, appending: bool) -> tuple[int, int, int]:
        """``check_rows`` of a batch of the row API (``fast/row_api_kernels.py``):
        ``live`` and the duplicate check's stamps are this part's."""
        self.stamp += 1
        return kernels.check_rows(self.live, self.store.tables_ref, rows, seq_lens, self.seen, self.stamp, appending)

    def take(self) -> int:
        """A row for a new table (the store grows if every row is in use)."""
        if self.free_rows:
            return self.free_rows.pop()
        store = self.store
        if self.num_used == store.tables.blocks.shape[0]:
            store.tables = T.grow_tables(store.tables, num_rows=self.num_used + 1)
            num_more = store.tables.blocks.shape[0] - len(self.live)
            self.live = np.concatenate([self.live, np.zeros(num_more, np.bool_)])
            self.seen = np.concatenate([self.seen, np.zeros(num_more, np.int64)])
            self.seq_of_row += [-1] * num_more
        self.num_used += 1
        return self.num_used - 1

    def give_back(self, rows: list[int]) -> None:
        """Rows taken for an allocation that did not happen (last taken first out)."""
        self.free_rows += rows[::-1]

    def bind(self, seq_id: int, row: int) -> None:
        self.of_seq[seq_id] = row
        self.seq_of_row[row] = seq_id
        self.live[row] = True

    def unbind(self, seq_id: int) -> int | None:
        """The row of a sequence being freed (None: it has none); recycle it after the kernel."""
        row = self.of_seq.pop(seq_id, None)
        if row is not None:
            self.live[row] = False
            self.answers.pop(seq_id, None)
            self.stale.pop(seq_id, None)
            self.prefixes.pop(seq_id, None)
        return row

    def unbind_cross(self, request_id: str) -> int | None:
        self.cross_answers.pop(request_id, None)
        return self.of_cross.pop(request_id, None)

    def recycle(self, row: int) -> None:
        self.free_rows.append(row)

    def rows_in_use(self) -> set[int]:
        return set(self.of_seq.values()) | set(self.of_cross.values())

    # -- answers --------------------------------------------------------------------
    def ids(self, row: int) -> BlockIds:
        """The row's block ids, read-only, built now."""
        num_blocks = self.store.tables_view.num_blocks[row]
        return BlockIds(self.store.tables.blocks[row, :num_blocks].tolist()) if num_blocks else EMPTY

    def block_ids(self, seq: SequenceLike) -> BlockIds:
        """``get_block_table``: the kept answer, or a new one."""
        ids = self.answers.get(seq.seq_id)
        if ids is None:
            old = self.stale.pop(seq.seq_id, EMPTY)
            ids = self.answers[seq.seq_id] = self._rebuilt(self.require(seq), old)
        return ids

    def _rebuilt(self, row: int, old: BlockIds) -> BlockIds:
        """The row's answer, made from ``old``, its answer before it changed."""
        view = self.store.tables_view
        num_blocks = view.num_blocks[row]
        start = min(view.changed_from[row], len(old), num_blocks)
        view.changed_from[row] = T.UNCHANGED
        if not num_blocks:
            return EMPTY
        if num_blocks - start <= _FEW:  # a decode step's change: read the cells, no array slice
            blocks = view.blocks
            return rebuilt(old, start, [blocks[row, index] for index in range(start, num_blocks)])
        return rebuilt(old, start, self.store.tables.blocks[row, start:num_blocks].tolist())

    def cross_block_ids(self, request_id: str) -> BlockIds:
        ids = self.cross_answers.get(request_id)
        if ids is None:
            ids = self.cross_answers[request_id] = self.ids(self.of_cross[request_id])
        return ids

    def cached_prefix(self, seq: SequenceLike, num_blocks: int) -> BlockIds:
        """The first ``num_blocks`` ids of the sequence's table, kept as long
        as the table and the count stay the same."""
        ids = self.block_ids(seq)
        if num_blocks >= len(ids):
            return ids
        kept = self.prefixes.get(seq.seq_id)
        if kept is None or kept[0] is not ids or len(kept[1]) != num_blocks:
            kept = self.prefixes[seq.seq_id] = (ids, rebuilt(ids, num_blocks, []) if num_blocks else EMPTY)
        return kept[1]

    def common_prefix(self, seqs: Sequence[SequenceLike], num_cached_blocks: list[int]) -> BlockIds:
        """The longest block-id prefix that the sequences' first
        ``num_cached_blocks[i]`` ids share; sequences without cached blocks
        are left out, as in vLLM (spec §9.15)."""
        return common_prefix([self.block_ids(seq)[:count] for seq, count in zip(seqs, num_cached_blocks)])

    def touch(self, seq: SequenceLike, access_time: float) -> None:
        """``access_all_blocks_in_seq``: the time is kept here and written
        into the table store only when the table is freed."""
        if seq.seq_id not in self.of_seq:
            raise unknown_sequence(seq.seq_id)
        self.access_times[seq.seq_id] = access_time

    def refresh(self, seq_id: int, row: int) -> None:
        """A kernel may have written the row: if it did, the new answer."""
        if self.store.tables_view.changed_from[row] != T.UNCHANGED:
            old = self.answers.get(seq_id)
            if old is not None:
                self.answers[seq_id] = self._rebuilt(row, old)

    def refresh_rows(self, rows: np.ndarray) -> None:
        """After a batch: the answers of its changed rows are set aside, to
        be rebuilt from when next asked for. Why not now: the row API's
        caller reads tables as arrays, and a long table's answer costs
        microseconds to rebuild, at every block it gains."""
        if self.answers:
            answers, stale, seq_of_row = self.answers, self.stale, self.seq_of_row
            for row in rows[self.store.tables.changed_from[rows] != T.UNCHANGED].tolist():
                old = answers.pop(seq_of_row[row], None)
                if old is not None:
                    stale[seq_of_row[row]] = old
