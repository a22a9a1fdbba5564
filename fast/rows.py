"""The array-level scheduler step: table rows and sequence lengths in,
arrays out.

Why: the batched API of ``fast/batch.py`` takes Sequence objects, and reading
them (ids, token lists, statuses) costs about a microsecond per sequence in
Python, some forty times the kernels' own work. A scheduler or model runner
that keeps its running batch as arrays (SGLang's request-pool indices, the
``seq_lens`` a v0 model runner builds anyway) hands the manager table rows
and lengths instead; the checks run in a kernel too, and a decode step of a
thousand sequences costs tens of microseconds.

A sequence's row comes from ``rows_of(seqs)`` (or ``row_of(seq)``) and stays
the same until the sequence is freed (a fork gets its own). Each method gives
exactly what the per-sequence calls give for sequences of those lengths;
``block_tables`` and ``slot_mapping`` also accept such a row array in place of
the sequences.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from blockspace.errors import EmptyTableError, InvalidArgumentError, UnknownSequenceError, WrongDeviceError
from blockspace.fast import table as T
from blockspace.fast.checks import checked_lookahead, token_array_or_none
from blockspace.fast.dispatch import direct
from blockspace.fast.rules import num_blocks_to_drop
from blockspace.validation import MAX_TOKEN_ID

# What check_rows finds first (code, index of the row).
ROWS_OK, NOT_LIVE, DUPLICATE, NEGATIVE, EMPTY, SWAPPED, SHRUNK = range(7)


@njit(cache=True)
def check_rows(live, tables, rows, seq_lens, seen, stamp, appending):
    """The first bad row of a batch as ``(code, index, 0)``: a row that is no
    live sequence's table, a repeated row (appends only: ``seen`` holds
    ``stamp`` at the rows met so far), a negative length, and for appends an
    empty table, one swapped out, or a length below the tokens it holds.
    For a good batch ``(ROWS_OK, -1, longest table)``."""
    num_blocks, device, num_filled = tables.num_blocks, tables.device, tables.num_filled  # read once
    longest = 0
    for i in range(rows.shape[0]):
        row = rows[i]
        if row < 0 or row >= live.shape[0] or not live[row]:
            return NOT_LIVE, i, 0
        longest = max(longest, num_blocks[row])
        if seq_lens[i] < 0:
            return NEGATIVE, i, 0
        if not appending:
            continue
        if seen[row] == stamp:
            return DUPLICATE, i, 0
        seen[row] = stamp
        if num_blocks[row] == 0:
            return EMPTY, i, 0
        if device[row] != T.GPU:
            return SWAPPED, i, 0
        if seq_lens[i] < num_filled[row]:
            return SHRUNK, i, 0
    return ROWS_OK, -1, longest


@njit(cache=True)
def blocks_to_drop(num_computed_tokens, block_size, max_window_blocks):
    """The sliding-window rule ``num_blocks_to_drop`` for each row."""
    drops = np.empty_like(num_computed_tokens)
    for i in range(num_computed_tokens.shape[0]):
        drops[i] = num_blocks_to_drop(num_computed_tokens[i], block_size, max_window_blocks)
    return drops


_PROBLEMS = {
    NOT_LIVE: (UnknownSequenceError, "is not the block table of a live sequence"),
    DUPLICATE: (InvalidArgumentError, "appears twice in the batch"),
    NEGATIVE: (InvalidArgumentError, "has a negative sequence length"),
    EMPTY: (EmptyTableError, "has no blocks to append to"),
    SWAPPED: (WrongDeviceError, "is swapped out; swap it in before appending"),
    SHRUNK: (InvalidArgumentError, "has a sequence length below the tokens its block table holds"),
}


def _int_array(name: str, values: Any, size: int | None = None) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1 or (array.dtype.kind not in "iu" and array.size):
        raise InvalidArgumentError(f"{name} must be a 1-D array of integers")
    if size is not None and len(array) != size:
        raise InvalidArgumentError(f"{name} has {len(array)} entries for {size} rows")
    return np.ascontiguousarray(array, dtype=np.int64)  # one layout: the kernels are called without typing


_check_rows, _max_blocks, _can_append_batch = direct(check_rows), direct(T.max_blocks), direct(T.can_append_batch)
_blocks_to_drop = direct(blocks_to_drop)


class RowSteps:
    """Mixin of ``FastBlockSpaceManager``: the array-level step."""

    def rows_of(self, seqs: list[Any]) -> np.ndarray:
        """The table rows of ``seqs`` (int64), for the ``*_rows`` methods."""
        return np.array([self._row(seq) for seq in seqs], np.int64)

    def _checked_rows(
        self, rows: Any, seq_lens: Any = None, appending: bool = False
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """The rows and lengths as int64 arrays, checked, and the longest table."""
        rows = _int_array("rows", rows)
        seq_lens = np.zeros(len(rows), np.int64) if seq_lens is None else _int_array("seq_lens", seq_lens, len(rows))
        self._stamp += 1
        code, index, longest = _check_rows(self._live, self._tables, rows, seq_lens, self._seen, self._stamp, appending)
        if code != ROWS_OK:
            error, why = _PROBLEMS[code]
            raise error(f"row {int(rows[index])} (entry {index} of the batch) {why}")
        return rows, seq_lens, longest

    def can_append_slots_rows(
        self, rows: Any, seq_lens: Any, num_lookahead_slots: int, group_ends: Any = None
    ) -> np.ndarray:
        """``can_append_slots`` for groups of rows (bool per group): group ``g``
        is ``rows[group_ends[g-1]:group_ends[g]]``, the RUNNING sequences of a
        group; without ``group_ends`` every row is a group of its own."""
        checked_lookahead(num_lookahead_slots)
        rows, seq_lens, _ = self._checked_rows(rows, seq_lens)
        if group_ends is None:
            group_ends = np.arange(1, len(rows) + 1, dtype=np.int64)
        else:
            group_ends = _int_array("group_ends", group_ends)
            if (np.diff(group_ends, prepend=0) < 0).any() or (len(group_ends) and group_ends[-1] != len(rows)):
                raise InvalidArgumentError("group_ends must rise from 0 to the number of rows")
        result = np.zeros(len(group_ends), np.bool_)
        _can_append_batch(
            self._gpu, self._tables, rows, seq_lens, group_ends, num_lookahead_slots, self.block_size, result
        )
        return result

    def append_slots_rows(
        self,
        rows: Any,
        seq_lens: Any,
        num_lookahead_slots: int,
        *,
        token_ids: Any = None,
        num_computed_tokens: Any = None,
    ) -> np.ndarray:
        """``append_slots`` for each row in order, for sequences now of
        ``seq_lens`` tokens; returns every copy-on-write pair of the step as
        an int64 array of shape ``(k, 2)``. With prefix caching, ``token_ids[i]``
        (the token ids of row ``i``'s sequence, a list or array) keys the
        blocks that fill; with a sliding window, ``num_computed_tokens[i]``
        decides the blocks to drop. Raises before any change, as
        ``append_slots_batch``."""
        checked_lookahead(num_lookahead_slots)
        rows, seq_lens, _ = self._checked_rows(rows, seq_lens, appending=True)
        num_drops = extras = np.zeros(len(rows), np.int64)
        if self._window:
            if num_computed_tokens is None:
                raise InvalidArgumentError("with a sliding window, append_slots_rows needs num_computed_tokens")
            computed = _int_array("num_computed_tokens", num_computed_tokens, len(rows))
            num_drops = _blocks_to_drop(computed, self.block_size, self.max_block_sliding_window)
        tokens, token_starts = T.NO_TOKENS, np.zeros(len(rows) + 1, np.int64)
        if self.enable_caching:
            tokens, token_starts = self._tails(token_ids, rows, seq_lens, self.tables.num_filled[rows])
            last = np.maximum(self.tables.num_blocks[rows] - 1, 0)
            extras = self.tables.extras[rows, last]  # the adapter ids recorded at allocate
        cow, count = self._run_appends(
            rows, seq_lens, num_lookahead_slots, tokens, token_starts, num_drops, extras,
            lambda index: f"row {int(rows[index])}",
        )  # fmt: skip
        return cow[: 2 * count].reshape(-1, 2).copy()

    def _tails(
        self, token_ids: Any, rows: np.ndarray, seq_lens: np.ndarray, num_filled: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each sequence's token ids from the start of its last block (what
        the append kernel keys), checked, in one flat array with offsets."""
        if token_ids is None or len(token_ids) != len(rows):
            raise InvalidArgumentError("with prefix caching, append_slots_rows needs token_ids for every row")
        parts = []
        for i, (ids, length, filled) in enumerate(zip(token_ids, seq_lens.tolist(), num_filled.tolist())):
            if len(ids) != length:
                raise InvalidArgumentError(f"token_ids[{i}] has {len(ids)} tokens, seq_lens[{i}] says {length}")
            part = token_array_or_none(ids[filled - filled % self.block_size :])
            if part is None:
                raise InvalidArgumentError(f"token_ids[{i}] holds a value that is no token id (0 to {MAX_TOKEN_ID})")
            parts.append(part)
        starts = np.zeros(len(rows) + 1, np.int64)
        np.cumsum([len(part) for part in parts], out=starts[1:])
        return (np.concatenate(parts) if parts else T.NO_TOKENS), starts

    def _rows_and_width(self, seqs_or_rows: Any) -> tuple[np.ndarray, int]:
        """Checked rows of sequences or of a row array, and the longest table."""
        if isinstance(seqs_or_rows, np.ndarray):
            rows, _, longest = self._checked_rows(seqs_or_rows)
            return rows, longest
        rows = self.rows_of(seqs_or_rows)
        return rows, _max_blocks(self._tables, rows)
