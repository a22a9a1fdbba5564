"""The blocks of one device in arrays, and the kernels that take and release
them: the compiled twin of ``reference/allocator.py`` and ``evictor.py``.

Per block (indexed by physical id, ``block_id - first_id``): refcount, the
content key it is cached under (-1: uncached), computed flag, last access,
touched flag, and the evictor's run it is idle in. The uncached free blocks
form a ring-buffer deque used LIFO, as the reference's ``deque``: a released
block goes to the front and is handed out next.

Idle cached blocks are evicted in the reference's exact LRU order: oldest
time, then deepest, then smallest id. They sit in *runs*, doubly linked lists
each already in that order, and the runs in an indexed binary min-heap
ordered by their first block: a k-way merge, whose top run's first block is
the next to go, whatever the runs are. Why runs and not one heap of blocks: a
table's blocks go idle together, at one time, so a released table is one run
(its next block joins the run last made when it sorts at either end), and an
eviction takes the top run's next block with a compare or two, where a heap
of blocks sifts through its depth, cache miss after cache miss, for every
block (about a third of a prefix-cached replay's time, measured in
docs/measurements/2026-12-06-evictor-runs.md). A hit on an idle block unlinks
it from its run in O(1).

The per-block steps (``take_step``, ``fill_step``, ``release_step``,
``stamp_step`` and the evictor's) are inlined: a table's blocks are taken and
released by one borrowing kernel of ``fast/table.py`` on ``arrays(pool)``,
with no call and no reference count per block (``fast/borrowing.py``).
Kernels that take or release a block now and then call the steps' one
compiled copy each (``take``, ``fill_full``, ``release``).

A plain (non-caching) pool uses the same arrays and simply never caches a
block, so both modes share every kernel.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from blockspace.fast.borrowing import borrowing, counting

NEVER_ACCESSED = -1.0
BUCKET = 1000  # hit-rate bucket (spec §6.7)

# Slots of Pool.meta
FIRST_ID = 0
NUM_BLOCKS = 1
FREE_HEAD = 2  # ring-buffer index of the front of the free deque
NUM_FREE_IDS = 3  # uncached free blocks
NUM_IDLE = 4  # idle cached blocks (in the evictor)
NUM_TOUCHED = 5
CACHING = 6
HIT_BUCKETS = 7
HIT_QUERIES = 8  # in the running bucket
HIT_HITS = 9  # in the running bucket
NUM_RUNS = 10  # runs in the evictor's heap
NUM_FREE_RUNS = 11  # run ids on the free stack
LAST_RUN = 12  # the run the last idle block went to (-1: none), which the next may join
NUM_META = 13


class Pool(NamedTuple):
    refcount: np.ndarray  # int64[n]
    block_key: np.ndarray  # int64[n]: content key of a cached block, -1 uncached
    computed: np.ndarray  # bool[n]
    last_access: np.ndarray  # float64[n]
    touched: np.ndarray  # bool[n]: registered since the last mark_computed
    touched_ids: np.ndarray  # int64[n]: the touched blocks (absolute ids), a stack
    free_ids: np.ndarray  # int64[n]: ring buffer of absolute ids
    idle_run: np.ndarray  # int32[n]: the run an idle block is in, -1 when not idle
    run_next: np.ndarray  # int32[n]: the idle block evicted after this one in its run, -1 last
    run_prev: np.ndarray  # int32[n]: the one before, -1 first
    run_head: np.ndarray  # int32[n]: per run id, its first block (physical), -1 when unused
    run_tail: np.ndarray  # int32[n]: per run id, its last block
    run_pos: np.ndarray  # int32[n]: per run id, its index in heap
    free_runs: np.ndarray  # int32[n]: the unused run ids, a stack
    heap: np.ndarray  # int32[n]: run ids, a min-heap by their first blocks (the evictor's arrays are int32: a
    # replica's pools are most of what it holds idle, and a fleet holds many; a pool has far fewer than 2**31 blocks)
    idle_time: np.ndarray  # float64[n]: eviction time of an idle block
    idle_depth: np.ndarray  # int64[n]: tokens up to the end of an idle block
    key_block: np.ndarray  # int32[key capacity]: content key -> absolute id cached here, -1 (int32: a key index
    # may cover a trace's every prompt block, fast/content.py's ids left to the caller)
    meta: np.ndarray  # int64[NUM_META]
    hit_mean: np.ndarray  # float64[1]: mean hit rate of the completed buckets


def new_pool(first_id: int, num_blocks: int, caching: bool, key_capacity: int) -> Pool:
    size = max(num_blocks, 1)  # a CPU pool may be empty; keep the ring buffer's modulus positive
    meta = np.zeros(NUM_META, np.int64)
    meta[FIRST_ID], meta[NUM_BLOCKS], meta[NUM_FREE_IDS], meta[CACHING] = first_id, num_blocks, num_blocks, caching
    meta[NUM_FREE_RUNS], meta[LAST_RUN] = size, -1
    free_ids = np.zeros(size, np.int64)
    free_ids[:num_blocks] = np.arange(first_id, first_id + num_blocks)
    return Pool(
        np.zeros(size, np.int64),
        np.full(size, -1, np.int64),
        np.zeros(size, np.bool_),
        np.full(size, NEVER_ACCESSED),
        np.zeros(size, np.bool_),
        np.zeros(size, np.int64),
        free_ids,
        np.full(size, -1, np.int32),
        np.full(size, -1, np.int32),
        np.full(size, -1, np.int32),
        np.full(size, -1, np.int32),
        np.full(size, -1, np.int32),
        np.zeros(size, np.int32),
        np.arange(size, dtype=np.int32),
        np.zeros(size, np.int32),
        np.full(size, NEVER_ACCESSED),
        np.zeros(size, np.int64),
        np.full(key_capacity, -1, np.int32),
        meta,
        np.zeros(1),
    )


@njit(cache=True, inline="always")
def arrays(pool):
    """The pool's arrays as a ``Pool``, from a handle or a ``Pool``: what a
    borrowing kernel takes (``fast/borrowing.py``), since it cannot read a
    handle's fields."""
    return Pool(
        pool.refcount, pool.block_key, pool.computed, pool.last_access, pool.touched, pool.touched_ids,
        pool.free_ids, pool.idle_run, pool.run_next, pool.run_prev, pool.run_head, pool.run_tail, pool.run_pos,
        pool.free_runs, pool.heap, pool.idle_time, pool.idle_depth, pool.key_block, pool.meta, pool.hit_mean,
    )  # fmt: skip


def grow_key_index(pool: Pool, key_capacity: int) -> Pool:
    key_block = np.full(key_capacity, -1, np.int32)
    key_block[: len(pool.key_block)] = pool.key_block
    return pool._replace(key_block=key_block)


# -- counts ------------------------------------------------------------------
@counting
def num_free(pool):
    """Uncached free blocks plus idle cached ones (both can be handed out)."""
    return pool.meta[NUM_FREE_IDS] + pool.meta[NUM_IDLE]


@counting
def refs(pool, block_id):
    return pool.refcount[block_id - pool.meta[FIRST_ID]]


@njit(cache=True, inline="always")
def owns(pool, block_id):
    return pool.meta[FIRST_ID] <= block_id < pool.meta[FIRST_ID] + pool.meta[NUM_BLOCKS]


# -- the free deque --------------------------------------------------------------
@njit(cache=True, inline="always")
def _pop_free(pool):
    head = pool.meta[FREE_HEAD]
    block_id = pool.free_ids[head]
    pool.meta[FREE_HEAD] = (head + 1) % pool.free_ids.shape[0]
    pool.meta[NUM_FREE_IDS] -= 1
    return block_id


@njit(cache=True, inline="always")
def _push_free_front(pool, block_id):
    head = (pool.meta[FREE_HEAD] - 1) % pool.free_ids.shape[0]
    pool.free_ids[head] = block_id
    pool.meta[FREE_HEAD] = head
    pool.meta[NUM_FREE_IDS] += 1


# -- the evictor: sorted runs of idle blocks, merged by a min-heap of runs ----------
# The sifts take the heap's arrays once and loop on them: every read of a
# field of a handle costs a reference count up and down (two atomic
# operations), and a sift reads a dozen fields per level.
@counting
def _before(pool, a, b):
    """Is idle block ``a`` evicted before ``b``? Oldest time, then deepest, then smallest id."""
    return _earlier(pool.idle_time, pool.idle_depth, a, b)


@njit(cache=True, inline="always")
def _earlier(idle_time, idle_depth, a, b):
    if idle_time[a] != idle_time[b]:
        return idle_time[a] < idle_time[b]
    if idle_depth[a] != idle_depth[b]:
        return idle_depth[a] > idle_depth[b]
    return a < b


@njit(cache=True, inline="always")
def _heap_arrays(pool):
    return pool.heap, pool.run_pos, pool.run_head, pool.idle_time, pool.idle_depth


@njit(cache=True, inline="always")
def _sift_up(pool, index):
    heap, run_pos, run_head, idle_time, idle_depth = _heap_arrays(pool)
    run = heap[index]
    first = run_head[run]
    while index > 0:
        parent = (index - 1) // 2
        if not _earlier(idle_time, idle_depth, first, run_head[heap[parent]]):
            break
        heap[index] = heap[parent]
        run_pos[heap[index]] = index
        index = parent
    heap[index] = run
    run_pos[run] = index


@njit(cache=True, inline="always")
def _sift_down(pool, index):
    heap, run_pos, run_head, idle_time, idle_depth = _heap_arrays(pool)
    size = pool.meta[NUM_RUNS]
    run = heap[index]
    first = run_head[run]
    while True:
        child = 2 * index + 1
        if child >= size:
            break
        if child + 1 < size and _earlier(idle_time, idle_depth, run_head[heap[child + 1]], run_head[heap[child]]):
            child += 1
        if not _earlier(idle_time, idle_depth, run_head[heap[child]], first):
            break
        heap[index] = heap[child]
        run_pos[heap[index]] = index
        index = child
    heap[index] = run
    run_pos[run] = index


@njit(cache=True, inline="always")
def _new_run(pool, physical):
    """A run of one block, put last in the heap; the caller sifts it up from
    the index returned."""
    meta = pool.meta
    meta[NUM_FREE_RUNS] -= 1
    run = pool.free_runs[meta[NUM_FREE_RUNS]]
    pool.run_head[run] = physical
    pool.run_tail[run] = physical
    pool.run_next[physical] = -1
    pool.run_prev[physical] = -1
    pool.idle_run[physical] = run
    index = meta[NUM_RUNS]
    meta[NUM_RUNS] = index + 1
    pool.heap[index] = run
    pool.run_pos[run] = index
    meta[LAST_RUN] = run
    return index


@njit(cache=True, inline="always")
def _evictor_add(pool, physical, depth, time):
    """The block goes idle: at an end of the last run if it sorts there, else
    in a run of its own. The front is tried first: a table releases its
    blocks first to last, each deeper, so each goes before the one before."""
    pool.idle_time[physical] = time
    pool.idle_depth[physical] = depth
    pool.meta[NUM_IDLE] += 1
    run = pool.meta[LAST_RUN]
    if run >= 0 and _earlier(pool.idle_time, pool.idle_depth, physical, pool.run_head[run]):
        head = pool.run_head[run]  # first of the run: its key falls
        pool.run_prev[head] = physical
        pool.run_next[physical] = head
        pool.run_prev[physical] = -1
        pool.run_head[run] = physical
        pool.idle_run[physical] = run
        index = pool.run_pos[run]
    elif run >= 0 and _earlier(pool.idle_time, pool.idle_depth, pool.run_tail[run], physical):
        tail = pool.run_tail[run]  # last of the run: its heap key stays
        pool.run_next[tail] = physical
        pool.run_prev[physical] = tail
        pool.run_next[physical] = -1
        pool.run_tail[run] = physical
        pool.idle_run[physical] = run
        return
    else:
        index = _new_run(pool, physical)
    _sift_up(pool, index)  # one call site: each inlined copy costs the cold compile


@borrowing
def _evictor_remove(pool, physical):
    """The block leaves its run (evicted, hit, or forgotten by ``reset``); an
    emptied run leaves the heap. One compiled copy, called on ``arrays(pool)``:
    each inlined copy cost the cold compile seconds."""
    meta = pool.meta
    run = pool.idle_run[physical]
    pool.idle_run[physical] = -1
    meta[NUM_IDLE] -= 1
    before, after = pool.run_prev[physical], pool.run_next[physical]
    if before >= 0:
        pool.run_next[before] = after
    else:
        pool.run_head[run] = after
    if after >= 0:
        pool.run_prev[after] = before
    else:
        pool.run_tail[run] = before
    if after < 0 and before < 0:  # the run is empty
        index, last = pool.run_pos[run], meta[NUM_RUNS] - 1
        meta[NUM_RUNS] = last
        down = -1
        if index != last:
            moved = pool.heap[last]
            pool.heap[index] = moved
            pool.run_pos[moved] = index
            _sift_up(pool, index)
            down = pool.run_pos[moved]
        pool.free_runs[meta[NUM_FREE_RUNS]] = run
        meta[NUM_FREE_RUNS] += 1
        if meta[LAST_RUN] == run:
            meta[LAST_RUN] = -1
    else:
        down = pool.run_pos[run] if before < 0 else -1  # its first block went: the run's key rose
    if down >= 0:
        _sift_down(pool, down)  # one call site


@njit(cache=True, inline="always")
def _next_evicted(pool):
    """The idle block evicted next: the first of the top run."""
    return pool.run_head[pool.heap[0]]


# -- the content cache -----------------------------------------------------------
@njit(cache=True, inline="always")
def _activate(pool, physical, computed):
    pool.computed[physical] = computed
    pool.last_access[physical] = NEVER_ACCESSED


@njit(cache=True, inline="always")
def _register(pool, key, block_id):
    physical = block_id - pool.meta[FIRST_ID]
    pool.key_block[key] = block_id
    pool.block_key[physical] = key
    if not pool.touched[physical]:
        pool.touched[physical] = True
        pool.touched_ids[pool.meta[NUM_TOUCHED]] = block_id
        pool.meta[NUM_TOUCHED] += 1


@njit(cache=True, inline="always")
def _forget(pool, physical):
    pool.key_block[pool.block_key[physical]] = -1
    pool.block_key[physical] = -1


@counting
def is_in_use_cached(pool, key):
    if key < 0:
        return False
    block_id = pool.key_block[key]
    return block_id >= 0 and refs(pool, block_id) > 0


@counting
def is_cached_and_computed(pool, key):
    """Cached, and computed: an in-use block by its flag, an idle one always."""
    return cached_and_computed(pool.key_block, pool.refcount, pool.computed, pool.idle_run, pool.meta[FIRST_ID], key)


@counting
def cached_and_computed(key_block, refcount, computed, idle_run, first_id, key):
    """``is_cached_and_computed`` on the pool's arrays (for a search that asks many times)."""
    block_id = key_block[key]
    if block_id < 0:
        return False
    physical = block_id - first_id
    if refcount[physical] > 0:
        return computed[physical]
    return idle_run[physical] >= 0


@counting
def fill_cost(pool, key):
    """Free blocks ``fill_full(key)`` consumes (0 on a hit of an in-use block)."""
    if pool.meta[CACHING] and is_in_use_cached(pool, key):
        return 0
    return 1


@counting
def promote_gain(pool, key):
    if pool.meta[CACHING] and is_in_use_cached(pool, key):
        return 1
    return 0


@njit(cache=True, inline="always")
def _query(pool, hit):
    """One cache lookup for the hit rate, in vLLM's bucketed arithmetic."""
    meta = pool.meta
    meta[HIT_QUERIES] += 1
    if hit:
        meta[HIT_HITS] += 1
    if meta[HIT_QUERIES] == BUCKET:
        rate = meta[HIT_HITS] / meta[HIT_QUERIES]
        pool.hit_mean[0] = (pool.hit_mean[0] * meta[HIT_BUCKETS] + rate) / (meta[HIT_BUCKETS] + 1)
        meta[HIT_QUERIES] = 0
        meta[HIT_HITS] = 0
        meta[HIT_BUCKETS] += 1


@counting
def hit_rate(pool):
    if not pool.meta[CACHING]:
        return -1.0
    num_buckets, num_queries, num_hits = pool.meta[HIT_BUCKETS], pool.meta[HIT_QUERIES], pool.meta[HIT_HITS]
    fraction = num_queries / BUCKET
    total = num_buckets + fraction
    if total == 0:
        return 0.0
    done = pool.hit_mean[0] * num_buckets if num_buckets > 0 else 0.0
    running = (num_hits / num_queries) * fraction if num_queries > 0 else 0.0
    return (done + running) / total


# -- taking and releasing (the caller has checked that a block is there) --------------
@njit(cache=True, inline="always")
def take_step(pool):
    """A block for new, unkeyed content: uncached free first, then the LRU idle one."""
    if pool.meta[NUM_FREE_IDS] > 0:
        block_id = _pop_free(pool)
        physical = block_id - pool.meta[FIRST_ID]
    else:
        physical = _next_evicted(pool)
        _evictor_remove(arrays(pool), physical)
        _forget(pool, physical)
        block_id = physical + pool.meta[FIRST_ID]
    pool.refcount[physical] = 1
    _activate(pool, physical, False)
    return block_id


@njit(cache=True, inline="always")
def _adopt(pool, block_id):
    """Share a cached block found by content; revive it if it was idle."""
    physical = block_id - pool.meta[FIRST_ID]
    pool.refcount[physical] += 1
    if pool.refcount[physical] == 1:
        _evictor_remove(arrays(pool), physical)
        _activate(pool, physical, True)


@njit(cache=True, inline="always")
def fill_step(pool, key):
    """A block for a full block of content (prompt allocation, swap), or,
    for ``key`` -1, for new unkeyed content (``take_step``, not counted as a
    lookup). One call site of ``take_step`` and ``_adopt``: each inlined copy
    costs the cold compile seconds."""
    caching = pool.meta[CACHING] and key >= 0
    if caching:
        cached_id = pool.key_block[key]
        _query(pool, cached_id >= 0)
        if cached_id >= 0:
            _adopt(pool, cached_id)
            return cached_id
    block_id = take_step(pool)
    if caching:
        _register(pool, key, block_id)
    return block_id


@counting
def share(pool, block_id):
    pool.refcount[block_id - pool.meta[FIRST_ID]] += 1


@njit(cache=True, inline="always")
def release_step(pool, block_id, key, depth):
    """One table entry stops pointing at the block: a keyed block goes idle
    (caching), anything else to the front of the free deque."""
    physical = block_id - pool.meta[FIRST_ID]
    pool.refcount[physical] -= 1
    if pool.refcount[physical] == 0:
        if key < 0 or not pool.meta[CACHING]:
            _push_free_front(pool, block_id)
        else:
            _evictor_add(pool, physical, depth, pool.last_access[physical])
        if pool.meta[CACHING]:
            _activate(pool, physical, False)


# One compiled copy each of the steps, for the kernels that take or release a
# block now and then (append, swap): inlining the steps there too made the
# cold compile half again as long (measured), for no gain.
@counting
def take(pool):
    return take_step(pool)


@counting
def fill_full(pool, key):
    return fill_step(pool, key)


@counting
def release(pool, block_id, key, depth):
    release_step(pool, block_id, key, depth)


@counting
def copy_on_write(pool, block_id):
    pool.refcount[block_id - pool.meta[FIRST_ID]] -= 1
    return take(pool)


@counting
def promote(pool, block_id, key):
    """A block just became full: register it, or give it back and share the
    cached copy of the same content."""
    if not pool.meta[CACHING]:
        return block_id
    cached_id = pool.key_block[key]
    if cached_id < 0:
        _register(pool, key, block_id)
        return block_id
    release(pool, block_id, -1, 0)
    _adopt(pool, cached_id)
    return cached_id


@njit(cache=True, inline="always")
def stamp_step(pool, block_id, time):
    if pool.meta[CACHING]:
        pool.last_access[block_id - pool.meta[FIRST_ID]] = time


@counting
def mark_computed(pool):
    for i in range(pool.meta[NUM_TOUCHED]):
        physical = pool.touched_ids[i] - pool.meta[FIRST_ID]
        pool.computed[physical] = True
        pool.touched[physical] = False
    pool.meta[NUM_TOUCHED] = 0


@counting
def reset(pool):
    """Forget every idle cached block, if no block is in use (spec §6.8)."""
    if not pool.meta[CACHING]:
        return True
    if pool.meta[NUM_BLOCKS] - num_free(pool) > 0:
        return False
    while pool.meta[NUM_IDLE] > 0:
        physical = _next_evicted(pool)
        _evictor_remove(arrays(pool), physical)
        _forget(pool, physical)
        _push_free_front(pool, physical + pool.meta[FIRST_ID])
    for physical in range(pool.meta[NUM_BLOCKS]):
        pool.computed[physical] = False
        pool.last_access[physical] = NEVER_ACCESSED
    pool.meta[HIT_BUCKETS] = 0
    pool.meta[HIT_QUERIES] = 0
    pool.meta[HIT_HITS] = 0
    pool.hit_mean[0] = 0.0
    return True
