"""``check_invariants()`` and ``snapshot()`` of the reference manager."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from blockspace.errors import InvariantError
from blockspace.reference.allocator import BlockAllocator, CachingAllocator

if TYPE_CHECKING:
    from blockspace.reference.manager import ReferenceBlockSpaceManager


def _fail(what: str) -> None:
    raise InvariantError(what)


def check_invariants(manager: ReferenceBlockSpaceManager) -> None:
    """Refcounts equal references; per device every id is exactly one of
    free, idle cached or in use; tables agree with their token counts."""
    bs = manager.block_size
    references: Counter[int] = Counter()
    tables = [(f"sequence {i}", t) for i, t in manager.block_tables.items()]
    tables += [(f"cross table {r!r}", t) for r, t in manager.cross_block_tables.items()]
    for name, table in tables:
        if table.num_filled > len(table.entries) * bs:
            _fail(f"{name}: {table.num_filled} tokens in {len(table.entries)} blocks")
        allocator = manager._allocator(table.device)
        for index, entry in enumerate(table.entries):
            expected = min(bs, max(0, table.num_filled - index * bs))
            if len(entry.tokens) != expected:
                _fail(f"{name}: block {index} holds {len(entry.tokens)} tokens, expected {expected}")
            if entry.is_null:
                if entry.block_id != manager.null_block_id:
                    _fail(f"{name}: dropped block {index} is not the null block")
                continue
            references[entry.block_id] += 1
            if not allocator.owns(entry.block_id):
                _fail(f"{name}: block {entry.block_id} is not on the {table.device.name}")
            if isinstance(allocator, CachingAllocator) and entry.key is not None:
                if allocator.cached.get(entry.key) != entry.block_id:
                    _fail(f"{name}: keyed block {entry.block_id} is not the cached block of its content")
    if manager.null_block_id is not None:
        references[manager.null_block_id] += 1
    for allocator in (manager.gpu, manager.cpu):
        _check_allocator(allocator, references)


def _check_allocator(allocator: BlockAllocator, references: Counter[int]) -> None:
    device = allocator.device.name
    free = list(allocator.free_ids)
    if len(set(free)) != len(free):
        _fail(f"{device}: a block is twice on the free list")
    free_set = set(free)
    idle = set(allocator.snapshot_evictable())
    for physical, ref in enumerate(allocator.refcount):
        block_id = physical + allocator.first_id
        if ref != references[block_id]:
            _fail(f"{device} block {block_id}: refcount {ref}, referenced {references[block_id]} times")
        states = (ref > 0) + (block_id in idle) + (block_id in free_set)
        if states != 1:
            _fail(f"{device} block {block_id} is in {states} of the states in use / idle cached / free")
    if allocator.num_free != len(free) + len(idle):
        _fail(f"{device}: free count {allocator.num_free} != {len(free)} free + {len(idle)} idle")
    if isinstance(allocator, CachingAllocator):
        if {v: k for k, v in allocator.cached.items()} != allocator.key_of:
            _fail(f"{device}: cache and block keys disagree")
        if not idle <= set(allocator.key_of) or free_set & set(allocator.key_of):
            _fail(f"{device}: an idle block is uncached or a free block is cached")


def snapshot(manager: ReferenceBlockSpaceManager) -> dict[str, Any]:
    """The observable state in the form of ``blockspace.snapshot``."""
    devices = {"GPU": manager.gpu, "CPU": manager.cpu}
    tracker = manager.tracker
    return {
        "tables": {
            seq_id: {
                "blocks": list(table.block_ids),
                "num_tokens": table.num_filled,
                "device": table.device.name,
                "last_access": table.last_access,
            }
            for seq_id, table in manager.block_tables.items()
        },
        "cross_tables": {request_id: list(t.block_ids) for request_id, t in manager.cross_block_tables.items()},
        "blocks": manager.gpu.snapshot_blocks() + manager.cpu.snapshot_blocks(),
        "free": {name: list(a.free_ids) for name, a in devices.items()},
        "evictable": {name: a.snapshot_evictable() for name, a in devices.items()},
        "touched": sorted(manager.gpu.touched) if isinstance(manager.gpu, CachingAllocator) else [],
        "hit_stats": {name: a.snapshot_stats() for name, a in devices.items()},
        "tracker": {}
        if tracker is None
        else {i: (len(tracker.keys_of[i]), tracker.num_cached[i]) for i in tracker.num_cached},
        "null_block": manager.null_block_id,
    }
