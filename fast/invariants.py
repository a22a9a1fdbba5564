"""``check_invariants()`` and ``snapshot()`` of the fast manager, read from
its arrays (plain NumPy: they are for tests and debugging, not the hot path)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from blockspace.errors import InvariantError
from blockspace.fast import pool as P
from blockspace.fast import table as T

if TYPE_CHECKING:
    from blockspace.fast.manager import FastBlockSpaceManager


def _fail(what: str) -> None:
    raise InvariantError(what)


def free_list(pool: P.Pool) -> list[int]:
    """The uncached free blocks, front of the deque first."""
    ring = pool.free_ids.tolist()
    head, count = int(pool.meta[P.FREE_HEAD]), int(pool.meta[P.NUM_FREE_IDS])
    return ring[head : head + count] + ring[: max(0, head + count - len(ring))]


def evictable(pool: P.Pool) -> list[int]:
    """The idle cached blocks in eviction order (oldest, deepest, smallest id)."""
    if pool.meta[P.NUM_IDLE] == 0:
        return []
    idle = np.flatnonzero(pool.idle_run[: pool.meta[P.NUM_BLOCKS]] >= 0)
    order = np.lexsort((idle, -pool.idle_depth[idle], pool.idle_time[idle]))
    return (idle[order] + pool.meta[P.FIRST_ID]).tolist()


def _blocks(pool: P.Pool, caching: bool) -> list[tuple[int, bool, bool, float]]:
    n = int(pool.meta[P.NUM_BLOCKS])
    refcount = pool.refcount[:n].tolist()
    if not caching:
        return [(ref, False, False, P.NEVER_ACCESSED) for ref in refcount]
    columns = (pool.idle_run, pool.idle_time, pool.last_access, pool.block_key, pool.computed)
    return [
        (ref, key >= 0, computed, idle_time if idle_run >= 0 else last_access)  # an idle block's time is its idle time
        for ref, idle_run, idle_time, last_access, key, computed in zip(
            refcount, *(column[:n].tolist() for column in columns)
        )
    ]


def _hit_stats(meta: Any, hit_mean: Any) -> tuple[int, float, int, int]:
    return (meta[P.HIT_BUCKETS], hit_mean[0], meta[P.HIT_QUERIES], meta[P.HIT_HITS])


def snapshot(m: FastBlockSpaceManager) -> dict[str, Any]:
    """The observable state in the form of ``blockspace.snapshot``. Single
    cells are read through the store's memoryviews (plain Python numbers,
    a fraction of a NumPy scalar's cost): the conformance explorer takes a
    snapshot after every move."""
    store, rows = m.store, m.rows
    view = store.tables_view
    null = store.null_block.item(0)
    pools = {"GPU": store.gpu, "CPU": store.cpu}
    metas = {"GPU": store.gpu_view, "CPU": store.cpu_view}
    times = rows.access_times
    return {
        "tables": {
            seq_id: {
                "blocks": list(rows.ids(row)),
                "num_tokens": view.num_filled[row],
                "device": "GPU" if view.device[row] == T.GPU else "CPU",
                "last_access": _time(times.get(seq_id)),
            }
            for seq_id, row in rows.of_seq.items()
        },
        "cross_tables": {request_id: list(rows.ids(row)) for request_id, row in rows.of_cross.items()},
        "blocks": _blocks(store.gpu, m.enable_caching) + _blocks(store.cpu, m.enable_caching),
        "free": {name: free_list(pool) for name, pool in pools.items()},
        "evictable": {name: evictable(pool) for name, pool in pools.items()},
        "touched": sorted(store.gpu.touched_ids[: metas["GPU"].meta[P.NUM_TOUCHED]].tolist())
        if m.enable_caching
        else [],
        "hit_stats": {name: _hit_stats(pool.meta, pool.hit_mean) for name, pool in metas.items()},
        "tracker": {
            seq_id: (store.tracker_view.num_keys[row], store.tracker_view.num_cached[row])
            for seq_id, row in m.tracker.tracked.items()
        },
        "null_block": None if null < 0 else null,
    }


def _time(access_time: Any) -> float | None:
    return None if access_time is None else float(access_time)


def check_invariants(m: FastBlockSpaceManager) -> None:
    """Refcounts equal references; per device every id is exactly one of
    free, idle cached or in use; keys, evictor and tables agree; every kept
    table answer is the table as it is now."""
    store, rows = m.store, m.rows
    bs, tables, null = m.block_size, store.tables, int(store.null_block[0])
    references: Counter[int] = Counter()
    if set(np.flatnonzero(rows.live).tolist()) != set(rows.of_seq.values()):
        _fail("the live rows of the array-level step are not the rows of the sequence tables")
    for seq_id, ids in rows.answers.items():
        if seq_id not in rows.of_seq or ids != rows.ids(rows.of_seq[seq_id]):
            _fail(f"sequence {seq_id}: the kept get_block_table answer is not its table")
    named = [(f"sequence {i}", r) for i, r in rows.of_seq.items()] + [
        (f"cross table {i!r}", r) for i, r in rows.of_cross.items()
    ]
    for name, row in named:
        num_blocks = int(tables.num_blocks[row])
        if tables.num_filled[row] > num_blocks * bs:
            _fail(f"{name}: {tables.num_filled[row]} tokens in {num_blocks} blocks")
        pool = store.gpu if tables.device[row] == T.GPU else store.cpu
        for index in range(num_blocks):
            block_id = int(tables.blocks[row, index])
            if index < tables.num_null[row]:
                if block_id != null:
                    _fail(f"{name}: dropped block {index} is not the null block")
                continue
            references[block_id] += 1
            if not P.owns(pool, block_id):
                _fail(f"{name}: block {block_id} is not on its device")
            key = int(tables.keys[row, index])
            if m.enable_caching and key >= 0 and pool.key_block[key] != block_id:
                _fail(f"{name}: keyed block {block_id} is not the cached block of its content")
    if null >= 0:
        references[null] += 1
    for name, pool in (("GPU", store.gpu), ("CPU", store.cpu)):
        _check_pool(name, pool, references)


def _idle_in_runs(device: str, pool: P.Pool) -> list[int]:
    """The evictor's blocks, run by run, checked: the heap orders the runs by
    their first blocks, each run is linked both ways in eviction order, and
    each block names its run."""
    first, heap = int(pool.meta[P.FIRST_ID]), pool.heap
    found: list[int] = []
    for index in range(int(pool.meta[P.NUM_RUNS])):
        run = int(heap[index])
        if pool.run_pos[run] != index:
            _fail(f"{device}: evictor heap position of run {run} is wrong")
        if index and P._before(pool, int(pool.run_head[run]), int(pool.run_head[heap[(index - 1) // 2]])):
            _fail(f"{device}: evictor heap order broken at run {run}")
        before, physical = -1, int(pool.run_head[run])
        if physical < 0:
            _fail(f"{device}: run {run} is empty but in the evictor's heap")
        while physical >= 0 and len(found) <= len(pool.refcount):
            if pool.idle_run[physical] != run or pool.run_prev[physical] != before:
                _fail(f"{device}: idle block {physical + first} is not linked into run {run}")
            if before >= 0 and not P._before(pool, before, physical):
                _fail(f"{device}: run {run} is out of eviction order at block {physical + first}")
            found.append(physical)
            before, physical = physical, int(pool.run_next[physical])
        if pool.run_tail[run] != before:
            _fail(f"{device}: the last block of run {run} is wrong")
    return found


def _check_pool(device: str, pool: P.Pool, references: Counter[int]) -> None:
    n, first = int(pool.meta[P.NUM_BLOCKS]), int(pool.meta[P.FIRST_ID])
    free = free_list(pool)
    if len(set(free)) != len(free):
        _fail(f"{device}: a block is twice on the free list")
    free_set = set(free)
    found = _idle_in_runs(device, pool)
    idle = {physical + first for physical in found}
    if len(idle) != len(found) or len(found) != int(pool.meta[P.NUM_IDLE]):
        _fail(f"{device}: the evictor holds {len(found)} blocks, its count says {int(pool.meta[P.NUM_IDLE])}")
    for physical in range(n):
        block_id = physical + first
        ref = int(pool.refcount[physical])
        if ref != references[block_id]:
            _fail(f"{device} block {block_id}: refcount {ref}, referenced {references[block_id]} times")
        states = (ref > 0) + (block_id in idle) + (block_id in free_set)
        if states != 1:
            _fail(f"{device} block {block_id} is in {states} of the states in use / idle cached / free")
        key = int(pool.block_key[physical])
        if key >= 0 and pool.key_block[key] != block_id:
            _fail(f"{device}: block {block_id} and its content key {key} disagree")
        if (block_id in idle and key < 0) or (block_id in free_set and key >= 0):
            _fail(f"{device}: an idle block is uncached or a free block is cached")
    if int((pool.key_block >= 0).sum()) != int((pool.block_key[:n] >= 0).sum()):
        _fail(f"{device}: cache and block keys disagree")
    if P.num_free(pool) != len(free) + len(idle):
        _fail(f"{device}: free count {P.num_free(pool)} != {len(free)} free + {len(idle)} idle")
