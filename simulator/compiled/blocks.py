"""The block manager's calls, as the compiled engine makes them: fast's
kernels called straight from compiled code, on fast's own arrays.

Each function is one ``BlockSpaceManager`` call of one request (a group of
one sequence), doing what ``FastBlockSpaceManager``'s Python layer does
around its kernel: the same kernel, the same arguments, in the same order
(``fast/allocations.py``, ``fast/appends.py``, ``fast/swaps.py``,
``fast/tracker_rows.py``). What that layer keeps in dictionaries (which row
holds which sequence, the access times, which sequences the tracker holds)
is kept per request in ``Requests``.

What is fast's, called from both: every kernel, and the stamp of a freed
table's blocks with the sequence's last access (``T.free`` takes the time,
as fast's manager passes it). What stays here, and why:

- The count of a row with nothing new to key (``count_known``: the last
  count while frozen, else fast's search, ``K.count_cached``), the last
  lines of ``K._key_and_count``. Shared through one more compiled function
  (``K.recount``), fast inside vLLM's Scheduler measured 3 to 8 % slower with
  caching on, in turns (docs/measurements/2026-12-06-house-and-clock-speed.md).

- Parking a tracker row. fast's layer parks a dropped row with a copy of
  the tokens it was keyed from and takes it back only if the next query
  brings the same tokens, since a caller's sequence may change; it keeps
  the last 64. Here a request's tokens are a function of the request
  (``tokens.py``), so its row is simply kept while untracked (``untrack``)
  and freed with the request (``forget``): its keys are those a fresh
  keying would make, since a key names content and tokens only grow.
- The row stacks (``take_row``, ``give_row``): fast's layer keeps its free
  rows in Python lists; here they are arrays the driver grows.
- The keys of a prompt's full blocks (``key_blocks``): the trace's own,
  made before the replay (``trace_keys.py``), where fast's layer keys
  tokens in its key table; the blocks past the prompt go to that table, by
  fast's own ``key_chain``, as fast's layer keys them. The key table leaves
  the trace's ids to this engine (``fast/content.py``).
- The router's probe (``probe_cached_tokens``): it keys a prompt by the
  trace's keys, which the manager must not know.

The twins tests hold all of it to fast's layer: every step's decisions and
block-table digest, and the manager's final snapshot, against the Python
engine driving ``FastBlockSpaceManager`` (``tests/test_compiled_engine.py``,
``tests/test_simulator_random.py``).

Why no room checks: the driver (``engine.py``) makes room for everything a
step can need before the step (``loop.room_for_step``), so a kernel never
answers NO_ROOM or NO_KEY_ROOM here; any other negative answer is recorded
in ``meta[ERROR]`` and stops the loop.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from blockspace.fast import content as C
from blockspace.fast import pool as P
from blockspace.fast import rules
from blockspace.fast import table as T
from blockspace.fast import tracker as K
from blockspace.fast.borrowing import counting
from blockspace.simulator.compiled import trace_keys as TK
from blockspace.simulator.compiled.state import (
    BLOCK_SIZE,
    CACHING,
    ERROR,
    FREE_TABLE_ROWS,
    FREE_TRACKER_ROWS,
    NUM_CPU,
    NUM_GPU,
    WATERMARK,
)
from blockspace.simulator.compiled.tokens import write_tokens

NO_ROWS = np.zeros(0, np.int64)


class Fast(NamedTuple):
    """fast's state, as its kernels take it (``fast/store.py``)."""

    gpu: object
    cpu: object
    keys: object
    tables: object
    tracker: object
    null_block: np.ndarray


class Views(NamedTuple):
    """The arrays of fast's state that every step reads per request, taken
    from the handles once per call of the loop. Why: each read of a field
    of a handle counts a reference up and down (two atomic operations),
    which costs more than what the usual decode does with it; and the arrays
    stay the same objects for the whole call (only the driver grows them,
    between calls)."""

    gpu_meta: np.ndarray
    refcount: np.ndarray
    key_block: np.ndarray
    computed: np.ndarray
    idle_run: np.ndarray
    blocks: np.ndarray
    num_blocks: np.ndarray
    num_filled: np.ndarray
    tracker_keys: np.ndarray
    num_keys: np.ndarray
    num_cached: np.ndarray


@counting
def views_of(fast):
    gpu, tables, tracker = fast.gpu, fast.tables, fast.tracker
    return Views(
        gpu.meta, gpu.refcount, gpu.key_block, gpu.computed, gpu.idle_run, tables.blocks, tables.num_blocks,
        tables.num_filled, tracker.keys, tracker.num_keys, tracker.num_cached,
    )  # fmt: skip


@njit(cache=True, inline="always")
def fail(loop, code):
    """Remember the first unexpected kernel answer."""
    if loop.meta[ERROR] == 0:
        loop.meta[ERROR] = code


@njit(cache=True, inline="always")
def take_row(stack, meta, count):
    """A row off a free stack (``meta[count]`` rows on it; the driver keeps it from running out)."""
    meta[count] -= 1
    return stack[meta[count]]


@njit(cache=True, inline="always")
def give_row(stack, meta, count, row):
    """A row back on a free stack."""
    stack[meta[count]] = row
    meta[count] += 1


@njit(cache=True, inline="always")
def num_free_gpu(views):
    """Free GPU blocks, uncached plus idle cached (``P.num_free``)."""
    return views.gpu_meta[P.NUM_FREE_IDS] + views.gpu_meta[P.NUM_IDLE]


# -- the computed-blocks tracker ---------------------------------------------------
@njit(cache=True, inline="always")
def num_cached_tokens(fast, views, loop, requests, r):
    """``get_num_cached_tokens``: key the new full blocks (``key_blocks``),
    then count the cached tokens (the last count, while the tracker holds a
    prefill), on the views, by the tracker kernel's own search (``count_known``)."""
    block_size = loop.config[BLOCK_SIZE]
    frozen = requests.tracked[r] == 1 and requests.decoding[r] == 0
    row = requests.tracker_row[r]
    if row < 0:
        row = take_row(loop.free_tracker_rows, loop.meta, FREE_TRACKER_ROWS)
        K.open_row(fast.tracker, row)
        requests.tracker_row[r] = row
    requests.tracked[r] = 1
    known = views.num_keys[row]
    num_full = requests.seq_len[r] // block_size
    if num_full > known:
        if not key_blocks(fast, loop, requests, r, views.tracker_keys[row], known, num_full):
            return 0
        views.num_keys[row] = num_full
    return count_known(views, row, frozen, block_size)


@counting
def key_blocks(fast, loop, requests, r, out, first, last):
    """The keys of request ``r``'s full blocks ``first .. last - 1`` into
    ``out``: a full prompt block's is the trace's (``trace_keys.py``, no
    tokens made), a later block's fast's key table gives, from its tokens
    (``C.key_chain``, as fast's kernels key). False, and the loop stops, if
    the table lacks room (the driver makes it before the step). Called, not
    inlined: three places key, and a copy in each cost the cold compile a
    fifth more time (measured), where a call costs nothing beside the keying."""
    block_size = loop.config[BLOCK_SIZE]
    split = min(last, requests.prompt_len[r] // block_size)
    chunk_lo, node_key, nodes = requests.chunk_lo[r], loop.node_key, loop.nodes  # read once, not a block at a time
    for index in range(first, split):
        out[index] = TK.block_key(node_key, nodes, chunk_lo, index, block_size)
    start = max(first, split)
    if start < last:
        if not C.has_room(fast.keys, last - start):
            fail(loop, T.NO_KEY_ROOM)
            return False
        tokens = write_tokens(requests, loop.chunks, r, start * block_size, last * block_size, loop.tokens)
        C.key_chain(fast.keys, -1, tokens, 0, out, start, last)
    return True


@njit(cache=True, inline="always")
def count_known(views, row, frozen, block_size):
    """``num_cached_tokens`` of a tracker row with nothing new to key: its
    last count while frozen, else the tracker kernel's own search
    (``K.count_cached``), on the views, as ``K._key_and_count`` ends."""
    if frozen:
        return views.num_cached[row]
    count = block_size * K.count_cached(
        views.tracker_keys[row], views.num_keys[row], views.num_keys[row], views.key_block, views.refcount,
        views.computed, views.idle_run, views.gpu_meta[P.FIRST_ID],
    )  # fmt: skip
    views.num_cached[row] = count
    return count


@njit(cache=True, inline="always")
def untrack(requests, r):
    """``remove_seq_from_computed_blocks_tracker``: its row is parked."""
    requests.tracked[r] = 0


@njit(cache=True, inline="always")
def forget(loop, requests, r):
    """The request's tracker row, parked or not, is free again."""
    row = requests.tracker_row[r]
    if row >= 0:
        give_row(loop.free_tracker_rows, loop.meta, FREE_TRACKER_ROWS, row)
        requests.tracker_row[r] = -1
    requests.tracked[r] = 0


# -- admission and release --------------------------------------------------------------
@njit(cache=True, inline="always")
def can_allocate(views, loop, requests, r):
    need = rules.blocks_for_prompt(requests.seq_len[r], 0, 0, loop.config[BLOCK_SIZE], None)  # fast's rule
    return rules.alloc_status(loop.config[NUM_GPU], num_free_gpu(views), need, loop.config[WATERMARK])


@njit(cache=True, inline="always")
def allocate(fast, views, loop, requests, r):
    """A table for the request's tokens. With caching, the tracker keyed
    those very tokens a moment ago (the admission loop counts them first):
    the kernel takes its keys and never reads the token ids, only their number."""
    block_size, seq_len = loop.config[BLOCK_SIZE], requests.seq_len[r]
    num_full = seq_len // block_size
    keyed = NO_ROWS
    tracker_row = requests.tracker_row[r]
    if loop.config[CACHING]:
        if tracker_row >= 0 and views.num_keys[tracker_row] >= num_full:
            keyed = views.tracker_keys[tracker_row, :num_full]
        else:
            keyed = loop.keyed[:num_full]
            if not key_blocks(fast, loop, requests, r, keyed, 0, num_full):
                return
    tokens = loop.tokens[:seq_len]  # only their number is read: the blocks come keyed
    row = take_row(loop.free_table_rows, loop.meta, FREE_TABLE_ROWS)
    result = T.allocate(fast.gpu, fast.keys, fast.tables, row, tokens, 0, -1, keyed, NO_ROWS, -1, NO_ROWS, 0, loop.info)
    if result != 0:
        fail(loop, result)
    requests.table_row[r] = row
    requests.accessed[r] = 0


@njit(cache=True, inline="always")
def free(fast, loop, requests, r):
    """Release the request's blocks, stamped with its last access time."""
    row = requests.table_row[r]
    if row < 0:
        return
    forget(loop, requests, r)
    T.free(fast.gpu, fast.cpu, fast.tables, row, loop.config[BLOCK_SIZE], requests.accessed[r] == 1,
           requests.access_time[r])  # fmt: skip
    give_row(loop.free_table_rows, loop.meta, FREE_TABLE_ROWS, row)
    requests.table_row[r] = -1
    requests.accessed[r] = 0


# -- appending -------------------------------------------------------------------------
@njit(cache=True, inline="always")
def can_append(views, loop, requests, r):
    """``can_append_slots``: the blocks its new tokens touch are free."""
    filled = views.num_filled[requests.table_row[r]]
    unseen = max(0, requests.seq_len[r] - filled)
    return rules.blocks_touched(filled, unseen, 0, loop.config[BLOCK_SIZE]) <= num_free_gpu(views)


@njit(cache=True, inline="always")
def append(fast, views, loop, requests, r, copies, start):
    """``append_slots``: the copy-on-write pairs go to ``copies[start:]``;
    returns their number. A step that only counts tokens into the table's
    own last block is done here, on the views, after the kernel's own test
    for it (as ``fast/appends.py`` does); everything else goes to the kernel."""
    block_size, row, seq_len = loop.config[BLOCK_SIZE], requests.table_row[r], requests.seq_len[r]
    filled = views.num_filled[row]
    if T.writes_in_place(
        views.refcount, views.gpu_meta[P.FIRST_ID], views.blocks, views.num_blocks, views.num_filled, row,
        seq_len - filled, 0, block_size, loop.config[CACHING],
    ):  # fmt: skip
        views.num_filled[row] = seq_len
        return 0
    first = filled - filled % block_size
    tokens = NO_ROWS
    if loop.config[CACHING] and seq_len - first >= block_size:  # a block fills up: key it
        tokens = write_tokens(requests, loop.chunks, r, first, seq_len, loop.tokens)
    count = T.append(
        fast.gpu, fast.keys, fast.tables, row, tokens, seq_len - filled, 0, 0, 0, False, fast.null_block, copies, start
    )
    if count < 0:
        fail(loop, count)
        return 0
    return count


# -- swapping --------------------------------------------------------------------------
@njit(cache=True, inline="always")
def swap_status(fast, loop, requests, r, to_gpu):
    """``can_swap_in`` (to the GPU) or ``can_swap_out``, as an AllocStatus value."""
    loop.one_row[0] = requests.table_row[r]
    loop.one_len[0] = requests.seq_len[r]
    destination = fast.gpu if to_gpu else fast.cpu
    need = T.swap_need(destination, fast.tables, loop.one_row, loop.one_len, 0, loop.config[BLOCK_SIZE])
    num_total = loop.config[NUM_GPU] if to_gpu else loop.config[NUM_CPU]
    watermark = loop.config[WATERMARK] if to_gpu else 0
    return rules.swap_status(num_total, P.num_free(destination), need, watermark)


@njit(cache=True, inline="always")
def swap(fast, views, loop, requests, r, to_gpu, mapping, start):
    """``swap_in`` or ``swap_out``: the (source, destination) pairs go to
    ``mapping[start:]``; their number, or -1 if the blocks did not fit."""
    row = requests.table_row[r]
    if views.num_blocks[row] == 0:
        return 0
    loop.one_row[0] = row
    if to_gpu:
        count = T.swap(fast.cpu, fast.gpu, fast.tables, loop.one_row, T.GPU, loop.config[BLOCK_SIZE], mapping[start:])
    else:
        count = T.swap(fast.gpu, fast.cpu, fast.tables, loop.one_row, T.CPU, loop.config[BLOCK_SIZE], mapping[start:])
    return -1 if count == T.NO_BLOCKS else count


# -- the metadata pass -----------------------------------------------------------------------
@njit(cache=True, inline="always")
def touch(fast, views, loop, requests, r, now):
    """``access_all_blocks_in_seq`` and ``get_common_computed_block_ids`` of
    a scheduled request (the block table is read where it is recorded)."""
    if loop.config[CACHING]:
        requests.access_time[r] = now
        requests.accessed[r] = 1
        num_cached_tokens(fast, views, loop, requests, r)


@njit(cache=True, inline="always")
def mark_computed(fast, views, loop):
    """``mark_blocks_as_computed``: every block registered since the last call."""
    if loop.config[CACHING] and views.gpu_meta[P.NUM_TOUCHED]:
        P.mark_computed(fast.gpu)


@njit(cache=True, inline="always")
def hit_rate(fast, loop):
    return P.hit_rate(fast.gpu) if loop.config[CACHING] else 0.0


# -- what a fleet's router asks ----------------------------------------------------------------
@counting
def probe_cached_tokens(gpu, node_key, nodes, chunk_lo, prompt_len, block_size, out):
    """``get_num_cached_tokens`` of a prompt on a sequence the tracker does
    not hold, then ``remove_seq_from_computed_blocks_tracker``, as the
    Python engine's router asks them (``Simulation.cached_tokens``), without
    their side effects: vLLM's search runs over the prompt's full blocks,
    keyed by the trace (``trace_keys.py``), as over a fresh row. A block of
    a node this replica never numbered was never keyed here, and is not
    cached. No block is touched and no hit counted. ``out``: scratch, a key
    per full block."""
    num_full = prompt_len // block_size
    num_known = 0
    while num_known < num_full and node_key.shape[0]:
        out[num_known] = TK.block_key(node_key, nodes, chunk_lo, num_known, block_size)
        if out[num_known] < 0:
            break
        num_known += 1
    return block_size * K.count_cached(
        out, num_full, num_known, gpu.key_block, gpu.refcount, gpu.computed, gpu.idle_run, gpu.meta[P.FIRST_ID]
    )
