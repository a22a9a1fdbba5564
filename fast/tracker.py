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
from numba import njit

from blockspace.fast import pool as P
from blockspace.fast.content import has_room, intern
from blockspace.fast.table import NO_KEY_ROOM, NO_ROOM


class Tracker(NamedTuple):
    keys: np.ndarray  # int64[rows, cols]: content keys of the full blocks
    num_keys: np.ndarray  # int64[rows]
    num_cached: np.ndarray  # int64[rows]: cached tokens at the last count


def new_tracker(num_rows: int = 16, num_cols: int = 16) -> Tracker:
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


@njit(cache=True)
def open_row(tracker, row):
    tracker.num_keys[row] = 0
    tracker.num_cached[row] = 0


@njit(cache=True)
def num_cached_tokens(gpu, keys, tracker, row, tokens, num_full, extra, root, frozen):
    """Key the sequence's full blocks up to ``num_full`` (``tokens`` are its
    ids from the first unkeyed block on; ``root`` the first block's parent), then count its cached tokens, or
    return the last count when ``frozen`` (still in prefill)."""
    block_size = keys.tokens.shape[1]
    known = tracker.num_keys[row]
    if num_full > tracker.keys.shape[1]:
        return NO_ROOM
    if not has_room(keys, max(0, num_full - known)):
        return NO_KEY_ROOM
    for index in range(known, num_full):
        parent = tracker.keys[row, index - 1] if index else root
        tracker.keys[row, index] = intern(keys, parent, tokens, (index - known) * block_size, extra)
    tracker.num_keys[row] = max(known, num_full)
    if frozen:
        return tracker.num_cached[row]
    low, high = 0, tracker.num_keys[row]
    while low < high:
        middle = (low + high) // 2
        if P.is_cached_and_computed(gpu, tracker.keys[row, middle]):
            low = middle + 1
        else:
            high = middle
    tracker.num_cached[row] = low * block_size
    return low * block_size
