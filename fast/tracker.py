"""The computed-blocks tracker in arrays: the twin of ``reference/tracker.py``.

One row per tracked sequence: the content keys of the full blocks of its
token ids (extended as it grows, never recomputed) and its last count of
cached tokens. The count is the longest prefix of keys cached and computed on
the GPU, found by vLLM's binary search (which may count past a hole, as vLLM
does, spec §14.8).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from blockspace.fast import pool as P
from blockspace.fast.borrowing import counting
from blockspace.fast.content import has_room, key_chain
from blockspace.fast.table import NO_KEY_ROOM, NO_ROOM


class Tracker(NamedTuple):
    keys: np.ndarray  # int64[rows, cols]: content keys of the full blocks
    num_keys: np.ndarray  # int64[rows]
    num_cached: np.ndarray  # int64[rows]: cached tokens at the last count


def new_tracker(num_rows: int = 2, num_cols: int = 2) -> Tracker:
    return Tracker(
        np.full((num_rows, num_cols), -1, np.int64), np.zeros(num_rows, np.int64), np.zeros(num_rows, np.int64)
    )


def grow_tracker(tracker: Tracker, num_rows: int = 0, num_cols: int = 0) -> Tracker:
    rows, cols = tracker.keys.shape
    while rows < num_rows:
        rows *= 2
    while cols < num_cols:
        cols *= 2
    grown = new_tracker(rows, cols)
    old_rows, old_cols = tracker.keys.shape
    grown.keys[:old_rows, :old_cols] = tracker.keys
    grown.num_keys[:old_rows] = tracker.num_keys
    grown.num_cached[:old_rows] = tracker.num_cached
    return grown


@counting
def open_row(tracker, row):
    tracker.num_keys[row] = 0
    tracker.num_cached[row] = 0


@counting
def num_cached_tokens(gpu, keys, tracker, row, tokens, num_full, extra, root, frozen):
    """Key the sequence's full blocks up to ``num_full`` (``tokens`` are its
    ids from the first unkeyed block on; ``root`` the first block's parent), then count its cached tokens, or
    return the last count when ``frozen`` (still in prefill)."""
    known = tracker.num_keys[row]
    if num_full > tracker.keys.shape[1]:
        return NO_ROOM
    if not has_room(keys, max(0, num_full - known)):
        return NO_KEY_ROOM
    return _key_and_count(gpu, keys, tracker, row, tokens, num_full, extra, root, frozen)


@counting
def plan_rows(tracker, rows, lengths, block_size, first_tokens, token_starts, num_full, growing):
    """Before a batch's keying (``rows[i]``: the sequence's tracker row, or
    -1 for a fresh one; ``lengths[i]``: its tokens): its full blocks
    (``num_full``), the first token of the blocks still to key
    (``first_tokens``), where each row's tokens to key begin in the batch's
    flat array (``token_starts``), and the rows that key any (``growing``).
    Returns (index of the first sequence shorter than what its row keyed,
    or -1; number of growing rows; most full blocks; number of fresh rows)."""
    token_starts[0] = 0
    num_growing = widest = num_fresh = 0
    for i in range(rows.shape[0]):
        known = tracker.num_keys[rows[i]] if rows[i] >= 0 else 0
        num_fresh += rows[i] < 0
        first_tokens[i] = known * block_size
        if lengths[i] < first_tokens[i]:
            return i, 0, 0, 0
        num_full[i] = lengths[i] // block_size
        widest = max(widest, num_full[i])
        token_starts[i + 1] = token_starts[i] + max(0, num_full[i] - known) * block_size
        if num_full[i] > known:
            growing[num_growing] = i
            num_growing += 1
    return -1, num_growing, widest, num_fresh


@counting
def num_computed_rows(gpu, keys, tracker, tables, table_rows, rows, tokens, token_starts, num_full, frozen, counts):
    """``num_cached_tokens`` for each tracker row of a batch (row ``i``'s
    tokens to key are ``tokens[token_starts[i]:token_starts[i + 1]]``, its
    salt and adapter ids those of table row ``table_rows[i]``), as the number
    of the table's blocks they cover, into ``counts``. The caller made room
    for every key first, so nothing can fail halfway."""
    block_size = keys.tokens.shape[1]
    for i in range(rows.shape[0]):
        table_row = table_rows[i]
        num_blocks = tables.num_blocks[table_row]
        extra = tables.extras[table_row, max(num_blocks - 1, 0)]  # the adapter ids recorded at allocate
        cached = _key_and_count(
            gpu, keys, tracker, rows[i], tokens[token_starts[i] : token_starts[i + 1]], num_full[i], extra,
            tables.roots[table_row], frozen[i],
        )  # fmt: skip
        counts[i] = min(cached // block_size, num_blocks)


@counting
def _key_and_count(gpu, keys, tracker, row, tokens, num_full, extra, root, frozen):
    block_size = keys.tokens.shape[1]
    known = tracker.num_keys[row]
    key_chain(keys, root, tokens, extra, tracker.keys[row], known, num_full)
    tracker.num_keys[row] = max(known, num_full)
    if frozen:
        return tracker.num_cached[row]
    low = count_cached(
        tracker.keys[row], tracker.num_keys[row], tracker.num_keys[row], gpu.key_block, gpu.refcount, gpu.computed,
        gpu.idle_run, gpu.meta[P.FIRST_ID],
    )  # fmt: skip
    tracker.num_cached[row] = low * block_size
    return low * block_size


@counting
def count_cached(row_keys, num_keys, num_known, key_block, refcount, computed, idle_run, first_id):
    """How many of the row's first ``num_keys`` blocks are cached and
    computed on the GPU, by vLLM's binary search (it may count past a hole,
    spec §14.8); only the first ``num_known`` have keys (the rest were never
    keyed, so none is cached). On arrays, not handles: the search reads
    them about ten times."""
    low, high = 0, num_keys
    while low < high:
        middle = (low + high) // 2
        if middle < num_known and P.cached_and_computed(
            key_block, refcount, computed, idle_run, first_id, row_keys[middle]
        ):
            low = middle + 1
        else:
            high = middle
    return low
