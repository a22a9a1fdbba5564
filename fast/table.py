"""Block tables in arrays, and the kernels that change them: the compiled
twin of ``reference/table.py`` (and the table side of the manager).

Every table (a sequence's, or a group's cross-attention table) is one row of
a 2-D store: per entry its block id, content key (-1: none) and interned
``extra``; per row the number of entries, of token slots written
(``num_filled``), the device, the number of leading entries the sliding
window dropped (they point at the null block), and the access time.

An entry's tokens are not stored: they are the sequence's token ids
``[index * bs : (index + 1) * bs]`` up to ``num_filled`` (sequences only grow
by appending), so a kernel that completes a block gets the sequence's tokens
from the start of its last block on.

Each kernel plans and checks first, then changes state, so a failure
(``NO_BLOCKS``: not enough free blocks; ``NO_ROOM``/``NO_KEY_ROOM``: the
arrays must grow) returns before anything changed. The only exception is
interning content keys, which is invisible and idempotent, as in the
reference. Every write to ``blocks`` goes through ``_set_block``: the one place
a block-table delta (row, column, value) is recorded. When the manager keeps a
device table in sync (``track_device_table``), ``_set_block`` appends the
written cell to ``log``; otherwise ``num_logged[0]`` is -1 and it only pays
one load and branch. The log is drained by ``table_deltas.flush_table_log``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from blockspace.fast import pool as P
from blockspace.fast.borrowing import borrowing, counting
from blockspace.fast.content import has_room, intern, key_chain
from blockspace.fast.rules import blocks_to_add, blocks_touched, cdiv

GPU = 0
CPU = 1

NO_TOKENS = np.zeros(0, np.int64)  # what the append kernel reads without caching
UNCHANGED = np.iinfo(np.int64).max  # changed_from of a row whose block ids are as last read

NO_BLOCKS = -1  # not enough free blocks (append: one of the three below)
NO_ROOM = -2  # the table store needs more columns
NO_KEY_ROOM = -3  # the content-key table needs more room
NO_NULL_BLOCK = -11
NO_NEW_BLOCK = -12
NO_COPY_BLOCK = -13
SHORTAGE = {
    NO_NULL_BLOCK: "the sliding-window null block",
    NO_NEW_BLOCK: "a new block",
    NO_COPY_BLOCK: "a copy-on-write",
}


class Tables(NamedTuple):
    blocks: np.ndarray  # int32[rows, cols]: absolute block id per entry
    keys: np.ndarray  # int64[rows, cols]: content key per entry, -1 none
    extras: np.ndarray  # int64[rows, cols]: interned extra_hash() per entry
    num_blocks: np.ndarray  # int64[rows]
    num_filled: np.ndarray  # int64[rows]: token slots written
    device: np.ndarray  # int64[rows]: GPU or CPU
    num_null: np.ndarray  # int64[rows]: leading entries dropped by the sliding window
    roots: np.ndarray  # int64[rows]: parent of the first block's key (-1, or a cache salt's id)
    changed_from: (
        np.ndarray
    )  # int64[rows]: first entry written since the row's block ids were last read (UNCHANGED: none)
    log: np.ndarray  # int32[capacity, 2]: (row, index) of each block write since the last drain
    num_logged: np.ndarray  # int64[1]: writes logged (past capacity: overflowed); -1: not logging


def new_tables(num_rows: int = 2, num_cols: int = 2) -> Tables:
    return Tables(
        np.zeros((num_rows, num_cols), np.int32),
        np.full((num_rows, num_cols), -1, np.int64),
        np.zeros((num_rows, num_cols), np.int64),
        np.zeros(num_rows, np.int64),
        np.zeros(num_rows, np.int64),
        np.zeros(num_rows, np.int64),
        np.zeros(num_rows, np.int64),
        np.full(num_rows, -1, np.int64),
        np.zeros(num_rows, np.int64),
        np.zeros((0, 2), np.int32),
        np.full(1, -1, np.int64),
    )


def grow_tables(tables: Tables, num_rows: int = 0, num_cols: int = 0) -> Tables:
    """A store with at least ``num_rows`` rows and ``num_cols`` columns (sizes double)."""
    rows, cols = tables.blocks.shape
    while rows < num_rows:
        rows *= 2
    while cols < num_cols:
        cols *= 2
    grown = new_tables(rows, cols)._replace(log=tables.log, num_logged=tables.num_logged)
    old_rows, old_cols = tables.blocks.shape
    for name in ("blocks", "keys", "extras"):
        getattr(grown, name)[:old_rows, :old_cols] = getattr(tables, name)
    for name in ("num_blocks", "num_filled", "device", "num_null", "roots", "changed_from"):
        getattr(grown, name)[:old_rows] = getattr(tables, name)
    return grown


@njit(cache=True, inline="always")
def arrays(tables):
    """The store's arrays as a ``Tables``, from a handle or a ``Tables``: what
    a borrowing kernel takes (``fast/borrowing.py``)."""
    return Tables(
        tables.blocks, tables.keys, tables.extras, tables.num_blocks, tables.num_filled, tables.device,
        tables.num_null, tables.roots, tables.changed_from, tables.log, tables.num_logged,
    )  # fmt: skip


# -- rows ----------------------------------------------------------------------
@njit(cache=True, inline="always")
def _set_block(tables, row, index, block_id):
    if index < tables.num_blocks[row] and tables.blocks[row, index] == block_id:
        return  # no change (a block promoted in place)
    tables.blocks[row, index] = block_id
    if index < tables.changed_from[row]:
        tables.changed_from[row] = index
    num_logged = tables.num_logged[0]
    if num_logged >= 0:
        if num_logged < tables.log.shape[0]:
            tables.log[num_logged, 0] = row
            tables.log[num_logged, 1] = index
        tables.num_logged[0] = num_logged + 1


@njit(cache=True, inline="always")
def _open_row(tables, row, device, root):
    tables.roots[row] = root
    tables.num_blocks[row] = 0
    tables.changed_from[row] = 0
    tables.num_filled[row] = 0
    tables.device[row] = device
    tables.num_null[row] = 0


@njit(cache=True, inline="always")
def _add_entry(tables, row, block_id, key, extra):
    index = tables.num_blocks[row]
    _set_block(tables, row, index, block_id)
    tables.keys[row, index] = key
    tables.extras[row, index] = extra
    tables.num_blocks[row] = index + 1


@counting
def _is_full(tables, row, index, block_size):
    return tables.num_filled[row] >= (index + 1) * block_size


# -- prompt allocation (§8.1), fork (§8.4), release (§8.5) ---------------------
@borrowing
def _fill(pool, tables, row, num_tokens, chunk_keys, extra, root, block_size):
    """The prompt's blocks, a block at a time as the reference takes them,
    in one borrowing kernel (``pool`` and ``tables`` are arrays): no call
    and no reference count per block."""
    _open_row(tables, row, GPU, root)
    num_full = chunk_keys.shape[0]
    for index in range(num_full + (num_tokens % block_size > 0)):  # the last: a partial block, unkeyed
        key = chunk_keys[index] if index < num_full else -1
        _add_entry(tables, row, P.fill_step(pool, key), key, extra)
    tables.num_filled[row] = num_tokens


@counting
def allocate(
    pool, keys, tables, row, tokens, extra, root, keyed, fork_rows, cross_row, encoder_tokens, encoder_extra, info
):
    """Tables for a WAITING group: ``row`` for the prompt ``tokens``, the
    ``fork_rows`` sharing it, and (``cross_row`` >= 0) the encoder's cross
    table. Keys the full chunks when caching, unless ``keyed`` already holds
    their keys (the tracker keyed these very tokens; else it is empty).
    NO_BLOCKS if it does not fit. ``info[0]`` gets the number of free blocks
    it needs."""
    block_size = keys.tokens.shape[1]
    num_full = tokens.shape[0] // block_size
    caching = pool.meta[P.CACHING]
    reuse = caching and keyed.shape[0] == num_full
    if cdiv(max(tokens.shape[0], encoder_tokens.shape[0]), block_size) > tables.blocks.shape[1]:
        return NO_ROOM
    if caching and not reuse and not has_room(keys, num_full):
        return NO_KEY_ROOM
    chunk_keys = keyed.copy() if reuse else np.full(num_full, -1, np.int64)
    if caching and not reuse:
        key_chain(keys, root, tokens, extra, chunk_keys, 0, num_full)
    need = 0
    for index in range(num_full):
        need += P.fill_cost(pool, chunk_keys[index])
    if tokens.shape[0] % block_size:
        need += 1
    if cross_row >= 0:
        need += cdiv(encoder_tokens.shape[0], block_size)
    info[0] = need
    if need > P.num_free(pool):
        return NO_BLOCKS
    pool_arrays, table_arrays = P.arrays(pool), arrays(tables)
    _fill(pool_arrays, table_arrays, row, tokens.shape[0], chunk_keys, extra, root, block_size)
    for child in fork_rows:
        fork(pool, tables, row, child)
    if cross_row >= 0:
        no_keys = np.full(encoder_tokens.shape[0] // block_size, -1, np.int64)
        _fill(pool_arrays, table_arrays, cross_row, encoder_tokens.shape[0], no_keys, encoder_extra, -1, block_size)
    return 0


@counting
def fork(pool, tables, parent, child):
    """The child shares every block of the parent."""
    _open_row(tables, child, tables.device[parent], tables.roots[parent])
    for index in range(tables.num_blocks[parent]):
        P.share(pool, tables.blocks[parent, index])
        _add_entry(
            tables, child, tables.blocks[parent, index], tables.keys[parent, index], tables.extras[parent, index]
        )
    tables.num_filled[child] = tables.num_filled[parent]
    tables.num_null[child] = tables.num_null[parent]


@borrowing
def release_all(pool, tables, row, block_size):
    """Release every entry, first to last (dropped entries are not ours).
    Borrowing: ``pool`` and ``tables`` are arrays (``P.arrays``, ``arrays``)."""
    for index in range(tables.num_null[row], tables.num_blocks[row]):
        P.release_step(pool, tables.blocks[row, index], tables.keys[row, index], (index + 1) * block_size)


@borrowing
def _stamp_all(gpu, tables, row, access_time):
    for index in range(tables.num_null[row], tables.num_blocks[row]):
        if P.owns(gpu, tables.blocks[row, index]):
            P.stamp_step(gpu, tables.blocks[row, index], access_time)


@counting
def free(gpu, cpu, tables, row, block_size, accessed, access_time):
    """Stamp the GPU blocks with the sequence's last access time, if it had
    one (``accessed``: ``access_all_blocks_in_seq`` since its allocation),
    then release them. Why the stamp is an argument: the time belongs to the
    sequence, not the table (fast's manager keeps it by sequence id, the
    compiled engine by request), and both call this one kernel."""
    gpu_arrays, table_arrays = P.arrays(gpu), arrays(tables)
    if accessed:
        _stamp_all(gpu_arrays, table_arrays, row, access_time)
    release_all(gpu_arrays if tables.device[row] == GPU else P.arrays(cpu), table_arrays, row, block_size)
    tables.num_blocks[row] = 0
    tables.changed_from[row] = 0


# -- append (§8.3) --------------------------------------------------------------
@counting
def _num_writes(num_filled, num_new, block_size):
    if num_new == 0:
        return 0
    return (num_filled + num_new - 1) // block_size - num_filled // block_size + 1


@counting
def writes_in_place(
    refcount, first_id, blocks, num_blocks, num_filled, row, num_new, num_lookahead, block_size, caching
):
    """Does an append only count the new tokens? Yes when it needs no new
    block and every block it writes is the table's alone, none filling up
    to be keyed (the usual decode step). Takes arrays, not handles, and
    divides once, so the batch loop can ask it cheaply; the per-sequence
    ``append_slots`` asks its Python form on memoryviews (``fast/appends.py``)."""
    filled = num_filled[row]
    if num_blocks[row] * block_size - filled < num_new + num_lookahead:
        return False  # needs a new block
    if num_new == 0:
        return True
    first_index = filled // block_size
    if caching and filled + num_new >= (first_index + 1) * block_size:
        return False  # a block fills up: it gets keyed
    last_index = first_index if num_new == 1 else (filled + num_new - 1) // block_size
    for index in range(first_index, last_index + 1):
        if refcount[blocks[row, index] - first_id] != 1:
            return False
    return True


@counting
def append(
    pool, keys, tables, row, tokens, num_new, num_lookahead, num_drops, extra, window, null_block, cow, cow_start
):
    """Room for ``num_new`` new tokens plus lookahead slots, as the reference's
    ``plan_append`` / ``_check_append_fits`` / ``append``. ``tokens`` are the
    sequence's ids from the start of its last block (only read when caching);
    ``null_block[0]`` is the sliding-window null block (-1 until taken). The
    copy-on-write pairs go to ``cow[cow_start:]``; returns their number or a
    failure code, before any change."""
    block_size = keys.tokens.shape[1]
    caching = pool.meta[P.CACHING]
    num_blocks, num_filled = tables.num_blocks[row], tables.num_filled[row]
    first_drop, end_drop = tables.num_null[row], min(num_drops, num_blocks)
    num_add = blocks_to_add(num_blocks, num_filled, num_new + num_lookahead, block_size)
    num_writes = _num_writes(num_filled, num_new, block_size)
    if num_blocks + num_add > tables.blocks.shape[1]:
        return NO_ROOM
    if caching and not has_room(keys, num_writes):
        return NO_KEY_ROOM
    if not window and writes_in_place(
        pool.refcount, pool.meta[P.FIRST_ID], tables.blocks, tables.num_blocks, tables.num_filled,
        row, num_new, num_lookahead, block_size, caching,
    ):  # fmt: skip
        tables.num_filled[row] = num_filled + num_new  # nothing else changes
        return 0

    # plan: the content key of every block a write fills
    first_index = num_filled // block_size
    write_keys = np.full(num_writes, -1, np.int64)
    for w in range(num_writes):
        index = first_index + w
        if caching and min((index + 1) * block_size, num_filled + num_new) == (index + 1) * block_size:
            if w:
                parent = write_keys[w - 1]
            else:
                parent = tables.keys[row, index - 1] if index else tables.roots[row]
            content_extra = tables.extras[row, index] if index < num_blocks else extra
            write_keys[w] = intern(keys, parent, tokens, (index - first_index) * block_size, content_extra)

    # check: walk the block traffic in order; fail if a take finds none free
    free = P.num_free(pool)
    if window and null_block[0] < 0:
        if free == 0:
            return NO_NULL_BLOCK
        free -= 1
    for index in range(first_drop, end_drop):
        if P.refs(pool, tables.blocks[row, index]) == 1:
            free += 1
    for _ in range(num_add):
        if free == 0:
            return NO_NEW_BLOCK
        free -= 1
    for w in range(num_writes):
        index = first_index + w
        if index < num_blocks and P.refs(pool, tables.blocks[row, index]) > 1:
            if free == 0:
                return NO_COPY_BLOCK
            free -= 1
        if write_keys[w] >= 0:
            free += P.promote_gain(pool, write_keys[w])

    # carry it out
    if window and null_block[0] < 0:
        null_block[0] = P.take(pool)
    for index in range(first_drop, end_drop):
        P.release(pool, tables.blocks[row, index], tables.keys[row, index], (index + 1) * block_size)
        _set_block(tables, row, index, null_block[0])
    tables.num_null[row] = max(first_drop, end_drop)
    for _ in range(num_add):
        _add_entry(tables, row, P.take(pool), -1, extra)
    count = 0
    for w in range(num_writes):
        index = first_index + w
        block_id = tables.blocks[row, index]
        if P.refs(pool, block_id) > 1:
            new_id = P.copy_on_write(pool, block_id)
            cow[cow_start + 2 * count] = block_id
            cow[cow_start + 2 * count + 1] = new_id
            count += 1
            _set_block(tables, row, index, new_id)
        if write_keys[w] >= 0:
            tables.keys[row, index] = write_keys[w]
            _set_block(tables, row, index, P.promote(pool, tables.blocks[row, index], write_keys[w]))
    tables.num_filled[row] = num_filled + num_new
    return count


@counting
def touched(num_filled, row, num_tokens, num_lookahead, block_size):
    """Blocks an append of a sequence of ``num_tokens`` tokens writes or
    reserves (the estimate of ``can_append_slots`` and the swap checks);
    ``num_filled`` is the tables' array (callers read the field once)."""
    filled = num_filled[row]
    return blocks_touched(filled, max(0, num_tokens - filled), num_lookahead, block_size)


# -- swapping (§9.6, §9.7) ----------------------------------------------------------
@counting
def swap_need(destination, tables, rows, num_tokens, num_lookahead, block_size):
    """Blocks a swap of the tables to ``destination`` is estimated to need."""
    need = 0
    for i in range(rows.shape[0]):
        row = rows[i]
        need += touched(tables.num_filled, row, num_tokens[i], num_lookahead, block_size)
        for index in range(tables.num_null[row], tables.num_blocks[row]):
            if _is_full(tables, row, index, block_size) and not P.is_in_use_cached(
                destination, tables.keys[row, index]
            ):
                need += 1
    return need


@counting
def swap_cost(destination, tables, rows, block_size):
    """Free destination blocks a swap of the tables consumes: every entry but
    the full keyed ones whose content is already in use there (or earlier in
    this swap, which then shares it)."""
    seen = set()
    seen.add(-1)
    cost = 0
    for row in rows:
        for index in range(tables.num_blocks[row]):
            key = tables.keys[row, index]
            if not _is_full(tables, row, index, block_size) or key < 0:
                cost += 1
            elif key not in seen:
                seen.add(key)
                cost += P.fill_cost(destination, key)
    return cost


@counting
def swap(source, destination, tables, rows, device, block_size, mapping):
    """Move the tables to ``destination`` (device code ``device``); the
    ``(source, destination)`` physical-id pairs go to ``mapping``. Shared
    blocks are not kept shared: each table takes its own destination blocks,
    re-shared only through content keys. Returns the number of pairs, or
    NO_BLOCKS before any change."""
    if swap_cost(destination, tables, rows, block_size) > P.num_free(destination):
        return NO_BLOCKS
    count = 0
    for row in rows:
        num_blocks = tables.num_blocks[row]
        old_ids = tables.blocks[row, :num_blocks].copy()
        release_all(P.arrays(source), arrays(tables), row, block_size)
        for index in range(num_blocks):
            key = tables.keys[row, index]
            if _is_full(tables, row, index, block_size) and key >= 0:
                new_id = P.fill_full(destination, key)
            else:
                new_id = P.take(destination)
            _set_block(tables, row, index, new_id)
            mapping[2 * count] = old_ids[index] - source.meta[P.FIRST_ID]
            mapping[2 * count + 1] = new_id - destination.meta[P.FIRST_ID]
            count += 1
        tables.device[row] = device
    return count


# -- the batched step -----------------------------------------------------------------
@counting
def can_append_batch(pool, tables, rows, num_tokens, group_ends, num_lookahead, block_size, result):
    """``result[g]``: do the sequences ``group_ends[g-1]:group_ends[g]`` fit?"""
    free = P.num_free(pool)
    num_filled = tables.num_filled  # read once: a handle field read per row costs more than the rule
    most = 0  # every sequence touches at most 1 + new tokens + lookahead blocks: no division needed
    for i in range(rows.shape[0]):
        most += 1 + max(0, num_tokens[i] - num_filled[rows[i]]) + num_lookahead
    if most <= free:
        result[:] = True
        return
    start = 0
    for g in range(group_ends.shape[0]):
        need = 0
        for i in range(start, group_ends[g]):
            need += touched(num_filled, rows[i], num_tokens[i], num_lookahead, block_size)
        result[g] = need <= free
        start = group_ends[g]


@counting
def batch_needs(tables, rows, seq_lens, num_lookahead, block_size, window, null_block, needs):
    """What a batch of appends (sequences now of ``seq_lens`` tokens) needs:
    ``needs[0]`` table columns, ``needs[1]`` content keys; returns a quick
    upper bound of the blocks it takes (``shared_bound`` is the tight one).
    Per row, at most ``a // bs + 1`` new blocks and ``a // bs + 2`` copies
    on write for ``a`` new tokens and lookahead slots; the sum of floors is
    at most the floor of the sum, so the loop needs no division (with a
    thousand rows, divisions cost more than the appends)."""
    num_filled = tables.num_filled
    num_rows = rows.shape[0]
    num_new, longest = 0, 0
    for i in range(num_rows):
        num_new += seq_lens[i] - num_filled[rows[i]]
        longest = max(longest, seq_lens[i])
    needs[0] = cdiv(longest + num_lookahead, block_size) if num_rows else 0
    needs[1] = num_new // block_size + 2 * num_rows
    null = 1 if window and null_block[0] < 0 else 0
    return 2 * ((num_new + num_rows * num_lookahead) // block_size) + 3 * num_rows + null


@counting
def shared_bound(pool, tables, rows, seq_lens, num_lookahead, block_size, window, null_block):
    """The bound of ``batch_needs`` counting only writes into blocks shared
    now: those are the copies on write (appends before them in the batch can
    only unshare a block, never share it)."""
    blocks, num_blocks, num_filled = tables.blocks, tables.num_blocks, tables.num_filled
    refcount, first_id = pool.refcount, pool.meta[P.FIRST_ID]
    bound = 1 if window and null_block[0] < 0 else 0
    for i in range(rows.shape[0]):
        row = rows[i]
        filled, num_new = num_filled[row], seq_lens[i] - num_filled[row]
        bound += blocks_to_add(num_blocks[row], filled, num_new + num_lookahead, block_size)
        first_index = filled // block_size
        for index in range(first_index, min(first_index + _num_writes(filled, num_new, block_size), num_blocks[row])):
            if refcount[blocks[row, index] - first_id] > 1:
                bound += 1
    return bound


@counting
def append_batch(
    pool,
    keys,
    tables,
    rows,
    tokens,
    token_starts,
    seq_lens,
    num_lookahead,
    num_drops,
    extras,
    window,
    null_block,
    cow,
    status,
):
    """``append`` for each sequence in order, each now of ``seq_lens[i]``
    tokens (rows are distinct). Stops at the first failure (``status[0]`` =
    code, ``status[1]`` = index); returns the CoW count."""
    num_cow = 0
    block_size, caching = keys.tokens.shape[1], pool.meta[P.CACHING]
    refcount, first_id = pool.refcount, pool.meta[P.FIRST_ID]
    blocks, num_blocks, num_filled = tables.blocks, tables.num_blocks, tables.num_filled
    for i in range(rows.shape[0]):
        row = rows[i]
        num_new = seq_lens[i] - num_filled[row]
        if not window and writes_in_place(
            refcount, first_id, blocks, num_blocks, num_filled, row, num_new, num_lookahead, block_size, caching
        ):
            num_filled[row] += num_new  # as ``append`` would, without entering it
            continue
        result = append(
            pool,
            keys,
            tables,
            row,
            tokens[token_starts[i] : token_starts[i + 1]],
            num_new,
            num_lookahead,
            num_drops[i],
            extras[i],
            window,
            null_block,
            cow,
            2 * num_cow,
        )
        if result < 0:
            status[0], status[1] = result, i
            return num_cow
        num_cow += result
    status[0] = 0
    return num_cow


@counting
def max_blocks(tables, rows):
    """The longest of the tables ``rows`` (0 for none)."""
    num_blocks = tables.num_blocks
    longest = 0
    for i in range(rows.shape[0]):
        longest = max(longest, num_blocks[rows[i]])
    return longest


@counting
def gather_tables(tables, rows, pad, out):
    """Row ``i`` of ``out``: the block ids of table ``rows[i]``, then ``pad``.
    (Plain loops over local names: a slice copy per row, or a handle field
    read per element, costs several times more.)"""
    blocks, num_blocks = tables.blocks, tables.num_blocks
    for i in range(rows.shape[0]):
        row = rows[i]
        count = num_blocks[row]
        for j in range(count):
            out[i, j] = blocks[row, j]
        for j in range(count, out.shape[1]):
            out[i, j] = pad


@counting
def gather_slots(tables, rows, num_step_tokens, block_size):
    """Slot ``block_id * bs + offset`` of the last ``num_step_tokens[i]``
    written tokens of each table, table by table; returns ``(slots, -1)``,
    or ``(empty, i)`` if count ``i`` is negative or above the tokens written."""
    blocks, num_filled = tables.blocks, tables.num_filled
    total = 0
    for i in range(rows.shape[0]):
        if not 0 <= num_step_tokens[i] <= num_filled[rows[i]]:
            return np.empty(0, np.int64), i
        total += num_step_tokens[i]
    slots = np.empty(total, np.int64)
    position = 0
    for i in range(rows.shape[0]):
        row = rows[i]
        end = num_filled[row]
        for token in range(end - num_step_tokens[i], end):
            slots[position] = blocks[row, token // block_size] * block_size + token % block_size
            position += 1
    return slots, -1
