"""The array-level step's kernels: checking a batch of table rows, and the
sliding window's drops per row (``fast/row_api.py`` is their Python side)."""

from __future__ import annotations

import numpy as np

from blockspace.fast import table as T
from blockspace.fast.borrowing import counting
from blockspace.fast.rules import num_blocks_to_drop

# What check_rows finds first (code, index of the row).
ROWS_OK, NOT_LIVE, DUPLICATE, NEGATIVE, EMPTY, SWAPPED, SHRUNK = range(7)


@counting
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


@counting
def ends_rise_to(group_ends, num_rows):
    """Do the group ends rise (never fall) from 0 and end at ``num_rows``?"""
    last = 0
    for end in group_ends:
        if end < last:
            return False
        last = end
    return last == num_rows


@counting
def plan_tails(tables, rows, seq_lens, lengths, block_size, firsts, starts):
    """Which token ids of a batch of appends to read (``lengths[i]``: row
    ``i``'s token list's length): ``firsts[i]`` is the first to check, the
    start of the last block for a row whose append fills a block (the
    kernel keys all of it), else the first new one; ``starts`` the offsets
    of the keyed tails in one flat array. Returns the first row whose list
    is not ``seq_lens[i]`` long, or -1."""
    starts[0] = 0
    for i in range(rows.shape[0]):
        if lengths[i] != seq_lens[i]:
            return i
        num_filled = tables.num_filled[rows[i]]
        block_start = num_filled - num_filled % block_size
        fills = seq_lens[i] - block_start >= block_size
        firsts[i] = block_start if fills else num_filled
        starts[i + 1] = starts[i] + (seq_lens[i] - block_start if fills else 0)
    return -1


@counting
def blocks_to_drop(num_computed_tokens, block_size, max_window_blocks):
    """The sliding-window rule ``num_blocks_to_drop`` for each row."""
    drops = np.empty_like(num_computed_tokens)
    for i in range(num_computed_tokens.shape[0]):
        drops[i] = num_blocks_to_drop(num_computed_tokens[i], block_size, max_window_blocks)
    return drops
