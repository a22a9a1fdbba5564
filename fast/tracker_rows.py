"""The computed-blocks tracker's rows: which sequence has which row of the
tracker arrays (``fast/tracker.py``), and the rows parked for a request
that waits.

Why parking: a waiting request that cannot be admitted yet is keyed,
dropped from the tracker (``remove_seq_from_computed_blocks_tracker``) and
keyed again at every scheduler step (vLLM v0's admission loop). Its tokens
do not change meanwhile, so a dropped row is parked with a copy of the
token list it was keyed from (its memo): if the next query brings the same
tokens (compared in full, a C loop far cheaper than converting them
again), the row's keys are exactly those a fresh keying would make, and the
row comes back instead. Only the last ``MAX_PARKED_ROWS`` are kept.
``allocate`` of a sequence whose row still has its memo takes the converted
tokens and the block keys from it, after the same comparison.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blockspace.fast import kernels
from blockspace.fast import table as T
from blockspace.fast import tracker as K
from blockspace.fast.checks import int64_or_none, joined_token_ids
from blockspace.fast.key_space import KeySpace
from blockspace.fast.row_args import not_token_ids
from blockspace.fast.saving import SavedFields
from blockspace.fast.store import Store
from blockspace.protocols import SequenceLike
from blockspace.validation import cache_salt, not_tracked, shrunk_tokens


class Memo:
    """The token list a tracker row was keyed from (a copy), its salt and
    adapter ids, and ``int64_or_none`` of the tokens."""

    __slots__ = ("tokens", "root", "extra", "array")

    def __init__(self, tokens: list[int], root: int, extra: int, array: np.ndarray | None) -> None:
        self.tokens, self.root, self.extra, self.array = tokens, root, extra, array

    def matches(self, tokens: Any, root: int, extra: int) -> bool:
        """Are ``tokens`` (and salt and adapters) those keyed, or do they begin with them?"""
        if root != self.root or extra != self.extra:
            return False
        if len(tokens) == len(self.tokens):
            return tokens == self.tokens  # no slice: the usual case, a waiting request
        return tokens[: len(self.tokens)] == self.tokens


class TrackerRows(SavedFields):
    """Tracker rows of sequences, parked rows and their memos."""

    MAX_PARKED_ROWS = 64
    SAVED = ("tracked", "free_rows", "num_used", "memos", "parked")

    def __init__(self, store: Store, key_space: KeySpace, block_size: int) -> None:
        self.store = store
        self.key_space = key_space
        self.block_size = block_size
        self.tracked: dict[int, int] = {}  # seq_id -> tracker row
        self.free_rows: list[int] = []
        self.num_used = 0  # rows ever used
        self.memos: dict[int, Memo | None] = {}  # tracker row -> the tokens it was keyed from (from 0)
        self.parked: dict[int, tuple[int, Memo]] = {}  # seq_id -> (row, memo), oldest first

    def tracks(self, seq_id: int) -> bool:
        """Does the tracker hold a row for the sequence (``group_salt`` counts those)?"""
        return seq_id in self.tracked

    def check_tokens(self, seq: SequenceLike, tokens: Any) -> tuple[int | None, int]:
        """The sequence's row (None: not tracked) and number of keyed blocks,
        after the reference's check that its tokens did not shrink."""
        row = self.tracked.get(seq.seq_id)
        known = 0 if row is None else self.store.tracker_view.num_keys[row]
        if len(tokens) < known * self.block_size:
            raise shrunk_tokens(seq.seq_id, len(tokens), known * self.block_size)
        return row, known

    def num_cached_tokens(self, seq: SequenceLike) -> int:
        """Key the sequence's new full blocks, then count its cached tokens (spec §10)."""
        tokens = seq.get_token_ids()
        row, known = self.check_tokens(seq, tokens)
        frozen = row is not None and seq.is_prefill()
        root = self.key_space.root_id(cache_salt(seq))  # checks the salt on every call, as the reference
        num_full = len(tokens) // self.block_size
        if row is not None and num_full == known:  # a known sequence, nothing new to key
            return self._count(row, T.NO_TOKENS, num_full, 0, root, frozen)
        extra = self.key_space.extra_id(seq.extra_hash())
        if row is None:
            row, known = self._unpark(seq.seq_id, tokens, root, extra)
        memo = None
        if num_full > known == 0:  # keyed from the start: remember the tokens (parking, allocate)
            memo = Memo(tokens[:], root, extra, int64_or_none(tokens))
            if memo.array is None:  # not all ints: convert as before (allocate will check them)
                array = np.array(tokens[: num_full * self.block_size], np.int64).reshape(-1)
            else:
                array = memo.array[: num_full * self.block_size]
        elif num_full > known:
            array = np.array(tokens[known * self.block_size : num_full * self.block_size], np.int64).reshape(-1)
        else:
            array = T.NO_TOKENS
        if row is None:
            row = self._take_row()
        count = self._count(row, array, num_full, extra, root, frozen)
        self.tracked[seq.seq_id] = row
        if num_full > known:
            self.memos[row] = memo
        return count

    def num_computed_rows(
        self, seq_ids: list[int], table_rows: np.ndarray, token_ids: Any, lengths: np.ndarray, prefill: np.ndarray
    ) -> np.ndarray:
        """How many blocks of each table ``get_common_computed_block_ids``
        would give for the sequences ``seq_ids`` (of table rows
        ``table_rows``), keyed and counted at once from their token lists
        (of ``lengths`` tokens, checked by the row API's boundary), with
        the salt and adapter ids their tables were allocated with: the row
        API reads no sequence object. A sequence the tracker does not hold is
        keyed from its first block (its parked row, if any, is dropped: a
        fresh keying gives the same keys). Checks come first: nothing
        changes on bad input."""
        num_rows, block_size, tracked, store = len(seq_ids), self.block_size, self.tracked, self.store
        rows = np.array([tracked.get(seq_id, -1) for seq_id in seq_ids], np.int64)
        first_tokens, num_full, growing = (np.empty(num_rows, np.int64) for _ in range(3))
        starts = np.empty(num_rows + 1, np.int64)
        shrunk, num_growing, widest, num_fresh = kernels.plan_tracker_rows(
            store.tracker_ref, rows, lengths, block_size, first_tokens, starts, num_full, growing
        )
        if shrunk >= 0:
            raise shrunk_tokens(seq_ids[shrunk], int(lengths[shrunk]), int(first_tokens[shrunk]))
        growing = growing[:num_growing].tolist()
        parts = [token_ids[i][first_tokens[i] : num_full[i] * block_size] for i in growing]
        tokens, bad = joined_token_ids(parts)
        if bad >= 0:
            raise not_token_ids(growing[bad])
        if num_fresh:  # sequences the tracker does not hold: fresh rows, counted afresh
            prefill = prefill.copy()
            for i in np.flatnonzero(rows < 0).tolist():
                self._drop_parked(seq_ids[i])
                rows[i] = tracked[seq_ids[i]] = self._take_row()
                prefill[i] = False
        if widest > store.tracker.keys.shape[1]:
            store.tracker = K.grow_tracker(store.tracker, num_cols=widest)
        num_new_keys = int(starts[-1]) // block_size
        while not kernels.has_room(store.keys_ref, num_new_keys):
            self.key_space.make_room(num_new_keys)
        counts = np.empty(num_rows, np.int64)
        kernels.num_computed_rows(
            store.gpu_ref, store.keys_ref, store.tracker_ref, store.tables_ref, table_rows, rows, tokens, starts,
            num_full, prefill, counts,
        )  # fmt: skip
        for i in growing:
            self.memos[int(rows[i])] = None  # keyed on past its memo's tokens: the memo no longer covers the row
        return counts

    def _count(self, row: int, array: np.ndarray, num_full: int, extra: int, root: int, frozen: bool) -> int:
        store = self.store
        while True:
            count = kernels.num_cached_tokens(
                store.gpu_ref, store.keys_ref, store.tracker_ref, row, array, num_full, extra, root, frozen
            )
            if count == T.NO_ROOM:
                store.tracker = K.grow_tracker(store.tracker, num_cols=2 * store.tracker.keys.shape[1])
            elif count == T.NO_KEY_ROOM:
                self.key_space.make_room()
            else:
                return int(count)

    def _take_row(self) -> int:
        if self.free_rows:
            row = self.free_rows.pop()
        else:
            row = self.num_used
            self.num_used += 1
            if row == self.store.tracker.keys.shape[0]:
                self.store.tracker = K.grow_tracker(self.store.tracker, num_rows=row + 1)
        kernels.open_tracker_row(self.store.tracker_ref, row)
        return row

    def remove(self, seq: SequenceLike) -> None:
        """``remove_seq_from_computed_blocks_tracker``: the row is parked."""
        row = self.tracked.pop(seq.seq_id, None)
        if row is None:
            raise not_tracked(seq.seq_id)
        memo = self.memos.pop(row, None)
        if memo is None:
            self.free_rows.append(row)
            return
        self.parked[seq.seq_id] = (row, memo)
        if len(self.parked) > self.MAX_PARKED_ROWS:
            self._drop_parked(next(iter(self.parked)))

    def forget(self, seq_id: int) -> None:
        """The sequence is freed: its row, parked or not, is free again."""
        row = self.tracked.pop(seq_id, None)
        if row is not None:
            self.memos.pop(row, None)
            self.free_rows.append(row)
        self._drop_parked(seq_id)

    def _drop_parked(self, seq_id: int) -> None:
        entry = self.parked.pop(seq_id, None)
        if entry is not None:
            self.free_rows.append(entry[0])

    def _unpark(self, seq_id: int, tokens: Any, root: int, extra: int) -> tuple[int | None, int]:
        """The parked row of ``seq_id`` and its number of keys, if it was keyed
        from these very tokens (and salt and adapters); else (None, 0)."""
        entry = self.parked.pop(seq_id, None)
        if entry is None:
            return None, 0
        row, memo = entry
        if memo.matches(tokens, root, extra):
            self.memos[row] = memo
            return row, self.store.tracker_view.num_keys[row]
        self.free_rows.append(row)
        return None, 0

    def prompt_memo(self, seq: SequenceLike, tokens: list[int]) -> Memo | None:
        """The memo of the sequence's row, if that row was keyed from these
        very tokens (so ``allocate`` takes their conversion and keys)."""
        row = self.tracked.get(seq.seq_id)
        memo = self.memos.get(row) if row is not None else None
        if memo is None or len(tokens) != len(memo.tokens) or tokens != memo.tokens:
            return None
        return memo

    def prompt_keys(self, seq: SequenceLike, num_blocks: int) -> np.ndarray:
        """The first ``num_blocks`` block keys of a sequence whose memo matched."""
        return self.store.tracker.keys[self.tracked[seq.seq_id], :num_blocks]
